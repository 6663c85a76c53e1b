"""float32 convolutions on oneDNN's gemm kernel (workspace/conv_gemm.py, routed by conv_select.py ``onednn_gemm``):
the rule's bytes against the profiler's measurement of the same op on seeded grouped and depthwise shapes (1-D,
2-D, 3-D; forward and backward), and the note kept on the shapes the port does not size."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import calibrate_workspace as calibrate
import pytest
import torch
from torch import nn

from nnmem import cpu
from nnmem.frontends.pytorch.workspace.conv_select import conv_backend, conv_call, onednn_gemm

HOST = cpu.describe()


def _draw(rng: random.Random) -> tuple[nn.Module, torch.Tensor]:
    """A grouped convolution whose per-group channels (1-8, 12, 16) mostly have no oneDNN block, a depthwise one,
    or a dense one (gemm for some channels-last weights' gradients below AVX-512); kernel 1-3, stride 1-2,
    padding 0-2, dilation 1-2, batch 1-8, with or without bias; some 2-D ones channels-last."""
    dims = rng.choice((1, 2, 2, 2, 3))
    g = rng.randint(2, 8)
    if rng.random() < 0.15:  # dense: gemm for a channels-last weights' gradient below AVX-512
        g, cg, og = 1, rng.randint(1, 20), rng.randint(1, 20)
    elif rng.random() < 0.2:
        cg = og = 1
    else:
        cg, og = rng.choice((1, 2, 3, 4, 5, 6, 7, 8, 12)), rng.choice((1, 2, 3, 4, 5, 6, 7, 8, 12, 16))
    k, s, d = rng.randint(1, 3), rng.randint(1, 2), rng.randint(1, 2)
    pad = rng.randint(0, min(2, k))
    size = rng.choice((4, 5, 7, 8, 11, 16) if dims == 3 else (5, 8, 11, 16, 23, 32, 56) if dims == 2 else
                      (9, 31, 64, 100, 500))
    size = max(size, d * (k - 1) + 1)
    conv_type = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[dims]
    conv = conv_type(cg * g, og * g, k, s, pad, d, groups=g, bias=rng.random() < 0.5)
    x = torch.randn(rng.randint(1, 8), cg * g, *([size] * dims))
    if dims == 2 and rng.random() < (0.8 if g == 1 else 0.2):  # channels-last
        x, conv = x.to(memory_format=torch.channels_last), conv.to(memory_format=torch.channels_last)
    return conv, x


def _rows(conv: nn.Module, x: torch.Tensor, train: bool) -> list[calibrate.OpMeasure]:
    if train:
        x = x.requires_grad_(True)

        def step() -> None:
            conv(x).sum().backward()
    else:
        def step() -> None:
            with torch.inference_mode():
                conv(x)
    return [r for r in calibrate.measure_ops(step, training=train) if "conv" in r.name]


def run_draws(seed: int, count: int, set_threads: Callable[[int], None]) -> tuple[int, int, list[str]]:
    """Measure ``count`` seeded draws; returns how many ops with a part on gemm were claimed (no note) and
    noted, and what failed: a claimed op off its measurement."""
    rng, claimed, noted, failures = random.Random(seed), 0, 0, []
    for _ in range(count):
        set_threads(rng.randint(1, 4))
        conv, x = _draw(rng)
        train = rng.random() < 0.6
        call = conv_call(x, conv.weight, conv.stride, conv.padding, conv.dilation, groups=conv.groups)
        assert call is not None
        if conv_backend(call, HOST) != "mkldnn":
            continue
        backward = dataclasses.replace(call, backward=True, grad_input=True)
        for row in _rows(conv, x, train):
            on_gemm = onednn_gemm(backward, HOST) if "backward" in row.name else (onednn_gemm(call, HOST)[0],)
            if not any(on_gemm):
                continue
            claimed, noted = claimed + (row.note is None), noted + (row.note is not None)
            if row.note is None and row.predicted != row.scratch:
                failures.append(f"{torch.get_num_threads()} threads {conv} {tuple(x.shape)} {call.x_layout} "
                                f"{row.name}: measured {row.scratch:,} B, rule {row.predicted:,} B")
    return claimed, noted, failures


def test_gemm_convolution_scratch_matches_measurement(torch_threads: Callable[[int], None]) -> None:
    """Every seeded op on gemm the rules claim (no note) is exact at 1-4 threads; most are claimed."""
    if not torch.backends.mkldnn.is_available():
        pytest.skip("oneDNN is not available in this torch build")
    claimed, noted, failures = run_draws(5, 200, torch_threads)
    assert not failures, "\n".join(failures)
    assert claimed >= 2 * noted, f"only {claimed} of {claimed + noted} ops on gemm claimed"
