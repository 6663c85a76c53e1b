"""bfloat16 NCHW convolutions on avx512_core_bf16 outside the older rules' domains: 1x1 kernels ``jit_bf16_1x1``
refuses (padded, or strided without tiling: ``jit_bf16`` or ``gemm:jit``), grouped 1x1 and grouped forwards
(``gemm:jit`` / ``jit_bf16``), one output position (``jit_bf16``; ``ip_convolution`` keeps its note), 3-D
depthwise forwards (``brdgmm_dw``) and dilated strided backwards (``gemm:jit``), against the profiler's measurement
of the same op on seeded shapes."""

from __future__ import annotations

import random
from collections.abc import Callable

import calibrate_workspace as calibrate
import pytest
import torch
from torch import nn

import nnmem
from nnmem import cpu
from nnmem.frontends.pytorch.workspace.matmul import MODELLED_ISA, MODELLED_THREADS

HOST = cpu.describe()
BF16 = torch.bfloat16
_CONV: dict[int, type[nn.Module]] = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
_SIZES = {1: (8, 160), 2: (4, 28), 3: (4, 10)}


def _draw(rng: random.Random) -> tuple[nn.Module, torch.Tensor]:
    """A bfloat16 1-D, 2-D or 3-D convolution of one of the shapes this rule set covers, and its input (which asks
    for its gradient in most draws)."""
    kinds = ["1x1", "grouped_1x1", "one_position", "grouped", "depthwise_3d", "dilated_strided"]
    kind, dim = rng.choice(kinds), rng.choice([1, 1, 2, 3])
    size, bias = rng.randint(*_SIZES[dim]), rng.random() < 0.8
    if kind == "1x1":
        conv = _CONV[dim](rng.randint(1, 48), rng.randint(1, 64), 1, rng.choice([1, 2, 3]), rng.choice([0, 0, 1]),
                          rng.choice([1, 1, 2]), bias=bias)
    elif kind == "grouped_1x1":
        g = rng.choice([2, 4])
        conv = _CONV[dim](g * rng.randint(1, 12), g * rng.randint(1, 12), 1, rng.choice([1, 1, 2, 3]),
                          rng.choice([0, 0, 1]), groups=g, bias=bias)
    elif kind == "one_position":  # the dilated kernel spans the input: one output position
        k, d = rng.choice([2, 3, 5]), rng.choice([1, 1, 2, 3])
        ext = d * (k - 1) + 1
        size = rng.randint(ext, ext + 3)
        stride = max(1, size - ext + 1) if rng.random() < 0.5 else rng.choice([size, size + 1])
        conv = _CONV[dim](rng.randint(1, 48), rng.randint(1, 64), k, stride, 0, d, bias=bias)
    elif kind == "dilated_strided":  # both passes on gemm:jit
        k, d = rng.choice([2, 3, 5]), rng.choice([2, 3])
        size = max(size, d * (k - 1) + 1)
        conv = _CONV[dim](rng.randint(1, 48), rng.randint(1, 64), k, rng.choice([2, 3]), rng.choice([0, 1, 2]), d,
                          bias=bias)
    elif kind == "grouped":
        g, k, d = rng.choice([2, 3, 4]), rng.choice([1, 2, 3, 5]), rng.choice([1, 1, 2])
        size = max(size, d * (k - 1) + 1)
        conv = _CONV[dim](g * rng.choice([4, 5, 8, 12, 16, 32]), g * rng.choice([3, 4, 8, 16, 24, 32]), k,
                          rng.choice([1, 1, 2, 3]), rng.choice([0, 1, 2]), d, groups=g, bias=bias)
    else:
        dim, size, g = 3, rng.randint(*_SIZES[3]), rng.randint(2, 40)
        k, d = rng.choice([1, 2, 3, 5]), rng.choice([1, 1, 2])
        size = max(size, d * (k - 1) + 1)
        conv = _CONV[3](g, g * rng.choice([1, 1, 2]), k, rng.choice([1, 1, 2, 3]), rng.choice([0, 1, 2]), d,
                        groups=g, bias=bias)
    batch, channels = rng.choice([1, 2, 3, 4, 5, 7, 8]), int(conv.in_channels)  # type: ignore[arg-type]
    x = torch.randn(batch, channels, *([size] * dim), dtype=BF16)
    return conv.to(BF16), x.requires_grad_(rng.random() < 0.7)


def _require_modelled_cpu() -> None:
    if not torch.backends.mkldnn.is_available() or HOST.isa != MODELLED_ISA:
        pytest.skip(f"these bfloat16 convolutions are modelled on ISA {MODELLED_ISA}; this CPU runs oneDNN at "
                    f"{HOST.isa}")


def _seeded_mismatches(seed: int, torch_threads: Callable[[int], None], draws: int) -> tuple[int, list[str]]:
    """``(ops claimed, mismatches)`` over ``draws`` seeded training steps at 1-4 threads: each convolution op that
    carries no note, its rule against the allocator's peak inside it minus its outputs."""
    rng, claimed, mismatches = random.Random(seed), 0, []
    for _ in range(draws):
        torch_threads(rng.choice(MODELLED_THREADS))
        conv, x = _draw(rng)

        def step(conv: nn.Module = conv, x: torch.Tensor = x) -> None:
            conv(x).float().sum().backward()

        rows = [r for r in calibrate.measure_ops(step, training=True)
                if r.name.startswith("aten.convolution") and r.note is None]
        claimed += len(rows)
        mismatches += [f"{torch.get_num_threads()} threads {conv} {tuple(x.shape)} grad_input={x.requires_grad} "
                       f"{r.name}: measured {r.scratch:,} B, rule {r.predicted:,} B"
                       for r in rows if r.predicted != r.scratch]
    return claimed, mismatches


@pytest.mark.parametrize("seed", [1, 2])
def test_bf16_more_convolution_scratch_matches_measurement(seed: int, torch_threads: Callable[[int], None]) -> None:
    """Every seeded forward and backward the rules claim equals the allocator's peak inside the op minus its
    outputs, at 1-4 threads; most are claimed."""
    _require_modelled_cpu()
    claimed, mismatches = _seeded_mismatches(seed, torch_threads, 20)
    assert not mismatches, "\n".join(mismatches)
    assert claimed >= 25


def test_bf16_inner_product_convolution_keeps_its_note() -> None:
    """A kernel as large as its input with more than 27 taps and a batch above 1 runs ``ip_convolution`` (an inner
    product, not sized): noted; the same shape with 27 taps runs ``jit_bf16`` and is not."""
    _require_modelled_cpu()
    x = torch.randn(2, 34, 5, 5, 5, dtype=BF16)
    ip = nnmem.estimate(nn.Conv3d(34, 50, 5).to(BF16), (x,), mode="infer")
    assert any("bfloat16 convolution" in n for n in ip.notes), ip.notes
    small = nnmem.estimate(nn.Conv3d(34, 50, 3).to(BF16), (x[:, :, :3, :3, :3].contiguous(),), mode="infer")
    assert not any("convolution" in n for n in small.notes), small.notes
