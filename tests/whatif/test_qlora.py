"""QLoRA (4-bit NF4 frozen weights, float32 LoRA adapters): modelled, not measured (bitsandbytes needs a GPU). The
row's categories against the sizes bitsandbytes and peft allocate, and the model left as it was."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import nnmem
from nnmem.errors import ConfigError, UnsupportedError


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256), nn.GELU(), nn.Linear(256, 10))


def test_only_the_adapters_train_and_the_weights_are_packed() -> None:
    model, inputs = _model(), (torch.randn(32, 256),)
    result = nnmem.what_if(model, inputs, optimizer="adam", techniques=["qlora:8"])
    row = result.rows[0]
    assert "2 linear layers" in row.description
    assert any("modelled, not measured" in n for n in row.report.notes)
    adapters = 4 * 8 * ((256 + 512) + (512 + 256))  # lora_A r x K and lora_B N x r, float32, per layer
    # at the peak only adapters' gradients, if any: where bfloat16 matmuls carry oneDNN's scratchpad
    # (avx512_core_bf16) the peak is in the forward pass, before any gradient
    assert row.report.breakdown.get("gradients", 0) <= adapters
    # Adam's two moments and its step counter (a float32 scalar), for the four adapter matrices only
    assert row.report.breakdown["optimizer state"] == 2 * adapters + 4 * 4
    # NF4: two weights per byte, one uint8 scale per 64, one float32 per 256 scales, the code books
    packed = sum(k * n // 2 + k * n // 64 + 4 * -(-k * n // 64 // 256) + 4 * 256 + 4 + 4 * 16
                 for k, n in ((256, 512), (512, 256)))
    frozen = 2 * (512 + 256) + 4 * (256 * 10 + 10)  # bfloat16 biases, the float32 head
    assert row.report.breakdown["parameters"] == packed + adapters + frozen
    assert result.saved(row) > 0
    # the model is back as it was
    assert all(type(m) is nn.Linear for m in model if not isinstance(m, nn.GELU))
    assert all(p.requires_grad for p in model.parameters())


def test_refusals() -> None:
    model, inputs = _model(), (torch.randn(4, 256),)
    with pytest.raises(UnsupportedError, match="way to train"):
        nnmem.what_if(model, inputs, mode="infer", techniques=["qlora:8"])
    with pytest.raises(ConfigError, match="qlora:R"):
        nnmem.what_if(model, inputs, techniques=["qlora:0"])
    with pytest.raises(UnsupportedError, match="need a GPU"):
        nnmem.apply_technique(model, "qlora:8")
    with pytest.raises(UnsupportedError, match="only its head"):
        nnmem.what_if(nn.Sequential(nn.Linear(4, 2)), (torch.randn(2, 4),), techniques=["qlora:8"])


def test_cli_refusals_exit_2() -> None:
    from click.testing import CliRunner

    from nnmem.cli import cli

    for args, message in ((["--technique", "qlora:0"], "qlora:R"),
                          (["--mode", "infer", "--technique", "qlora:8"], "way to train")):
        result = CliRunner().invoke(cli, ["whatif", "mlp", "--batch", "4", *args])
        assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output, \
            result.output
