"""The preloaded malloc counter: it sees a real allocation's bytes, and its high-water mark resets."""

from __future__ import annotations

import pytest

from nnmem.runner.child import run_in_child
from nnmem.runner.mallocpeak import counters, library

pytestmark = pytest.mark.skipif(library() is None, reason="needs a C compiler on glibc Linux")


def _probe() -> tuple[int, int, int, int]:
    import ctypes

    from nnmem.runner.mallocpeak import counters as child_counters

    c = child_counters()
    assert c is not None, "the counter library is not loaded in the child"
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    before = c.current()
    c.reset_peak()
    block = libc.malloc(10 << 20)
    ctypes.memset(block, 1, 10 << 20)
    during = c.current()
    libc.free(block)
    after = c.current()
    peak = c.peak()
    c.reset_peak()
    return during - before, peak - before, after - before, c.peak() - c.current()


def test_counts_a_block_and_resets_its_high_water_mark() -> None:
    grew, peak, left, reset = run_in_child(_probe, timeout_s=120, preload=library())
    assert grew >= 10 << 20 and peak >= 10 << 20  # malloc_usable_size: the request, rounded up
    assert abs(left) < 64 << 10  # freed (ctypes' own bookkeeping may stay)
    assert reset == 0


def test_not_loaded_without_preload() -> None:
    assert counters() is None  # the test process was not started with it
