"""Headless-Chromium check that a self-contained HTML report renders offline: no errors, every chart drawn.

Used by tests, not shipped. Chromium is driven through Playwright's ``executable_path`` (no downloaded browser);
every request that is not ``file:``, ``data:`` or ``blob:`` is aborted, so a report that needs the network fails.
Charts are Plotly's: ``.js-plotly-plot`` once ``Plotly.newPlot`` ran, ``.plotly-graph-div`` before (or never).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
CHROMIUM_ARGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # no DNS either: what page.route cannot see (sockets) fails too
)  # fmt: skip
_LOCAL_SCHEMES = ("file:", "data:", "blob:")
_POLL_S = 0.1
# A chart is drawn when its main SVG holds a trace: Plotly puts every 2-D trace in a ``g.trace`` (heatmaps in ``g.hm``).
_COUNT_CHARTS_JS = """() => {
  const charts = [...document.querySelectorAll('.js-plotly-plot, .plotly-graph-div')];
  const traced = 'g.trace, .scatterlayer .trace, .barlayer .trace, .pielayer .trace, g.hm, .plot image';
  const drawn = charts.filter(c => c.querySelector('svg.main-svg') && (c.querySelector(traced)
    || [...c.querySelectorAll('.plot path')].some(p => (p.getAttribute('d') || '').trim() !== ''))).length;
  return [charts.length, drawn, typeof window.Plotly !== 'undefined'];
}"""


def find_chromium() -> str | None:
    """The Chromium to drive: ``NNMEM_CHROMIUM`` if set, else the first of `CHROMIUM_NAMES` on ``PATH``."""
    if os.environ.get("NNMEM_CHROMIUM"):
        return os.environ["NNMEM_CHROMIUM"]
    return next((found for name in CHROMIUM_NAMES if (found := shutil.which(name))), None)


def require_chromium() -> str:
    """Chromium's path for a test; skips it without Chromium or Playwright, fails under ``NNMEM_REQUIRE_BROWSER=1``."""
    import pytest

    missing = []
    try:
        import playwright.sync_api  # noqa: F401  (a broken install fails here, not mid-test)
    except ImportError as err:
        missing.append(f"the Python package playwright ({err}; pip install playwright, no `playwright install`)")
    chromium = find_chromium()
    if chromium is None:
        missing.append(f"a Chromium ({', '.join(CHROMIUM_NAMES)} on PATH, or NNMEM_CHROMIUM); apt-get install chromium")
    if chromium is not None and not missing:
        return chromium
    reason = f"browser check needs {' and '.join(missing)}"
    if os.environ.get("NNMEM_REQUIRE_BROWSER") == "1":
        pytest.fail(f"NNMEM_REQUIRE_BROWSER=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def artifacts_dir() -> Path:
    """Where tests leave screenshots: ``NNMEM_ARTIFACTS`` if set, else ``build/test-artifacts`` (git-ignored)."""
    return Path(os.environ.get("NNMEM_ARTIFACTS") or REPO_ROOT / "build" / "test-artifacts")


@dataclass(frozen=True, slots=True)
class PageCheck:
    """What headless Chromium saw on one page.

    Example:
        >>> check = check_page(Path("report.html"), Path("build/report.png"))
        >>> assert check.ok, check.problems()

    Attributes:
        console_errors: Console messages of type "error" and uncaught page errors, in order.
        failed_loads: Requests that failed, and those blocked for leaving the machine (not file:/data:/blob:).
        charts: Plotly chart containers on the page, drawn or not.
        drawn: Charts whose main SVG holds at least one drawn trace.
        screenshot: The full-page PNG taken after the charts drew (or the wait timed out).
        title: The document's title.
    """

    console_errors: list[str]
    failed_loads: list[str]
    charts: int
    drawn: int
    screenshot: Path
    title: str

    @property
    def ok(self) -> bool:
        """No errors, nothing failed to load, and at least one chart, every one drawn."""
        return not self.console_errors and not self.failed_loads and self.charts > 0 and self.drawn == self.charts

    def problems(self) -> str:
        """One line saying what is wrong, or "ok"."""
        found = [f"console error: {(e.splitlines() or [''])[0]}" for e in self.console_errors]
        found += [f"failed load: {url}" for url in self.failed_loads]
        if self.charts == 0:
            found.append("no Plotly chart on the page")
        elif self.drawn != self.charts:
            found.append(f"{self.charts - self.drawn} of {self.charts} charts not drawn")
        return "; ".join(found) or "ok"


def check_page(html: Path, screenshot: Path, *, timeout_s: float = 30) -> PageCheck:
    """Open ``html`` in headless Chromium offline, wait for its charts to draw, and screenshot it.

    Args:
        html: The self-contained report to open.
        screenshot: Where to write the full-page PNG; its folder is created.
        timeout_s: Most seconds to wait for the page to load and, separately, for every chart to draw.

    Raises:
        RuntimeError: Chromium or Playwright is missing, or Chromium fails to start.
    """
    chromium = find_chromium()
    if chromium is None:
        raise RuntimeError(
            f"no Chromium found: looked for NNMEM_CHROMIUM, then {', '.join(CHROMIUM_NAMES)} on PATH. "
            "Fix: apt-get install chromium, or set NNMEM_CHROMIUM to a Chromium binary."
        )
    try:
        from playwright.sync_api import Error, Route, sync_playwright
    except ImportError as err:
        raise RuntimeError(f"cannot import playwright ({err}). Fix: pip install playwright") from err
    errors: list[str] = []
    failed: list[str] = []
    blocked: set[str] = set()

    def guard(route: Route) -> None:
        url = route.request.url
        if url.startswith(_LOCAL_SCHEMES):
            route.continue_()
            return
        blocked.add(url)
        failed.append(f"{url} (blocked: not a local file)")
        route.abort("blockedbyclient")

    with sync_playwright() as pw:
        try:
            browser = pw.chromium.launch(executable_path=chromium, headless=True, args=list(CHROMIUM_ARGS))
        except Error as err:
            first = next((line for line in str(err).splitlines() if line.strip()), "no message")
            raise RuntimeError(f"Chromium at {chromium} failed to start: {first}") from err
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.route("**/*", guard)
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(f"{exc.name}: {exc.message}"))
            page.on(
                "requestfailed",
                lambda req: None if req.url in blocked else failed.append(f"{req.url} ({req.failure or 'failed'})"),
            )
            page.goto(html.resolve().as_uri(), wait_until="load", timeout=timeout_s * 1000)
            deadline = time.monotonic() + timeout_s
            while True:  # Plotly draws asynchronously; without Plotly after "load", nothing ever will
                charts, drawn, plotly = page.evaluate(_COUNT_CHARTS_JS)
                if drawn == charts or not plotly or time.monotonic() > deadline:
                    break
                page.wait_for_timeout(_POLL_S * 1000)
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot), full_page=True)
            title = page.title()
        finally:
            browser.close()
    return PageCheck(list(errors), list(failed), charts, drawn, screenshot, title)
