"""The Keras frontend on TensorFlow, estimated: categories, layers, residents and initializer holes of a trace."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

if os.environ.get("KERAS_BACKEND") != "tensorflow":
    pytest.skip("needs KERAS_BACKEND=tensorflow", allow_module_level=True)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from nnmem.allocators.bfc import bfc_round  # noqa: E402
from nnmem.errors import TraceError  # noqa: E402
from nnmem.frontends.keras.common import prepare, resident_variables  # noqa: E402
from nnmem.frontends.keras.tensorflow import trace  # noqa: E402
from nnmem.trace import Category, Phase  # noqa: E402
from nnmem.zoo.keras_models import FACTORIES  # noqa: E402

BATCH = 8


def test_trace_categories_and_meta(zoo_step: Callable[..., Any]) -> None:
    step = zoo_step("keras_mlp", "train", BATCH)
    traced = trace.trace_step(step, meta={"batch": BATCH})
    cats = {b.category for b in traced.blocks}
    assert {Category.PARAMETERS, Category.OPTIMIZER_STATE, Category.INPUTS, Category.GRADIENTS} <= cats
    grads = sum(b.nbytes for b in traced.blocks if b.category is Category.GRADIENTS)
    params = sum(b.nbytes for b in traced.blocks if b.category is Category.PARAMETERS)
    assert params <= grads < 2 * params  # one gradient per trainable variable, in a BFC chunk of at least its size
    assert traced.framework == "keras-tensorflow" and traced.meta["optimizer"] == "adam"
    assert {op.phase for op in traced.ops} == {Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER}
    layers = {b.layer for b in traced.blocks if b.category is Category.SAVED_ACTIVATIONS}
    assert any(path.startswith("keras_mlp/dense") for path in layers)
    assert sum(b.nbytes for b in traced.blocks if b.alloc_op < 0) == traced.resident_bytes


def test_frozen_layers_have_no_gradients_or_slots(zoo_step: Callable[..., Any]) -> None:
    step = zoo_step("keras_partly_frozen", "train", BATCH)
    traced = trace.trace_step(step, meta={})
    trainable = sum(bfc_round(int(np.prod(v.shape)) * 4) for v in step.model.trainable_variables)
    grads = [b.nbytes for b in traced.blocks if b.category is Category.GRADIENTS]
    assert len(grads) == len(step.model.trainable_variables)
    assert trainable <= sum(grads) < 2 * trainable  # BFC chunks: at least the request, under twice it
    frozen = {b.layer for b in traced.blocks if b.category is Category.GRADIENTS}
    assert not any(path.split("/")[-1].startswith("frozen_") for path in frozen)
    slots = [layer for _, c, layer in resident_variables(step.model, "train") if c is Category.OPTIMIZER_STATE]
    assert not any("frozen_" in layer for layer in slots)


def test_mixed_float16_halves_activations(zoo_step: Callable[..., Any]) -> None:
    step = zoo_step("keras_mixed_float16", "infer", BATCH)
    traced = trace.trace_step(step, meta={})
    conv = max(b.nbytes for b in traced.blocks if b.alloc_op >= 0)
    assert conv == bfc_round(BATCH * 32 * 32 * 32 * 2)  # the first conv's float16 output


def test_estimate_allocates_nothing_batch_sized(zoo_step: Callable[..., Any]) -> None:
    step = zoo_step("keras_two_branch_cnn", "train", 512)
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    traced = trace.trace_step(step, meta={})
    assert tf.config.experimental.get_memory_info("CPU:0")["current"] - before < 1 << 20
    assert max(b.nbytes for b in traced.blocks) >= 512 * 32 * 32 * 32 * 4


def test_wrong_input_shape_is_a_trace_error() -> None:
    model, x, y, loss = FACTORIES["keras_mlp"](BATCH)
    step = prepare(model, x, y, mode="train", optimizer="adam", loss=loss)
    bad = type(step)(step.model, np.zeros((BATCH, 100), "float32"), y, "train", BATCH)
    with pytest.raises(TraceError, match="rejected inputs"):
        trace.trace_step(bad, meta={})


def test_recurrent_estimates_say_the_default_executor_can_peak_higher() -> None:
    import nnmem

    lstm = nnmem.estimate("keras_lstm", mode="infer", batch=BATCH)
    mlp = nnmem.estimate("keras_mlp", mode="infer", batch=BATCH)
    assert any("while-loop iterations concurrently" in n for n in lstm.notes)
    assert not any("while-loop" in n for n in mlp.notes)


def test_estimates_say_which_schedule_they_model() -> None:
    import nnmem

    report = nnmem.estimate("keras_mlp", mode="train", batch=BATCH)
    assert any(n.startswith("schedule:") and "construction order" in n for n in report.notes)
    assert any(n.startswith("BFC layout:") for n in report.notes)


def test_initializer_temporaries_follow_each_variables_initializer() -> None:
    model = FACTORIES["keras_lstm"](BATCH)[0]
    temps = trace._initializer_temporaries(model)
    embedding, lstm = model.layers[0], model.layers[1].cell  # Keras numbers layer names per process: no paths
    assert temps[id(embedding.embeddings)] == trace.RANDOM_INITIALIZER_TEMPORARIES  # RandomUniform
    assert temps[id(lstm.kernel)] == trace.RANDOM_INITIALIZER_TEMPORARIES  # GlorotUniform
    assert temps[id(lstm.recurrent_kernel)] == 0  # Orthogonal: not calibrated
    assert temps[id(lstm.bias)] == 0


def test_a_loop_casting_its_weights_every_iteration_widens_the_high_end() -> None:
    """keras_lstm under mixed_float16: each of the loop's 32 iterations in flight casts the 128 x 512 recurrent
    kernel (131,072 B), in a BFC chunk of up to twice that (plain predict_on_batch runs measured 5.6-7.6 MB where
    the high end without the chunks was 5.78 MB: docs/backends/keras-tensorflow.md). The float32 step has no such
    cast."""
    import keras

    def traced(policy: str) -> Any:
        keras.config.set_dtype_policy(policy)
        try:
            model, x, y, loss = FACTORIES["keras_lstm"](BATCH)
        finally:
            keras.config.set_dtype_policy("float32")
        return trace.trace_step(prepare(model, x, y, mode="infer", optimizer=None, loss=loss), meta={})

    assert "loop_casts" not in traced("float32").meta
    mixed = traced("mixed_float16").meta
    assert "up to 32 iterations run at once, each holding a 131,072 B copy" in str(mixed["loop_casts"])
    assert int(mixed["peak_high"]) >= 32 * 2 * 131_072  # every copy in a chunk of up to twice its size
