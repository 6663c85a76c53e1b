"""What the zoo benchmarks share: their command line (run them as ``python benchmarks/<name>.py``)."""

from __future__ import annotations

import argparse
from typing import Any

from nnmem import zoo


def zoo_parser(doc: str | None, *, batch: bool = True) -> argparse.ArgumentParser:
    """A parser with ``--models`` (default: the accuracy zoo), ``--batch`` (when ``batch``) and ``--json``."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--models", default=",".join(zoo.ACCURACY_ZOO))
    if batch:
        parser.add_argument("--batch", type=int, default=zoo.DEFAULT_BATCH)
    parser.add_argument("--json", dest="json_path")
    return parser


def print_score(table: list[dict[str, Any]], what: str) -> list[dict[str, Any]]:
    """Print the median and maximum |error| of the rows other than the baselines that are not noted (a kernel
    path the report says is not modelled on this CPU), and the noted rows' error range apart; returns the
    scored rows."""
    import statistics

    scored = [r for r in table if r["technique"] != "baseline" and not r["noted"]]
    noted = [r["error"] for r in table if r["technique"] != "baseline" and r["noted"]]
    if scored:
        errors = [abs(r["error"]) for r in scored]
        print(f"\n{len(scored)} {what} scored: |error| median {100 * statistics.median(errors):.2f} %, "
              f"max {100 * max(errors):.2f} %")
    if noted:
        print(f"{len(noted)} noted (a kernel path not modelled on this CPU, said in the report): error from "
              f"{100 * min(noted):+.2f} % to {100 * max(noted):+.2f} %")
    return scored
