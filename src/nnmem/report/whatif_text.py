"""The what-if comparison as terminal text: the baseline step next to each technique's."""

from __future__ import annotations

from rich import box
from rich.console import RenderableType
from rich.table import Table

from nnmem.report.text import IEC_NOTE, _render
from nnmem.units import format_bytes
from nnmem.whatif.compare import TechniqueRow, WhatIf

__all__ = ["render_whatif"]


def _signed(n: int) -> str:
    return f"{'+' if n > 0 else '−' if n < 0 else ''}{format_bytes(abs(n))}"


def _moved(w: WhatIf, row: TechniqueRow, limit: int = 3) -> str:
    moved = list(w.moved(row).items())
    text = ", ".join(f"{c} {_signed(d)}" for c, d in moved[:limit])
    if not moved:
        return " (nothing moved at the peak)"
    return ": " + text + (f" (+{len(moved) - limit} more)" if len(moved) > limit else "")


def render_whatif(w: WhatIf, *, width: int = 120) -> str:
    """The comparison table: peak, saved (bytes and %), extra compute, the categories that moved, and with a
    budget the largest training batch each technique allows."""
    base = w.baseline
    batch = f", batch {w.batch}" if w.batch else ""
    opt = f", {base.report.optimizer}" if base.report.optimizer else ""
    header = f"what-if for {w.model} ({w.mode}{batch}{opt}): each row is the step traced with the technique applied"
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("technique", no_wrap=True)
    table.add_column(f"peak ({w.level})", justify="right", no_wrap=True)
    table.add_column("saved", justify="right", no_wrap=True)
    table.add_column("extra compute", justify="right", no_wrap=True)
    if w.budget_bytes is not None:
        table.add_column("largest train batch", justify="right", no_wrap=True)
    table.add_column("what moved at the peak")
    for row in (base, *w.rows):
        saved = w.saved(row)
        share = 100 * saved / base.peak_bytes if base.peak_bytes else 0.0
        cells = [row.technique, format_bytes(row.peak_bytes),
                 "—" if row is base else f"{_signed(saved)} ({share:+.1f} %)",
                 "—" if row is base else f"{100 * w.extra_compute(row):+.1f} % FLOPs"]
        if w.budget_bytes is not None:
            cells.append(f"{row.train_batch:,}" if row.train_batch is not None else "—")
        cells.append(row.description if row is base else f"{row.description}{_moved(w, row)}")
        table.add_row(*cells)
    lines: list[RenderableType] = [header, table]
    if w.budget_bytes is not None and w.infer_batch is not None:
        lines.append(f"within {format_bytes(w.budget_bytes)}: inference fits batch {w.infer_batch:,} with or without "
                     f"these techniques (checkpointing changes training only)")
    by_reason: dict[str, list[str]] = {}
    for technique, reason in w.skipped:
        by_reason.setdefault(reason, []).append(technique)
    for reason, techniques in by_reason.items():
        lines.append(f"not applied: {', '.join(techniques)}: {reason}")
    notes = sorted({n for row in (base, *w.rows) for n in row.report.notes})
    lines += [f"note: {n}" for n in notes]
    lines.append("saved: bytes less at the peak than the baseline (negative: the technique costs memory). Extra "
                 "compute: FLOPs added to the step (recomputed forwards). " + IEC_NOTE)
    return _render(*lines, width=width)
