"""Weight-only int8 / int4 quantization of linear layers (ATen's CPU weight-only kernels, as torchao's CPU layouts
call them): what-if's prediction against the model quantized for real and measured, and what it refuses."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner
from torch import nn

import nnmem
from nnmem.cli import cli
from nnmem.errors import ConfigError, UnsupportedError
from nnmem.frontends.pytorch.weight_only import WeightOnlyLinear, weight_only_spec


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 96), nn.GELU(), nn.Linear(96, 32))


@pytest.mark.parametrize(("technique", "layers"), [("weight-only:int8", 3), ("weight-only:int4", 2),
                                                   ("weight-only:int4:32", 3)])
def test_what_if_prediction_equals_the_model_quantized_for_real(technique: str, layers: int) -> None:
    model, inputs = _model(), (torch.randn(3, 7, 256),)
    result = nnmem.what_if(model, inputs, mode="infer", techniques=[technique])
    row = result.rows[0]
    assert row.description.startswith(f"{layers} linear layers")  # int4 at G=128: 96 inputs do not divide
    assert isinstance(model[0], nn.Linear)  # the trace put the float layers back
    nnmem.apply_technique(model, technique)
    assert sum(isinstance(m, WeightOnlyLinear) for m in model.modules()) == layers
    measured = nnmem.measure(model, inputs, mode="infer", timeout_s=120)
    assert measured.peaks["tensor"] == row.report.peaks["tensor"]
    assert abs(measured.peaks["allocator"] - row.report.peaks["allocator"]) <= 64, (measured.peaks, row.report.peaks)
    assert result.saved(row) > 0  # the float32 weights are gone


@pytest.mark.parametrize("group", [32, 128])
def test_int4_layer_computes_with_the_weight_it_quantized(group: int) -> None:
    """The kernel dequantizes (q - 8) * scale + zero per group: the product equals the dequantized weight's."""
    torch.manual_seed(0)
    linear = nn.Linear(256, 64)
    x = torch.randn(15, 256)
    with torch.no_grad():
        layer = WeightOnlyLinear.from_linear(linear, 4, group)
        w = linear.weight.reshape(64, -1, group)
        low, high = w.amin(2), w.amax(2)
        scale = ((high - low) / 15).clamp(min=1e-8)
        q = torch.round((w - low[..., None]) / scale[..., None]).clamp(0, 15)
        expected = x @ (q * scale[..., None] + low[..., None]).reshape(64, 256).T + linear.bias
        assert torch.allclose(layer(x), expected, atol=1e-5)
        assert (layer(x) - linear(x)).abs().max() < 0.2  # 4-bit: close to the float layer, not equal


def test_int8_layer_is_close_to_the_float_one() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(100, 30)
    x = torch.randn(4, 100)
    with torch.no_grad():
        assert (WeightOnlyLinear.from_linear(linear, 8, 0)(x) - linear(x)).abs().max() < 0.02


def test_malformed_training_gpu_and_no_layer_are_refused() -> None:
    assert weight_only_spec("weight-only:int4") == (4, 128)
    for bad in ("weight-only:int3", "weight-only:int4:100", "weight-only:int8:32", "weight-only"):
        with pytest.raises(ConfigError, match="weight-only:int8 or weight-only:int4"):
            weight_only_spec(bad)
    model, inputs = _model(), (torch.randn(4, 256),)
    with pytest.raises(UnsupportedError, match="is for inference"):
        nnmem.what_if(model, inputs, techniques=["weight-only:int8"])
    with pytest.raises(UnsupportedError, match="CPU weight-only kernels"):
        nnmem.what_if(model, inputs, mode="infer", device="A100-80GB", techniques=["weight-only:int4"])
    odd = nn.Sequential(nn.Linear(100, 10))
    with pytest.raises(UnsupportedError, match="multiple of 16"):
        nnmem.what_if(odd, (torch.randn(2, 100),), mode="infer", techniques=["weight-only:int4"])


def test_cli_compares_it_and_refuses_a_malformed_one() -> None:
    runner = CliRunner()
    done = runner.invoke(cli, ["whatif", "gpt", "--mode", "infer", "--technique", "weight-only:int4"])
    assert done.exit_code == 0, done.output
    assert "weight-only:int4" in done.output and "int4" in done.output
    refused = runner.invoke(cli, ["whatif", "gpt", "--mode", "infer", "--technique", "weight-only:int5"])
    assert refused.exit_code == 2
    assert "expected weight-only:int8 or weight-only:int4" in refused.output
