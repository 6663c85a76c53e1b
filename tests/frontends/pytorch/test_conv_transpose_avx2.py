"""Dense float32 nc(d)hw transposed convolutions on oneDNN at AVX2 (8-channel blocks): the deconvolution's forward
on ``jit:avx2`` / ``jit_1x1:avx2`` backward data or ``gemm``, its input gradient on the convolution's forward
kernels, its weights' gradient on the backward-weights kernels (:mod:`.conv_transpose_avx2`), against the
profiler's measurement of the same op on seeded 1-D, 2-D and 3-D shapes at 1-4 threads. On a CPU above AVX2 the
draws run in a child process capped at AVX2 (test_conv_avx2's ``_on_avx2``)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import torch
from test_conv_avx2 import _on_avx2, tally  # loaded by conftest.py: tests are not a package
from torch import nn

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs a build with oneDNN")


def _draw(rng: random.Random, dim: int) -> tuple[nn.Module, torch.Tensor]:
    """A dense float32 transposed convolution of rank ``dim`` (kernel 1-7, 1-3 in 3-D; stride 1-3; dilation 1-2;
    a padding below the dilated kernel that leaves an output; an output padding below the stride, which oneDNN
    takes; 1-24 input and 4-23 output channels a group, in 1-3 groups; with or without bias) and its input, asking
    for its gradient most of the time."""
    g = rng.choice([1, 1, 1, 2, 3])
    c, o = g * rng.choice([1, 3, 4, 8, 11, 16, 17, 24]), g * rng.choice([4, 8, 9, 12, 16, 20, 23])
    k, s, d = rng.randint(1, 7 if dim < 3 else 3), rng.randint(1, 3), rng.choice([1, 1, 2])
    ext, size = (k - 1) * d + 1, rng.randint(2, 14 if dim < 3 else 5)
    p = rng.randint(0, min(ext - 1, ((size - 1) * s + ext - 1) // 2))
    conv = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)[dim - 1](
        c, o, k, s, p, rng.randint(0, s - 1), g, bias=rng.random() < 0.6, dilation=d)
    return conv, torch.randn(rng.randint(2, 6), c, *([size] * dim)).requires_grad_(rng.random() < 0.6)


def transpose_mismatches(seed: int, draws: int, dim: int) -> dict[str, object]:
    """Over ``draws`` seeded training steps at 1-4 threads: the transposed convolution ops seen, those the rules
    claim (no note) and each claimed op whose rule differs from the allocator's peak inside it minus its
    outputs."""
    return _mismatches(seed, draws, dim, channels_last=False)


def channels_last_mismatches(seed: int, draws: int, dim: int) -> dict[str, object]:
    """:func:`transpose_mismatches` with a channels-last input, weight or both (2-D)."""
    return _mismatches(seed, draws, dim, channels_last=True)


def _mismatches(seed: int, draws: int, dim: int, channels_last: bool) -> dict[str, object]:
    rng = random.Random(seed)

    def steps() -> Iterator[tuple[nn.Module, torch.Tensor, bool]]:
        for _ in range(draws):
            torch.set_num_threads(rng.randint(1, 4))
            conv, x = _draw(rng, dim)
            if channels_last:
                which = rng.random()
                x = x.detach().to(memory_format=torch.channels_last).requires_grad_(x.requires_grad) \
                    if which < 0.8 else x
                conv = conv.to(memory_format=torch.channels_last) if which > 0.4 else conv
            yield conv, x, True

    return tally(steps())


@pytest.mark.parametrize(("dim", "seed", "draws", "share"), [(1, 1, 30, 0.75), (2, 2, 30, 0.75), (3, 3, 20, 0.75)])
def test_avx2_transposed_convolutions_match_their_measurement(dim: int, seed: int, draws: int,
                                                              share: float) -> None:
    """Every claimed op equals the allocator's peak inside it minus its outputs, and the share claimed is reached
    (all were noted before, "kernel scratch not modelled"): unit-stride forwards on jit:avx2 / jit_1x1:avx2 backward
    data (nChw8c, ``BAcd8b8a`` weights, a bias buffer the destination's size) or gemm, strided undilated ones on
    brgconv_strided (a bias buffer where an output size is not a multiple of the stride), dilated ones on gemm,
    grouped ones without 8-channel blocks on gemm throughout, and the backward on the convolution's forward and
    backward-weights kernels."""
    _check(_on_avx2(seed, draws, dim, transpose_mismatches), share)


def test_avx2_channels_last_transposed_convolutions_match_their_measurement() -> None:
    """The same with a channels-last input or weight: unit-stride forwards on ``brg_deconv:avx2`` (the brgemm
    forward with flipped weights: its batch, ``Acdb8a..32a`` weights), input gradients on the brgemm forward
    (``Bcda8b..32b`` weights), weights' gradients on jit:avx2 / jit_1x1:avx2 or gemm (nhwc); ATen's
    ``slow_conv_transpose2d`` (batch 1, small inputs) with its channels-last copies. Strided forwards keep their
    note."""
    _check(_on_avx2(3, 40, 2, channels_last_mismatches), 0.4)


def _check(result: dict[str, object], share: float) -> None:
    assert result["isa"] == "avx2", result["isa"]
    failures = result["failures"]
    assert isinstance(failures, list) and not failures, "\n".join(failures)
    seen, claimed = result["seen"], result["claimed"]
    assert isinstance(seen, int) and isinstance(claimed, int) and claimed >= share * seen, (claimed, seen)
