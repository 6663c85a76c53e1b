"""What each chart of a result shows, as plain data: the HTML (Plotly) and PNG (matplotlib) renderers draw these.

One function per chart turns a result into a :class:`Timeline`, :class:`Bars` or :class:`Curves`;
:func:`charts_for` lists the charts of any result (an estimate's or measurement's Report, an estimate next to a
measurement, the largest batches, an explanation, a what-if comparison). Every figure is in bytes; the
renderers pick the unit. Colours are fixed per category and phase so that every chart reads alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from nnmem.report.compare import Comparison
from nnmem.report.layers import default_depth, fold
from nnmem.report.model import LayerRow, Report
from nnmem.trace import Category
from nnmem.units import format_bytes
from nnmem.whatif.batch import FitResult, Fits
from nnmem.whatif.compare import WhatIf
from nnmem.whatif.explain import Explanation, ModeFigures

__all__ = ["Timeline", "Bars", "Curves", "Chart", "Page", "CATEGORY_COLORS", "MODE_COLORS", "PHASE_COLORS",
           "named_phases", "charts_for", "timeline_chart", "layer_chart", "breakdown_chart", "comparison_chart",
           "batch_chart", "explain_chart", "whatif_chart", "unit_for"]

CATEGORY_COLORS = {
    Category.PARAMETERS.value: "#4c78a8", Category.BUFFERS.value: "#9ecae9", Category.GRADIENTS.value: "#f58518",
    Category.OPTIMIZER_STATE.value: "#e45756", Category.INPUTS.value: "#72b7b2",
    Category.SAVED_ACTIVATIONS.value: "#54a24b", Category.ACTIVATIONS.value: "#eeca3b",
    Category.TEMPORARIES.value: "#b279a2", Category.WORKSPACE.value: "#ff9da6",
    Category.ALLOCATOR_CACHE.value: "#9d755d", Category.FRAGMENTATION.value: "#bab0ac",
}
PHASE_COLORS = {"forward": "#dbe9f6", "backward": "#fde5d2", "optimizer": "#e5f5e0", "setup": "#eeeeee"}
MODE_COLORS = {"train": "#e45756", "infer": "#4c78a8"}
SOURCE_COLORS = {"estimated": "#4c78a8", "measured": "#f58518"}
MAX_TIMELINE_POINTS = 2000
"""Ops drawn at most in a timeline; a longer step keeps each stretch's highest op (and the peak)."""
MAX_LAYER_BARS = 24
LAYER_CATEGORIES = (Category.PARAMETERS.value, Category.GRADIENTS.value, Category.OPTIMIZER_STATE.value,
                    Category.SAVED_ACTIVATIONS.value)


@dataclass(frozen=True)
class Timeline:
    """Live bytes after each op, stacked by category, with the phases shaded and the peak marked.

    Attributes:
        x: op indices drawn.
        stacks: (category, bytes at each drawn op), bottom first; their sum is the live bytes (allocator level
            where the kernel workspace is a stack).
        hover: per drawn op, "op · layer · phase".
        phases: (phase, first op, last op) runs.
        peak: (op index, bytes, label) of the highest point of the stacks; the label's lines are split by "\\n".
        peak_level: the level of that point ("allocator" where kernel workspace is stacked, else "tensor").
        reported: (bytes, label) of the report's peak where the stacks do not reach it (an allocator model
            that rounds and caches: TensorFlow's BFC, CUDA's reserved level), else None.
        note: what was left out, if anything.
    """

    name: str
    title: str
    x: tuple[int, ...]
    stacks: tuple[tuple[str, tuple[int, ...]], ...]
    hover: tuple[str, ...]
    phases: tuple[tuple[str, int, int], ...]
    peak: tuple[int, int, str]
    peak_level: str
    reported: tuple[int, str] | None = None
    note: str = ""


@dataclass(frozen=True)
class Bars:
    """Bars per label, one series per colour; ``stacked`` piles the series, else they stand side by side.

    Attributes:
        labels: one per bar (or group).
        series: (name, bytes per label, colour).
        horizontal: bars along the x axis, labels down the y axis (long names).
        line: (bytes, label) of a horizontal reference, e.g. the budget.
        text: per label, a caption shown beside the bar (e.g. "saves 12 MiB, +33 % FLOPs").
        colors: per label, the colour of a single series' bar (one colour per category).
    """

    name: str
    title: str
    labels: tuple[str, ...]
    series: tuple[tuple[str, tuple[int, ...], str], ...]
    stacked: bool = True
    horizontal: bool = False
    line: tuple[int, str] | None = None
    text: tuple[str, ...] = ()
    colors: tuple[str, ...] = ()
    note: str = ""

    def totals(self) -> list[int]:
        """Each bar's length in bytes: its series summed when stacked, the longest of them side by side."""
        return [sum(s[1][i] for s in self.series) if self.stacked else max(s[1][i] for s in self.series)
                for i in range(len(self.labels))]


@dataclass(frozen=True)
class Curves:
    """Peak bytes against the batch: one line per mode, the budget, and the largest batch of each marked.

    Attributes:
        lines: (name, batches, bytes, colour).
        points: (label, batch, bytes, colour) marked on the lines.
        budget: the budget in bytes, when there is one.
    """

    name: str
    title: str
    lines: tuple[tuple[str, tuple[int, ...], tuple[int, ...], str], ...]
    points: tuple[tuple[str, int, int, str], ...] = ()
    budget: int | None = None
    note: str = ""


Chart = Timeline | Bars | Curves


def unit_for(largest: float) -> tuple[str, int]:
    """The IEC unit that shows ``largest`` bytes with at most four digits: ("MiB", 1048576)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if largest >= size:
            return unit, size
    return "B", 1


def _subject(report: Report) -> str:
    batch = f", batch {report.batch}" if report.batch is not None else ""
    return f"{report.model} ({report.framework}), {report.mode}{batch}"


MAX_NAME = 40
"""Characters of an op or layer name in a chart's labels: longer ones keep their end."""
MIN_PHASE_LABEL = 0.06
"""Share of the step a phase must span for the timeline to name it (TensorFlow interleaves short runs)."""


def _short(name: str, most: int = MAX_NAME) -> str:
    return name if len(name) <= most else "…" + name[-(most - 1):]


def _thinned(totals: Sequence[int], keep: int, most: int) -> list[int]:
    """Indices to draw: every one when they are few, else each stretch's highest, with ``keep`` among them."""
    n = len(totals)
    if n <= most:
        return list(range(n))
    size = n / (most // 2)
    chosen = {keep}
    for k in range(most // 2):
        lo, hi = int(k * size), min(n, int((k + 1) * size))
        if lo < hi:
            chosen.update((lo, max(range(lo, hi), key=totals.__getitem__)))
    return sorted(chosen)


def timeline_chart(report: Report, *, most: int = MAX_TIMELINE_POINTS) -> Timeline | None:
    """Memory over the step (None when the report has no timeline, e.g. a step of one compiled op)."""
    points = report.timeline
    if len(points) < 2:
        return None
    full = dict(report.timeline_categories)
    if not full:  # a report written before categories: the tensor level as one stack
        full = {"live tensors": tuple(p.tensor_bytes for p in points)}
    workspace = tuple(max(p.allocator_bytes - p.tensor_bytes, 0) for p in points)
    if any(workspace):
        full[Category.WORKSPACE.value] = tuple(a + b for a, b in zip(full.get(Category.WORKSPACE.value, (0,) * len(
            points)), workspace))
    totals = [sum(values[i] for values in full.values()) for i in range(len(points))]
    peak_index = max(range(len(points)), key=totals.__getitem__)
    keep = _thinned(totals, peak_index, most)
    phases: list[list[Any]] = []
    for p in points:
        if phases and phases[-1][0] == p.phase:
            phases[-1][2] = p.index
        else:
            phases.append([p.phase, p.index, p.index])
    top = points[peak_index]
    level = "allocator" if any(workspace) else "tensor"
    where = f"\nin {_short(top.layer)}" if top.layer else ""
    label = f"{level} peak {format_bytes(totals[peak_index])} ({top.phase})\n{_short(top.op)}{where}"
    note = "" if len(keep) == len(points) else f"{len(keep):,} of {len(points):,} ops drawn (each stretch's highest)"
    reported = None
    if report.peak_bytes > totals[peak_index]:
        reported = (report.peak_bytes, f"reported peak ({report.level} level) {format_bytes(report.peak_bytes)}")
    return Timeline(
        name="timeline", title=f"Memory over the step — {_subject(report)}",
        x=tuple(points[i].index for i in keep),
        stacks=tuple((c, tuple(v[i] for i in keep)) for c, v in full.items()),
        hover=tuple(f"{_short(points[i].op)} · {_short(points[i].layer) or '(model)'} · {points[i].phase}"
                    for i in keep),
        phases=tuple((str(a), int(b), int(c)) for a, b, c in phases),
        peak=(top.index, totals[peak_index], label), peak_level=level, reported=reported, note=note)


def named_phases(chart: Timeline) -> list[tuple[str, int, int]]:
    """The phase runs wide enough to carry their name in the chart."""
    span = max(chart.x[-1] - chart.x[0] + 1, 1)
    return [run for run in chart.phases if (run[2] - run[1] + 1) / span >= MIN_PHASE_LABEL]


def _layer_value(row: LayerRow, category: str) -> int:
    if category == Category.PARAMETERS.value:
        return row.parameter_bytes
    if category == Category.SAVED_ACTIVATIONS.value:
        return row.saved_bytes
    return row.held.get(category, 0)


def layer_chart(report: Report, *, most: int = MAX_LAYER_BARS) -> Bars | None:
    """Per layer: its parameters, the most gradients and optimizer state it holds at once, the activations it
    leaves saved for backward; folded to the module depth of the terminal table, the largest first."""
    rows = [r for r in report.layers if any(_layer_value(r, c) for c in LAYER_CATEGORIES)]
    if not rows:
        return None
    rows = list(fold(rows, default_depth(rows)))
    rows.sort(key=lambda r: -sum(_layer_value(r, c) for c in LAYER_CATEGORIES))
    note = ""
    if len(rows) > most:
        rest = rows[most - 1:]
        note = f"the {len(rest)} smallest layers summed in the last bar"
        rows = rows[:most - 1] + [LayerRow(f"{len(rest)} other layers", "", 0, 0, 0, 0, 0)]
        values = {c: [_layer_value(r, c) for r in rows[:-1]] + [sum(_layer_value(r, c) for r in rest)]
                  for c in LAYER_CATEGORIES}
    else:
        values = {c: [_layer_value(r, c) for r in rows] for c in LAYER_CATEGORIES}
    series = tuple((c, tuple(values[c]), CATEGORY_COLORS[c]) for c in LAYER_CATEGORIES if any(values[c]))
    labels = tuple(f"{r.path or '(model)'} {r.kind}".strip() for r in rows)
    return Bars(name="layers", title=f"Per layer — {_subject(report)}", labels=labels, series=series,
                horizontal=True, note=note)


def breakdown_chart(report: Report) -> Bars:
    """The peak split by category."""
    items = [(c, b) for c, b in report.breakdown.items() if b]
    return Bars(name="breakdown", title=f"At the peak ({report.level} level): {format_bytes(report.peak_bytes)} — "
                f"{_subject(report)}", labels=tuple(c for c, _ in items),
                series=(("bytes", tuple(b for _, b in items), "#4c78a8"),), stacked=False, horizontal=True,
                text=tuple(format_bytes(b) for _, b in items),
                colors=tuple(CATEGORY_COLORS.get(c, "#888888") for c, _ in items))


def comparison_chart(comparison: Comparison) -> Bars:
    """Estimated next to measured: the peak at each level and each category at the peak."""
    rows = [r for r in comparison.rows if r.estimated or r.measured]
    return Bars(name="compare", title=f"Estimated next to measured — {_subject(comparison.measured)}",
                labels=tuple(r.field for r in rows), stacked=False,
                series=(("estimated", tuple(r.estimated for r in rows), SOURCE_COLORS["estimated"]),
                        ("measured", tuple(r.measured for r in rows), SOURCE_COLORS["measured"])),
                text=tuple(f"{100 * r.error:+.1f} %" if r.measured else "" for r in rows),
                note="the caption of each pair is the estimate's error against the measurement")


def _fit_line(fit: FitResult) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if fit.curve is not None and fit.batch:
        top = max(2, int(fit.batch * 1.25))
        batches = sorted({1, *(max(1, round(top * k / 40)) for k in range(41)), fit.batch, fit.batch + 1})
        return tuple(batches), tuple(fit.curve.peak(b) for b in batches)
    return (fit.batch, fit.batch + 1), (fit.peak_bytes, fit.next_peak_bytes)


def batch_chart(fits: Fits | Sequence[tuple[str, FitResult]], *, model: str = "") -> Curves:
    """The peak against the batch for each mode, with the budget and the largest batch of each."""
    results = fits.results if isinstance(fits, Fits) else tuple(fits)
    name = fits.model if isinstance(fits, Fits) else model
    lines, points = [], []
    budget = None
    for mode, fit in results:
        xs, ys = _fit_line(fit)
        color = MODE_COLORS.get(mode, "#444444")
        lines.append((mode, xs, ys, color))
        points.append((f"largest {mode} batch: {fit.batch:,}", fit.batch, fit.peak_bytes, color))
        budget = fit.budget_bytes
    return Curves(name="batch", title=f"Peak against batch — {name}", lines=tuple(lines), points=tuple(points),
                  budget=budget, note="each line from the traced steps' fitted curve; the marks are traced")


def _samples(figures: ModeFigures) -> int:
    """The batch an explanation's per-sample bytes are shown at: the largest that fits, else the one read at."""
    if figures.fit is not None and figures.fit.batch:
        return figures.fit.batch
    return figures.at_batch or 1


def explain_chart(exp: Explanation) -> list[Chart]:
    """Why the batches differ: for each mode, the fixed bytes and what the samples add at its batch (the largest
    that fits, where a budget was given), by category; and the batch lines."""
    figures = (exp.train, exp.infer)
    categories = list(dict.fromkeys(c for f in figures for c in (*f.fixed_by_category, *f.per_sample_by_category)))
    labels = tuple(f"{f.mode}: fixed" for f in figures) + tuple(
        f"{f.mode}: {_samples(f):,} samples × {format_bytes(f.per_sample_bytes)}" for f in figures)
    series = tuple(
        (c, tuple(max(f.fixed_by_category.get(c, 0), 0) for f in figures)
         + tuple(max(f.per_sample_by_category.get(c, 0), 0) * _samples(f) for f in figures),
         CATEGORY_COLORS.get(c, "#888888"))
        for c in categories)
    parts = Bars(name="explain", title=f"Fixed bytes and what the samples add — {exp.model}", labels=labels,
                 series=series, horizontal=True,
                 note="a training sample keeps its saved activations until backward; an inference sample does not")
    charts: list[Chart] = [parts]
    fitted = [(f.mode, f.fit) for f in figures if f.fit is not None]
    if fitted:
        charts.append(batch_chart(fitted, model=exp.model))  # type: ignore[arg-type]
    return charts


def whatif_chart(result: WhatIf) -> Bars:
    """The baseline and each technique, the peak stacked by category, the budget as a line."""
    rows = (result.baseline, *result.rows)
    categories = list(dict.fromkeys(c for row in rows for c in row.report.breakdown))
    series = tuple((c, tuple(max(row.report.breakdown.get(c, 0), 0) for row in rows),
                    CATEGORY_COLORS.get(c, "#888888")) for c in categories)
    counted = result.baseline.flops > 0  # counted on PyTorch steps and, by each backend, on Keras ones
    text = ("baseline",) + tuple(
        f"{'saves' if result.saved(r) >= 0 else 'costs'} {format_bytes(abs(result.saved(r)))}"
        + (f", {100 * result.extra_compute(r):+.0f} % FLOPs" if counted else "") for r in result.rows)
    line = (result.budget_bytes, "budget") if result.budget_bytes is not None else None
    batch = f", batch {result.batch}" if result.batch is not None else ""
    return Bars(name="whatif", title=f"What each technique buys — {result.model}, {result.mode}{batch}",
                labels=tuple(r.technique for r in rows), series=series, line=line, text=text, horizontal=True)


@dataclass(frozen=True)
class Page:
    """The charts of one result, with its heading and the notes the reader must see."""

    title: str
    summary: str
    charts: tuple[Chart, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)


def charts_for(result: Any) -> Page:
    """The page of charts for a Report, Comparison, Fits, Explanation or WhatIf.

    Raises:
        TypeError: ``result`` is none of those.
    """
    if isinstance(result, Report):
        charts = [timeline_chart(result), breakdown_chart(result), layer_chart(result)]
        summary = f"{result.source}: peak {format_bytes(result.peak_bytes)} at the {result.level} level"
        return Page(f"nnmem {result.source} — {_subject(result)}", summary,
                    tuple(c for c in charts if c is not None), result.notes)
    if isinstance(result, Comparison):
        est, meas = result.estimated, result.measured
        charts = [comparison_chart(result), timeline_chart(est), layer_chart(est)]
        summary = (f"estimated {format_bytes(est.peak_bytes)}, measured {format_bytes(meas.peak_bytes)} "
                   f"({meas.level} level)")
        return Page(f"nnmem measure — {_subject(meas)}", summary, tuple(c for c in charts if c is not None),
                    tuple(dict.fromkeys((*est.notes, *meas.notes))))
    if isinstance(result, Fits):
        summary = ", ".join(f"{mode}: largest batch {fit.batch:,}" for mode, fit in result.results)
        return Page(f"nnmem fit — {result.model} on {result.device}", summary, (batch_chart(result),))
    if isinstance(result, Explanation):
        summary = (f"a training sample costs {result.per_sample_ratio:.1f}x an inference sample"
                   if result.infer.per_sample_bytes else "")
        return Page(f"nnmem explain — {result.model}", summary, tuple(explain_chart(result)))
    if isinstance(result, WhatIf):
        summary = f"baseline peak {format_bytes(result.baseline.peak_bytes)} ({result.level} level)"
        return Page(f"nnmem whatif — {result.model}", summary, (whatif_chart(result),),
                    tuple(f"{t}: {why}" for t, why in result.skipped))
    raise TypeError(f"no charts for a {type(result).__name__}")
