"""Charts as one self-contained HTML file (Plotly, its JavaScript inlined: no network when opened).

``to_html(result)`` returns the page (``nnmem.write_html`` writes it), ``notebook_html(result)`` is the
fragment a notebook shows (``_repr_html_``). Plotly is an optional dependency (``pip install 'nnmem[report]'``).
"""

from __future__ import annotations

import html
from typing import Any

from nnmem.report.charts import (
    CATEGORY_COLORS,
    PHASE_COLORS,
    Bars,
    Chart,
    Curves,
    Page,
    Timeline,
    charts_for,
    named_phases,
    unit_for,
)
from nnmem.report.output import check_chart_support
from nnmem.units import format_bytes

__all__ = ["to_html", "notebook_html", "figure"]

_CONFIG = {"displaylogo": False, "responsive": True}
_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; margin: 0 0 4px 0; } p.summary { margin: 0 0 16px 0; color: #444; }
div.chart { margin: 0 0 28px 0; } p.note { font-size: 12px; color: #666; margin: 2px 0 0 8px; }
ul.notes { font-size: 13px; color: #7a4a00; }
"""


def _plotly() -> Any:
    check_chart_support(html=True)
    import plotly.graph_objects as go

    return go


def _scaled(values: tuple[int, ...], size: int) -> list[float]:
    return [v / size for v in values]


def _timeline(go: Any, chart: Timeline) -> Any:
    unit, size = unit_for(max(chart.peak[1], chart.reported[0] if chart.reported else 0, 1))
    fig = go.Figure()
    named = named_phases(chart)
    for run in chart.phases:
        phase, first, last = run
        fig.add_vrect(x0=first - 0.5, x1=last + 0.5, fillcolor=PHASE_COLORS.get(phase, "#eeeeee"), opacity=0.6,
                      layer="below", line_width=0, annotation_text=phase if run in named else "",
                      annotation_position="top left")
    for category, values in chart.stacks:
        fig.add_trace(go.Scatter(
            x=list(chart.x), y=_scaled(values, size), name=category, mode="lines", stackgroup="live",
            line={"width": 0.5, "color": CATEGORY_COLORS.get(category, "#888888")}, customdata=list(chart.hover),
            hovertemplate=f"%{{customdata}}<br>{category}: %{{y:.3f}} {unit}<extra></extra>"))
    index, peak, label = chart.peak
    text = "<br>".join(html.escape(line) for line in label.split("\n"))
    fig.add_trace(go.Scatter(x=[index], y=[peak / size], mode="markers", name="peak", showlegend=False,
                             marker={"symbol": "triangle-down", "size": 12, "color": "#000000"},
                             hovertemplate=f"{text}<extra></extra>"))
    right_half = index > (chart.x[0] + chart.x[-1]) / 2
    fig.add_annotation(x=index, y=peak / size, text=text, showarrow=True, arrowhead=2, ax=-40 if right_half else 40,
                       ay=-28, xanchor="right" if right_half else "left", align="left",
                       bgcolor="rgba(255,255,255,0.85)")
    top = peak
    if chart.reported is not None:
        top = chart.reported[0]
        fig.add_hline(y=top / size, line_dash="dash", line_color="#000000", annotation_text=chart.reported[1],
                      annotation_position="bottom right")
    fig.update_layout(xaxis_title="op in the step", yaxis_title=f"live ({chart.peak_level} level), {unit}",
                      yaxis_range=[0, 1.3 * top / size])
    return fig


def _bars(go: Any, chart: Bars) -> Any:
    totals = chart.totals()
    unit, size = unit_for(max([*totals, chart.line[0] if chart.line else 1, 1]))
    fig = go.Figure()
    labels = list(chart.labels)
    for name, values, color in chart.series:
        scaled = _scaled(values, size)
        xy = {"x": scaled, "y": labels} if chart.horizontal else {"x": labels, "y": scaled}
        fig.add_trace(go.Bar(name=name, marker_color=list(chart.colors) or color,
                             orientation="h" if chart.horizontal else "v", customdata=[format_bytes(v) for v in values],
                             hovertemplate=f"{html.escape(name)}: %{{customdata}}<extra></extra>", **xy))
    if chart.text:
        for label, total, text in zip(labels, totals, chart.text):
            xy = {"x": total / size, "y": label, "xanchor": "left"} if chart.horizontal else \
                {"x": label, "y": total / size, "yanchor": "bottom"}
            fig.add_annotation(text=html.escape(text), showarrow=False, **xy)
    axis = f"bytes, {unit}"
    fig.update_layout(barmode="stack" if chart.stacked else "group", showlegend=len(chart.series) > 1)
    if chart.horizontal:
        fig.update_layout(xaxis_title=axis, yaxis={"autorange": "reversed", "automargin": True},
                          height=max(320, 80 + 26 * len(labels)))
        if chart.line is not None:
            fig.add_vline(x=chart.line[0] / size, line_dash="dash", line_color="#000000",
                          annotation_text=chart.line[1])
    else:
        fig.update_layout(yaxis_title=axis)
        if chart.line is not None:
            fig.add_hline(y=chart.line[0] / size, line_dash="dash", line_color="#000000",
                          annotation_text=chart.line[1])
    return fig


def _curves(go: Any, chart: Curves) -> Any:
    largest = max([max(ys) for _, _, ys, _ in chart.lines] + [chart.budget or 1])
    unit, size = unit_for(max(largest, 1))
    fig = go.Figure()
    for name, xs, ys, color in chart.lines:
        fig.add_trace(go.Scatter(x=list(xs), y=_scaled(ys, size), name=name, mode="lines",
                                 line={"color": color, "width": 2},
                                 hovertemplate=f"{name}: batch %{{x:,}} → %{{y:.3f}} {unit}<extra></extra>"))
    for k, (label, batch, peak, color) in enumerate(chart.points):
        fig.add_trace(go.Scatter(x=[batch], y=[peak / size], mode="markers+text", name=label, text=[label],
                                 textposition="top left" if k % 2 == 0 else "bottom right",
                                 marker={"size": 10, "color": color}, showlegend=False,
                                 hovertemplate=f"{html.escape(label)}: {format_bytes(peak)}<extra></extra>"))
    if chart.budget is not None:
        fig.add_hline(y=chart.budget / size, line_dash="dash", line_color="#000000",
                      annotation_text=f"budget {format_bytes(chart.budget)}")
    fig.update_layout(xaxis_title="batch", yaxis_title=f"peak, {unit}")
    return fig


def figure(chart: Chart) -> Any:
    """The Plotly figure of one chart."""
    go = _plotly()
    if isinstance(chart, Timeline):
        fig = _timeline(go, chart)
    elif isinstance(chart, Bars):
        fig = _bars(go, chart)
    else:
        fig = _curves(go, chart)
    fig.update_layout(title={"text": html.escape(chart.title), "x": 0.01}, template="plotly_white",
                      legend={"orientation": "h", "y": -0.2}, margin={"l": 60, "r": 30, "t": 60, "b": 40})
    return fig


def _body(page: Page) -> str:
    parts = [f"<h1>{html.escape(page.title)}</h1>", f'<p class="summary">{html.escape(page.summary)}</p>']
    for chart in page.charts:
        div = figure(chart).to_html(full_html=False, include_plotlyjs=False, config=_CONFIG,
                                    div_id=f"nnmem-{chart.name}")
        note = f'<p class="note">{html.escape(chart.note)}</p>' if chart.note else ""
        parts.append(f'<div class="chart">{div}{note}</div>')
    if page.notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{html.escape(n)}</li>" for n in page.notes) + "</ul>")
    return "\n".join(parts)


def _plotly_js() -> str:
    _plotly()
    from plotly.offline import get_plotlyjs

    return str(get_plotlyjs())


def to_html(result: Any) -> str:
    """A self-contained page with the charts of ``result`` (Report, Comparison, Fits, Explanation, WhatIf)."""
    page = charts_for(result)
    body = _body(page)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f"<title>{html.escape(page.title)}</title>\n<style>{_STYLE}</style>\n"
            f'<script type="text/javascript">{_plotly_js()}</script>\n</head>\n<body>\n{body}\n</body>\n</html>\n')


def notebook_html(result: Any) -> str:
    """The charts as a notebook fragment, plotly.js inlined (a notebook offline still draws them)."""
    page = charts_for(result)
    return f'<div class="nnmem-report"><script type="text/javascript">{_plotly_js()}</script>{_body(page)}</div>'
