"""The headless-browser checker can fail: a thrown error, a network load and an undrawn chart each turn it red.

Pages are made here with Plotly (plotly.js inlined unless a case says otherwise). Without Chromium or Playwright
the tests skip; ``NNMEM_REQUIRE_BROWSER=1`` makes that a failure. Screenshots land in `artifacts_dir()`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.report.browser import PageCheck, artifacts_dir, check_page, require_chromium

pytest.importorskip("plotly")
import plotly.graph_objects as go  # noqa: E402

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_FAIL_FAST_S = 10  # the failing pages still draw (or never can) well within this; a hang shows as a slow test


@pytest.fixture(autouse=True)
def _chromium() -> str:
    return require_chromium()


def _figures() -> tuple[go.Figure, go.Figure]:
    scatter = go.Figure(go.Scatter(x=[1, 2, 3], y=[4, 1, 3], mode="lines+markers"), layout={"title": "scatter"})
    bar = go.Figure(go.Bar(x=["a", "b", "c"], y=[3, 5, 2]), layout={"title": "bar"})
    return scatter, bar


def _page(tmp_path: Path, *, head: str = "", body: str = "", plotlyjs: bool = True) -> Path:
    """Two charts in one self-contained page, with ``head``/``body`` HTML injected before the closing tags."""
    scatter, bar = _figures()
    html = scatter.to_html(include_plotlyjs=plotlyjs, full_html=True)
    html = html.replace("</head>", f"<title>harness</title>{head}</head>", 1)
    html = html.replace("</body>", bar.to_html(include_plotlyjs=False, full_html=False) + body + "</body>", 1)
    path = tmp_path / "page.html"
    path.write_text(html, encoding="utf-8")
    return path


def _check(html: Path, request: pytest.FixtureRequest, **kwargs: float) -> PageCheck:
    return check_page(html, artifacts_dir() / "browser_harness" / f"{request.node.name}.png", **kwargs)


def test_a_good_page_passes_with_both_charts_drawn(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    check = _check(_page(tmp_path), request)
    assert check.ok, check.problems()
    assert (check.charts, check.drawn) == (2, 2)
    assert check.title == "harness"
    assert check.problems() == "ok"
    assert check.screenshot.read_bytes()[:8] == _PNG_MAGIC


def test_an_uncaught_error_fails(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    page = _page(tmp_path, body='<script>throw new Error("boom")</script>')
    check = _check(page, request, timeout_s=_FAIL_FAST_S)
    assert not check.ok
    assert any("boom" in e for e in check.console_errors), check.console_errors
    assert "boom" in check.problems()


def test_a_network_load_is_blocked_and_fails(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    cdn = "https://cdn.plot.ly/plotly-2.0.0.min.js"
    check = _check(_page(tmp_path, head=f'<script src="{cdn}"></script>'), request, timeout_s=_FAIL_FAST_S)
    assert not check.ok
    assert any(cdn in f for f in check.failed_loads), check.failed_loads
    assert check.drawn == check.charts == 2  # the inlined plotly.js still draws; only the load is wrong


def test_an_undrawn_chart_fails(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    check = _check(_page(tmp_path, plotlyjs=False), request, timeout_s=_FAIL_FAST_S)
    assert not check.ok
    assert check.drawn < check.charts == 2
    assert any("Plotly is not defined" in e for e in check.console_errors), check.console_errors
    assert "2 of 2 charts not drawn" in check.problems()
