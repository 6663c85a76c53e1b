"""The oneDNN scratchpad of bfloat16 matmuls (workspace/matmul.py) against the profiler's measurement of the
same op, and a bfloat16 MLP's estimate against its measurement.

The rule is a port of oneDNN's brgemm matmul for one ISA (``avx512_core_bf16``) at the thread counts it was
measured at; elsewhere these tests skip, and the calls keep their "not modelled" note (checked here too).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import calibrate_workspace as calibrate
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nnmem
from nnmem import cpu
from nnmem.frontends.pytorch.workspace import note_for
from nnmem.frontends.pytorch.workspace.matmul import MODELLED_ISA, MODELLED_THREADS, matmul_scratch

HOST = cpu.describe()
BF16 = torch.bfloat16


def _require_modelled_cpu(threads: int) -> None:
    if not torch.backends.mkldnn.is_available() or HOST.isa != MODELLED_ISA:
        pytest.skip(f"the bf16 oneDNN matmul scratchpad is modelled on ISA {MODELLED_ISA}; this CPU "
                    f"({HOST.model}) runs oneDNN at {HOST.isa}")
    if threads not in MODELLED_THREADS:
        pytest.skip(f"the bf16 oneDNN matmul scratchpad is modelled at {MODELLED_THREADS} threads, not {threads}")


@contextmanager
def _threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("threads", MODELLED_THREADS)
def test_bf16_matmul_scratch_matches_measurement(threads: int) -> None:
    """Every bf16 matmul op of 40 seeded steps: the rule's bytes equal the allocator's peak inside the op minus
    its outputs (one scratchpad block from ideep), and no note; at least 30 of them run through oneDNN."""
    _require_modelled_cpu(threads)
    with _threads(threads):
        through_onednn, mismatches = calibrate.matmul_draws(random.Random(2026), BF16, 40)
    assert not mismatches, "\n".join(mismatches)
    assert through_onednn >= 30


def test_big_k_and_row_vector_blockings() -> None:
    """The K-split (transposed src, K a power of two >= 2048), the 1024-deep K block, the copy of a
    power-of-two-wide src (M >= 1024) and a 1-row src, whose ambiguous tag oneDNN reads as transposed."""
    threads = torch.get_num_threads()
    _require_modelled_cpu(threads)
    shapes = [("ta", 64, 2048, 32), ("ta", 300, 2048, 130), ("", 8, 3000, 40), ("", 1024, 4096, 64),
              ("", 1, 4096, 16), ("", 1, 5000, 1), ("", 3, 4096, 1), ("ta", 777, 1, 255)]
    for kind, m, k, n in shapes:
        a = torch.randn(k, m, dtype=BF16).t() if kind == "ta" else torch.randn(m, k, dtype=BF16)
        b = torch.randn(k, n, dtype=BF16)
        (row,) = [r for r in calibrate.measure_ops(lambda a=a, b=b: torch.mm(a, b), training=False)
                  if r.name == "aten.mm.default"]
        assert row.predicted == row.scratch > 0 and row.note is None, (kind, m, k, n, row)


def test_note_stays_where_not_modelled() -> None:
    """Another ISA, float16, a strided operand or an unmodelled thread count keep the note and get no bytes."""
    mm, a, b = torch.ops.aten.mm.default, torch.zeros(64, 64, dtype=BF16), torch.zeros(64, 64, dtype=BF16)
    modelled = cpu.CpuInfo(model="test", arch="x86_64", flags=(), isa=MODELLED_ISA)
    for isa in ("avx512_core_fp16", "avx2_vnni_2"):
        other = cpu.CpuInfo(model="test", arch="x86_64", flags=(), isa=isa)
        assert matmul_scratch(mm, (a, b), {}, other) is None
        assert note_for(mm, (a, b), {}, other) is not None
    half = cpu.CpuInfo(model="test", arch="x86_64", flags=(), isa="avx512_core_amx_fp16")
    assert note_for(mm, (a.half(), b.half()), {}, half) is not None
    every_other = torch.zeros(64, 128, dtype=BF16)[:, ::2]  # no unit stride: ATen clones it first
    assert note_for(mm, (every_other, b), {}, modelled) is not None
    if torch.backends.mkldnn.is_available():
        with _threads(max(MODELLED_THREADS) + 1):
            assert note_for(mm, (a, b), {}, modelled) is not None
        with _threads(MODELLED_THREADS[0]):
            assert note_for(mm, (a, b), {}, modelled) is None
            assert (matmul_scratch(mm, (a, b), {}, modelled) or 0) > 0


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_bf16_mlp_estimate_matches_measurement(mode: str) -> None:
    """A bf16 MLP with odd widths: no note, and the allocator peak within 0.5 % of the measured one."""
    _require_modelled_cpu(torch.get_num_threads())
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(300, 512), nn.ReLU(), nn.Linear(512, 257), nn.GELU(),
                          nn.Linear(257, 10)).to(BF16)
    x = torch.randn(64, 300, dtype=BF16)
    estimate = nnmem.estimate(model, (x,), mode=mode, optimizer="sgd")
    measured = nnmem.measure(model, (x,), mode=mode, optimizer="sgd")
    assert not any("matmul" in n for n in estimate.notes), estimate.notes
    e, m = estimate.peaks["allocator"], measured.peaks["allocator"]
    assert abs(e - m) <= 0.005 * m, f"estimated {e:,} B, measured {m:,} B ({(e - m) / m:+.2%})"


def test_a_padded_leading_dimension_books_the_dense_scratchpad(torch_threads: Callable[[int], None]) -> None:
    """``x[:, 0]`` of a ``[B, T, D]`` activation (a classifier's first token) reaches ``addmm`` with a padded
    leading dimension; oneDNN takes it as it is, with the dense operand's scratchpad (it was noted before)."""
    rng, checked = random.Random(21), 0
    for _ in range(10):
        threads = rng.choice(MODELLED_THREADS)
        _require_modelled_cpu(threads)
        torch_threads(threads)
        m, k, n, pad = rng.choice([2, 8, 33, 64]), rng.choice([32, 128, 200]), rng.choice([64, 128, 384]), 9
        x = torch.randn(m, pad, k, dtype=BF16)[:, 0]
        w, b = torch.randn(n, k, dtype=BF16, requires_grad=True), torch.randn(n, dtype=BF16, requires_grad=True)

        def step(x: torch.Tensor = x, w: torch.Tensor = w, b: torch.Tensor = b) -> None:
            with torch.inference_mode():
                F.linear(x, w, b)

        row = next(r for r in calibrate.measure_ops(step, training=False) if r.name == "aten.linear.default")
        if row.scratch == 0:
            continue  # a product small enough for ATen's own gemm
        assert row.note is None and row.predicted == row.scratch, (threads, m, k, n, row)
        checked += 1
    assert checked >= 6


def test_a_padded_column_major_operand_books_the_dense_scratchpad(torch_threads: Callable[[int], None]) -> None:
    """One direction's slice of a bidirectional output, transposed for a weight gradient, is column-major with
    a padded leading dimension: ``mm`` takes it without a copy (it was noted before)."""
    rng, checked = random.Random(22), 0
    for _ in range(8):
        threads = rng.choice(MODELLED_THREADS)
        _require_modelled_cpu(threads)
        torch_threads(threads)
        m, k, n = rng.choice([8, 37, 128]), rng.choice([32, 64, 200]), rng.choice([16, 77, 384])
        a = torch.randn(k, 2 * m, dtype=BF16)[:, :m].t()  # [m, k], strides (1, 2m)
        b = torch.randn(k, n, dtype=BF16)

        def step(a: torch.Tensor = a, b: torch.Tensor = b) -> None:
            with torch.inference_mode():
                torch.mm(a, b)

        row = next(r for r in calibrate.measure_ops(step, training=False) if r.name == "aten.mm.default")
        if row.scratch == 0:
            continue
        assert row.note is None and row.predicted == row.scratch, (threads, m, k, n, row)
        checked += 1
    assert checked >= 5


def test_strided_batch_operands_are_copied_then_multiplied(torch_threads: Callable[[int], None]) -> None:
    """``nn.MultiheadAttention`` splits its projection into heads as strided slices; ``mkldnn_matmul`` copies a
    batch operand that is not a dense batch, then runs the dense product (it was noted before)."""
    rng, checked = random.Random(23), 0
    for _ in range(12):
        threads = rng.choice(MODELLED_THREADS)
        _require_modelled_cpu(threads)
        torch_threads(threads)
        batch, steps = rng.choice([1, 2, 4]), rng.choice([7, 25, 64])
        dim, heads = rng.choice([8, 32]), rng.choice([1, 2])
        proj = torch.randn(steps, batch, 2 * dim, dtype=BF16)
        q = proj[..., :dim].reshape(steps, batch * heads, dim // heads).transpose(0, 1)
        k = proj[..., dim:].reshape(steps, batch * heads, dim // heads).transpose(0, 1)
        scores = rng.random() < 0.5

        def step(q: torch.Tensor = q, k: torch.Tensor = k, scores: bool = scores) -> None:
            with torch.inference_mode():
                torch.bmm(q, k.transpose(1, 2)) if scores else torch.bmm(torch.bmm(q, k.transpose(1, 2)), k)

        for row in calibrate.measure_ops(step, training=False):
            if row.name != "aten.bmm.default" or row.scratch == 0:
                continue
            assert row.note is None and row.predicted == row.scratch, (threads, batch, steps, dim, heads, row)
            checked += 1
    assert checked >= 8
