"""Loads ``benchmarks/calibrate_workspace.py`` once as the module ``calibrate_workspace``, for the tests that
measure kernels op by op (``import calibrate_workspace as calibrate``): benchmarks/ is not a package."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

if "calibrate_workspace" not in sys.modules:
    _spec = importlib.util.spec_from_file_location(
        "calibrate_workspace", Path(__file__).resolve().parents[3] / "benchmarks" / "calibrate_workspace.py")
    assert _spec is not None and _spec.loader is not None
    _module = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = _module
    _spec.loader.exec_module(_module)
