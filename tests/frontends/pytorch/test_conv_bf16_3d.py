"""bfloat16 3-D (NCDHW) convolutions through oneDNN on ``avx512_core_bf16`` (workspace/conv_bf16_3d.py): each op the
rules claim against the profiler's measurement of the same op, on seeded shapes at 1-4 threads (``jit_bf16``'s
padded bias and backward-weights transposes and reductions, ``jit_bf16_1x1``'s store buffers)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import calibrate_workspace as calibrate
import pytest
import torch
from torch import nn

from nnmem import cpu
from nnmem.frontends.pytorch.workspace.conv_bf16_3d import bf16_3d_claims
from nnmem.frontends.pytorch.workspace.conv_select import conv_call
from nnmem.frontends.pytorch.workspace.matmul import MODELLED_ISA, MODELLED_THREADS

HOST = cpu.describe()
BF16 = torch.bfloat16


def _require_modelled_cpu() -> None:
    if not torch.backends.mkldnn.is_available() or HOST.isa != MODELLED_ISA:
        pytest.skip(f"these bfloat16 3-D convolutions are modelled on ISA {MODELLED_ISA}; this CPU runs oneDNN at "
                    f"{HOST.isa}")


def _conv3d(rng: random.Random) -> tuple[nn.Conv3d, torch.Tensor]:
    """A dense bfloat16 3-D convolution (1-130 input and 1-128 output channels, cubic, flat or 1x1x1 kernels,
    stride 1-3, dilation 1-2, padding, with or without bias) and its input, which asks for its gradient in most
    draws."""
    c = rng.choice([1, 2, 3, 5, 8, 15, 16, 17, 32, 48, 64, 130])
    o = rng.choice([1, 4, 8, 11, 16, 24, 32, 33, 64, 80, 128])
    k = rng.choice([1, 1, 2, 3, 3, 5, (3, 1, 1), (1, 3, 3), (3, 3, 1)])
    s, d = rng.choice([1, 1, 1, 2, 3]), rng.choice([1, 1, 2])
    n, size = rng.choice([1, 2, 3, 4]), rng.choice([4, 5, 6, 8, 10, 11, 14, 17])
    kmax = max(k) if isinstance(k, tuple) else k
    size = max(size, d * (kmax - 1) + 2)  # the kernel fits the input, more than one output position
    pad, bias = rng.choice([0, 0, d * (kmax // 2), 1]), rng.random() < 0.7
    conv = nn.Conv3d(c, o, k, s, pad, d, bias=bias).to(BF16)
    return conv, torch.randn(n, c, size, size, size, dtype=BF16).requires_grad_(rng.random() < 0.7)


def _claimed(conv: nn.Conv3d, x: torch.Tensor, backward: bool) -> bool:
    """Whether :mod:`.conv_bf16_3d` claims this forward (or backward) call."""
    call = conv_call(x, conv.weight, conv.stride, conv.padding, conv.dilation, False, 0, conv.groups)
    assert call is not None
    if backward:
        call = dataclasses.replace(call, backward=True, grad_input=x.requires_grad)
    return bf16_3d_claims(call, HOST)


def _mismatches(seed: int, draws: int, training: bool, torch_threads: Callable[[int], None]) -> tuple[int, list[str]]:
    """Run ``draws`` seeded convolutions at 1-4 threads (forward and backward when ``training``, else forward under
    no_grad or inference mode); ``(ops claimed, mismatches)`` over the ops the rules here claim."""
    rng, claimed, mismatches = random.Random(seed), 0, []
    for _ in range(draws):
        torch_threads(rng.choice(MODELLED_THREADS))
        conv, x = _conv3d(rng)
        inference = rng.random() < 0.5

        def step(conv: nn.Conv3d = conv, x: torch.Tensor = x, inference: bool = inference) -> None:
            if training:
                conv(x).float().sum().backward()
                return
            with torch.inference_mode() if inference else torch.no_grad():
                conv(x)

        claims = {False: _claimed(conv, x, False), True: training and _claimed(conv, x, True)}
        for r in calibrate.measure_ops(step, training=training):
            if not r.name.startswith("aten.conv") or not claims[r.name.startswith("aten.convolution_backward")]:
                continue
            claimed += 1
            if r.note is not None or r.predicted != r.scratch:
                mismatches.append(f"{torch.get_num_threads()} threads {conv} {tuple(x.shape)} "
                                  f"grad_input={x.requires_grad} {r.name}: measured {r.scratch:,} B, rule "
                                  f"{r.predicted:,} B, note {r.note}")
    return claimed, mismatches


def test_bf16_3d_forward_scratch_matches_measurement(torch_threads: Callable[[int], None]) -> None:
    """Every seeded 3-D forward the rules claim (``jit_bf16``, ``jit_bf16_1x1``) equals the allocator's peak inside
    the op minus its output, carries no note, and most of them are claimed."""
    _require_modelled_cpu()
    claimed, mismatches = _mismatches(3, 40, False, torch_threads)
    assert not mismatches, "\n".join(mismatches)
    assert claimed >= 24


def test_bf16_3d_backward_scratch_matches_measurement(torch_threads: Callable[[int], None]) -> None:
    """Every seeded 3-D forward and ``convolution_backward`` the rules claim (the weights' gradient on ``jit_bf16``'s
    3-D reduction or ``jit_bf16_1x1``, the input's at unit stride) equals the allocator's peak inside the op minus
    its outputs, carries no note, and a solid share of them is claimed."""
    _require_modelled_cpu()
    claimed, mismatches = _mismatches(5, 40, True, torch_threads)
    assert not mismatches, "\n".join(mismatches)
    assert claimed >= 40


def test_bf16_3d_strided_input_gradient_keeps_its_note() -> None:
    """A strided 3-D input gradient runs ``brgconv_strided``: not claimed here."""
    conv = nn.Conv3d(16, 16, 3, 2, 1).to(BF16)
    x = torch.empty(2, 16, 8, 8, 8, dtype=BF16).requires_grad_()
    assert not _claimed(conv, x, True)
