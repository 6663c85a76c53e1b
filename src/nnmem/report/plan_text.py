"""A plan for a budget as terminal text: the Pareto table of the combinations that fit, the chosen one, the code
that applies it and, with --verify, its measured peak."""

from __future__ import annotations

from rich import box
from rich.console import RenderableType
from rich.table import Table

from nnmem.report.text import COMPACT_BELOW, IEC_NOTE, _render, keep_figures_whole
from nnmem.units import format_bytes
from nnmem.whatif.plan import MemoryPlan, PlanRow

__all__ = ["render_plan"]


def _label(row: PlanRow, limit: int = 70) -> str:
    text = row.label(short=True)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def render_plan(p: MemoryPlan, *, width: int = 120) -> str:
    """The fitting combinations no other beats (recomputed FLOPs, micro-batches, peak), cheapest first."""
    base = p.baseline
    header = (f"plan for {p.model} (train, batch {p.batch}, {base.report.optimizer or 'sgd'}) within "
              f"{format_bytes(p.budget_bytes)}: as it is {format_bytes(base.peak_bytes)} "
              f"({100 * base.peak_bytes / p.budget_bytes:.0f} % of the budget)")
    compact = width < COMPACT_BELOW  # short headings and labels: fits 80 columns
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("", no_wrap=True)
    table.add_column("techniques", overflow="fold")
    table.add_column("peak" if compact else f"peak ({p.level})", justify="right", no_wrap=True)
    table.add_column("budget" if compact else "of budget", justify="right", no_wrap=True)
    table.add_column("+FLOPs" if compact else "recomputed", justify="right", no_wrap=True)
    table.add_column("micro" if compact else "micro-batches", justify="right", no_wrap=True)
    for row in p.front:
        table.add_row("→" if row is p.chosen else "", _label(row, 36 if compact else 70), format_bytes(row.peak_bytes),
                      f"{100 * row.peak_bytes / p.budget_bytes:.0f} %",
                      f"+{100 * row.extra_compute:.1f} %" + ("" if compact else " FLOPs"), str(row.micro_batches))
    keep_figures_whole(table)
    lines: list[RenderableType] = [header, table, f"chosen: {p.chosen.label()}", "", p.code(), ""]
    if p.measured is not None:
        verdict = "within" if p.measured.peak_bytes <= p.budget_bytes else "OVER"
        error = (p.chosen.peak_bytes - p.measured.peak_bytes) / p.measured.peak_bytes
        lines.append(f"verified: measured {format_bytes(p.measured.peak_bytes)} ({p.measured.peak_bytes:,} B), "
                     f"{verdict} the budget; predicted {p.chosen.peak_bytes:,} B ({100 * error:+.2f} %)")
    fitting = len([r for r in p.rows if r.fits])
    lines.append(f"{len(p.rows)} distinct combinations traced, {fitting} fit; {fitting - len(p.front)} fitting "
                 f"ones are beaten by a row above on recomputed FLOPs, micro-batches and peak")
    lines += list(p.notes)
    counter = base.report.meta.get("flops_counter")  # a Keras step's: its backend's own count
    lines.append("Each peak is a trace of the step with the techniques applied. Recomputed: FLOPs that "
                 + (f"the techniques add to the step ({counter}). " if counter else
                    "checkpointing adds (torch's FlopCounterMode: matmuls, convolutions, attention). ")
                 + "Micro-batches: the same FLOPs in smaller steps (slower kernels). " + IEC_NOTE)
    return _render(*lines, width=width)
