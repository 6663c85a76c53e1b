"""The malloc high-water mark of a process: a tiny preloaded library that counts every malloc and free.

On CPU, XLA (JAX's backend) and YNNPACK take their buffers straight from glibc ``malloc`` and keep no
statistics of their own (``memory_stats()`` is None on CPU). The exact allocator-level peak of a step is
the high-water mark of the bytes malloc has handed out and not yet taken back. ``mallocpeak.c`` interposes
``malloc``, ``calloc``, ``realloc``, ``free``, ``posix_memalign``, ``aligned_alloc``, ``memalign`` and
``valloc`` (each forwards to glibc's ``__libc_*``), counts ``malloc_usable_size`` of each block and keeps
the high-water mark; it only works when it is loaded at process start (``LD_PRELOAD``), so a measuring
child is started with it (``run_in_child(..., preload=library())``).

The library is compiled once per source version with the system's C compiler (``$CC``, else ``cc`` or
``gcc``) into ``$XDG_CACHE_HOME/nnmem`` (``~/.cache/nnmem``). Without a compiler, or off glibc Linux,
:func:`library` returns None and callers fall back to a coarser measurement, saying so in the report.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

__all__ = ["library", "Counters", "counters"]

_SOURCE = Path(__file__).with_name("mallocpeak.c")


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and (path := shutil.which(name)):
            return path
    return None


@cache
def library() -> str | None:
    """Path of the compiled interposer, built on first use; None where it cannot be built or used."""
    if not sys.platform.startswith("linux") or not _SOURCE.exists():
        return None
    cc = _compiler()
    if cc is None:
        return None
    digest = hashlib.sha256(_SOURCE.read_bytes()).hexdigest()[:16]
    cache_dir = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nnmem"
    target = cache_dir / f"mallocpeak-{digest}.so"
    if target.exists():
        return str(target)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
            out = Path(tmp) / target.name
            subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(out), str(_SOURCE)], check=True,
                           capture_output=True, timeout=120)
            os.replace(out, target)  # atomic: a concurrent build leaves one complete file
    except (OSError, subprocess.SubprocessError):
        return None
    return str(target)


class Counters:
    """The counters of the interposer loaded in this process."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._current = lib.nnmem_malloc_current
        self._peak = lib.nnmem_malloc_peak
        self._reset = lib.nnmem_malloc_reset_peak
        self._current.restype = self._peak.restype = ctypes.c_int64

    def current(self) -> int:
        """Bytes malloc has handed out and not taken back, now."""
        return int(self._current())

    def peak(self) -> int:
        """The high-water mark of :meth:`current` since the last :meth:`reset_peak`."""
        return int(self._peak())

    def reset_peak(self) -> None:
        """Start a new high-water mark at the current bytes."""
        self._reset()


def counters() -> Counters | None:
    """The interposer's counters when this process was started with it preloaded, else None."""
    lib = ctypes.CDLL(None)
    if not hasattr(lib, "nnmem_malloc_peak"):
        return None
    return Counters(lib)
