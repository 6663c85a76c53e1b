"""The Keras torch backend's fake-tensor trace: Keras semantics, the model left as it was, errors."""

from __future__ import annotations

import os

import pytest

if os.environ.get("KERAS_BACKEND") != "torch":
    pytest.skip("needs KERAS_BACKEND=torch", allow_module_level=True)

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import torch

import nnmem
from nnmem.errors import ConfigError, TraceError
from nnmem.frontends.keras.torch.trace import trace_step
from nnmem.report.model import report_from_trace
from nnmem.zoo.keras_models import FACTORIES


def test_estimate_leaves_the_model_real_and_unchanged(zoo_step: Callable[..., Any]) -> None:
    step = zoo_step("keras_two_branch_cnn", "train")
    before = [(v.path, v._value.data_ptr()) for v in step.model.variables + step.model.optimizer.variables]
    trace_step(step, meta={})
    after = [(v.path, v._value.data_ptr()) for v in step.model.variables + step.model.optimizer.variables]
    assert before == after
    assert all(not isinstance(v._value, torch._subclasses.fake_tensor.FakeTensor) for v in step.model.variables)
    assert all(v._value.grad is None for v in step.model.trainable_variables)


def test_breakdown_follows_keras_semantics() -> None:
    report = nnmem.estimate("keras_mlp", batch=8, optimizer="adam")
    assert report.framework == "keras-torch"
    assert report.breakdown["parameters"] == 41_802 * 4
    # Keras zeroes gradients after the forward pass, so the last step's gradients are live at the start.
    assert report.breakdown["gradients"] == 41_802 * 4
    # Adam: two slots per variable, plus the iteration counter and learning rate.
    assert report.breakdown["optimizer state"] >= 2 * 41_802 * 4


def test_frozen_layers_have_no_gradients_or_optimizer_state(zoo_step: Callable[..., Any]) -> None:
    frozen = zoo_step("keras_partly_frozen", "train")
    trainable = sum(int(np.prod(v.shape)) for v in frozen.model.trainable_variables)
    total = sum(int(np.prod(v.shape)) for v in frozen.model.variables)
    assert trainable < total
    report = report_from_trace(trace_step(frozen, meta={}), source="estimate", model="f", device="cpu")
    slots = [v for v in frozen.model.optimizer.variables if len(v.shape)]
    assert sum(int(np.prod(v.shape)) for v in slots) == 2 * trainable
    assert report.breakdown["gradients"] <= trainable * 4


def test_mixed_float16_traces_the_loss_scale_step(zoo_step: Callable[..., Any]) -> None:
    step = zoo_step("keras_mixed_float16", "train")
    assert type(step.model.optimizer).__name__ == "LossScaleOptimizer"
    trace = trace_step(step, meta={})
    assert any(op.phase.value == "optimizer" for op in trace.ops)


def test_wrong_input_shape_is_a_trace_error() -> None:
    model, _, y, loss = FACTORIES["keras_mlp"](4)
    with pytest.raises(TraceError, match="rejected inputs"):
        nnmem.estimate(model, np.zeros((4, 100), "float32"), target=y, loss_fn=loss, optimizer="adam")


def test_uncompiled_model_without_loss_is_a_config_error() -> None:
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    with pytest.raises(ConfigError, match="not compiled with a loss"):
        nnmem.estimate(model, np.zeros((4, 8), "float32"), target=np.zeros((4, 2), "float32"))
