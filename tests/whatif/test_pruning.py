"""Unstructured pruning (torch.nn.utils.prune) costs memory: what-if's prediction against the model pruned for
real and measured, and the user's model left as it was."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

import nnmem
from nnmem.errors import ConfigError, UnsupportedError


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(96, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_prediction_equals_the_model_pruned_for_real(mode: str) -> None:
    model, inputs = _model(), (torch.randn(16, 96),)
    optimizer = "adam" if mode == "train" else None
    result = nnmem.what_if(model, inputs, mode=mode, optimizer=optimizer, techniques=["prune:0.5"])
    predicted = result.rows[0].report.peaks["allocator"]
    nnmem.apply_technique(model, "prune:0.5")
    assert hasattr(model[0], "weight_mask")
    measured = nnmem.measure(model, inputs, mode=mode, optimizer=optimizer, timeout_s=120).peaks["allocator"]
    assert abs(predicted - measured) <= 64, (predicted, measured)
    weights = sum(m.weight_orig.nbytes for m in model if isinstance(m, nn.Linear))
    # the mask and the recomputed weight come on top of the dense step: pruning this way never saves memory
    assert result.saved(result.rows[0]) <= -weights


def test_the_trace_leaves_the_model_as_it_was() -> None:
    model = _model()
    before = [(name, p) for name, p in model.named_parameters()]
    nnmem.what_if(model, (torch.randn(4, 96),), optimizer="sgd", techniques=["prune:0.3"])
    assert [(name, p) for name, p in model.named_parameters()] == before
    assert all(not m._forward_pre_hooks and not m._buffers for m in model)


def test_an_estimate_leaves_no_fake_tensor_in_a_pruned_model() -> None:
    """The forward pre-hook sets ``weight`` during the fake trace; the model keeps its real one."""
    model = _model()
    prune.l1_unstructured(model[0], "weight", amount=0.5)
    weight = model[0].weight
    nnmem.estimate(model, (torch.randn(4, 96),), optimizer="adam")
    assert model[0].weight is weight


def test_bad_amounts_and_models_without_weights() -> None:
    with pytest.raises(ConfigError, match="prune:AMOUNT"):
        nnmem.what_if(_model(), (torch.randn(4, 96),), techniques=["prune:1.5"])
    with pytest.raises(UnsupportedError, match="no linear or convolution weight"):
        nnmem.what_if(nn.Sequential(nn.ReLU()), (torch.randn(4, 96),), mode="infer", techniques=["prune:0.5"])
