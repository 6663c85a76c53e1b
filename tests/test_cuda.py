"""CUDA targets: a trace's blocks replayed through the caching-allocator model (no GPU needed, none used)."""

from __future__ import annotations

import pytest

from nnmem.cuda import CudaTarget, cuda_events, cuda_peaks, cuda_target
from nnmem.errors import ConfigError, UnsupportedError
from nnmem.trace import Block, Category, Op, Phase, Trace

MiB = 2**20


def _trace() -> Trace:
    """A parameter live before the step (1 MiB + 1 B), an 11 MiB activation made by op 0 and freed after op 1."""
    blocks = (Block(0, MiB + 1, Category.PARAMETERS, "fc", Phase.SETUP, -1, -1),
              Block(1, 11 * MiB, Category.ACTIVATIONS, "fc", Phase.FORWARD, 0, 1),
              Block(2, 1000, Category.TEMPORARIES, "fc", Phase.FORWARD, 1, 1))
    ops = (Op(0, "aten.addmm.default", Phase.FORWARD, "fc", 11 * MiB, 0),
           Op(1, "aten.relu.default", Phase.FORWARD, "fc", 1000, 11 * MiB + 1000))
    return Trace("torch", "infer", blocks, ops)


def test_events_follow_program_order() -> None:
    events = [(e.kind, e.block) for e in cuda_events(_trace(), resident_extra=4096)]
    assert events == [("alloc", 0), ("alloc", 3), ("alloc", 1), ("alloc", 2), ("free", 1), ("free", 2)]


def test_peaks_follow_the_allocator_rules() -> None:
    """CUDACachingAllocator.cpp: 1 MiB + 1 B is a large-pool request (rounded to 512 B) that gets a 20 MiB
    segment (requests < 10 MiB); the 11 MiB activation is then cut from that segment's cached remainder
    (19 MiB - 512 B) instead of a new segment; 1000 B goes to a 2 MiB small-pool segment: 22 MiB reserved."""
    target = CudaTarget("cuda", (8, 0), None)
    peaks = cuda_peaks(_trace(), target, uses_cublas=False)
    assert peaks["allocator"] == (MiB + 512) + 11 * MiB + 1024
    assert peaks["reserved"] == 22 * MiB
    with_cublas = cuda_peaks(_trace(), target, uses_cublas=True)
    # With the pre-Hopper cuBLAS workspace (8 MiB + 128 KiB) resident in the first segment, 11 MiB no longer
    # fits its remainder: a 12 MiB segment, not split because the 1 MiB left is not above kSmallSize.
    workspace = 4096 * 1024 * 2 + 16 * 1024 * 8
    assert with_cublas["allocator"] == (MiB + 512) + workspace + 12 * MiB + 1024
    assert with_cublas["reserved"] == 20 * MiB + 12 * MiB + 2 * MiB


def test_a_request_larger_than_the_cached_remainder_gets_its_own_segment() -> None:
    """19 MiB does not fit the 19 MiB - 512 B remainder: a new segment, rounded to 2 MiB (20 MiB)."""
    t = _trace()
    big = Block(1, 19 * MiB, Category.ACTIVATIONS, "fc", Phase.FORWARD, 0, 1)
    trace = Trace(t.framework, t.mode, (t.blocks[0], big, t.blocks[2]), t.ops)
    assert cuda_peaks(trace, CudaTarget("cuda", (8, 0), None), uses_cublas=False)["reserved"] == 42 * MiB


def test_device_names() -> None:
    assert cuda_target("cpu") is None
    assert cuda_target("cuda:1") == CudaTarget("cuda:1", (8, 0), None)
    h100 = cuda_target("H100-80GB")
    assert h100 is not None and h100.compute_capability[0] == 9 and h100.usable_bytes
    with pytest.raises(UnsupportedError, match="tpu"):
        cuda_target("TPU-v4")
    with pytest.raises(ConfigError, match="A100-81GB"):
        cuda_target("A100-81GB")


torch = pytest.importorskip("torch")

import nnmem  # noqa: E402


def test_estimate_on_cuda_reports_reserved_and_says_it_is_not_validated() -> None:
    report = nnmem.estimate("mlp", batch=32, optimizer="adam", device="H100-80GB")
    assert report.level == "reserved" and report.peak_bytes == report.peaks["reserved"]
    assert sum(report.breakdown.values()) == report.peak_bytes
    # the 32 MiB Hopper cuBLAS workspace is handed out by the allocator, on top of the tensors
    assert report.peaks["allocator"] >= report.peaks["tensor"] + 32 * MiB
    assert report.peaks["reserved"] % (2 * MiB) == 0 and report.peaks["reserved"] >= report.peaks["allocator"]
    assert any("not yet validated" in note for note in report.notes)
    cpu = nnmem.estimate("mlp", batch=32, optimizer="adam")
    assert cpu.peaks["tensor"] == report.peaks["tensor"] and "reserved" not in cpu.peaks


def test_measure_on_cuda_is_refused() -> None:
    with pytest.raises(UnsupportedError, match="CPU steps only"):
        nnmem.measure("mlp", batch=4, device="cuda")


def test_max_batch_on_cuda_answers_at_the_reserved_level() -> None:
    fit = nnmem.max_batch("vgg", budget="120MiB", device="cuda", mode="train", optimizer="adam")
    assert fit.batch > 0 and not fit.at_limit
    at = nnmem.estimate("vgg", batch=fit.batch, optimizer="adam", device="cuda").peaks["reserved"]
    above = nnmem.estimate("vgg", batch=fit.batch + 1, optimizer="adam", device="cuda").peaks["reserved"]
    assert at == fit.peak_bytes <= 120 * MiB < above == fit.next_peak_bytes


def test_search_limit_is_reported() -> None:
    fit = nnmem.max_batch("mlp", budget="1GiB", upper=64)
    assert fit.at_limit and fit.batch == 64
