"""Float32 channels-last 3-D convolutions (``torch.channels_last_3d``, ndhwc) on oneDNN below AVX-512 (``avx2``):
the rules of workspace/conv_nhwc_avx2.py (dense forward and backward, grouped forward and weights' gradient,
depthwise forward) against the profiler's measurement of the same op on seeded shapes at 1-4 threads, training and
inference. On a CPU above AVX2 the draws run in a child process capped at AVX2 (test_conv_avx2's ``_on_avx2``)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import torch
from test_conv_avx2 import _on_avx2, tally  # loaded by conftest.py: tests are not a package
from torch import nn

KINDS = ("dense", "grouped", "depthwise")

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs a build with oneDNN")


def _draw(rng: random.Random, kind: str) -> tuple[nn.Conv3d, torch.Tensor, bool]:
    """A float32 ndhwc 3-D convolution of ``kind`` (kernel 1-3, stride 1-3, dilation 1-3, any padding below the
    dilated kernel, with or without bias, batch 1-8), its input, and whether the step trains (else inference)."""
    c, o, g = rng.choice([1, 2, 3, 4, 8, 12, 16, 17, 24, 32, 40]), rng.choice([1, 4, 7, 8, 12, 16, 20, 32, 40]), 1
    if kind == "depthwise":
        c = o = g = rng.choice([2, 4, 6, 8, 12, 16])
    elif kind == "grouped":
        g = rng.choice([2, 3, 4, 8])
        c, o = g * rng.choice([1, 2, 3, 4, 5, 8, 16]), g * rng.choice([1, 2, 3, 4, 8, 16, 28, 40])
    k, s, dil = rng.randint(1, 3), rng.randint(1, 3), rng.choice([1, 1, 1, 2, 3])
    ext = (k - 1) * dil + 1
    size = max(rng.randint(3, 9), ext)
    conv = nn.Conv3d(c, o, k, s, rng.randint(0, ext - 1), dilation=dil, groups=g, bias=rng.random() < 0.6)
    x = torch.randn(rng.randint(1, 8), c, size, size, size).contiguous(memory_format=torch.channels_last_3d)
    train = rng.random() < 0.7
    return conv.to(memory_format=torch.channels_last_3d), x.requires_grad_(train and rng.random() < 0.7), train


def mismatches(seed: int, draws: int, kind: int) -> dict[str, object]:
    """:func:`test_conv_avx2.tally` over ``draws`` seeded steps of ``KINDS[kind]`` at 1-4 threads."""
    rng = random.Random(seed)

    def steps() -> Iterator[tuple[nn.Module, torch.Tensor, bool]]:
        for _ in range(draws):
            torch.set_num_threads(rng.randint(1, 4))
            yield _draw(rng, KINDS[kind])

    return tally(steps(), ops="conv")


@pytest.mark.parametrize(("kind", "seed", "draws", "least"), [(0, 1, 60, 80), (1, 2, 60, 55), (2, 3, 60, 28)])
def test_ndhwc_convolutions_on_avx2_match_their_measurement(kind: int, seed: int, draws: int, least: int) -> None:
    """Every claimed op equals the allocator's peak inside it minus its outputs, and at least ``least`` are claimed
    (14, 0 and 2 before, on ATen's native kernels: every ndhwc convolution through oneDNN below AVX-512 carried a
    note). Dense: forward on the brgemm kernels, the unit-stride input gradient on brg_conv_bwd (its batch
    elements), the weights' gradient on jit:avx2 / jit_1x1:avx2 (their reducers; three channels flat) or gemm;
    grouped: forward on the grouped brgemm kernels, the weights' gradient alone on jit:avx2; depthwise forward on
    brdgmm_dw. Noted: depthwise backward, a grouped input gradient or weights' gradient on gemm, a dilated
    depthwise forward, brgconv_strided's input gradient."""
    result = _on_avx2(seed, draws, kind, mismatches)
    assert result["isa"] == "avx2", result["isa"]
    failures = result["failures"]
    assert isinstance(failures, list) and not failures, "\n".join(failures)
    claimed = result["claimed"]
    assert isinstance(claimed, int) and claimed >= least, (claimed, result["seen"])
