"""``optimizer.zero_grad(set_to_none=False)``: the gradients stay allocated between steps. The estimate of that
step against the same step measured, and what refuses it."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner
from torch import nn

import nnmem
from nnmem.cli import cli
from nnmem.errors import ConfigError


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(96, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 10))


def test_kept_gradients_are_estimated_as_measured() -> None:
    model, inputs = _model(), (torch.randn(64, 96),)
    freed = nnmem.estimate(model, inputs, optimizer="sgd")
    kept = nnmem.estimate(model, inputs, optimizer="sgd", set_to_none=False)
    measured = nnmem.measure(model, inputs, optimizer="sgd", set_to_none=False, timeout_s=120)
    assert abs(kept.peaks["allocator"] - measured.peaks["allocator"]) <= 64, (kept.peaks, measured.peaks)
    assert kept.peaks["tensor"] == measured.peaks["tensor"]
    grads = sum(p.numel() * 4 for p in model.parameters())
    # SGD's peak is in backward: with the gradients kept, every one of them is live there, not only some
    assert kept.breakdown["gradients"] == grads
    assert kept.peaks["allocator"] > freed.peaks["allocator"]
    assert kept.meta["zero_grad"] == "set_to_none=False"


def test_what_if_row_and_refusals() -> None:
    model, inputs = _model(), (torch.randn(8, 96),)
    result = nnmem.what_if(model, inputs, optimizer="sgd", techniques=["zero-grad:zeros"])
    assert result.saved(result.rows[0]) < 0  # keeping the gradients costs memory
    with pytest.raises(ConfigError, match="mode='train'"):
        nnmem.estimate(model, inputs, mode="infer", set_to_none=False)
    with pytest.raises(ConfigError, match="set_to_none=False"):
        nnmem.apply_technique(model, "zero-grad:zeros")
    with pytest.raises(ConfigError, match="zero-grad:zeros"):
        nnmem.what_if(model, inputs, optimizer="sgd", techniques=["zero-grad:ones"])
    with pytest.raises(nnmem.UnsupportedError, match="training only"):
        nnmem.what_if(model, inputs, mode="infer", techniques=["zero-grad:zeros"])


def test_cli_option() -> None:
    result = CliRunner().invoke(cli, ["estimate", "mlp", "--batch", "8", "--optimizer", "sgd", "--zero-grad",
                                      "zeros", "--json"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(cli, ["estimate", "mlp", "--mode", "infer", "--zero-grad", "zeros"])
    assert result.exit_code == 2 and "set_to_none=False" in result.output
