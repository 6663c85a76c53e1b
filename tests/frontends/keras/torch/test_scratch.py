"""The Keras torch backend's op rules are PyTorch's CPU rules, and a fake trace applies them."""

from __future__ import annotations

import os

import pytest

if os.environ.get("KERAS_BACKEND") != "torch":
    pytest.skip("needs KERAS_BACKEND=torch", allow_module_level=True)

from collections.abc import Callable
from typing import Any

from nnmem.frontends.keras.torch import scratch
from nnmem.frontends.keras.torch.trace import trace_step
from nnmem.frontends.pytorch import workspace


def test_rules_are_pytorchs_and_fresh_per_trace() -> None:
    first, second = scratch.rules(), scratch.rules()
    assert isinstance(first, workspace.WorkspaceRules) and first is not second  # notes never pile up


def test_fake_trace_counts_onednn_convolution_scratch(zoo_step: Callable[..., Any]) -> None:
    trace = trace_step(zoo_step("keras_conv1d_gru", "train"), meta={})
    scratch_by_op = {op.name: op.workspace for op in trace.ops if op.workspace > 0}
    assert {"aten.convolution.default", "aten.convolution_backward.default"} <= set(scratch_by_op)
