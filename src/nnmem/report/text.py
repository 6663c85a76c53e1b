"""Terminal renderers: a Report or a Comparison as text. They return strings; only the CLI prints.

All sizes are shown in IEC units (1 KiB = 1024 B) via :func:`nnmem.units.format_bytes`.
"""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from rich import box
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from nnmem.devices import Device
from nnmem.report.charts import CATEGORY_COLORS
from nnmem.report.compare import Comparison
from nnmem.report.layers import default_depth, depth_of, fold, largest
from nnmem.report.model import LayerRow, Report
from nnmem.units import format_bytes
from nnmem.whatif.batch import FitResult, batch_ratio
from nnmem.whatif.explain import Explanation, ModeFigures

__all__ = [
    "IEC_NOTE",
    "colored",
    "keep_figures_whole",
    "render_report",
    "render_summary",
    "render_comparison",
    "render_budget",
    "render_examples",
    "render_fits",
    "render_explanation",
    "render_devices",
]

IEC_NOTE = "IEC units (1 KiB = 1024 B)"
_SOURCE_LABEL = {"estimate": "estimated", "measure": "measured"}


_COLOR: ContextVar[bool] = ContextVar("nnmem_color", default=False)


@contextmanager
def colored(on: bool = True) -> Iterator[None]:
    """Render in colour inside this block (bold headings, the breakdown's bars in their category's colour, for a
    terminal); plain text, with no control codes, outside it."""
    token = _COLOR.set(on)
    try:
        yield
    finally:
        _COLOR.reset(token)


def _render(*items: RenderableType, width: int) -> str:
    """Render rich objects to text: plain (no colour, no terminal control codes) unless inside :func:`colored`."""
    color = _COLOR.get()
    console = Console(file=io.StringIO(), width=width, color_system="256" if color else None, force_terminal=color,
                      force_jupyter=False, force_interactive=False, highlight=False, emoji=False,
                      markup=False, soft_wrap=False)
    for item in items:
        console.print(item)
    output = console.file.getvalue()  # type: ignore[attr-defined]
    return "\n".join(line.rstrip() for line in output.splitlines()) + "\n"


def keep_figures_whole(table: Table) -> Table:
    """Make each right-aligned (figure) column and each no-wrap column at least as wide as its widest cell, so
    that a narrow terminal shrinks the free-text columns and never cuts a number or a name ("19.64 M…")."""
    for column in table.columns:
        if column.justify == "right" or column.no_wrap:
            cells = [str(column.header), *(str(c) for c in column._cells)]
            column.min_width = max(len(c) for c in cells)
    return table


def _bytes(n: int) -> str:
    """A size in IEC units, with the exact count for sizes of a KiB and more."""
    return format_bytes(n) if abs(n) < 1024 else f"{format_bytes(n)} ({n:,} B)"


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "—"


def _peak_line(report: Report) -> str:
    return f"peak ({report.level} level): {_bytes(report.peak_bytes)}"


def _header(report: Report) -> str:
    optimizer = report.optimizer or ("none (inference)" if report.mode == "infer" else "—")
    batch = str(report.batch) if report.batch is not None else "—"
    if int(report.meta.get("accumulate", 1)) > 1:
        batch += f" per micro-batch, {report.meta['accumulate']} accumulated per optimizer step"
    if report.meta.get("checkpoint"):
        batch += f" · checkpoint: {report.meta['checkpoint']}"
    if report.meta.get("optimizer_in_backward"):
        batch += " · optimizer step in backward"
    lines = [
        f"nnmem {report.source} — model {report.model} ({report.framework})",
        f"  mode: {report.mode} · optimizer: {optimizer} · device: {report.device} · batch: {batch}",
        f"  {_peak_line(report)}",
        f"  {IEC_NOTE}",
    ]
    return "\n".join(lines)


def _parameters_cell(row: LayerRow, compact: bool) -> str:
    if compact or not row.arithmetic:
        return f"{row.parameters:,}"
    return row.arithmetic


COMPACT_BELOW = 118
"""Narrower than this many columns, the per-layer table leaves out the kind and output columns and the
parameter arithmetic, so that it fits 80 columns without wrapping a number."""


def _layer_table(rows: tuple[LayerRow, ...], totals: tuple[LayerRow, ...], width: int) -> Table:
    compact = width < COMPACT_BELOW
    table = Table(box=box.SIMPLE_HEAD, show_footer=True, pad_edge=False)
    path_width = min(max((len(r.path or "(model)") for r in rows), default=5), 32)
    kind_width = min(max((len(r.kind) for r in rows), default=4), 24)
    columns = [("parameter bytes", "parameter_bytes"), ("output", "output_bytes"),
               ("saved for backward", "saved_bytes"), ("live at peak", "peak_bytes")]
    if compact:  # the numbers never wrap; a long layer name gives way at its start, where paths repeat
        columns = [("param bytes", "parameter_bytes"), ("saved", "saved_bytes"), ("at peak", "peak_bytes")]
        params_total = f"{sum(r.parameters for r in totals):,}"
        widths = [max(len("params"), len(params_total))] + [
            max(len(header), len(format_bytes(sum(getattr(r, attr) for r in totals))),
                *(len(format_bytes(getattr(r, attr))) for r in rows)) for header, attr in columns]
        room = max(12, width - sum(widths) - 3 * len(widths) - 2)  # a pad, a rule and a pad between columns; edges
        table.add_column("layer", footer="total", no_wrap=True, min_width=min(path_width, room))
        table.add_column("params", footer=params_total, justify="right", no_wrap=True)
    else:
        table.add_column("layer", footer="total", no_wrap=True, min_width=path_width)
        table.add_column("kind", no_wrap=True, min_width=kind_width)
        table.add_column("parameters", footer=f"{sum(r.parameters for r in totals):,}", justify="right")
    for header, attr in columns:
        total = sum(getattr(r, attr) for r in totals)
        table.add_column(header, footer=format_bytes(total), justify="right", no_wrap=True)
    for row in rows:
        cells = [format_bytes(getattr(row, attr)) for _, attr in columns]
        if compact:
            name = row.path or "(model)"
            name = name if len(name) <= room else "…" + name[-(room - 1):]
            table.add_row(name, _parameters_cell(row, True), *cells)
        else:
            table.add_row(row.path or "(model)", row.kind, _parameters_cell(row, False), *cells)
    return table


def _layer_section(report: Report, width: int, depth: int | None, top: int | None) -> list[RenderableType]:
    params = report.parameter_count
    param_bytes = sum(r.parameter_bytes for r in report.layers)
    deepest = max((depth_of(r.path) for r in report.layers), default=0)
    shown = depth if depth is not None else default_depth(report.layers)
    rows = fold(report.layers, shown) if shown < deepest else tuple(report.layers)
    title = f"per layer (live at peak: bytes owned by the layer at the {report.level}-level peak)"
    how = []
    if shown < deepest:
        how.append(f"folded to depth {shown} of {deepest} (--depth {deepest} shows every layer)")
    if top is not None and top < len(rows):
        rows = largest(rows, top)
        how.append(f"the {top} largest at the peak first")
    if width < COMPACT_BELOW:
        how.append("narrow terminal: kind and output left out (--json has every field)")
    return [
        title + (f"\n{'; '.join(how)}" if how else ""),
        _layer_table(rows, tuple(report.layers), width),
        f"parameters: {params:,} elements, {param_bytes:,} B ({format_bytes(param_bytes)})",
        "",
    ]


_EIGHTHS = " ▏▎▍▌▋▊▉"


def _bar(part: int, whole: int, width: int, category: str = "") -> Text:
    """A horizontal bar of ``part / whole`` of ``width`` characters, in eighths of a character, in the category's
    colour (shown only inside :func:`colored`)."""
    if whole <= 0 or part <= 0:
        return Text("")
    eighths = round(8 * width * min(part / whole, 1.0))
    return Text(("█" * (eighths // 8) + _EIGHTHS[eighths % 8]).rstrip() or "▏", style=CATEGORY_COLORS.get(category, ""))


def _breakdown_section(report: Report, width: int) -> list[RenderableType]:
    table = Table(box=box.SIMPLE_HEAD, show_footer=True, pad_edge=False)
    total = sum(report.breakdown.values())
    bar_width = max(6, min(24, width - 72))  # what the widest category, bytes and share cells leave of the line
    largest = max(report.breakdown.values(), default=0)
    table.add_column("category", footer="total")
    table.add_column("bytes", footer=_bytes(total), justify="right", no_wrap=True)
    table.add_column("share", footer=_share(total, total), justify="right", no_wrap=True)
    table.add_column("", no_wrap=True, min_width=bar_width, max_width=bar_width)
    for category, nbytes in sorted(report.breakdown.items(), key=lambda kv: -kv[1]):
        table.add_row(category, _bytes(nbytes), _share(nbytes, total), _bar(nbytes, largest, bar_width, category))
    return [f"at the peak ({report.level} level), by category", table]


def _peaks_section(report: Report) -> list[RenderableType]:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("level")
    table.add_column("peak", justify="right", no_wrap=True)
    table.add_column("", no_wrap=True)
    for level, nbytes in report.peaks.items():
        table.add_row(level, _bytes(nbytes), "← reported" if level == report.level else "")
    if report.peak_range is not None:
        low, high = report.peak_range
        table.add_row(f"{report.level} range", f"{format_bytes(low)} – {format_bytes(high)}", _range_reason(report))
    return ["peak at every level", table]


def _range_reason(report: Report) -> str:
    """Why the peak is a range: TensorFlow's executor picks an op order; XLA's and YNNPACK's threads overlap or
    not."""
    if "jax" in report.framework:
        return "over whether the runtime's threads overlap the step's ops"
    return "over the op orders the step can run in"


def _notes(notes: Iterable[str]) -> str:
    return "\n".join(f"note: {note}" for note in notes)


def render_report(report: Report, *, width: int = 120, depth: int | None = None, top: int | None = None) -> str:
    """The whole report as text: header, per-layer table, breakdown at the peak, peaks, notes.

    Args:
        report: an estimated or measured report.
        width: line width in characters; below :data:`COMPACT_BELOW` the per-layer table drops its kind and
            output columns (80 columns fit).
        depth: fold the per-layer table to this module depth (:func:`nnmem.report.layers.fold`); None: the
            deepest that keeps it to :data:`~nnmem.report.layers.DEFAULT_MAX_ROWS` rows.
        top: list only the layers holding the most at the peak, the rest summed in one row; None: all.

    Returns:
        Plain text ending in a newline.

    Example:
        >>> text = render_report(nnmem.estimate("mlp", batch=32))  # doctest: +SKIP
    """
    items: list[RenderableType] = [_header(report), ""]
    if report.layers:
        items += _layer_section(report, width, depth, top)
    items += [*_breakdown_section(report, width), *_peaks_section(report)]
    if report.notes:
        items.append(_notes(report.notes))
    return _render(*items, width=width)


def render_summary(report: Report, *, width: int | None = None) -> str:
    """The key figures of a report in a few lines (for side-by-side use, e.g. ``nnmem measure``); with ``width``,
    each line wrapped to it between words (continuations indented)."""
    categories = ", ".join(f"{c} {format_bytes(b)}" for c, b in sorted(report.breakdown.items(), key=lambda kv: -kv[1]))
    peaks = ", ".join(f"{level} {format_bytes(b)}" for level, b in report.peaks.items())
    lines = [
        f"{_SOURCE_LABEL.get(report.source, report.source)}: {_peak_line(report)}",
        f"  peaks: {peaks}",
        *([f"  {report.level} range ({_range_reason(report)}): {format_bytes(report.peak_range[0])} – "
            f"{format_bytes(report.peak_range[1])}"] if report.peak_range is not None else []),
        f"  at the peak: {categories}",
    ]
    lines += [f"  note: {note}" for note in report.notes]
    if width is not None:
        lines = [part for line in lines for part in textwrap.wrap(line, width, subsequent_indent="    ",
                                                                 break_long_words=False, break_on_hyphens=False)]
    return "\n".join(lines) + "\n"


def _error_cell(error: float) -> str:
    if math.isinf(error):
        return "n/a (measured 0)"
    return f"{100 * error:+.1f} %"


def render_comparison(cmp: Comparison, *, width: int = 120) -> str:
    """Estimated next to measured, field by field, with the signed error of the estimate.

    The error is ``(estimated - measured) / measured``: positive means the estimate is high.
    """
    est, meas = cmp.estimated, cmp.measured
    title = f"estimated vs measured — model {est.model}, {est.mode}, batch {est.batch if est.batch else '—'}"
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("field")
    table.add_column("estimated", justify="right", no_wrap=True)
    table.add_column("measured", justify="right", no_wrap=True)
    table.add_column("error", justify="right", no_wrap=True)
    for row in cmp.rows:
        table.add_row(row.field, _bytes(row.estimated), _bytes(row.measured), _error_cell(row.error))
    footer = f"error = (estimated − measured) / measured; {IEC_NOTE}"
    if meas.level != est.level:
        footer += f"; estimate reports the {est.level} level, measurement the {meas.level} level"
    return _render(title, table, footer, width=width)


def render_budget(peak_bytes: int, budget_bytes: int) -> str:
    """One line: whether ``peak_bytes`` fits in ``budget_bytes`` (both in bytes), and by how much."""
    budget = format_bytes(budget_bytes)
    if peak_bytes <= budget_bytes:
        return f"fits in {budget} with {format_bytes(budget_bytes - peak_bytes)} headroom"
    return f"does NOT fit in {budget}: short by {format_bytes(peak_bytes - budget_bytes)}"


def render_examples(examples: Iterable[tuple[str, str]], *, width: int = 120) -> str:
    """A table of built-in example models: (name, description) pairs."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("name", no_wrap=True)
    table.add_column("description", overflow="fold")
    for name, description in examples:
        table.add_row(name, description)
    return _render("built-in example models (use the name as MODEL)", table, width=width)


def render_fits(fits: Iterable[tuple[str, FitResult]], *, budget_label: str, level: str, width: int = 120,
                notes: Iterable[str] = ()) -> str:
    """The largest batch per mode, side by side: batch, peak there, the next batch's peak, headroom.

    Args:
        fits: (mode, result) pairs, e.g. training then inference.
        budget_label: what the budget is, e.g. "16.00 GiB" or "A100-80GB (usable 79.21 GiB)".
        level: the memory level the budget is compared with.
        notes: what the answer rests on, each printed as a note.
    """
    fits = list(fits)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("mode", no_wrap=True)
    table.add_column("largest batch", justify="right", no_wrap=True)
    table.add_column("peak at it", justify="right", no_wrap=True)
    table.add_column("headroom", justify="right", no_wrap=True)
    table.add_column("peak at batch + 1", justify="right", no_wrap=True)
    table.add_column("traces", justify="right", no_wrap=True)
    for mode, fit in fits:
        fits_none = fit.batch == 0
        shown = "none fits" if fits_none else _fit_batch(fit)
        table.add_row(mode, shown,
                      format_bytes(fit.peak_bytes) if not fits_none else "—",
                      format_bytes(fit.headroom_bytes) if not fits_none else "—",
                      "—" if fit.at_limit else format_bytes(fit.next_peak_bytes), str(fit.traces))
    lines: list[RenderableType] = [f"largest batch that fits {budget_label} ({level} level)", table]
    by_mode = dict(fits)
    train, infer = by_mode.get("train"), by_mode.get("infer")
    ratio = batch_ratio(train, infer)
    if ratio is not None:
        lines.append(f"inference fits {ratio:.1f}× the batch of training (`nnmem explain` says why)")
    lines += [f"note: {note}" for note in notes]
    lines.append(IEC_NOTE)
    return _render(*lines, width=width)


def _parts_list(items: dict[str, int], limit: int = 4) -> str:
    """Categories largest first, the smallest beyond ``limit`` summed as "other": the parts add up to the total
    (a negative part is the allocator reusing chunks at the larger batch)."""
    ranked = sorted(items.items(), key=lambda kv: -abs(kv[1]))
    shown, rest = ranked[:limit], ranked[limit:]
    if len(rest) == 1:
        shown, rest = ranked, []
    parts = [f"{c} {_signed(b)}" for c, b in shown]
    if rest and sum(b for _, b in rest):
        parts.append(f"other {_signed(sum(b for _, b in rest))}")
    return ", ".join(parts) or "nothing"


def _signed(nbytes: int) -> str:
    return format_bytes(nbytes) if nbytes >= 0 else f"−{format_bytes(-nbytes)}"


def _fit_batch(fit: FitResult) -> str:
    return f"at least {fit.batch:,} (the upper limit asked for)" if fit.at_limit else f"{fit.batch:,}"


def _gradients_at_peak(exp: Explanation) -> str:
    """Which share of the gradients is live at the training peak, and why."""
    live, total = exp.train.fixed_by_category.get("gradients", 0), exp.gradient_bytes
    where = " ".join(x for x in (exp.train.peak_phase, f"of {exp.train.peak_layer}" if exp.train.peak_layer else "")
                     if x)
    at = f"At the training peak ({where})" if where else "At the training peak"
    if not total:
        return ""
    if not exp.gradients_labelled:
        return (f"{at} the compiled step's buffers do not say which hold gradients: they are counted among its "
                "temporaries.")
    if live >= total:
        return f"{at} all of them are live."
    if not live:
        return f"{at} none of them is live yet."
    share = f"{live / total:.0%}" if live / total >= 0.01 else f"{live / total:.1%}"
    return (f"{at} {format_bytes(live)} of them ({share}) are live: backward computes them layer by "
            "layer from the output back, and the layers it has not reached yet have none yet.")


def _holds(name: str, figures: ModeFigures, level: str = "allocator") -> str:
    """One mode's peak as fixed bytes plus bytes per sample, each split by category (the parts add up)."""
    where = f"At batch {figures.at_batch:,}, {name}'s peak" if figures.at_batch else f"At its peak, {name}"
    text = (f"{where} holds {format_bytes(figures.fixed_bytes)} whatever the batch "
            f"({_parts_list(figures.fixed_by_category)}) and {format_bytes(figures.per_sample_bytes)} per sample "
            f"({_parts_list(figures.per_sample_by_category)}).")
    fit = figures.fit
    if figures.at_batch and fit is not None and fit.batch == figures.at_batch:
        told = figures.fixed_bytes + figures.at_batch * figures.per_sample_bytes
        if fit.peak_bytes > told * 1.005 and level == "reserved":  # CUDA: whole segments decide the OOM
            text += (f" The search holds the budget to {format_bytes(fit.peak_bytes)} there, the caching "
                     f"allocator's reserved segments, {format_bytes(fit.peak_bytes - told)} above the bytes these "
                     "figures describe.")
        elif fit.peak_bytes > told * 1.005:  # TensorFlow: the search holds the range's high end to the budget
            text += (f" The search holds the budget to {format_bytes(fit.peak_bytes)} there, the highest peak over "
                     f"the op orders the executor may run, {format_bytes(fit.peak_bytes - told)} above the order "
                     "these figures describe.")
    return text


def render_explanation(exp: Explanation, *, model: str, width: int = 120) -> str:
    """Training next to inference in plain sentences with the model's own figures."""
    train, infer = exp.train, exp.infer
    lines = [f"why training and inference of {model} fit different batch sizes", ""]
    lines.append(_holds("training", train, exp.level))
    lines.append(_holds("inference", infer, exp.level))
    lines.append(f"A training sample costs {exp.per_sample_ratio:.1f}× an inference sample.")
    lines.append("")
    lines.append(f"The gradients take {format_bytes(exp.gradient_bytes)} in all: the size of the trainable "
                 "parameters, the same at batch 1 and at batch 10,000. Training does not store a gradient per "
                 "sample; backward sums each sample's contribution into one gradient per parameter. "
                 + _gradients_at_peak(exp))
    lines.append("What grows per sample in training is the activations each layer saves for backward; "
                 "inference keeps only the working set of the layers running at the moment.")
    if exp.saved_per_sample:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        table.add_column("layer", no_wrap=True)
        table.add_column("saved for backward per sample", justify="right", no_wrap=True)
        for path, nbytes in exp.saved_per_sample[:10]:
            table.add_row(path, format_bytes(nbytes))
        rest = exp.saved_per_sample[10:]
        if rest:
            table.add_row(f"({len(rest)} more layers)", format_bytes(sum(b for _, b in rest)))
        lines_r: list[RenderableType] = [*lines, "", "largest savers of activations (training)", table]
    else:
        lines_r = list(lines)
    if exp.budget_bytes is not None and train.fit is not None and infer.fit is not None:
        ratio = exp.batch_ratio
        lines_r.append(f"Within {format_bytes(exp.budget_bytes)}: training fits batch {_fit_batch(train.fit)}, "
                       f"inference batch {_fit_batch(infer.fit)}"
                       + (f" — {ratio:.1f}× more." if ratio is not None else "."))
    lines_r += [f"note: {note}" for note in exp.notes]
    lines_r.append(IEC_NOTE)
    return _render(*lines_r, width=width)


def render_devices(devices: Iterable[Device], *, width: int = 120) -> str:
    """The device catalog: memory, what is not available to tensors, bandwidth and the source of each figure."""
    compact = width < COMPACT_BELOW  # no kind column, the sources numbered below the table: fits 80 columns
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("name", no_wrap=True)
    if not compact:
        table.add_column("kind", no_wrap=True)
    table.add_column("memory", justify="right", no_wrap=True)
    table.add_column("not for tensors", justify="right", no_wrap=True)
    table.add_column("usable", justify="right", no_wrap=True)
    table.add_column("GB/s", justify="right", no_wrap=True)
    table.add_column("source", overflow="fold", no_wrap=compact)
    devices = list(devices)
    for k, d in enumerate(devices, 1):
        kind = [] if compact else [d.kind]
        table.add_row(d.name, *kind, format_bytes(d.memory_bytes), format_bytes(d.context_bytes),
                      format_bytes(d.usable_bytes), f"{d.bandwidth_gbps:,.0f}", f"[{k}]" if compact else d.source)
    keep_figures_whole(table)
    note = ("'not for tensors' is the CUDA context and library handles (cuBLAS / cuDNN), an estimate per "
            "architecture; use the name with --device")
    sources = [f"[{k}] {d.name}: {d.source}" for k, d in enumerate(devices, 1)] if compact else []
    return _render("device catalog", table, *sources, note, IEC_NOTE, width=width)
