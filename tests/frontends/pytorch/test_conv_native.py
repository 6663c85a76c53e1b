"""Convolutions on ATen's native kernels, drawn at random: every ``convolution`` and ``convolution_backward`` whose
scratch a rule claims (no note) equals the allocator's peak inside the op minus its outputs.

oneDNN declines a float32 convolution of batch 1 with a small input and kernel (``ConvParams::use_mkldnn``), so
those draws run ``slow_conv_dilated2d`` / ``slow_conv_dilated3d`` / ``slow_conv3d`` on any CPU; float64 never goes
to oneDNN, so its draws (batches up to 3, groups, channels-last) reach the same kernels and ``thnn_conv2d``
(workspace/conv_native.py, workspace/conv_im2col.py)."""

from __future__ import annotations

import random
from collections.abc import Callable

import calibrate_workspace as calibrate
import pytest
import torch
from torch import nn

from nnmem.cpu import describe
from nnmem.frontends.pytorch.workspace.conv_select import conv_backend, conv_call

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs a build with oneDNN")


def _draw(rng: random.Random, dtype: torch.dtype) -> tuple[nn.Module, torch.Tensor, bool]:
    """A 2-D or 3-D convolution (1-8 channels, kernel 1-3, stride 1-2, dilation 1-2, padding, groups, bias), its
    input (channels-last for some 2-D ones) and whether the step trains; float32 draws keep batch 1."""
    dims = rng.choice([2, 3])
    c, o = rng.choice([1, 2, 4, 8]), rng.choice([2, 4, 6, 8])
    g = rng.choice([1, 1, 2]) if c % 2 == 0 and o % 2 == 0 and dtype != torch.float32 else 1
    k, s, d = rng.choice([1, 2, 3]), rng.choice([1, 2]), rng.choice([1, 2])
    n, size = (1 if dtype == torch.float32 else rng.choice([1, 2, 3])), rng.choice([5, 7, 9])
    conv = (nn.Conv3d if dims == 3 else nn.Conv2d)(c, o, k, s, rng.choice([0, d * (k // 2)]), d, groups=g,
                                                    bias=rng.random() < 0.7).to(dtype)
    x = torch.randn(n, c, *([size] * dims), dtype=dtype)
    if dims == 2 and rng.random() < 0.3:
        x = x.contiguous(memory_format=torch.channels_last)
    return conv, x.requires_grad_(rng.random() < 0.6), rng.random() < 0.7


@pytest.mark.parametrize(("dtype", "seed"), [(torch.float32, 21), (torch.float64, 22)])
def test_native_kernels_scratch_matches_measurement(dtype: torch.dtype, seed: int,
                                                    torch_threads: Callable[[int], None]) -> None:
    rng, claimed, native, mismatches = random.Random(seed), 0, 0, []
    for _ in range(40):
        torch_threads(rng.choice([1, 2, 3]))
        conv, x, train = _draw(rng, dtype)

        def step(conv: nn.Module = conv, x: torch.Tensor = x, train: bool = train) -> None:
            if train:
                conv(x).sum().backward()
            else:
                with torch.no_grad():
                    conv(x)

        rows = [r for r in calibrate.measure_ops(step, training=train)
                if r.name.startswith("aten.convolution") and r.note is None]
        claimed += len(rows)
        call = conv_call(x, conv.weight, conv.stride, conv.padding, conv.dilation, groups=conv.groups)
        if rows and call is not None and conv_backend(call, describe()).startswith(("slow_dilated", "slow3d")):
            native += 1
        mismatches += [f"{torch.get_num_threads()} threads {conv} {tuple(x.shape)} train={train} "
                       f"grad_input={x.requires_grad} {r.name}: measured {r.scratch:,} B, rule {r.predicted:,} B"
                       for r in rows if r.predicted != r.scratch]
    assert not mismatches, "\n".join(mismatches)
    assert claimed >= 30 and native >= 10, (claimed, native)
