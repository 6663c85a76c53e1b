"""Loads ``benchmarks/calibrate_workspace.py`` once as the module ``calibrate_workspace``, for the tests that
measure kernels op by op (``import calibrate_workspace as calibrate``): benchmarks/ is not a package; and
``test_conv_avx2`` for the AVX2 tests that reuse its capped child (``from test_conv_avx2 import _on_avx2``). The
``torch_threads`` fixture sets torch's thread count inside a test and restores it after."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch


def _load(name: str, path: Path) -> None:
    """Import the file ``path`` once as the module ``name``."""
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


_load("calibrate_workspace", Path(__file__).resolve().parents[3] / "benchmarks" / "calibrate_workspace.py")
# the capped-child helper of the AVX2 tests (``from test_conv_avx2 import _on_avx2``): tests are not a package
_load("test_conv_avx2", Path(__file__).resolve().parent / "test_conv_avx2.py")


@pytest.fixture
def torch_threads() -> Iterator[Callable[[int], None]]:
    """``torch.set_num_threads`` for the test; the count before it is restored after it."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)
