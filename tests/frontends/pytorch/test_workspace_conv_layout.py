"""Convolutions on few-channel inputs transposed from channels-last, as Keras on torch runs ``Conv1D`` /
``Conv2D`` on (batch, steps, features) and (batch, height, width, channels) data: each estimate against
``nnmem.measure`` of the same step, or the estimate's "not modelled" note where oneDNN relays the input out.

ATen decides the layout from the strides (``suggest_memory_format``): a transposed (N, L, 1) is contiguous and
its 4-D view suggests channels-last, so oneDNN runs it nhwc; with more channels a 1-D input is copied
contiguous first (``_convolution`` and ``convolution_backward``), a 2-D one runs nhwc. Found by
benchmarks/keras_families.py (a depthwise 1-D Keras layer on one feature: -43 %).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn

import nnmem
from nnmem.cpu import describe

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs a build with oneDNN")


class _Transposed(nn.Module):
    """A convolution on channels-last data transposed to channels-first, as Keras's torch backend does."""

    def __init__(self, conv: nn.Module) -> None:
        super().__init__()
        self.conv = conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 1) if x.dim() == 3 else x.permute(0, 3, 1, 2)
        return self.conv(x).sum(dim=1)


@dataclass(frozen=True)
class Case:
    label: str
    conv: tuple[int, ...]  # channels, filters, kernel, dilation, stride, batch, spatial dims
    mode: str
    low: float  # the error band the rules reach on this case (AVX-512); 0 below means "never under"
    high: float


CASES = [
    Case("1d-one-channel-dilated-infer", (1, 8, 3, 2, 1, 5, 1), "infer", -0.005, 0.005),
    Case("1d-one-channel-dilated-train", (1, 8, 3, 2, 1, 5, 1), "train", -0.005, 0.005),
    Case("1d-one-filter-dilated-train", (1, 1, 3, 2, 1, 5, 1), "train", -0.005, 0.005),
    Case("1d-one-channel-1x1-infer", (1, 32, 1, 1, 1, 8, 1), "infer", -0.005, 0.005),
    Case("1d-one-channel-batch1-train", (1, 8, 3, 1, 1, 1, 1), "train", -0.005, 0.005),
    Case("1d-two-channels-train", (2, 8, 3, 2, 1, 6, 1), "train", -0.005, 0.005),
    Case("1d-three-channels-train", (3, 8, 3, 1, 1, 6, 1), "train", -0.005, 0.005),
    Case("2d-one-channel-dilated-train", (1, 8, 3, 2, 1, 4, 2), "train", 0.0, 0.02),
    # the nhwc first-convolution weights' reduction is sized with the nchw balance: 3x3 over by up to 6 % (not
    # exact yet); a 1x1 one was under by 2.4 % and is noted now (test below)
    Case("2d-rgb-train", (3, 16, 3, 1, 1, 4, 2), "train", 0.0, 0.06),
    Case("2d-rgb-strided-train", (3, 8, 3, 1, 2, 2, 2), "train", 0.0, 0.06),
]


def _build(case: Case) -> tuple[nn.Module, torch.Tensor]:
    c, o, k, d, s, n, dims = case.conv
    torch.manual_seed(0)
    if dims == 1:
        return _Transposed(nn.Conv1d(c, o, k, dilation=d, stride=s)), torch.randn(n, 40, c)
    return _Transposed(nn.Conv2d(c, o, k, dilation=d, stride=s)), torch.randn(n, 12, 12, c)


@pytest.mark.accuracy
@pytest.mark.parametrize("case", CASES, ids=[c.label for c in CASES])
def test_transposed_few_channel_convolution(case: Case) -> None:
    if describe().onednn_block != 16:
        pytest.skip(f"sized for oneDNN's AVX-512 kernels; this CPU runs ISA {describe().isa}")
    model, x = _build(case)
    kw = {"mode": case.mode, "optimizer": "sgd" if case.mode == "train" else None}
    estimated = nnmem.estimate(model, x, **kw)
    assert not [n for n in estimated.notes if "not modelled" in n], estimated.notes
    measured = nnmem.measure(model, x, **kw)
    assert estimated.peaks["tensor"] == measured.peaks["tensor"]
    error = (estimated.peaks["allocator"] - measured.peaks["allocator"]) / measured.peaks["allocator"]
    assert case.low <= error <= case.high, (f"{case.label}: estimated {estimated.peaks['allocator']:,} B, "
                                            f"measured {measured.peaks['allocator']:,} B ({error:+.2%})")


def test_one_channel_input_relayout_is_noted() -> None:
    """oneDNN's brgemm forward relays a one-channel input out per thread (exec_trans): not sized, said so."""
    if describe().onednn_block != 16:
        pytest.skip(f"the relayout is AVX-512's (try_relo_wi); this CPU runs ISA {describe().isa}")
    model, x = _build(Case("", (1, 8, 3, 1, 1, 5, 1), "infer", 0.0, 0.0))
    notes = nnmem.estimate(model, x, mode="infer").notes
    assert any("exec_trans" in n and "not modelled" in n for n in notes), notes


def test_channels_last_1x1_backward_is_noted() -> None:
    """A 1x1 channels-last convolution's backward (jit_1x1 on nhwc, estimated 2.4 % low with the nchw port): noted."""
    if describe().onednn_block != 16:
        pytest.skip(f"sized for oneDNN's AVX-512 kernels; this CPU runs ISA {describe().isa}")
    model, x = _build(Case("", (1, 8, 1, 1, 1, 5, 1), "train", 0.0, 0.0))
    notes = nnmem.estimate(model, x, mode="train", optimizer="sgd").notes
    assert any("1x1 channels-last" in n and "not modelled" in n for n in notes), notes


def test_a_model_moved_to_channels_last_on_an_nchw_input_runs_nhwc() -> None:
    """``model.to(memory_format=torch.channels_last)`` gives depthwise and 1x1 weights strides that are contiguous
    and channels-last at once; ATen's ``suggest_memory_format`` reads them as channels-last, so oneDNN runs the
    convolution nhwc even on an nchw input. Read as contiguous, such calls were sized on the nchw kernels: the
    depthwise backward below measured 654,528 B against 50,880 B estimated. Each op's rule (no note) against the
    allocator's peak inside it."""
    import calibrate_workspace as calibrate

    if describe().onednn_block != 16:
        pytest.skip("the nhwc depthwise and 1x1 rules are measured on AVX-512")
    model = nn.Sequential(nn.Conv2d(24, 24, 5, padding=2, groups=24), nn.ReLU(), nn.Conv2d(24, 32, 1))
    model = model.to(memory_format=torch.channels_last)
    x = torch.randn(2, 24, 14, 14)

    def step() -> None:
        model(x).sum().backward()

    rows = [r for r in calibrate.measure_ops(step, training=True) if "convolution" in r.name]
    assert len(rows) == 4 and all(r.note is None for r in rows), [(r.name, r.note) for r in rows]
    assert [r.predicted for r in rows] == [r.scratch for r in rows]
