"""The nnmem command line: output of the happy paths, and one line on stderr with exit 2 for every mistake."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import nnmem
from nnmem.cli import cli

# --- helpers -------------------------------------------------------------------------------------------


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def assert_one_line_error(stderr: str, *needles: str, prefix: str = "nnmem: error: ") -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{stderr}"
    line = lines[0]
    assert line.startswith(prefix), line
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    return line


def assert_user_error(result: Result, *needles: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert result.stdout == "", result.stdout
    return assert_one_line_error(result.stderr, *needles)


def run_module(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
               timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nnmem", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def write(tmp_path: Path, name: str, source: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return str(path)


MODEL_ONLY = """
    import torch

    def make(batch):
        return torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
"""

BROKEN_FACTORIES = """
    import torch

    def raises(batch):
        raise RuntimeError("no weights here")

    def string(batch):
        return "a model, honestly"

    def five(batch):
        return (torch.nn.Linear(2, 2), torch.zeros(batch, 2), None, None, "extra")

    not_callable = 42
"""

KILLED_WHEN_REAL = """
    import os
    import signal

    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    class DiesWhenRun(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            # Tracing sees fake (or meta) tensors; only the measuring child runs with real ones.
            if not isinstance(x, FakeTensor) and not x.is_meta:
                os.kill(os.getpid(), signal.SIGKILL)
            return self.lin(x)

    def make(batch):
        return DiesWhenRun(), torch.zeros(batch, 4)
"""

BLOCK_TORCH = """
    import importlib.abc
    import sys

    class BlockTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    for mod in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
        del sys.modules[mod]
    sys.meta_path.insert(0, BlockTorch())

    from nnmem.cli import main

    main(["estimate", "mlp"])
"""

# --- happy paths ---------------------------------------------------------------------------------------


def test_estimate_mlp_shows_parameters_and_breakdown() -> None:
    result = invoke("estimate", "mlp", "--batch", "32")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "41,802" in out
    assert "167,208" in out or "163.29 KiB" in out
    assert "128·256 + 128 = 32,896" in out
    for category in ("parameters", "gradients", "inputs"):
        assert category in out
    assert "peak (allocator level)" in out
    assert out.count("IEC units (1 KiB = 1024 B)") == 1
    assert result.stderr == ""


def test_estimate_json_is_only_json_and_breakdown_sums_to_peak() -> None:
    result = invoke("estimate", "mlp", "--batch", "32", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["peak_bytes"] == sum(data["breakdown"].values())
    assert sum(row["parameters"] for row in data["layers"]) == 41_802
    assert data["batch"] == 32
    assert "budget_bytes" not in data


def test_estimate_infer_with_adam_is_case_insensitive() -> None:
    result = invoke("estimate", "mlp", "--mode", "INFER", "--optimizer", "Adam", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["mode"] == "infer"
    assert "gradients" not in data["breakdown"]


def test_budget_too_small_does_not_fit() -> None:
    result = invoke("estimate", "mlp", "--budget", "1KiB")
    assert result.exit_code == 0, result.output
    assert "does NOT fit in 1.00 KiB" in result.stdout
    assert "short by" in result.stdout


def test_budget_large_fits() -> None:
    result = invoke("estimate", "mlp", "--budget", "16GiB")
    assert result.exit_code == 0, result.output
    assert "fits in 16.00 GiB with" in result.stdout
    assert "headroom" in result.stdout


def test_budget_in_json() -> None:
    small = json.loads(invoke("estimate", "mlp", "--budget", "1KiB", "--json").stdout)
    large = json.loads(invoke("estimate", "mlp", "--budget", "16 GB", "--json").stdout)
    assert (small["budget_bytes"], small["fits"]) == (1024, False)
    assert (large["budget_bytes"], large["fits"]) == (16 * 10**9, True)


def test_measure_mlp_shows_estimated_and_measured() -> None:
    result = invoke("measure", "mlp", "--batch", "8")
    assert result.exit_code == 0, result.output
    assert "estimated" in result.stdout
    assert "measured" in result.stdout
    assert "peak (allocator)" in result.stdout
    assert "error" in result.stdout


def test_measure_json_is_the_comparison() -> None:
    result = invoke("measure", "mlp", "--batch", "8", "--json", "--budget", "16GiB")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["estimated"]["source"] == "estimate"
    assert data["measured"]["source"] == "measure"
    assert any(row["field"] == "peak (allocator)" for row in data["rows"])
    assert data["fits"] is True


def test_measure_runs_reports_the_median_run_and_every_peak() -> None:
    result = invoke("measure", "mlp", "--batch", "8", "--json", "--runs", "3")
    assert result.exit_code == 0, result.output
    measured = json.loads(result.stdout)["measured"]
    peaks = measured["meta"]["runs_peaks"]
    assert len(peaks) == 3 and measured["meta"]["runs"] == 3
    assert measured["peak_bytes"] == sorted(peaks)[1]
    assert any("median of 3 runs" in note for note in measured["notes"])


@pytest.mark.parametrize("runs", ["0", "x", "51"])
def test_bad_runs(runs: str) -> None:
    assert_user_error(invoke("measure", "mlp", "--runs", runs), "--runs")


def test_bad_runs_in_the_api() -> None:
    with pytest.raises(nnmem.ConfigError, match="runs"):
        nnmem.measure("mlp", batch=2, runs=0)


def test_examples_lists_mlp() -> None:
    result = invoke("examples")
    assert result.exit_code == 0, result.output
    assert "mlp" in result.stdout.split()


def test_model_file_with_input_shape(tmp_path: Path) -> None:
    spec = write(tmp_path, "model_only.py", MODEL_ONLY) + ":make"
    result = invoke("estimate", spec, "--input-shape", "8", "--batch", "4", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["batch"] == 4


def test_help_and_version_exit_zero() -> None:
    assert invoke("--help").exit_code == 0
    assert "--input-shape" in invoke("estimate", "--help").stdout
    version = invoke("--version")
    assert version.exit_code == 0 and nnmem.__version__ in version.stdout


# --- user mistakes: exit 2, one line ------------------------------------------------------------------


def test_wrong_input_shape_is_a_trace_error() -> None:
    assert_user_error(invoke("estimate", "mlp", "--input-shape", "3,4"), "rejected")


@pytest.mark.parametrize("shape", ["3x32", "0,4", "", "3,,4", "-1,2", "2.5"])
def test_malformed_input_shape(shape: str) -> None:
    assert_user_error(invoke("estimate", "mlp", "--input-shape", shape), "--input-shape", "3,32,32")


@pytest.mark.parametrize("batch", ["0", "-1", "-3", "2.5", "abc", ""])
def test_bad_batch(batch: str) -> None:
    assert_user_error(invoke("estimate", "mlp", "--batch", batch), "--batch", "positive integer")


def test_unknown_optimizer() -> None:
    assert_user_error(invoke("estimate", "mlp", "--optimizer", "lamb"), "--optimizer", "lamb", "adam")


def test_keras_only_optimizer_on_a_torch_model_is_a_clear_error() -> None:
    assert_user_error(invoke("estimate", "mlp", "--optimizer", "lion"), "unknown optimizer 'lion'", "torch.optim")


def test_unknown_mode() -> None:
    assert_user_error(invoke("estimate", "mlp", "--mode", "eval"), "--mode", "eval", "infer")


@pytest.mark.parametrize("budget", ["16 gigs", "", "-1GiB", "0"])
def test_malformed_budget(budget: str) -> None:
    assert_user_error(invoke("estimate", "mlp", "--budget", budget), "--budget")


def test_unknown_device() -> None:
    assert_user_error(invoke("estimate", "mlp", "--device", "A100-81GB"), "A100-81GB")


def test_non_cuda_catalog_device_is_unsupported() -> None:
    assert_user_error(invoke("estimate", "mlp", "--device", "TPU-v4"), "TPU")


def test_click_usage_errors_are_one_line() -> None:
    assert_user_error(invoke("estimate"), "MODEL")
    assert_user_error(invoke("estimate", "mlp", "--bach", "3"), "--bach")
    assert_user_error(invoke("estimate", "mlp", "--batch"), "--batch")
    assert_user_error(invoke("frobnicate"), "frobnicate")


def test_missing_file(tmp_path: Path) -> None:
    assert_user_error(invoke("estimate", str(tmp_path / "nofile.py") + ":f"), "not found", "nofile.py")


def test_file_without_the_factory(tmp_path: Path) -> None:
    path = write(tmp_path, "broken.py", BROKEN_FACTORIES)
    assert_user_error(invoke("estimate", f"{path}:absent"), "absent", "not found")
    assert_user_error(invoke("estimate", f"{path}:not_callable"), "not_callable", "not callable")


def test_factory_that_raises(tmp_path: Path) -> None:
    path = write(tmp_path, "broken.py", BROKEN_FACTORIES)
    assert_user_error(invoke("estimate", f"{path}:raises"), "RuntimeError", "no weights here")


def test_factory_that_returns_a_string(tmp_path: Path) -> None:
    path = write(tmp_path, "broken.py", BROKEN_FACTORIES)
    assert_user_error(invoke("estimate", f"{path}:string"), "torch.nn.Module", "str")


def test_factory_that_returns_a_five_tuple(tmp_path: Path) -> None:
    path = write(tmp_path, "broken.py", BROKEN_FACTORIES)
    assert_user_error(invoke("estimate", f"{path}:five"), "tuple of 5")


def test_model_only_factory_needs_an_input_shape(tmp_path: Path) -> None:
    spec = write(tmp_path, "model_only.py", MODEL_ONLY) + ":make"
    assert_user_error(invoke("estimate", spec), "--input-shape")


def test_file_that_fails_to_import(tmp_path: Path) -> None:
    path = write(tmp_path, "syntax.py", "def make(batch):\n    return (\n")
    assert_user_error(invoke("estimate", f"{path}:make"), "SyntaxError")


def test_unknown_builtin_name() -> None:
    assert_user_error(invoke("estimate", "no_such_model"), "no_such_model", "mlp")


def test_unknown_module_spec() -> None:
    assert_user_error(invoke("estimate", "no_such_package_xyz.models:make"), "no_such_package_xyz")


# --- interruption and internal errors -----------------------------------------------------------------


def _raiser(exc: BaseException):  # type: ignore[no-untyped-def]
    def fn(*args: object, **kwargs: object) -> None:
        raise exc

    return fn


def test_keyboard_interrupt_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nnmem, "estimate", _raiser(KeyboardInterrupt()))
    result = invoke("estimate", "mlp")
    assert result.exit_code == 130
    assert_one_line_error(result.stderr, "interrupted", prefix="nnmem: ")


def test_internal_error_exits_1_and_asks_for_a_report(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NNMEM_DEBUG", raising=False)
    monkeypatch.setattr(nnmem, "estimate", _raiser(ZeroDivisionError("oops")))
    result = invoke("estimate", "mlp")
    assert result.exit_code == 1
    assert_one_line_error(result.stderr, "ZeroDivisionError: oops", "please report", prefix="nnmem: internal error: ")


def test_debug_env_re_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NNMEM_DEBUG", "1")
    monkeypatch.setattr(nnmem, "estimate", _raiser(ZeroDivisionError("oops")))
    result = invoke("estimate", "mlp")
    assert isinstance(result.exception, ZeroDivisionError)


# --- real processes: exit codes and stderr as a user sees them ----------------------------------------


def test_subprocess_trace_error_is_one_line() -> None:
    proc = run_module("estimate", "mlp", "--input-shape", "3,4")
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert_one_line_error(proc.stderr, "rejected")


def test_subprocess_missing_file_is_one_line(tmp_path: Path) -> None:
    proc = run_module("estimate", "nofile.py:f", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert_one_line_error(proc.stderr, "nofile.py")


def test_subprocess_bad_batch_is_one_line() -> None:
    proc = run_module("estimate", "mlp", "--batch", "0")
    assert proc.returncode == 2, proc.stderr
    assert_one_line_error(proc.stderr, "--batch")


def test_subprocess_estimate_json() -> None:
    proc = run_module("estimate", "mlp", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["peak_bytes"] == sum(data["breakdown"].values())


def test_missing_framework_names_the_extra(tmp_path: Path) -> None:
    bootstrap = write(tmp_path, "no_torch.py", BLOCK_TORCH)
    proc = subprocess.run([sys.executable, bootstrap], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert_one_line_error(proc.stderr, "pip install 'nnmem[torch]'")


def test_measuring_child_killed_by_sigkill(tmp_path: Path) -> None:
    spec = write(tmp_path, "dies.py", KILLED_WHEN_REAL) + ":make"
    assert invoke("estimate", spec).exit_code == 0  # tracing never runs the model for real
    result = invoke("measure", spec, "--batch", "2")
    assert_user_error(result, "SIGKILL")
    proc = run_module("measure", spec, "--batch", "2")
    assert proc.returncode == 2, proc.stderr
    assert_one_line_error(proc.stderr, "SIGKILL")


# --- fit, explain, devices ----------------------------------------------------------------------------


def test_fit_answers_exactly_against_real_measurements() -> None:
    budget = 8 * 2**20
    result = invoke("fit", "mlp", "--budget", "8MiB", "--optimizer", "adam", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["level"] == "allocator"
    for mode in ("train", "infer"):
        b = data[mode]["batch"]
        assert b > 1
        at_b = nnmem.measure("mlp", batch=b, mode=mode, optimizer="adam").peaks["allocator"]
        at_next = nnmem.measure("mlp", batch=b + 1, mode=mode, optimizer="adam").peaks["allocator"]
        assert at_b <= budget < at_next, (mode, b, at_b, at_next)
    assert data["infer"]["batch"] > data["train"]["batch"]


def test_fit_table_shows_both_modes() -> None:
    result = invoke("fit", "mlp", "--budget", "8MiB")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "largest batch that fits 8.00 MiB (allocator level)" in out
    assert "train" in out and "infer" in out
    assert "inference fits" in out


def test_fit_on_a_catalog_device() -> None:
    result = invoke("fit", "vgg", "--device", "T4", "--mode", "train", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["train"]["budget_bytes"] == nnmem.get_device("T4").usable_bytes
    assert data["train"]["peak_bytes"] <= data["train"]["budget_bytes"] < data["train"]["next_peak_bytes"]


def test_fit_needs_exactly_one_budget() -> None:
    assert_user_error(invoke("fit", "mlp"), "--budget")
    assert_user_error(invoke("fit", "mlp", "--budget", "1GiB", "--device", "A100-80GB"), "not both")
    assert_user_error(invoke("fit", "mlp", "--budget", "16 gigs"), "--budget")
    assert_user_error(invoke("fit", "mlp", "--device", "A100-81GB"), "A100-81GB")


def _measured_slope(model: str, mode: str, b1: int, b2: int) -> float:
    p1 = nnmem.measure(model, batch=b1, mode=mode).peaks["allocator"]
    p2 = nnmem.measure(model, batch=b2, mode=mode).peaks["allocator"]
    return (p2 - p1) / (b2 - b1)


LARGE_BATCHES = {"mlp": (1024, 2048), "vgg": (64, 128)}


@pytest.mark.parametrize("model", ["mlp", "vgg"])
def test_explain_figures_match_real_measurements(model: str) -> None:
    result = invoke("explain", model, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    params = sum(row["parameter_bytes"] for row in nnmem.estimate(model, batch=2).to_dict()["layers"])
    assert data["gradient_bytes"] == params  # gradients are the size of the parameters, whatever the batch
    assert "gradients" not in data["train"]["per_sample_by_category"]
    assert data["train"]["per_sample_by_category"].get("saved activations", 0) > 0
    assert "saved activations" not in data["infer"]["per_sample_by_category"]
    assert data["train"]["per_sample_bytes"] > data["infer"]["per_sample_bytes"] > 0
    for mode in ("train", "infer"):  # at large batches, where the steepest segment decides the peak
        measured = _measured_slope(model, mode, *LARGE_BATCHES[model])
        assert abs(data[mode]["per_sample_bytes"] - measured) <= 0.02 * measured, (mode, measured, data[mode])


def test_explain_mlp_gradients_are_the_seed_arithmetic() -> None:
    data = json.loads(invoke("explain", "mlp", "--json").stdout)
    assert data["gradient_bytes"] == ((256 * 128 + 128) + (128 * 64 + 64) + (64 * 10 + 10)) * 4


def test_explain_prose_names_the_misconception() -> None:
    result = invoke("explain", "mlp", "--budget", "8MiB")
    assert result.exit_code == 0, result.output
    out = " ".join(result.stdout.split())  # prose wraps at the terminal width
    assert "does not store a gradient per sample" in out
    assert "163.29 KiB" in out  # 167,208 B of gradients
    assert "Within 8.00 MiB: training fits batch" in out


def test_devices_cite_sources() -> None:
    result = invoke("devices", "--json")
    assert result.exit_code == 0, result.output
    catalog = {d["name"]: d for d in json.loads(result.stdout)}
    for name in ("T4", "A100-80GB", "H100-80GB", "H200", "TPU-v5e"):
        assert name in catalog, sorted(catalog)
    assert all(d["source"] for d in catalog.values())
    assert catalog["A100-80GB"]["usable_bytes"] == catalog["A100-80GB"]["memory_bytes"] - \
        catalog["A100-80GB"]["context_bytes"]
    table = invoke("devices").stdout
    assert "A100-80GB" in table and "source" in table


BATCH_IGNORED = """
    import torch

    def make(batch):  # the batch is ignored: the step is the same at every batch size
        return torch.nn.Linear(8, 4), torch.zeros(3, 8)
"""


@pytest.mark.parametrize("command", ["fit", "explain"])
def test_memory_that_does_not_grow_with_the_batch_is_one_line(tmp_path: Path, command: str) -> None:
    """A factory that ignores its batch: no largest batch exists, so the search refuses rather than answer."""
    spec = write(tmp_path, "fixed.py", BATCH_IGNORED) + ":make"
    proc = run_module(command, spec, "--budget", "1GiB")
    assert proc.returncode == 2, proc.stderr
    assert_one_line_error(proc.stderr, "does not grow with the batch")


def test_progress_is_silent_with_json_and_when_stderr_is_not_a_terminal() -> None:
    from nnmem import cli as cli_module

    with cli_module._progress(as_json=True) as progress:
        assert progress is None
    with cli_module._progress() as progress:  # pytest captures stderr: not a terminal
        assert progress is None


def test_no_color_is_accepted_anywhere_and_output_is_plain_off_a_terminal() -> None:
    for args in (["--no-color", "estimate", "mlp"], ["estimate", "mlp", "--no-color"]):
        result = invoke(*args)
        assert result.exit_code == 0, result.output
        assert "\x1b[" not in result.output and "by category" in result.output


def test_colour_only_inside_colored() -> None:
    from nnmem.report.text import colored, render_report

    report = nnmem.estimate("mlp", batch=4)
    with colored():
        painted = render_report(report)
    plain = render_report(report)
    assert "\x1b[" in painted and "\x1b[" not in plain
    assert re.sub(r"\x1b\[[0-9;]*m", "", painted).split() == plain.split()  # the same text, only painted


@pytest.mark.parametrize("args", [
    ("estimate", "mlp"), ("estimate", "gpt", "--batch", "2"), ("fit", "mlp", "--budget", "1GiB"),
    ("explain", "mlp", "--budget", "1GiB"), ("whatif", "gpt", "--batch", "2", "--budget", "64MiB", "--checkpoint",
                                             "blocks", "--technique", "accumulate:2"),
    ("devices",), ("examples",), ("measure", "mlp", "--batch", "4"),
])
def test_every_command_fits_80_columns_without_cutting_a_figure(args: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli, list(args), env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    widest = max(result.stdout.splitlines(), key=len)
    assert len(widest) <= 80, widest
    assert "…" not in result.stdout  # rich's mark of a cell cut short
