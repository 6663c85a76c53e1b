"""The charts as PNG files (matplotlib, no display needed), for papers and CI logs.

``write_png(result, folder)`` draws each chart of :func:`nnmem.report.charts.charts_for` into
``folder/<chart>.png`` (timeline, breakdown, layers, compare, batch, explain, whatif) and returns the paths.
matplotlib is an optional dependency (``pip install 'nnmem[report]'``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nnmem.report.charts import (
    CATEGORY_COLORS,
    PHASE_COLORS,
    Bars,
    Chart,
    Curves,
    Timeline,
    charts_for,
    named_phases,
    unit_for,
)
from nnmem.report.output import check_chart_support
from nnmem.units import format_bytes

__all__ = ["write_png", "draw"]

DPI = 90


def _pyplot() -> Any:
    check_chart_support(png=True)
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _timeline(ax: Any, chart: Timeline) -> None:
    unit, size = unit_for(max(chart.peak[1], chart.reported[0] if chart.reported else 0, 1))
    for phase, first, last in chart.phases:
        ax.axvspan(first - 0.5, last + 0.5, color=PHASE_COLORS.get(phase, "#eeeeee"), zorder=0)
    for phase, first, _ in named_phases(chart):
        ax.text(first, 1.0, f" {phase}", transform=ax.get_xaxis_transform(), va="top", fontsize=8, color="#555555")
    names = [c for c, _ in chart.stacks]
    ax.stackplot(list(chart.x), *[[v / size for v in values] for _, values in chart.stacks], labels=names,
                 colors=[CATEGORY_COLORS.get(c, "#888888") for c in names], linewidth=0.3, zorder=2)
    index, peak, label = chart.peak
    right_half = index > (chart.x[0] + chart.x[-1]) / 2
    ax.annotate(label, xy=(index, peak / size), xytext=(-14 if right_half else 14, 8), textcoords="offset points",
                fontsize=8, ha="right" if right_half else "left", va="bottom", arrowprops={"arrowstyle": "->"},
                bbox={"boxstyle": "round", "fc": "white", "alpha": 0.85})
    top = peak
    if chart.reported is not None:
        top = chart.reported[0]
        ax.axhline(top / size, ls="--", color="black", lw=1)
        ax.text(1.0, top / size, f"{chart.reported[1]} ", transform=ax.get_yaxis_transform(), ha="right",
                va="bottom", fontsize=8)
    ax.set_ylim(0, 1.3 * top / size)
    ax.set_xlim(chart.x[0] - 0.5, chart.x[-1] + 0.5)
    ax.set_xlabel("op in the step")
    ax.set_ylabel(f"live ({chart.peak_level} level), {unit}")
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _bars(ax: Any, chart: Bars) -> None:
    totals = chart.totals()
    unit, size = unit_for(max([*totals, chart.line[0] if chart.line else 1, 1]))
    positions = list(range(len(chart.labels)))
    width = 0.8 if chart.stacked or len(chart.series) == 1 else 0.8 / len(chart.series)
    base = [0.0] * len(positions)
    for k, (name, values, color) in enumerate(chart.series):
        scaled = [v / size for v in values]
        offset = 0.0 if chart.stacked or len(chart.series) == 1 else (k - (len(chart.series) - 1) / 2) * width
        where = [p + offset for p in positions]
        colors = list(chart.colors) if chart.colors else color
        if chart.horizontal:
            ax.barh(where, scaled, height=width, left=base if chart.stacked else None, color=colors, label=name)
        else:
            ax.bar(where, scaled, width=width, bottom=base if chart.stacked else None, color=colors, label=name)
        if chart.stacked:
            base = [b + s for b, s in zip(base, scaled)]
    for p, total, text in zip(positions, totals, chart.text):
        if chart.horizontal:
            ax.text(total / size, p, f" {text}", va="center", fontsize=7)
        else:
            ax.text(p, total / size, text, ha="center", va="bottom", fontsize=7)
    if chart.horizontal:
        ax.set_yticks(positions, list(chart.labels), fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel(f"bytes, {unit}")
        ax.margins(x=0.25)
        if chart.line is not None:
            ax.axvline(chart.line[0] / size, ls="--", color="black", lw=1)
            ax.text(chart.line[0] / size, -0.6, f" {chart.line[1]}", fontsize=8)
    else:
        ax.set_xticks(positions, list(chart.labels), fontsize=7, rotation=20, ha="right")
        ax.set_ylabel(f"bytes, {unit}")
        if chart.line is not None:
            ax.axhline(chart.line[0] / size, ls="--", color="black", lw=1)
    if len(chart.series) > 1:
        ax.legend(fontsize=7)


def _curves(ax: Any, chart: Curves) -> None:
    unit, size = unit_for(max([max(ys) for _, _, ys, _ in chart.lines] + [chart.budget or 1, 1]))
    for name, xs, ys, color in chart.lines:
        ax.plot(list(xs), [y / size for y in ys], color=color, label=name, lw=2)
    for k, (label, batch, peak, color) in enumerate(chart.points):
        ax.plot([batch], [peak / size], "o", color=color)
        above = k % 2 == 0
        ax.annotate(label, xy=(batch, peak / size), xytext=(-8, 10) if above else (8, -14), textcoords="offset points",
                    ha="right" if above else "left", fontsize=8)
    if chart.budget is not None:
        ax.axhline(chart.budget / size, ls="--", color="black", lw=1)
        ax.text(0.01, chart.budget / size, f"budget {format_bytes(chart.budget)}", transform=ax.get_yaxis_transform(),
                va="bottom", fontsize=8)
    ax.set_xlabel("batch")
    ax.set_ylabel(f"peak, {unit}")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)


def draw(chart: Chart, path: str | Path) -> Path:
    """Draw one chart into a PNG file at ``path``."""
    plt = _pyplot()
    rows = len(chart.labels) if isinstance(chart, Bars) and chart.horizontal else 0
    fig, ax = plt.subplots(figsize=(10, max(4.2, 1.2 + 0.28 * rows)), dpi=DPI)
    if isinstance(chart, Timeline):
        _timeline(ax, chart)
    elif isinstance(chart, Bars):
        _bars(ax, chart)
    else:
        _curves(ax, chart)
    ax.set_title(chart.title, fontsize=10, loc="left")
    if chart.note:
        fig.text(0.01, 0.005, chart.note, fontsize=7, color="#666666")
    fig.tight_layout()
    target = Path(path)
    fig.savefig(target)
    plt.close(fig)
    return target


def write_png(result: Any, folder: str | Path) -> list[Path]:
    """Draw every chart of ``result`` into ``folder`` (created when missing): one ``<chart>.png`` each."""
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    return [draw(chart, target / f"{chart.name}.png") for chart in charts_for(result).charts]
