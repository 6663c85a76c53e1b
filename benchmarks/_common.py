"""What the zoo benchmarks share: their command line (run them as ``python benchmarks/<name>.py``)."""

from __future__ import annotations

import argparse

from nnmem import zoo


def zoo_parser(doc: str | None, *, batch: bool = True) -> argparse.ArgumentParser:
    """A parser with ``--models`` (default: the accuracy zoo), ``--batch`` (when ``batch``) and ``--json``."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--models", default=",".join(zoo.ACCURACY_ZOO))
    if batch:
        parser.add_argument("--batch", type=int, default=zoo.DEFAULT_BATCH)
    parser.add_argument("--json", dest="json_path")
    return parser
