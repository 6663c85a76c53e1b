"""Which accuracy cases ``make test`` runs: a fixed sample, for CI's 30 minutes; ``NNMEM_ACCURACY_ALL=1`` runs them
all (the benchmarks measure every case)."""

from __future__ import annotations

import os

import pytest

ALL = os.environ.get("NNMEM_ACCURACY_ALL") == "1"


def unless_sampled(sampled: bool, why: str) -> list[pytest.MarkDecorator]:
    """No mark for a case in ``make test``'s sample (or under :data:`ALL`); else a skip that says ``why`` and how
    to run it."""
    return [] if ALL or sampled else [pytest.mark.skip(reason=f"{why}: set NNMEM_ACCURACY_ALL=1")]
