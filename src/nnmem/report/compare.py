"""Estimated next to measured, field by field."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from nnmem.report.model import Report

__all__ = ["ComparisonRow", "Comparison", "compare", "relative_error"]


def relative_error(estimated: int, measured: int) -> float:
    """Signed error of an estimate, as a fraction of the measurement (0.01 = 1 % high)."""
    if measured == 0:
        return 0.0 if estimated == 0 else float("inf")
    return (estimated - measured) / measured


@dataclass(frozen=True, slots=True)
class ComparisonRow:
    """One compared figure: ``field`` is e.g. "peak (allocator)" or a category name; bytes are ints."""

    field: str
    estimated: int
    measured: int

    @property
    def error(self) -> float:
        """Signed relative error of the estimate (fraction of the measurement)."""
        return relative_error(self.estimated, self.measured)


@dataclass(frozen=True, slots=True)
class Comparison:
    """An estimate and a measurement of the same step, lined up."""

    estimated: Report
    measured: Report
    rows: tuple[ComparisonRow, ...]

    def __repr__(self) -> str:
        return (f"Comparison({self.measured.model}: estimated {self.estimated.peak_bytes:,} B, measured "
                f"{self.measured.peak_bytes:,} B at the {self.measured.level} level)")

    def _repr_html_(self) -> str | None:
        """The charts, in a notebook (None without Plotly: the plain repr)."""
        from nnmem.report.output import repr_html

        return repr_html(self)

    def row(self, field: str) -> ComparisonRow:
        """The row for ``field`` (KeyError if absent)."""
        for row in self.rows:
            if row.field == field:
                return row
        raise KeyError(field)

    def to_dict(self, *, budget_bytes: int | None = None) -> dict[str, Any]:
        """A JSON-ready dict (strict JSON: an error that is not finite is None); with ``budget_bytes``, whether
        the measured peak fits it."""
        data: dict[str, Any] = {
            "estimated": self.estimated.to_dict(),
            "measured": self.measured.to_dict(),
            "rows": [{"field": r.field, "estimated": r.estimated, "measured": r.measured,
                      "error": r.error if math.isfinite(r.error) else None} for r in self.rows],
        }
        if budget_bytes is not None:
            data.update(budget_bytes=budget_bytes, fits=self.measured.peak_bytes <= budget_bytes)
        return data


def compare(estimated: Report, measured: Report) -> Comparison:
    """Line up two reports of the same step: peaks per level, then categories at the tensor peak."""
    rows = [ComparisonRow(f"peak ({level})", estimated.peaks[level], measured.peaks[level])
            for level in estimated.peaks if level in measured.peaks]
    categories = list(dict.fromkeys([*estimated.breakdown, *measured.breakdown]))
    rows += [ComparisonRow(c, estimated.breakdown.get(c, 0), measured.breakdown.get(c, 0)) for c in categories]
    return Comparison(estimated, measured, tuple(rows))
