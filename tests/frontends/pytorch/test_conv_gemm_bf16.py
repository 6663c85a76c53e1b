"""bfloat16 NCHW convolutions on oneDNN's ``gemm:jit`` kernel (workspace/conv_gemm_bf16.py): first convolutions whose
output channels ``jit_bf16``'s weights' gradient refuses, grouped ones without a channel block and depthwise ones
with a multiplier, in 1-D, 2-D and 3-D, forward and backward, against the profiler's measurement of the same ops."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import calibrate_workspace as calibrate
import pytest
import torch
from torch import nn
from torch.nn.modules.conv import _ConvNd

from nnmem import cpu
from nnmem.frontends.pytorch.workspace.conv_gemm_bf16 import gemm_bf16_claims
from nnmem.frontends.pytorch.workspace.conv_select import conv_call
from nnmem.frontends.pytorch.workspace.matmul import MODELLED_ISA, MODELLED_THREADS

HOST = cpu.describe()
BF16 = torch.bfloat16
_CONVS = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}


def _draw(rng: random.Random) -> tuple[_ConvNd, torch.Tensor]:
    """A bfloat16 convolution oneDNN runs (partly) on gemm: a first convolution (1-15 input channels, output
    channels not a multiple of 16), a grouped one (2-8 groups, per-group channels without a common block of
    16), a depthwise one with a channel multiplier or without (gemm where ``jit_dw`` refuses); 1-D, 2-D or 3-D,
    kernel 2-5, stride 1-2, dilation 1-2, padding (some past the kernel), with or without bias; its input asks
    for its gradient in most draws."""
    kind, dim = rng.choice(["first", "first", "grouped", "multiplier", "depthwise"]), rng.choice([1, 2, 2, 3])
    if kind == "first":
        g, c, o = 1, rng.randint(1, 15), rng.choice([1, 2, 3, 4, 5, 6, 7, 11, 13, 20, 24])
    elif kind == "grouped":
        g = rng.choice([2, 3, 4, 5, 8])
        c, o = g * rng.choice([1, 2, 3, 5, 6, 8, 12]), g * rng.choice([1, 2, 3, 5, 7, 14])
    elif kind == "multiplier":
        g = rng.choice([2, 3, 4, 6, 10])
        c, o = g, g * rng.choice([2, 3, 4])
    else:
        g = c = o = rng.choice([2, 3, 8, 17, 20])
    k, s, d = rng.choice([2, 3, 3, 5]), rng.choice([1, 1, 1, 2]), rng.choice([1, 1, 1, 2])
    n = rng.choice([1, 2, 3, 4, 5, 8])
    size = max({1: rng.choice([9, 20, 40, 82]), 2: rng.choice([5, 7, 9, 12, 18, 21]),
                3: rng.choice([4, 5, 6, 8])}[dim], d * (k - 1) + 2)
    pad, bias = rng.choice([0, 0, 1, d * (k // 2), d * (k - 1) + 1]), rng.random() < 0.7  # the last: outside
    conv = _CONVS[dim](c, o, k, s, pad, d, groups=g, bias=bias).to(BF16)
    return conv, torch.randn(n, c, *([size] * dim), dtype=BF16).requires_grad_(rng.random() < 0.7)


def test_bf16_gemm_convolution_scratch_matches_measurement(torch_threads: Callable[[int], None]) -> None:
    """Every seeded forward and ``convolution_backward`` on gemm the rules claim (no note; gemm's per-thread
    bfloat16 columns, float32 accumulators and partial sums; the input's gradient on gemm, ``jit_bf16``, ``jit_dw``
    or ``brgconv_strided``): its bytes equal the allocator's peak inside the op minus its outputs, at 1-4 threads;
    most of them are claimed."""
    if not torch.backends.mkldnn.is_available() or HOST.isa != MODELLED_ISA:
        pytest.skip(f"these bfloat16 convolutions are modelled on ISA {MODELLED_ISA}; this CPU runs oneDNN at "
                    f"{HOST.isa}")
    rng, claimed, on_gemm, mismatches = random.Random(3), 0, 0, []
    for _ in range(40):
        torch_threads(rng.choice(MODELLED_THREADS))
        conv, x = _draw(rng)

        def step(conv: _ConvNd = conv, x: torch.Tensor = x) -> None:
            conv(x).float().sum().backward()

        rows = [r for r in calibrate.measure_ops(step, training=True)
                if r.name.startswith("aten.convolution") and r.note is None]
        claimed += len(rows)
        call = conv_call(x, conv.weight, conv.stride, conv.padding, conv.dilation, False, 0, conv.groups)
        assert call is not None
        on_gemm += sum(gemm_bf16_claims(dataclasses.replace(call, backward=b, grad_input=x.requires_grad), HOST)
                       for b in (False, True))
        mismatches += [f"{torch.get_num_threads()} threads {conv} {tuple(x.shape)} grad_input={x.requires_grad} "
                       f"{r.name}: measured {r.scratch:,} B, rule {r.predicted:,} B"
                       for r in rows if r.predicted != r.scratch]
    assert not mismatches, "\n".join(mismatches)
    assert claimed >= 65 and on_gemm >= 40
