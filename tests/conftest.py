"""Settings every test process shares (the main suite and each Keras backend's, and each pytest-xdist worker)."""

from __future__ import annotations

import os
from typing import Any

import pytest

# The command line renders at the terminal's width (nnmem.cli._width): tests read it at 120 columns, what a process
# without a terminal gets, whoever runs them (a pytest-xdist worker is handed COLUMNS=80). Tests of other widths
# pass their own COLUMNS.
os.environ["COLUMNS"] = "120"

SHARED_RESULTS = frozenset({
    "tests/report/test_browser.py", "tests/report/test_charts.py", "tests/test_schemas.py",
    "tests/whatif/test_checkpoint_search.py", "tests/whatif/test_checkpoint_branches.py"})
"""Modules whose tests share results that take tens of seconds (module-scoped fixtures, cached command lines):
under pytest-xdist each runs whole on one worker, so they are computed once, not once per worker."""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``-n N`` (xdist's "load" distribution): each test goes to the next free worker, except that the tests of a
    :data:`SHARED_RESULTS` module go together. (xdist's own ``--dist loadgroup`` marks do not take under pytest 9,
    which no longer reads the node id xdist rewrites.) Larger units are handed out first."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class _SharedResultsTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in SHARED_RESULTS else nodeid

    return _SharedResultsTogether(config, log)
