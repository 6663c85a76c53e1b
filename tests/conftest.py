"""Settings every test process shares (the main suite and each Keras backend's, and each pytest-xdist worker)."""

from __future__ import annotations

import os

# The command line renders at the terminal's width (nnmem.cli._width): tests read it at 120 columns, what a process
# without a terminal gets, whoever runs them (a pytest-xdist worker is handed COLUMNS=80). Tests of other widths
# pass their own COLUMNS.
os.environ["COLUMNS"] = "120"
