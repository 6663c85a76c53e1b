"""bfloat16 transposed convolutions and strided input gradients on ``avx512_core_bf16`` (workspace/
conv_bf16_transpose.py, conv_bf16_strided_bwd.py): oneDNN's deconvolution (``jit_bf16`` / ``jit_bf16_1x1`` backward
data at unit stride, ``brgconv_strided`` strided, its backward on the transposed convolution's forward and backward
weights) and ``brgconv_strided``'s bfloat16 input gradient, the rules' bytes against the profiler's measurement of
the same op on seeded shapes."""

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


def _require_modelled_cpu() -> None:
    if not torch.backends.mkldnn.is_available() or HOST.isa != MODELLED_ISA:
        pytest.skip(f"these bfloat16 convolutions are modelled on ISA {MODELLED_ISA}; this CPU runs oneDNN at "
                    f"{HOST.isa}")


def _transposed(rng: random.Random) -> tuple[nn.Module, torch.Tensor]:
    """A 1-D, 2-D or 3-D bfloat16 transposed convolution (channels 1-64, kernel 1-4, stride 1-3, padding, output
    padding and dilation sometimes, bias or not, batch 1-8) and its input, which asks for its gradient in most
    draws."""
    c, o = rng.choice([1, 3, 4, 8, 16, 17, 30, 32, 48, 64]), rng.choice([1, 2, 4, 8, 12, 16, 23, 24, 32, 33, 64])
    k, s, d = rng.randint(1, 4), rng.choice([1, 1, 2, 3]), rng.choice([1, 1, 1, 2])
    pad = rng.randint(0, k - 1) if rng.random() < 0.4 else 0
    out_pad = rng.randint(0, s - 1) if rng.random() < 0.3 else 0
    n, size, bias = rng.randint(1, 8), rng.choice([4, 5, 7, 8, 12, 16]), rng.random() < 0.5
    dims = rng.choice([1, 2, 2, 3])
    spatial = {1: 3 * size, 2: size, 3: max(2, size // 2)}[dims]
    if (spatial - 1) * s - 2 * pad + d * (k - 1) + out_pad + 1 <= 0:  # an empty output: oneDNN refuses it
        pad = 0
    if dims == 1:
        conv, x = nn.ConvTranspose1d(c, o, k, s, pad, out_pad, bias=bias, dilation=d), torch.randn(n, c, 3 * size)
    elif dims == 2:
        conv = nn.ConvTranspose2d(c, o, k, s, pad, out_pad, bias=bias, dilation=d)
        x = torch.randn(n, c, size, size)
    else:
        conv = nn.ConvTranspose3d(c, o, k, s, pad, out_pad, bias=bias, dilation=d)
        x = torch.randn(n, c, spatial, spatial, spatial)
    return conv.to(BF16), x.to(BF16).requires_grad_(rng.random() < 0.7)


def _strided(rng: random.Random) -> tuple[nn.Module, torch.Tensor]:
    """A dense strided 1-D, 2-D or 3-D bfloat16 convolution (1-130 input channels, kernel 1-7, 3-D 1-3, stride 2-3,
    padding, with or without bias) and its input, which asks for its gradient."""
    c, o = rng.choice([1, 2, 3, 8, 15, 16, 17, 32, 48, 64, 100, 130]), rng.choice([8, 16, 24, 32, 64, 65, 128])
    k, s = rng.choice([1, 2, 3, 5, 7]), rng.choice([2, 3])
    n, size = rng.choice([1, 2, 3, 4, 8]), max(rng.choice([7, 8, 14, 16, 28, 33]), k + 1)
    pad, bias = rng.choice([0, k // 2, 1]) if k > 1 else 0, rng.random() < 0.7
    dims = rng.choice([1, 2, 2, 3])
    if dims == 1:
        conv, x = nn.Conv1d(c, o, k, s, pad, bias=bias), torch.randn(n, c, 4 * size, dtype=BF16)
    elif dims == 2:
        conv, x = nn.Conv2d(c, o, k, s, pad, bias=bias), torch.randn(n, c, size, size, dtype=BF16)
    else:
        k = rng.choice([1, 2, 3])
        conv = nn.Conv3d(c % 48 or 8, o % 64 or 16, k, s, pad if k > 1 else 0, bias=bias)
        x = torch.randn(min(n, 2), c % 48 or 8, *(rng.choice([5, 6, 8, 9]),) * 3, dtype=BF16)
    return conv.to(BF16), x.requires_grad_(True)


def _seeded(draw: Callable[[random.Random], tuple[nn.Module, torch.Tensor]], seed: int, draws: int, ops: str,
            torch_threads: Callable[[int], None]) -> tuple[int, list[str]]:
    """``(ops claimed, mismatches)`` over the ops named ``ops...`` of ``draws`` seeded training steps at 1-4 threads
    that carry no note: each rule against the allocator's peak inside the op minus its outputs."""
    rng, claimed, mismatches = random.Random(seed), 0, []
    for _ in range(draws):
        torch_threads(rng.choice(MODELLED_THREADS))
        conv, x = draw(rng)

        def step(conv: nn.Module = conv, x: torch.Tensor = x) -> None:
            conv(x).float().sum().backward()

        rows = [r for r in calibrate.measure_ops(step, training=True) if r.name.startswith(ops) and r.note is None]
        claimed += len(rows)
        mismatches += [f"{torch.get_num_threads()} threads {conv} {tuple(x.shape)} grad_input={x.requires_grad} "
                       f"{r.name}: measured {r.scratch:,} B, rule {r.predicted:,} B"
                       for r in rows if r.predicted != r.scratch]
    return claimed, mismatches


def test_bf16_transposed_convolution_scratch_matches_measurement(torch_threads: Callable[[int], None]) -> None:
    """Every seeded bfloat16 transposed forward and backward the rules claim equals the allocator's peak inside the
    op minus its outputs at 1-4 threads (the deconvolution's nested scratchpad, a bias through float32, the
    backward's forward and backward weights); most are claimed."""
    _require_modelled_cpu()
    claimed, mismatches = _seeded(_transposed, 1, 30, "aten.convolution", torch_threads)
    assert not mismatches, "\n".join(mismatches)
    assert claimed >= 50


def test_bf16_strided_input_gradient_scratch_matches_measurement(torch_threads: Callable[[int], None]) -> None:
    """Every seeded strided bfloat16 ``convolution_backward`` the rules claim (``brgconv_strided``'s blocking and
    float32 accumulation buffer) equals the allocator's peak inside the op minus its outputs at 1-4 threads."""
    _require_modelled_cpu()
    claimed, mismatches = _seeded(_strided, 4, 25, "aten.convolution_backward", torch_threads)
    assert not mismatches, "\n".join(mismatches)
    assert claimed >= 21


def test_bf16_transposed_outside_the_ported_kernels_keep_their_note() -> None:
    """A grouped transposed convolution (no rule sizes its kernels) keeps its note; a DCGAN-like strided one and a
    dilated strided one (``gemm:jit``) are claimed."""
    _require_modelled_cpu()
    x = torch.randn(2, 16, 8, 8, dtype=BF16)
    grouped = nn.ConvTranspose2d(16, 8, 3, stride=2, groups=2).to(BF16)
    estimate = nnmem.estimate(grouped, (x,), mode="infer")
    assert any("convolution" in n for n in estimate.notes), estimate.notes
    for conv in (nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1), nn.ConvTranspose2d(16, 8, 3, stride=2, dilation=2)):
        estimate = nnmem.estimate(conv.to(BF16), (x,), mode="infer")
        assert not any("convolution" in n for n in estimate.notes), (conv, estimate.notes)
