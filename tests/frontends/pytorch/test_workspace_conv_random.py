"""Convolution, pooling, upsampling and normalization steps drawn at random, each estimate against
``nnmem.measure`` of the same step.

Draws (fixed seed) 1-D/2-D/3-D stacks of convolutions (stride, dilation, groups and depthwise, padding modes,
transposed, channels-last input), max/avg/adaptive pooling, nearest/linear upsampling and batch, layer,
group, RMS and channels-last layer norms, at odd batch sizes, trained (Adam) or inferred in float32. The
tensor level must match within 0.5 % and the allocator level within 2 %; a case whose estimate says a kernel
path is not modelled on this CPU is skipped with that note. Run it under caps too (``ONEDNN_MAX_CPU_ISA=AVX2
ATEN_CPU_CAPABILITY=avx2``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn

import nnmem

SEED = 18
CASES = 12

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs a build with oneDNN")


class ChannelsLastNorm(nn.Module):
    """ConvNeXt's channels-first LayerNorm: permute to NHWC, normalize the channels, permute back."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ToChannelsLast(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.contiguous(memory_format=torch.channels_last)


@dataclass(frozen=True)
class Case:
    label: str
    model: nn.Module
    x: torch.Tensor
    mode: str


_CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
_TCONV = {1: nn.ConvTranspose1d, 2: nn.ConvTranspose2d, 3: nn.ConvTranspose3d}
_BN = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}
_MAX = {1: nn.MaxPool1d, 2: nn.MaxPool2d, 3: nn.MaxPool3d}
_AVG = {1: nn.AvgPool1d, 2: nn.AvgPool2d, 3: nn.AvgPool3d}
_ADAPT = {1: (nn.AdaptiveAvgPool1d, nn.AdaptiveMaxPool1d), 2: (nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d),
          3: (nn.AdaptiveAvgPool3d, nn.AdaptiveMaxPool3d)}
_LINEAR = {1: "linear", 2: "bilinear", 3: "trilinear"}


def _conv(r: random.Random, dim: int, ch: int, size: int) -> nn.Module:
    kind = r.choice(["dense", "dense", "depthwise", "grouped", "transposed"])
    k = r.choice([1, 3, 3, 5, 7]) if size >= 9 else r.choice([1, 3])
    stride, pad = r.choice([1, 1, 2]), r.choice([0, k // 2])
    dilation = r.choice([1, 1, 1, 2]) if kind != "transposed" and (k - 1) * 2 < size else 1
    out = ch if kind == "depthwise" else r.choice([8, 12, 16, 24, 32, 40])
    groups = ch if kind == "depthwise" else r.choice([2, 4]) if kind == "grouped" else 1
    if ch % groups or out % groups:
        groups = 1
    if kind == "transposed":
        return _TCONV[dim](ch, out, k, stride=stride, padding=min(pad, k - 1), groups=groups)
    mode = r.choice(["zeros", "zeros", "reflect", "replicate", "circular"]) if 0 < pad < size else "zeros"
    return _CONV[dim](ch, out, k, stride=stride, padding=pad, dilation=dilation, groups=groups,
                      padding_mode=mode, bias=r.random() < 0.7)


def _layer(r: random.Random, dim: int, ch: int, size: int) -> nn.Module:
    kind = r.choice(["conv", "conv", "conv", "pool", "upsample", "norm"])
    if kind == "conv":
        return _conv(r, dim, ch, size)
    if kind == "pool":
        return r.choice([lambda: _MAX[dim](r.choice([2, 3]), stride=r.choice([None, 1])),
                         lambda: _AVG[dim](2), lambda: r.choice(_ADAPT[dim])(r.choice([1, 3, 5]))])()
    if kind == "upsample":
        return nn.Upsample(scale_factor=2, mode=r.choice(["nearest", _LINEAR[dim]]))
    norms = [lambda: _BN[dim](ch), lambda: nn.GroupNorm(r.choice([g for g in (1, 2, 4) if ch % g == 0]), ch),
             lambda: nn.LayerNorm(size), lambda: nn.RMSNorm(size)]
    if dim == 2:
        norms.append(lambda: ChannelsLastNorm(ch))
    return r.choice(norms)()


def _out_shape(layer: nn.Module, ch: int, size: int, dim: int) -> tuple[int, int]:
    with torch.no_grad():
        y = layer(torch.zeros(1, ch, *([size] * dim)))
    return int(y.shape[1]), int(y.shape[-1])


def draw(seed: int, count: int) -> list[Case]:
    """``count`` cases from ``random.Random(seed)``; the models get seeded random weights."""
    r = random.Random(seed)
    cases = []
    while len(cases) < count:
        dim = r.choice([1, 2, 2, 2, 3])
        batch, ch = r.choice([1, 2, 3, 5]), r.choice([3, 8, 12, 16, 24])
        size = {1: r.choice([100, 150, 256]), 2: r.choice([24, 29, 32, 40]), 3: r.choice([8, 9, 12])}[dim]
        torch.manual_seed(len(cases))
        layers: list[nn.Module] = [ToChannelsLast()] if dim == 2 and r.random() < 0.3 else []
        c, s = ch, size
        for _ in range(r.choice([1, 2, 3])):
            layer = _layer(r, dim, c, s)
            if s > 48 and isinstance(layer, nn.Upsample):
                continue
            c2, s2 = _out_shape(layer, c, s, dim)
            if s2 < 2:
                continue
            layers.append(layer)
            c, s = c2, s2
        if not any(p.requires_grad for layer in layers for p in layer.parameters()):
            layers.append(_CONV[dim](c, 8, 3 if s >= 3 else 1))
        model, x = nn.Sequential(*layers), torch.randn(batch, ch, *([size] * dim))
        mode = r.choice(["train", "infer"])
        label = f"{len(cases)}-{mode}-n{batch}-" + "-".join(type(m).__name__ for m in layers)
        cases.append(Case(label, model, x, mode))
    return cases


DRAWN = draw(SEED, CASES)


@pytest.mark.parametrize("case", DRAWN, ids=[c.label for c in DRAWN])
def test_drawn_step_matches_its_measurement(case: Case) -> None:
    estimate = nnmem.estimate(case.model, (case.x,), mode=case.mode, optimizer="adam")
    notes = [n for n in estimate.notes if "not modelled" in n]
    if notes:
        pytest.skip(notes[0])
    measured = nnmem.measure(case.model, (case.x,), mode=case.mode, optimizer="adam")
    for level, tolerance in (("tensor", 0.005), ("allocator", 0.02)):
        e, m = estimate.peaks[level], measured.peaks[level]
        assert abs(e - m) <= tolerance * m, f"{level}: estimated {e:,} B, measured {m:,} B ({(e - m) / m:+.2%})"


def _convnext() -> tuple[nn.Module, torch.Tensor]:
    transformers: Any = pytest.importorskip("transformers")
    config = transformers.ConvNextConfig(num_channels=3, hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 2, 1],
                                         num_labels=10, image_size=64)
    torch.manual_seed(0)
    model = transformers.ConvNextForImageClassification(config)

    class Logits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.model(pixel_values=x).logits

    return Logits(), torch.randn(2, 3, 64, 64)


def _plain_conv_net() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 32, 3), nn.Conv2d(32, 64, 3, stride=2), nn.Conv2d(64, 64, 1))
    return net, torch.randn(8, 3, 32, 32)


@pytest.mark.parametrize("make", [_convnext, _plain_conv_net], ids=["convnext", "plain-conv2d"])
def test_named_nets_train_matches_its_measurement(make: Any) -> None:
    """HF ConvNeXt (depthwise 7x7 convolutions, channels-last LayerNorm) and a contiguous Conv2d net."""
    model, x, mode = *make(), "train"
    estimate = nnmem.estimate(model, (x,), mode=mode, optimizer="adam")
    notes = [n for n in estimate.notes if "not modelled" in n]
    if notes:
        pytest.skip(notes[0])
    measured = nnmem.measure(model, (x,), mode=mode, optimizer="adam")
    for level, tolerance in (("tensor", 0.005), ("allocator", 0.02)):
        e, m = estimate.peaks[level], measured.peaks[level]
        assert abs(e - m) <= tolerance * m, f"{level}: estimated {e:,} B, measured {m:,} B ({(e - m) / m:+.2%})"
