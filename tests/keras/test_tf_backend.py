"""The Keras frontend on TensorFlow: the graph replay against the BFC allocator's real peak of the same step."""

from __future__ import annotations

import os

import pytest

if os.environ.get("KERAS_BACKEND") != "tensorflow":
    pytest.skip("needs KERAS_BACKEND=tensorflow", allow_module_level=True)
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

import gc  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from nnmem.errors import TraceError  # noqa: E402
from nnmem.frontends.keras import tf_backend  # noqa: E402
from nnmem.frontends.keras.common import prepare, resident_variables  # noqa: E402
from nnmem.report.model import report_from_trace  # noqa: E402
from nnmem.trace import Category, Phase  # noqa: E402
from nnmem.zoo.keras_models import FACTORIES  # noqa: E402

BATCH = 8
LIMIT = 0.15  # the per-case maximum error against the BFC peak

# Cases the sequential replay meets the target on (see the module docstring of tf_backend for the others:
# oneDNN convolution scratch in training, RNN loops running 32 iterations concurrently).
CASES = [("keras_transformer_block", "infer"), ("keras_mlp", "train"), ("keras_mlp", "infer"),
         ("keras_subclassed", "train"), ("keras_two_branch_cnn", "infer"),
         ("keras_mixed_float16", "train"), ("keras_subclassed", "infer")]


def _step(name: str, mode: str, batch: int = BATCH):  # type: ignore[no-untyped-def]
    model, x, y, loss = FACTORIES[name](batch)
    if mode == "train":
        return prepare(model, x, y, mode="train", optimizer="adam", loss=loss)
    return prepare(model, x, None, mode="infer")


def test_bfc_allocator_is_on() -> None:
    ones = tf.ones((1024,)) * 2.0  # computed on the CPU device: allocated by its allocator
    assert tf.config.experimental.get_memory_info("CPU:0")["current"] >= ones.shape[0] * 4, "BFC not in use"


@pytest.mark.accuracy
@pytest.mark.parametrize(("name", "mode"), CASES)
def test_estimate_matches_bfc_peak(name: str, mode: str) -> None:
    gc.collect()
    foreign = tf.config.experimental.get_memory_info("CPU:0")["current"]  # left by earlier cases in this process
    step = _step(name, mode)
    est = report_from_trace(tf_backend.trace_step(step, meta={}), source="estimate", model=name, device="cpu")
    meas = tf_backend.measure_step(step, name=name, meta={})
    measured = meas.peak_bytes - foreign
    assert abs(est.peak_bytes - measured) <= LIMIT * measured, (
        f"estimated {est.peak_bytes:,} B, measured {measured:,} B ({(est.peak_bytes - measured) / measured:+.1%})")
    assert meas.meta["method"] == "bfc_peak"


def test_trace_categories_and_meta() -> None:
    step = _step("keras_mlp", "train")
    trace = tf_backend.trace_step(step, meta={"batch": BATCH})
    cats = {b.category for b in trace.blocks}
    assert {Category.PARAMETERS, Category.OPTIMIZER_STATE, Category.INPUTS, Category.GRADIENTS} <= cats
    grads = sum(b.nbytes for b in trace.blocks if b.category is Category.GRADIENTS)
    params = sum(b.nbytes for b in trace.blocks if b.category is Category.PARAMETERS)
    assert grads == params  # one gradient per trainable variable, of its size
    assert trace.framework == "keras-tensorflow" and trace.meta["optimizer"] == "adam"
    assert {op.phase for op in trace.ops} == {Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER}
    layers = {b.layer for b in trace.blocks if b.category is Category.SAVED_ACTIVATIONS}
    assert any(path.startswith("keras_mlp/dense") for path in layers)
    assert sum(b.nbytes for b in trace.blocks if b.alloc_op < 0) == trace.resident_bytes


def test_frozen_layers_have_no_gradients_or_slots() -> None:
    step = _step("keras_partly_frozen", "train")
    trace = tf_backend.trace_step(step, meta={})
    trainable = sum(tf_backend.bfc_round(int(np.prod(v.shape)) * 4) for v in step.model.trainable_variables)
    assert sum(b.nbytes for b in trace.blocks if b.category is Category.GRADIENTS) == trainable
    frozen = {b.layer for b in trace.blocks if b.category is Category.GRADIENTS}
    assert not any(path.split("/")[-1].startswith("frozen_") for path in frozen)
    slots = [layer for _, c, layer in resident_variables(step.model, "train") if c is Category.OPTIMIZER_STATE]
    assert not any("frozen_" in layer for layer in slots)


def test_mixed_float16_halves_activations() -> None:
    step = _step("keras_mixed_float16", "infer")
    trace = tf_backend.trace_step(step, meta={})
    conv = max(b.nbytes for b in trace.blocks if b.alloc_op >= 0)
    assert conv == tf_backend.bfc_round(BATCH * 32 * 32 * 32 * 2)  # the first conv's float16 output


def test_estimate_allocates_nothing_batch_sized() -> None:
    step = _step("keras_two_branch_cnn", "train", batch=512)
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    trace = tf_backend.trace_step(step, meta={})
    assert tf.config.experimental.get_memory_info("CPU:0")["current"] - before < 1 << 20
    assert max(b.nbytes for b in trace.blocks) >= 512 * 32 * 32 * 32 * 4


def test_wrong_input_shape_is_a_trace_error() -> None:
    model, x, y, loss = FACTORIES["keras_mlp"](BATCH)
    step = prepare(model, x, y, mode="train", optimizer="adam", loss=loss)
    bad = type(step)(step.model, np.zeros((BATCH, 100), "float32"), y, "train", BATCH)
    with pytest.raises(TraceError, match="rejected inputs"):
        tf_backend.trace_step(bad, meta={})
