"""median_run: several measured reports of one step summarised by their median run."""

from __future__ import annotations

import pytest

from nnmem.report.model import Report
from nnmem.report.runs import median_run


def _report(peak: int, tag: str) -> Report:
    return Report(source="measure", framework="keras-tensorflow", model="m", mode="train", optimizer="adam",
                  device="cpu", level="allocator", peak_bytes=peak, peaks={"tensor": peak - 10, "allocator": peak},
                  breakdown={"parameters": 10, "kernel workspace": peak - 10}, meta={"tag": tag})


def test_the_median_run_is_an_actual_run_with_every_peak() -> None:
    runs = [_report(300, "a"), _report(100, "b"), _report(200, "c"), _report(900, "d"), _report(250, "e")]
    chosen = median_run(runs)
    assert chosen.meta["tag"] == "e" and chosen.peak_bytes == 250
    assert sum(chosen.breakdown.values()) == chosen.peak_bytes  # the run's own breakdown, untouched
    assert chosen.meta["runs_peaks"] == [300, 100, 200, 900, 250]
    assert (chosen.meta["runs_peak_min"], chosen.meta["runs_peak_max"]) == (100, 900)
    assert "median of 5 runs" in chosen.notes[-1] and "320.0%" in chosen.notes[-1]  # (900 - 100) / 250


def test_even_count_takes_the_lower_median_and_one_run_is_unchanged() -> None:
    assert median_run([_report(400, "a"), _report(100, "b")]).meta["tag"] == "b"
    single = _report(123, "only")
    assert median_run([single]) is single


def test_round_trips_through_json() -> None:
    chosen = median_run([_report(300, "a"), _report(100, "b"), _report(200, "c")])
    assert Report.from_dict(chosen.to_dict()) == chosen


def test_no_reports_is_an_error() -> None:
    with pytest.raises(ValueError):
        median_run([])


def test_measure_says_which_run_it_is_in() -> None:
    import nnmem

    said: list[str] = []
    report = nnmem.measure("mlp", batch=4, runs=2, progress=said.append)
    assert said == ["measuring in a child process (run 1 of 2)", "measuring in a child process (run 2 of 2)"]
    assert report.source == "measure"
