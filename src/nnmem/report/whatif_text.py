"""The what-if comparison as terminal text: the baseline step next to each technique's."""

from __future__ import annotations

from rich import box
from rich.console import RenderableType
from rich.table import Table

from nnmem.report.text import COMPACT_BELOW, IEC_NOTE, _render, keep_figures_whole
from nnmem.units import format_bytes
from nnmem.whatif.accumulation import Accumulation
from nnmem.whatif.compare import TechniqueRow, WhatIf

__all__ = ["render_whatif", "render_accumulation"]


def _signed(n: int) -> str:
    return f"{'+' if n > 0 else '−' if n < 0 else ''}{format_bytes(abs(n))}"


def _moved(w: WhatIf, row: TechniqueRow, limit: int = 4) -> str:
    moved = list(w.moved(row).items())
    if not moved:
        return "nothing moved at the peak"
    text = ", ".join(f"{c} {_signed(d)}" for c, d in moved[:limit])
    return "at the peak: " + text + (f" (+{len(moved) - limit} more)" if len(moved) > limit else "")


def render_whatif(w: WhatIf, *, width: int = 120) -> str:
    """The comparison table: peak, saved (bytes and %), extra compute, the categories that moved, and with a
    budget the largest training and inference batch each technique allows."""
    base = w.baseline
    batch = f", batch {w.batch}" if w.batch else ""
    opt = f", {base.report.optimizer}" if base.report.optimizer else ""
    header = f"what-if for {w.model} ({w.mode}{batch}{opt}): each row is the step traced with the technique applied"
    compact = width < COMPACT_BELOW  # short headings, the saved share and "FLOPs" left out: fits 80 columns
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("technique", overflow="fold")
    table.add_column("peak" if compact else f"peak ({w.level})", justify="right", no_wrap=True)
    table.add_column("saved", justify="right", no_wrap=True)
    table.add_column("+FLOPs" if compact else "extra compute", justify="right", no_wrap=True)
    if w.budget_bytes is not None:
        table.add_column("batch train / infer" if compact else "largest batch train / infer", justify="right",
                         no_wrap=True)
    counted = base.flops > 0  # FLOPs are counted on PyTorch steps and, by each backend, on Keras ones
    for row in (base, *w.rows):
        saved = w.saved(row)
        share = f"{100 * saved / base.peak_bytes:+.1f} %".replace("-", "−") if base.peak_bytes else "—"
        flops = f"{100 * w.extra_compute(row):+.1f} %" + ("" if compact else " FLOPs")
        cells = [row.technique, format_bytes(row.peak_bytes),
                 "—" if row is base else _signed(saved) if compact else f"{_signed(saved)} ({share})",
                 "—" if row is base or not counted else flops.replace("-", "−")]
        if w.budget_bytes is not None:
            cells.append(" / ".join(f"{b:,}" if b is not None else "—" for b in (row.train_batch, row.infer_batch)))
        table.add_row(*cells)
    keep_figures_whole(table)
    lines: list[RenderableType] = [header, table]
    if compact:
        lines.append(f"peak at the {w.level} level; +FLOPs: extra compute, as a share of the baseline step's FLOPs")
    lines += [f"{row.technique}: {row.description}; {_moved(w, row)}" for row in w.rows]
    if w.budget_bytes is not None:
        lines.append(f"largest batches within {format_bytes(w.budget_bytes)}; checkpointing, accumulation and the "
                     f"optimizer in backward change training only, so their inference batch is the baseline's; "
                     f"accumulate:K's training batch is K micro-batches of the largest that fits")
    by_reason: dict[str, list[str]] = {}
    for technique, reason in w.skipped:
        by_reason.setdefault(reason, []).append(technique)
    for reason, techniques in by_reason.items():
        lines.append(f"not applied: {', '.join(techniques)}: {reason}")
    rows_of: dict[str, list[str]] = {}
    for row in (base, *w.rows):
        for n in row.report.notes:
            rows_of.setdefault(n, []).append(row.technique)
    for n in sorted(rows_of):  # a note every row has is the model's; else it names the rows it is about
        which = rows_of[n]
        lines.append(f"note: {n}" if len(which) == len(w.rows) + 1 else f"note ({', '.join(which)}): {n}")
    counter = base.report.meta.get("flops_counter")  # a Keras step's: the backend's own count
    lines.append("saved: bytes less at the peak than the baseline (negative: the technique costs memory). Extra "
                 + (f"compute: FLOPs added to the step (recomputed forwards; {counter}). "
                    if counted and counter else
                    "compute: FLOPs added to the step (recomputed forwards) as torch's FlopCounterMode counts them: "
                    "matmuls, convolutions and attention; pointwise ops and norms are not counted. " if counted else
                    "compute: not counted on this step. ") + IEC_NOTE)
    return _render(*lines, width=width)


def render_accumulation(split: Accumulation, *, budget_label: str) -> str:
    """Lines: how an effective batch fits the budget, with the searched batches behind the answer."""
    b = split.effective_batch
    if split.micro_steps == 1:
        head = (f"effective batch {b:,} fits {budget_label} in one step (peak {format_bytes(split.peak_bytes)}); "
                f"the largest training batch is {split.largest_plain:,}")
    elif split.micro_steps == 0:
        head = (f"effective batch {b:,} does not fit {budget_label} even in micro-batches of 1: a step with "
                f"accumulation holds a full set of gradients beside the micro-batch")
    else:
        head = (f"effective batch {b:,} fits {budget_label} in {split.micro_steps} micro-batches of "
                f"{split.micro_batch:,} (gradient accumulation; peak {format_bytes(split.peak_bytes)})\n"
                f"without accumulation the largest training batch is {split.largest_plain:,}; with it the largest "
                f"micro-batch is {split.largest_micro:,} (the first micro-batch's gradients live through the rest)")
    return f"{head}\n{IEC_NOTE}\n"
