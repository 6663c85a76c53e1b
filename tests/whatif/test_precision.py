"""Mixed precision (torch.autocast) and half-precision parameters: what-if's prediction against the technique
applied for real and measured, and the user's model left as it was."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import nnmem
from nnmem.errors import ConfigError
from nnmem.frontends.pytorch.workspace._common import NOT_MODELLED


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(96, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))


@pytest.mark.parametrize("technique", ["autocast:fp16", "half:fp16", "half:bf16"])
@pytest.mark.parametrize("mode", ["train", "infer"])
def test_prediction_equals_the_model_run_in_lower_precision(technique: str, mode: str) -> None:
    """Where the prediction carries no note, both levels equal the run's. Where it notes that oneDNN's kernel
    scratch is not modelled on this CPU (bf16 matmuls on AVX-512 CPUs but the one modelled; fp16 ones where the
    CPU has AVX512-FP16, e.g. Sapphire Rapids), the tensor level equals the run's and the allocator level is at
    most the run's, as the note says."""
    model, inputs = _model(), (torch.randn(16, 96),)
    optimizer = "adam" if mode == "train" else None
    result = nnmem.what_if(model, inputs, mode=mode, optimizer=optimizer, techniques=[technique])
    report = result.rows[0].report
    predicted = report.peaks
    nnmem.apply_technique(model, technique)
    measured = nnmem.measure(model, inputs, mode=mode, optimizer=optimizer, timeout_s=120).peaks
    _check(report.notes, predicted, measured)


def _check(notes: tuple[str, ...], predicted: dict[str, int], measured: dict[str, int]) -> None:
    """Both levels within 64 B of the run's, or, where every note is a kernel-scratch one, the tensor level and
    the allocator level no higher than the run's."""
    assert all(NOT_MODELLED in n for n in notes), notes
    if notes:
        assert abs(predicted["tensor"] - measured["tensor"]) <= 64, (predicted, measured, notes)
        assert predicted["allocator"] <= measured["allocator"] + 64, (predicted, measured, notes)
    else:
        assert all(abs(predicted[k] - measured[k]) <= 64 for k in ("tensor", "allocator")), (predicted, measured)


def test_half_precision_halves_the_fixed_part_and_autocast_keeps_it() -> None:
    model, inputs = _model(), (torch.randn(16, 96),)
    result = nnmem.what_if(model, inputs, optimizer="adam", techniques=["autocast:fp16", "half:fp16"])
    base = result.baseline.report.breakdown
    autocast, half = (row.report.breakdown for row in result.rows)
    weights = sum(p.nbytes for p in model.parameters())
    steps = base["optimizer state"] - 2 * weights  # Adam's float32 step counters, one per parameter
    assert 0 < steps <= 4 * len(list(model.parameters()))
    assert autocast["optimizer state"] == base["optimizer state"]
    assert autocast["parameters"] == half["parameters"] * 2 == weights
    assert half["optimizer state"] == weights + steps  # exp_avg and exp_avg_sq in float16
    assert all(p.dtype == torch.float32 and not p.is_meta for p in model.parameters())
    assert "forward" not in vars(model)


def test_an_unknown_dtype_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="autocast:bf16 or autocast:fp16"):
        nnmem.what_if(_model(), (torch.randn(4, 96),), techniques=["autocast:int8"])


class _Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm, self.head = nn.LSTM(16, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(x)[0])


def test_a_float16_lstm_under_autocast_runs_where_onednn_has_one() -> None:
    """autocast casts ``mkldnn_rnn_layer`` to float16 after ATen chose oneDNN for the float32 LSTM: where oneDNN
    has no float16 LSTM (no AVX512-FP16 / AMX-FP16) the real step fails, and the estimate says so."""
    from nnmem import cpu

    inputs = (torch.randn(5, 3, 16),)
    if cpu.describe().onednn_fp16:
        result = nnmem.what_if(_Recurrent(), inputs, optimizer="sgd", techniques=["autocast:fp16"])
        assert result.rows[0].peak_bytes > 0
        return
    with pytest.raises(nnmem.UnsupportedError, match="no float16 LSTM on this CPU"):
        nnmem.what_if(_Recurrent(), inputs, optimizer="sgd", techniques=["autocast:fp16"])
    model = _Recurrent()
    nnmem.apply_technique(model, "autocast:fp16")
    with pytest.raises((nnmem.MeasureError, nnmem.TraceError), match="primitive descriptor"):
        nnmem.measure(model, inputs, optimizer="sgd", timeout_s=120)


def test_estimate_measure_and_batch_search_take_a_precision() -> None:
    from click.testing import CliRunner

    from nnmem.cli import cli

    estimated = nnmem.estimate("mlp", batch=8, optimizer="adam", precision="half:fp16")
    measured = nnmem.measure("mlp", batch=8, optimizer="adam", precision="half:fp16", timeout_s=120)
    assert abs(estimated.peak_bytes - measured.peak_bytes) <= 64 and estimated.meta["precision"] == "half:fp16"
    row = nnmem.what_if("mlp", batch=8, optimizer="adam", techniques=["half:fp16"]).rows[0]
    assert row.peak_bytes == estimated.peak_bytes
    assert nnmem.estimate("mlp", batch=8, precision="fp16").meta["precision"] == "autocast:fp16"
    assert "precision" not in nnmem.estimate("mlp", batch=8, precision="fp32").meta
    plain = nnmem.max_batch("mlp", budget="4MiB", optimizer="adam").batch
    assert nnmem.max_batch("mlp", budget="4MiB", optimizer="adam", precision="half:fp16").batch > plain
    result = CliRunner().invoke(cli, ["estimate", "mlp", "--precision", "int4"])
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1 and "half:fp16" in result.stderr


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.lin(x)  # under autocast: a float16 output added into the float32 input


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_a_mixed_dtype_add_converts_its_float16_input_on_a_cpu(mode: str) -> None:
    """TensorIterator gives the float16 input a float32 copy for the op (aten/src/ATen/TensorIterator.cpp)."""
    inputs = (torch.randn(256, 64),)
    optimizer = "sgd" if mode == "train" else None
    estimated = nnmem.estimate(_Residual(), inputs, mode=mode, optimizer=optimizer, precision="fp16")
    assert estimated.breakdown.get("kernel workspace", 0) >= 256 * 64 * 4 or mode == "train"
    model = nnmem.apply_technique(_Residual(), "autocast:fp16")
    measured = nnmem.measure(model, inputs, mode=mode, optimizer=optimizer, timeout_s=120)
    _check(estimated.notes, estimated.peaks, measured.peaks)
