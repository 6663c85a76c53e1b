"""The TensorFlow graph replay: while-loop gradient accumulators and nested function calls."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

if os.environ.get("KERAS_BACKEND") != "tensorflow":
    pytest.skip("needs KERAS_BACKEND=tensorflow", allow_module_level=True)

from nnmem.frontends.keras.tensorflow import replay, trace  # noqa: E402

BATCH = 8


def test_call_depth_counts_nested_function_calls(zoo_step: Callable[..., Any]) -> None:
    assert trace.trace_step(zoo_step("keras_mlp", "infer", BATCH), meta={}).meta["call_depth"] == 0
    depth = trace.trace_step(zoo_step("keras_mixed_float16", "train", BATCH), meta={}).meta["call_depth"]
    assert isinstance(depth, int) and depth >= 1  # the loss-scale optimizer's tf.cond


def test_rnn_gradient_accumulators_keep_each_recomputed_state(zoo_step: Callable[..., Any]) -> None:
    step = zoo_step("keras_lstm", "train", BATCH)
    cf, _ = trace._concrete(step)
    functions = replay.functions_of(cf.graph)
    loop = next(o for o in cf.graph.get_operations()
                if o.type in replay.WHILES and not o.name.startswith("gradient_tape/"))
    body = functions[loop.get_attr("body").name].graph
    graph_replay = replay.Replay(functions)
    state = BATCH * 128 * 4  # h and c: (8, 128) float32
    kept = {}
    for k, out in enumerate(body.outputs):
        if out.op.type == "TensorListPushBack":
            pushed = out.op.inputs[1]
            key = (pushed.op.type, replay._carried_state(body, pushed), pushed.shape.rank)
            kept[key] = graph_replay._accumulated(loop, k)
    assert kept[("Placeholder", True, 2)] == 31 * state  # 32 tokens: the first state is the loop's input
    assert kept[("Placeholder", True, 0)] == 31 * 256  # the time counter: a 256 B chunk per iteration
    assert kept[("ReadVariableOp", False, 2)] == 0  # the kernel read each iteration is the variable itself
    assert kept[("TensorListGetItem", False, 2)] == 0  # x_t: an element of the input list, already held
    assert kept[("Tanh", False, 2)] == 32 * state
