"""The Keras torch backend's measurement of the real step, against the fake-tensor estimate of the same step."""

from __future__ import annotations

import os

import pytest

if os.environ.get("KERAS_BACKEND") != "torch":
    pytest.skip("needs KERAS_BACKEND=torch", allow_module_level=True)

from collections.abc import Callable
from typing import Any

import keras
import numpy as np

import nnmem
from nnmem.frontends.keras.torch.measure import live_variable_bytes, measure_step
from nnmem.frontends.keras.torch.trace import trace_step
from nnmem.report.model import report_from_trace
from nnmem.zoo.keras_models import FACTORIES


@pytest.mark.accuracy
@pytest.mark.parametrize("name", sorted(FACTORIES))
@pytest.mark.parametrize("mode", ["train", "infer"])
def test_estimate_matches_real_step(zoo_step: Callable[..., Any], name: str, mode: str) -> None:
    step = zoo_step(name, mode)
    trace = trace_step(step, meta={})
    if trace.meta.get("unmodelled"):  # a kernel path this CPU takes that no rule models: the report says so
        pytest.skip(str(trace.meta["unmodelled"]).replace("\n", "; "))
    estimate = report_from_trace(trace, source="estimate", model=name, device="cpu")
    measured = measure_step(step, name=name, meta={})
    assert estimate.peaks["tensor"] == measured.peaks["tensor"]
    # The allocator level is the profiler's, from steps run without any dispatch mode.
    error = abs(estimate.peaks["allocator"] - measured.peaks["allocator"]) / measured.peaks["allocator"]
    assert error <= 0.10, (estimate.peaks, measured.peaks)


def test_measure_runs_in_a_child_and_matches() -> None:
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(4)])
    model.compile(optimizer="adam", loss="mse")
    x, y = np.zeros((16, 64), "float32"), np.zeros((16, 4), "float32")
    estimate = nnmem.estimate(model, x, target=y)
    measured = nnmem.measure(model, x, target=y)
    assert measured.source == "measure" and estimate.optimizer == "adam"
    assert abs(estimate.peak_bytes - measured.peak_bytes) <= 0.02 * measured.peak_bytes


def test_live_variable_bytes_counts_variables_slots_and_gradients(zoo_step: Callable[..., Any]) -> None:
    step = zoo_step("keras_mlp", "train")
    params = 41_802 * 4
    assert live_variable_bytes(step.model) >= 3 * params  # the weights and Adam's m and v, no gradients yet
    for v in step.model.trainable_variables:
        v._value.grad = v._value.detach().clone()
    try:
        assert live_variable_bytes(step.model) >= 4 * params
    finally:
        for v in step.model.trainable_variables:
            v._value.grad = None


@pytest.mark.accuracy
def test_a_loss_scaled_step_is_measured_once_its_scale_has_settled() -> None:
    """A LossScaleOptimizer skips the update of a step whose scaled float16 gradients overflow (and halves its
    scale): such a step peaks lower than the ones training runs. The measured steps are ones that update, as the
    estimate counts them; here every step overflows until the scale has come down from 2**30."""
    from nnmem.frontends.keras.common import prepare

    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(4)])
    finally:
        keras.config.set_dtype_policy("float32")
    model.compile(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(), initial_scale=2.0 ** 30),
                  loss="mse")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 64)).astype("float32"), rng.normal(size=(16, 4)).astype("float32")
    step = prepare(model, x, y, mode="train")
    estimate = report_from_trace(trace_step(step, meta={}), source="estimate", model="m", device="cpu")
    measured = measure_step(step, name="m", meta={})
    assert float(keras.ops.convert_to_numpy(model.optimizer.dynamic_scale)) < 2.0 ** 30  # steps overflowed
    assert not any("skipped" in note for note in measured.notes), measured.notes
    assert abs(estimate.peaks["allocator"] - measured.peaks["allocator"]) <= 64, (estimate.peaks, measured.peaks)
