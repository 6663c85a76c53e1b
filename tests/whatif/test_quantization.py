"""Dynamic int8 quantization (torch.ao.quantization.quantize_dynamic): FBGEMM's packed weights and per-thread
buffers live outside PyTorch's allocator, so both the estimate and the measurement must count them; what-if's
prediction is checked against the model quantized for real and measured with the malloc counter."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import nnmem
from nnmem.cpu import CpuInfo, describe
from nnmem.errors import ConfigError, UnsupportedError
from nnmem.frontends.pytorch.quantized import fbgemm_blocking, packed_bytes, packed_modules

needs_fbgemm = pytest.mark.skipif(fbgemm_blocking(describe()) is None, reason="FBGEMM needs AVX2")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(300, 700), nn.ReLU(), nn.Linear(700, 130), nn.ReLU(), nn.Linear(130, 10))


def _quantized(model: nn.Module) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


def _cpu(*flags: str) -> CpuInfo:
    return CpuInfo(model="test", arch="x86_64", flags=tuple(sorted(flags)), isa="unknown")


def test_blocking_follows_the_instruction_set_fbgemm_picks() -> None:
    avx512 = ("avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl")
    assert fbgemm_blocking(_cpu(*avx512, "avx512_vnni")).isa == "avx512_vnni"  # type: ignore[union-attr]
    assert fbgemm_blocking(_cpu(*avx512)).isa == "avx512"  # type: ignore[union-attr]
    assert fbgemm_blocking(_cpu("avx2", "fma")).isa == "avx2"  # type: ignore[union-attr]
    assert fbgemm_blocking(_cpu("avx")) is None
    vnni = fbgemm_blocking(_cpu(*avx512, "avx512_vnni"))
    assert vnni is not None
    # 513 inputs take two 512-row blocks, 49 outputs two 48-column ones; + column offsets, scale and zero point
    assert packed_bytes(513, 49, vnni) == 2 * 2 * 512 * 48 + 4 * 49 + 8


@needs_fbgemm
def test_a_quantized_model_is_estimated_with_its_packed_weights_and_measured_the_same() -> None:
    model, inputs = _quantized(_model()), (torch.randn(64, 300),)
    assert len(packed_modules(model)) == 3
    estimate = nnmem.estimate(model, inputs, mode="infer")
    measured = nnmem.measure(model, inputs, mode="infer", timeout_s=120)
    int8 = 300 * 700 + 700 * 130 + 130 * 10
    assert estimate.breakdown["parameters"] >= int8  # the packed weights, invisible to PyTorch's allocator
    assert any("malloc counter" in n for n in measured.notes)
    # FBGEMM's per-thread input blocks overlap in time or not: the range holds both (2 % for malloc's bookkeeping)
    assert estimate.peak_range is not None and estimate.peak_range[1] == estimate.peaks["allocator"]
    low, high = estimate.peak_range
    truth = measured.peaks["allocator"]
    assert 0.98 * low <= truth <= 1.02 * high, (low, truth, high)


@needs_fbgemm
def test_what_if_prediction_equals_the_model_quantized_for_real() -> None:
    model, inputs = _model(), (torch.randn(64, 300),)
    result = nnmem.what_if(model, inputs, mode="infer", techniques=["quantize:int8"])
    row = result.rows[0]
    assert "3 linear layers" in row.description
    assert isinstance(model[0], nn.Linear)  # the trace put the float layers back
    nnmem.apply_technique(model, "quantize:int8")
    assert len(packed_modules(model)) == 3
    measured = nnmem.measure(model, inputs, mode="infer", timeout_s=120).peaks["allocator"]
    low, high = row.report.peak_range or (row.report.peaks["allocator"],) * 2
    assert 0.98 * low <= measured <= 1.02 * high, (low, measured, high)


def test_training_and_other_types_are_refused() -> None:
    model, inputs = _model(), (torch.randn(4, 300),)
    with pytest.raises(UnsupportedError, match="inference"):
        nnmem.what_if(model, inputs, mode="train", optimizer="sgd", techniques=["quantize:int8"])
    with pytest.raises(ConfigError, match="quantize:int8"):
        nnmem.what_if(model, inputs, mode="infer", techniques=["quantize:int4"])
    with pytest.raises(UnsupportedError, match="no float32 nn.Linear"):
        nnmem.what_if(nn.Sequential(nn.Conv2d(3, 4, 3)), (torch.randn(1, 3, 8, 8),), mode="infer",
                      techniques=["quantize:int8"])
    with pytest.raises(ConfigError, match="meta device"):
        nnmem.apply_technique(_model().to("meta"), "quantize:int8")
    # training's default technique list skips it with the reason
    skipped = dict(nnmem.what_if(_model(), inputs, mode="train", optimizer="sgd").skipped)
    assert "inference" in skipped["quantize:int8"]


@needs_fbgemm
def test_the_cli_compares_it_and_refuses_what_it_cannot_do() -> None:
    from click.testing import CliRunner

    from nnmem.cli import cli

    result = CliRunner().invoke(cli, ["whatif", "mlp", "--mode", "infer", "--batch", "8", "--technique",
                                      "quantize:int8"])
    assert result.exit_code == 0, result.output
    assert "quantize:int8" in result.output and "packed by FBGEMM" in result.output
    for args, message in ((["--mode", "infer", "--technique", "quantize:int4"], "expected quantize:int8"),
                          (["--technique", "quantize:int8"], "for inference")):
        result = CliRunner().invoke(cli, ["whatif", "mlp", *args])
        assert result.exit_code == 2 and message in result.output, result.output


class _LstmHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm, self.head = nn.LSTM(16, 32, batch_first=True), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(x)[0])


def test_quantized_modules_without_a_rule_are_said_not_modelled() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = torch.ao.quantization.quantize_dynamic(_LstmHead(), {nn.LSTM}, dtype=torch.qint8)
    notes = nnmem.estimate(model, (torch.randn(2, 5, 16),), mode="infer").notes
    assert any("quantized modules (LSTM)" in n and "not modelled" in n for n in notes), notes
