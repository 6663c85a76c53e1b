"""The measuring child process: the caller survives its death, and it never inherits a stuck thread pool."""

from __future__ import annotations

import os
import signal

import pytest

torch = pytest.importorskip("torch")

from nnmem.errors import MeasureError  # noqa: E402
from nnmem.runner.child import run_in_child  # noqa: E402


def test_child_runs_after_the_caller_used_openmp() -> None:
    """A plain fork after a parallel MKL matmul hangs in libgomp; the fork server's child does not."""
    a = torch.randn(768, 768)
    for _ in range(3):
        a = torch.tanh(a @ a)

    def work() -> float:
        b = torch.randn(512, 512)
        return float((b @ b).abs().sum())

    assert run_in_child(work, timeout_s=60) > 0


def test_closure_and_lambda_travel_to_the_child() -> None:
    scale = 3
    assert run_in_child(lambda: scale * 7, timeout_s=60) == 21


def test_child_killed_is_reported() -> None:
    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    with pytest.raises(MeasureError, match="SIGKILL"):
        run_in_child(die, timeout_s=60)


def test_child_exception_is_a_measure_error() -> None:
    def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(MeasureError, match="ValueError: boom"):
        run_in_child(fail, timeout_s=60)


def test_child_timeout_kills_it() -> None:
    import time

    with pytest.raises(MeasureError, match="did not finish"):
        run_in_child(lambda: time.sleep(30), timeout_s=2)
