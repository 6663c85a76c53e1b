"""bfloat16 forward convolutions through oneDNN (workspace/conv_select.py ``bf16_forward_modelled``): the scratch
of the float32 forward's sequence with 2-byte elements, against the profiler's measurement of the same op on
seeded shapes, and a bfloat16 CNN's inference estimate against its measurement."""

from __future__ import annotations

import random
from collections.abc import Callable

import calibrate_workspace as calibrate
import pytest
import torch
from torch import nn

import nnmem
from nnmem import cpu
from nnmem.frontends.pytorch.workspace.matmul import AMX_ISA, MODELLED_ISA, MODELLED_THREADS

HOST = cpu.describe()
BF16 = torch.bfloat16


def _require_modelled_cpu(isas: tuple[str, ...] = (MODELLED_ISA,)) -> None:
    if not torch.backends.mkldnn.is_available() or HOST.isa not in isas:
        pytest.skip(f"these bfloat16 convolutions are modelled on ISA {' and '.join(isas)}; this CPU runs oneDNN at "
                    f"{HOST.isa}")


def _conv(rng: random.Random) -> tuple[nn.Module, torch.Tensor, bool]:
    """A dense 1-D or 2-D bfloat16 convolution (channels 1-100, kernel 2-7, stride 1-3, dilation 1-2, with or
    without bias and padding) and its input; whether it runs under inference mode (else no_grad)."""
    c, o = rng.choice([1, 2, 3, 8, 15, 16, 17, 32, 64, 100]), rng.choice([1, 8, 16, 24, 32, 64, 65])
    k, s, d = rng.choice([2, 3, 5, 7]), rng.choice([1, 1, 2, 3]), rng.choice([1, 1, 2])
    n, size = rng.choice([1, 2, 3, 4, 8]), rng.choice([7, 8, 14, 16, 28])
    size = max(size, d * (k - 1) + 1)  # the kernel fits the input
    pad, bias = rng.choice([0, d * (k // 2), d * (k - 1)]), rng.random() < 0.7  # the last: refused by jit_bf16
    if rng.random() < 0.25:
        return nn.Conv1d(c, o, k, s, pad, d, bias=bias).to(BF16), torch.randn(n, c, 4 * size, dtype=BF16), True
    conv = nn.Conv2d(c, o, k, s, pad, d, bias=bias).to(BF16)
    return conv, torch.randn(n, c, size, size, dtype=BF16), rng.random() < 0.5


def test_bf16_forward_convolution_scratch_matches_measurement(torch_threads: Callable[[int], None]) -> None:
    """Every seeded forward the rule claims (no note): its bytes equal the allocator's peak inside the op minus
    its output, at 1-4 threads; most of them are claimed."""
    _require_modelled_cpu()
    rng, claimed, mismatches = random.Random(7), 0, []
    for _ in range(40):
        torch_threads(rng.choice(MODELLED_THREADS))
        conv, x, inference = _conv(rng)

        def step(conv: nn.Module = conv, x: torch.Tensor = x, inference: bool = inference) -> None:
            with torch.inference_mode() if inference else torch.no_grad():
                conv(x)

        rows = [r for r in calibrate.measure_ops(step, training=False) if "conv" in r.name and r.note is None]
        claimed += len(rows)
        mismatches += [f"{torch.get_num_threads()} threads {conv} {tuple(x.shape)}: measured {r.scratch:,} B, "
                       f"rule {r.predicted:,} B" for r in rows if r.predicted != r.scratch]
    assert not mismatches, "\n".join(mismatches)
    assert claimed >= 30


def _seeded_mismatches(draw: Callable[[random.Random], tuple[nn.Module, torch.Tensor]], seed: int, ops: str,
                       torch_threads: Callable[[int], None], draws: int = 40) -> tuple[int, list[str]]:
    """Run ``draws`` seeded convolutions forward and backward at 1-4 threads; ``(ops claimed, mismatches)`` over the
    ops whose name starts with ``ops`` and that carry no note: each one's rule against the allocator's peak
    inside it minus its outputs."""
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


def _conv_backward(rng: random.Random) -> tuple[nn.Module, torch.Tensor]:
    """A dense 1-D or 2-D bfloat16 convolution (1-130 input channels, kernel 2-7, stride 1-3, dilation 1-2,
    padding, with or without bias) and its input, which asks for its gradient in most draws."""
    c, o = rng.choice([1, 2, 3, 8, 15, 16, 17, 32, 48, 64, 100, 130]), rng.choice([8, 16, 24, 32, 64, 65, 128])
    k, s, d = rng.choice([2, 3, 5, 7]), rng.choice([1, 1, 1, 2, 3]), rng.choice([1, 1, 2])
    n, size = rng.choice([1, 2, 3, 4, 8]), rng.choice([7, 8, 14, 16, 28, 33])
    size = max(size, d * (k - 1) + 2)  # the kernel fits the input, more than one output position
    pad, bias = rng.choice([0, d * (k // 2), 1]), rng.random() < 0.7
    if rng.random() < 0.25:
        conv, x = nn.Conv1d(c, o, k, s, pad, d, bias=bias), torch.randn(n, c, 4 * size, dtype=BF16)
    else:
        conv, x = nn.Conv2d(c, o, k, s, pad, d, bias=bias), torch.randn(n, c, size, size, dtype=BF16)
    return conv.to(BF16), x.requires_grad_(rng.random() < 0.7)


def test_bf16_backward_convolution_scratch_matches_measurement(torch_threads: Callable[[int], None]) -> None:
    """Every seeded ``convolution_backward`` the rule claims (no note): its bytes equal the allocator's peak inside
    the op minus its outputs, at 1-4 threads (jit_bf16's transposed source and output gradient, the float32
    partial sums of the weights' gradient); most of them are claimed."""
    _require_modelled_cpu()
    claimed, mismatches = _seeded_mismatches(_conv_backward, 11, "aten.convolution_backward", torch_threads)
    assert not mismatches, "\n".join(mismatches)
    assert claimed >= 15


def _one_by_one(rng: random.Random) -> tuple[nn.Module, torch.Tensor]:
    """A bfloat16 1x1 convolution (1-520 input and 1-1,024 output channels, stride 1-3, images 1-64 wide, with or
    without bias) and its input, which asks for its gradient in most draws."""
    c = rng.choice([1, 2, 3, 8, 15, 16, 17, 32, 48, 64, 100, 130, 256, 520])
    o = rng.choice([1, 8, 16, 24, 32, 64, 65, 128, 600, 1024])
    s, n, size = rng.choice([1, 1, 2, 3]), rng.choice([1, 2, 3, 4, 8, 16]), rng.choice([1, 2, 4, 7, 8, 14, 16, 28, 64])
    bias = rng.random() < 0.7
    if rng.random() < 0.25:
        conv, x = nn.Conv1d(c, o, 1, s, bias=bias), torch.randn(n, c, 4 * size, dtype=BF16)
    else:
        conv, x = nn.Conv2d(c, o, 1, s, bias=bias), torch.randn(n, c, size, size, dtype=BF16)
    return conv.to(BF16), x.requires_grad_(rng.random() < 0.6)


def test_bf16_1x1_convolution_scratch_matches_measurement(torch_threads: Callable[[int], None]) -> None:
    """Every seeded 1x1 forward and backward the rules claim (``jit_bf16_1x1``: the float32 store buffer, the
    weights' partial sums and transposes, the strided source gathered at unit stride) equals the allocator's peak
    inside the op minus its outputs, at 1-4 threads; most of them are claimed."""
    _require_modelled_cpu()
    claimed, mismatches = _seeded_mismatches(_one_by_one, 5, "aten.convolution", torch_threads)
    assert not mismatches, "\n".join(mismatches)
    assert claimed >= 35


def _depthwise(rng: random.Random) -> tuple[nn.Module, torch.Tensor]:
    """A bfloat16 depthwise convolution (2-130 channels, kernel 1-7, stride 1-3, dilation 1-2, padding) and its
    input, which asks for its gradient in most draws."""
    c = rng.choice([2, 3, 8, 15, 16, 17, 32, 48, 64, 100, 130])
    k, s, d = rng.choice([1, 2, 3, 5, 7]), rng.choice([1, 1, 2, 3]), rng.choice([1, 1, 2])
    n, size = rng.choice([1, 2, 3, 4, 8]), rng.choice([7, 8, 14, 16, 28, 33])
    size = max(size, d * (k - 1) + 2)
    pad, bias = rng.choice([0, d * (k // 2), 1]), rng.random() < 0.7
    if rng.random() < 0.25:
        conv, x = nn.Conv1d(c, c, k, s, pad, d, groups=c, bias=bias), torch.randn(n, c, 4 * size, dtype=BF16)
    else:
        conv, x = nn.Conv2d(c, c, k, s, pad, d, groups=c, bias=bias), torch.randn(n, c, size, size, dtype=BF16)
    return conv.to(BF16), x.requires_grad_(rng.random() < 0.7)


def test_bf16_depthwise_convolution_scratch_matches_measurement(torch_threads: Callable[[int], None]) -> None:
    """Every seeded depthwise forward and backward the rules claim (``jit_dw``: the float32 bias, the weights'
    float32 partial sums per batch thread) equals the allocator's peak inside the op minus its outputs. AMX CPUs
    run the same ``jit_dw:avx512_core_bf16`` kernels."""
    _require_modelled_cpu((MODELLED_ISA, AMX_ISA))
    claimed, mismatches = _seeded_mismatches(_depthwise, 2, "aten.convolution", torch_threads)
    assert not mismatches, "\n".join(mismatches)
    assert claimed >= 35


def test_bf16_convolutions_outside_the_measured_domain_keep_their_note() -> None:
    """A grouped channels-last bfloat16 convolution with few channels a group (which brgemm leaves to jit_bf16),
    and a grouped strided convolution whose weights' gradient runs the grouped ``jit_bf16``, are noted; a padded
    1x1 forward (``gemm:jit``, conv_gemm_bf16), a grouped NCHW one (``jit_bf16``, conv_bf16_more), dense and 1x1
    training steps (a strided 1x1 first) are not."""
    _require_modelled_cpu()
    x = torch.randn(2, 16, 8, 8, dtype=BF16)
    grouped_nhwc = nnmem.estimate(nn.Conv2d(16, 32, 3, groups=2).to(BF16),
                                  (x.contiguous(memory_format=torch.channels_last),), mode="infer")
    assert any("bfloat16 convolution" in n for n in grouped_nhwc.notes), grouped_nhwc.notes
    for conv in (nn.Conv2d(16, 32, 1, padding=1), nn.Conv2d(16, 32, 3, groups=2)):
        estimate = nnmem.estimate(conv.to(BF16), (x,), mode="infer")
        assert not any("convolution" in n for n in estimate.notes), (conv, estimate.notes)
    # a grouped strided one whose weights' gradient runs the grouped jit_bf16 (16 channels a group): noted
    strided = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.Conv2d(32, 64, 3, stride=2, groups=2))
    train = nnmem.estimate(strided.to(BF16), (x,), mode="train", optimizer="sgd")
    assert any("bfloat16 convolution" in n for n in train.notes), train.notes
    dense = nn.Sequential(nn.Conv2d(16, 32, 1, stride=2), nn.Conv2d(32, 16, 3), nn.Conv2d(16, 8, 1))
    estimate = nnmem.estimate(dense.to(BF16), (x,), mode="train", optimizer="sgd")
    assert not any("convolution" in n for n in estimate.notes), estimate.notes


def test_bf16_cnn_training_estimate_matches_measurement() -> None:
    """A bfloat16 CNN of dense 3x3 / 5x5 convolutions trained with Adam: no convolution note, the allocator peak
    within 0.5 % of the measured one."""
    _require_modelled_cpu()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3),
                          nn.ReLU(), nn.Conv2d(64, 48, 3, padding=1), nn.Flatten(), nn.LazyLinear(10))
    x = torch.randn(8, 3, 32, 32)
    model(x)
    model, x = model.to(BF16), x.to(BF16)
    estimate = nnmem.estimate(model, (x,), mode="train", optimizer="adam")
    measured = nnmem.measure(model, (x,), mode="train", optimizer="adam")
    assert not any("convolution" in n for n in estimate.notes), estimate.notes
    e, m = estimate.peaks["allocator"], measured.peaks["allocator"]
    assert abs(e - m) <= 0.005 * m, f"estimated {e:,} B, measured {m:,} B ({(e - m) / m:+.2%})"


def test_bf16_cnn_inference_estimate_matches_measurement() -> None:
    """A bfloat16 CNN of dense 3x3 / 5x5 convolutions: no convolution note, the allocator peak within 0.5 %."""
    _require_modelled_cpu()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3),
                          nn.ReLU(), nn.Conv2d(64, 17, 3, stride=2), nn.Flatten(), nn.LazyLinear(10))
    x = torch.randn(8, 3, 32, 32)
    model(x)
    model = model.to(BF16)
    x = x.to(BF16)
    estimate = nnmem.estimate(model, (x,), mode="infer")
    measured = nnmem.measure(model, (x,), mode="infer")
    assert not any("convolution" in n for n in estimate.notes), estimate.notes
    e, m = estimate.peaks["allocator"], measured.peaks["allocator"]
    assert abs(e - m) <= 0.005 * m, f"estimated {e:,} B, measured {m:,} B ({(e - m) / m:+.2%})"
