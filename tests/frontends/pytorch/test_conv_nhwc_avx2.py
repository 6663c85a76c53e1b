"""Float32 channels-last 2-D and 1-D convolutions (``torch.channels_last``, nhwc) on oneDNN below AVX-512 (``avx2``):
the backward rules of workspace/conv_nhwc_avx2.py against the profiler's measurement of the same op on seeded
shapes at 1-4 threads. On a CPU above AVX2 the draws run in a child process capped at AVX2 (test_conv_avx2's
``_on_avx2``)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import torch
from test_conv_avx2 import _on_avx2, tally
from torch import nn

KINDS = ("dense", "grouped", "depthwise", "one_d")

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs a build with oneDNN")


def _draw(rng: random.Random, kind: str) -> tuple[nn.Module, torch.Tensor]:
    """A float32 channels-last convolution of ``kind`` (kernel 1-5, stride 1-3, dilation 1-3, any padding below the
    dilated kernel, with or without bias, batch 1-8) and its input, channels-last or (with a channels-last
    module) contiguous."""
    c, o, g = rng.choice([1, 2, 3, 4, 8, 12, 16, 17, 24, 32, 40]), rng.choice([1, 4, 7, 8, 12, 16, 20, 32, 40]), 1
    if kind == "depthwise":
        c = o = g = rng.choice([2, 4, 6, 8, 12, 16])
    elif kind == "grouped":
        g = rng.choice([2, 3, 4, 8])
        c, o = g * rng.choice([1, 2, 3, 4, 5, 8, 16]), g * rng.choice([1, 2, 3, 4, 8, 16])
    k, s, dil = rng.choice([1, 1, 2, 3, 3, 5]), rng.randint(1, 3), rng.choice([1, 1, 1, 2, 3])
    # a strided 1x1 weights' gradient on jit_1x1:avx2 gathers an nhwc source of channels not a multiple of 8 past
    # its rtus buffer (torch 2.13, oneDNN 3.12: Conv2d(4, 20, 1, 2) on (2, 4, 16, 16) aborts within a few steps)
    s = 1 if k == 1 and c % 8 else s
    ext = (k - 1) * dil + 1
    size = max(rng.randint(3, 16), ext)
    one_d = kind == "one_d"
    conv: nn.Module = (nn.Conv1d if one_d else nn.Conv2d)(c, o, k, s, rng.randint(0, ext - 1), dilation=dil,
                                                         groups=g, bias=rng.random() < 0.6)
    x = torch.randn(rng.randint(1, 8), c, *([size] if one_d else [size, size]))
    if one_d:  # 1-D: a channels-last-looking input (batch-major, channels innermost) viewed as 2-D by ATen
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    elif rng.random() < 0.8:
        x = x.contiguous(memory_format=torch.channels_last)
    if not one_d and (rng.random() < 0.6 or x.is_contiguous()):
        conv = conv.to(memory_format=torch.channels_last)
    return conv, x.requires_grad_(rng.random() < 0.6)


def mismatches(seed: int, draws: int, kind: int) -> dict[str, object]:
    """:func:`test_conv_avx2.tally` over ``draws`` seeded training steps of ``KINDS[kind]`` at 1-4 threads (2 for
    a unit-stride 1x1 of a small batch, which ATen keeps on its native kernel at 1 thread)."""
    rng = random.Random(seed)

    def steps() -> Iterator[tuple[nn.Module, torch.Tensor, bool]]:
        for _ in range(draws):
            threads = rng.randint(1, 4)
            conv, x = _draw(rng, KINDS[kind])
            one_by_one = conv.kernel_size == (1,) * (x.dim() - 2) and set(conv.stride) == set(conv.dilation) == {1}
            torch.set_num_threads(2 if one_by_one and threads == 1 and x.shape[0] < 16 else threads)
            yield conv, x, True

    return tally(steps(), ops="conv")


@pytest.mark.parametrize(("kind", "seed", "draws", "least"),
                         [(0, 1, 40, 60), (0, 21, 40, 60), (1, 2, 40, 40), (2, 3, 40, 40), (3, 4, 40, 60)])
def test_nhwc_convolutions_on_avx2_match_their_measurement(kind: int, seed: int, draws: int, least: int) -> None:
    """Every claimed op equals the allocator's peak inside it minus its outputs, and at least ``least`` are claimed.
    Before workspace/conv_nhwc_avx2.py sized 2-D: dense backward claimed without oneDNN's reducers (jit:avx2,
    jit_1x1:avx2 with its unit-stride gather) and with three input channels padded (measured 31,228 B where the rule
    said 8,576 B), a dilated 1x1 weights' gradient sized on jit_1x1 (gemm runs); grouped ones all noted;
    depthwise ones on the grouped jit:avx2 kernel without its reducers, dilated ones on gemm sized as jit_uni_dw.
    Noted: a strided or grouped input gradient, a grouped weights' gradient on gemm, a 1x1 dilated depthwise
    backward, a dilated depthwise forward, a one-position output on the brgemm kernels at 2+ threads."""
    result = _on_avx2(seed, draws, kind, mismatches)
    assert result["isa"] == "avx2", result["isa"]
    failures = result["failures"]
    assert isinstance(failures, list) and not failures, "\n".join(failures)
    claimed = result["claimed"]
    assert isinstance(claimed, int) and claimed >= least, (claimed, result["seen"])
