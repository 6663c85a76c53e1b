"""The optimizer step's implementation (torch.optim's for-loop, foreach, fused): their temporaries differ, and
what-if's prediction equals the step measured with that implementation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import nnmem
from nnmem.errors import ConfigError, UnsupportedError


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(96, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))


def test_each_implementation_equals_its_real_step() -> None:
    model, inputs = _model(), (torch.randn(16, 96),)
    result = nnmem.what_if(model, inputs, optimizer="adam",
                           techniques=["optimizer:for-loop", "optimizer:foreach", "optimizer:fused"])
    for row in result.rows:
        name = "adam:" + row.technique.split(":")[1]
        measured = nnmem.measure(model, inputs, optimizer=name, timeout_s=120).peaks["allocator"]
        assert abs(row.report.peaks["allocator"] - measured) <= 64, (row.technique, row.report.peaks, measured)
    loop, foreach, fused = (row.peak_bytes for row in result.rows)
    assert loop == result.baseline.peak_bytes  # torch's default on a CPU is the for-loop
    assert fused < loop


def test_bad_implementations() -> None:
    with pytest.raises(ConfigError, match="adam:for-loop|foreach|fused"):
        nnmem.estimate(_model(), (torch.randn(4, 96),), optimizer="adam:turbo")
    with pytest.raises(ConfigError, match="optimizer:for-loop"):
        nnmem.what_if(_model(), (torch.randn(4, 96),), optimizer="adam", techniques=["optimizer:turbo"])
    with pytest.raises(UnsupportedError, match="class"):
        nnmem.what_if(_model(), (torch.randn(4, 96),), optimizer=torch.optim.Adam, techniques=["optimizer:fused"])
    with pytest.raises(ConfigError, match="changes the step"):
        nnmem.apply_technique(_model(), "optimizer:fused")
