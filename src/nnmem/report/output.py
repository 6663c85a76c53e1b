"""Charts of any result, written where the user asked: ``nnmem.write_html`` and ``nnmem.write_png``.

A result is a Report (estimate or measurement), a Comparison, Fits, an Explanation or a WhatIf. Both need the
``report`` extra (Plotly for HTML, matplotlib for PNG); without it they raise MissingFrameworkError.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nnmem.errors import ConfigError

__all__ = ["write_html", "write_png", "repr_html", "check_chart_support"]


def check_chart_support(*, html: bool = False, png: bool = False) -> None:
    """Raise MissingFrameworkError now, before a long estimate, when a chart format asked for cannot be drawn."""
    from nnmem.errors import MissingFrameworkError

    for wanted, module, fmt in ((html, "plotly", "HTML reports need Plotly"),
                                (png, "matplotlib", "PNG charts need matplotlib")):
        if wanted:
            try:
                __import__(module)
            except ImportError as err:
                raise MissingFrameworkError(f"{fmt}: pip install 'nnmem[report]'") from err


def write_html(result: Any, path: str | Path) -> Path:
    """Write the charts of ``result`` as one self-contained HTML file (no network needed to open it).

    Raises:
        MissingFrameworkError: Plotly is not installed.
        ConfigError: the file cannot be written.
    """
    from nnmem.report.html import to_html

    text = to_html(result)
    target = Path(path)
    try:
        target.write_text(text, encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot write the HTML report to {target}: {err.strerror or err}") from err
    return target


def write_png(result: Any, folder: str | Path) -> list[Path]:
    """Draw each chart of ``result`` into ``folder/<chart>.png`` (the folder is made when missing).

    Raises:
        MissingFrameworkError: matplotlib is not installed.
        ConfigError: the folder cannot be made or written.
    """
    from nnmem.report.png import write_png as draw_all

    try:
        return draw_all(result, folder)
    except OSError as err:
        raise ConfigError(f"cannot write PNG charts to {folder}: {err.strerror or err}") from err


def repr_html(result: Any) -> str | None:
    """A notebook's rich display of ``result``: its charts, or None (plain repr) without Plotly."""
    try:
        from nnmem.report.html import notebook_html

        return notebook_html(result)
    except ImportError:
        return None
