"""Loads ``benchmarks/calibrate_workspace.py`` once as the module ``calibrate_workspace``, for the tests that
measure kernels op by op (``import calibrate_workspace as calibrate``): benchmarks/ is not a package. The
``torch_threads`` fixture sets torch's thread count inside a test and restores it after."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

if "calibrate_workspace" not in sys.modules:
    _spec = importlib.util.spec_from_file_location(
        "calibrate_workspace", Path(__file__).resolve().parents[3] / "benchmarks" / "calibrate_workspace.py")
    assert _spec is not None and _spec.loader is not None
    _module = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = _module
    _spec.loader.exec_module(_module)


@pytest.fixture
def torch_threads() -> Iterator[Callable[[int], None]]:
    """``torch.set_num_threads`` for the test; the count before it is restored after it."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)
