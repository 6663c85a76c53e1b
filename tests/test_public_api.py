"""The public surface: a small __all__, no framework imported by importing nnmem, every result JSON-ready."""

from __future__ import annotations

import subprocess
import sys

import nnmem


def test_importing_nnmem_and_its_cli_imports_no_framework() -> None:
    code = ("import sys, nnmem, nnmem.cli, nnmem.optimizers; "
            "print(sorted(m for m in ('torch', 'keras', 'tensorflow', 'jax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_all_names_exist_and_no_function_shadows_a_subpackage() -> None:
    import importlib.util

    for name in nnmem.__all__:
        assert hasattr(nnmem, name), name
        if callable(getattr(nnmem, name)) and not isinstance(getattr(nnmem, name), type):
            assert importlib.util.find_spec(f"nnmem.{name}") is None, f"nnmem.{name} is both a function and a module"
    assert "resolve_budget" not in nnmem.__all__


def test_every_public_result_has_to_dict() -> None:
    for name in ("Report", "Comparison", "FitResult", "Fits", "BatchCurve", "Explanation", "ModeFigures", "Device"):
        assert callable(getattr(getattr(nnmem, name), "to_dict", None)), name


def test_report_json_carries_the_parameter_totals() -> None:
    data = nnmem.estimate("mlp", batch=4).to_dict()
    assert (data["parameters"], data["parameter_bytes"]) == (41_802, 167_208)  # DESIGN.md's classic example
