"""The TensorFlow op schedule: construction order, mergeable kernels back to back, and the pinned chain."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

if os.environ.get("KERAS_BACKEND") != "tensorflow":
    pytest.skip("needs KERAS_BACKEND=tensorflow", allow_module_level=True)

from nnmem.frontends.keras.tensorflow import schedule, trace  # noqa: E402

BATCH = 8


def _traced_graph(step: Any) -> Any:
    cf, _ = trace._concrete(step)
    return cf.graph


def test_execution_order_runs_mergeable_kernels_back_to_back(zoo_step: Callable[..., Any]) -> None:
    graph = _traced_graph(zoo_step("keras_separable_cnn", "train", BATCH))
    order = schedule.execution_order(graph, schedule.reachable(graph))
    position = {op.name: i for i, op in enumerate(order)}
    assert len(order) == len(position) == len(schedule.reachable(graph))
    for i, op in enumerate(order):  # topological
        assert all(position[t.op.name] < i for t in op.inputs), op.name
        assert all(position[c.name] < i for c in op.control_inputs), op.name
    pairs = 0
    for op in order:
        if op.type == "BiasAdd" and op.inputs[0].op.type == "Conv2D":
            assert position[op.name] == position[op.inputs[0].op.name] + 1, op.name
            pairs += 1
        if op.type == "BiasAddGrad":
            filters = [c for c in op.inputs[0].consumers() if c.type == "Conv2DBackpropFilter"]
            assert all(abs(position[f.name] - position[op.name]) == 1 for f in filters), op.name
            pairs += len(filters)
    assert pairs == 6  # three separable convolutions: forward bias adds and backward bias gradients


def test_pin_leaves_the_executor_one_order(zoo_step: Callable[..., Any]) -> None:
    graph = _traced_graph(zoo_step("keras_mlp", "train", BATCH))
    schedule.pin(graph)
    chain = [op for op in schedule.execution_order(graph, schedule.reachable(graph))
             if op.type not in schedule.UNPINNED]
    for before, op in zip(chain, chain[1:]):
        assert before in op.control_inputs or any(t.op is before for t in op.inputs), (before.name, op.name)
