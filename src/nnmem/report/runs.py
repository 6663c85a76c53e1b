"""Several measurements of one step, each in its own fresh process, summarised by their median run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from nnmem.report.model import Report

__all__ = ["MAX_RUNS", "median_run"]

MAX_RUNS = 50
"""Most fresh processes one ``measure(runs=...)`` call starts (each imports its framework: seconds apiece)."""


def median_run(reports: Sequence[Report]) -> Report:
    """The run whose peak is the median of ``reports`` (the lower median for an even count), with the spread.

    An actual run is returned, not averaged figures, so its breakdown still sums to its peak. Its ``meta`` gains
    ``runs`` (how many), ``runs_peaks`` (each run's ``peak_bytes``, in run order, in bytes) and ``runs_peak_min``
    / ``runs_peak_max`` (in bytes); a note states the spread. Why several processes: a peak can depend on the process
    as well as on the step — TensorFlow's BFC allocator fits a step's tensors into the holes the setup left,
    which move by a chunk or two between processes (keras_separable_cnn infer: 3,043,840 or 3,142,144 B), and a
    JAX step's malloc high-water mark takes two values on some models (keras_partly_frozen infer).

    Example:
        >>> # median_run([measure(m, x) for _ in range(5)]).meta["runs_peak_max"]

    Raises:
        ValueError: ``reports`` is empty.
    """
    if not reports:
        raise ValueError("median_run needs at least one report")
    if len(reports) == 1:
        return reports[0]
    peaks = [r.peak_bytes for r in reports]
    order = sorted(range(len(reports)), key=lambda i: peaks[i])
    chosen = reports[order[(len(order) - 1) // 2]]
    low, high = min(peaks), max(peaks)
    spread = (high - low) / chosen.peak_bytes if chosen.peak_bytes else 0.0
    note = (f"median of {len(reports)} runs, each in a fresh process: {chosen.level} peaks "
            f"{', '.join(f'{p:,}' for p in peaks)} B (spread {spread:.1%} of the median)")
    meta = {**chosen.meta, "runs": len(reports), "runs_peaks": peaks, "runs_peak_min": low, "runs_peak_max": high}
    return replace(chosen, notes=(*chosen.notes, note), meta=meta)
