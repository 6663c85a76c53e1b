"""Structured pruning (output channels removed with the next layer's inputs) frees memory: what-if's prediction
against the model pruned for real and measured."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import nnmem
from nnmem.errors import UnsupportedError


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 8, 1),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_prediction_equals_the_model_pruned_for_real(mode: str) -> None:
    model, inputs = _cnn(), (torch.randn(4, 3, 16, 16),)
    optimizer = "adam" if mode == "train" else None
    result = nnmem.what_if(model, inputs, mode=mode, optimizer=optimizer, techniques=["prune-channels:0.5"])
    row = result.rows[0]
    assert result.saved(row) > 0
    assert [m.weight.shape[0] for m in model if isinstance(m, nn.Conv2d)] == [16, 32, 8]  # left as it was
    expected = model.eval()(inputs[0])
    nnmem.apply_technique(model, "prune-channels:0.5")
    convs = [m for m in model if isinstance(m, nn.Conv2d)]
    assert [(c.in_channels, c.out_channels) for c in convs] == [(3, 8), (8, 16), (16, 8)]
    assert model[1].num_features == 8 and model(inputs[0]).shape == expected.shape
    measured = nnmem.measure(model, inputs, mode=mode, optimizer=optimizer, timeout_s=120).peaks["allocator"]
    assert abs(row.report.peaks["allocator"] - measured) <= 64, (row.report.peaks, measured)


def test_the_kept_channels_are_the_largest_and_models_without_pairs_are_refused() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1.0] * 4, [5.0] * 4, [3.0] * 4]))
        model[2].weight.copy_(torch.arange(6.0).reshape(2, 3))
    nnmem.apply_technique(model, "prune-channels:0.4")  # 3 - floor(1.2) = 2 kept: rows 1 and 2
    assert model[0].weight[:, 0].tolist() == [5.0, 3.0]
    assert model[2].weight.tolist() == [[1.0, 2.0], [4.0, 5.0]]
    with pytest.raises(UnsupportedError, match="channel pruning needs that structure"):
        nnmem.what_if(nn.Sequential(nn.Linear(4, 2)), (torch.randn(2, 4),), techniques=["prune-channels:0.5"])
    with pytest.raises(nnmem.ConfigError, match="prune-channels:AMOUNT"):
        nnmem.what_if(_cnn(), (torch.randn(2, 3, 8, 8),), techniques=["prune-channels:2"])
