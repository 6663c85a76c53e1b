"""One exception tree for everything nnmem raises on purpose.

A user mistake is an ``NnmemError``: the CLI prints its message on one line and exits 2.
Anything else escaping the library is a bug in nnmem.
"""

from __future__ import annotations

__all__ = [
    "NnmemError",
    "ConfigError",
    "ModelLoadError",
    "TraceError",
    "UnsupportedError",
    "MissingFrameworkError",
    "MeasureError",
    "BudgetError",
    "first_line",
]


class NnmemError(Exception):
    """Base of every error nnmem raises for bad input or an unsupported case."""


class ConfigError(NnmemError, ValueError):
    """An argument has the wrong value: unknown optimizer, bad batch, malformed size, bad shape."""


class ModelLoadError(NnmemError):
    """MODEL could not be loaded: missing file or factory, a factory that raised or returned junk."""


class TraceError(NnmemError):
    """The step could not be traced: the model rejected the inputs (wrong shape, dtype...)."""


class UnsupportedError(NnmemError):
    """nnmem does not support this case yet; the message says what is missing."""


class MissingFrameworkError(NnmemError, ImportError):
    """A framework extra is not installed; the message names the pip command that fixes it."""


class MeasureError(NnmemError):
    """The measuring child process failed (OOM kill, crash, error in the model)."""


class BudgetError(NnmemError):
    """A step will not fit its memory budget (raised by ``nnmem.keras.MemoryCheck`` before training starts)."""


# Lines Keras wraps a layer's error in ("Exception encountered when calling X.call()."): not the cause.
_WRAPPER_LINES = ("Exception encountered", "Arguments received")


def first_line(err: BaseException, limit: int | None = None) -> str:
    """The first line of an exception's message that says what went wrong (Keras's wrapper lines skipped), cut
    to ``limit`` characters; the exception type's name when the message is empty."""
    for line in str(err).strip().splitlines():
        line = line.strip()
        if line and not line.startswith(_WRAPPER_LINES):
            return line[:limit]
    return type(err).__name__
