"""The range a step's BFC peak spans over the op orders TensorFlow's default executor can run it in.

The default executor (``common_runtime/executor.cc``) runs ready kernels concurrently on its inter-op pool, in an
order that follows timing, so the peak of a plain ``train_on_batch`` differs between processes. The range is
the lowest and highest BFC peak over the sequential order the estimate replays (:mod:`.schedule`,
``execution_order``) and the executor's FIFO order one op at a time and ``threads`` ops at a time
(``executor_waves``), each replayed (:mod:`.replay`) and handed to the BFC allocator model
(:mod:`nnmem.allocators.bfc`) with the same resident blocks.
"""

from __future__ import annotations

import os
from typing import Any

import tensorflow as tf

from nnmem.allocators.bfc import steady_state_chunks
from nnmem.frontends.keras.tensorflow.replay import Replay
from nnmem.frontends.keras.tensorflow.schedule import executor_waves
from nnmem.trace import Phase

__all__ = ["allocator_peak", "inter_op_threads", "peak_in_use", "peak_range"]


def inter_op_threads() -> int:
    """Threads of TensorFlow's inter-op pool in this process: the configured number, else TensorFlow's
    default, the CPUs the process may run on (``port::MaxParallelism``, ``NumSchedulableCPUs``)."""
    configured = tf.config.threading.get_inter_op_parallelism_threads()
    if configured > 0:
        return int(configured)
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def allocator_peak(resident: list[tuple[int, int]], sizes: list[int], alloc_at: list[int], free_at: list[int],
                   workspace: list[int], fixed: int = 0) -> int:
    """The BFC bytes in use at the peak of a steady-state step, in bytes.

    Args:
        resident: (bytes, initializer temporaries) of the variables, as :func:`steady_state_chunks` takes them.
        sizes, alloc_at, free_at, workspace: the step's blocks and ops, as :func:`steady_state_chunks` takes them.
        fixed: bytes live throughout that the allocator model does not place (inputs, constants).
    """
    held, chunks = steady_state_chunks(resident, sizes, alloc_at, free_at, workspace)
    return peak_in_use(fixed + sum(held), chunks, alloc_at, free_at, workspace)


def peak_in_use(resident: int, chunks: list[int], alloc_at: list[int], free_at: list[int],
                workspace: list[int]) -> int:
    """Bytes in use at the peak: ``resident`` plus the step's live chunks plus the running op's scratch."""
    born = [0] * len(workspace)
    dying = [0] * len(workspace)
    for b, (a, f) in enumerate(zip(alloc_at, free_at)):
        born[a] += chunks[b]
        if f >= 0:
            dying[f] += chunks[b]
    live = peak = resident
    for i, scratch in enumerate(workspace):
        live += born[i]
        peak = max(peak, live + scratch)
        live -= dying[i]
    return peak


def _wave_peak(graph: Any, kept: set[str], threads: int, functions: dict[str, Any], keep: list[str],
               resident: list[tuple[int, int]], fixed: int) -> int:
    """The peak of the executor's FIFO order run ``threads`` ops at a time (inputs freed when a wave ends)."""
    ops, wave_end = executor_waves(graph, kept, threads)
    replay = Replay(functions)
    replay.run(ops, {t.name for t in graph.inputs}, [(Phase.FORWARD, "")] * len(ops), keep=keep)
    free_at = [wave_end[f] if f >= 0 else -1 for f in replay.free_at]
    return allocator_peak(resident, replay.sizes, replay.alloc_at, free_at, [w for *_, w in replay.ops], fixed)


def peak_range(graph: Any, kept: set[str], functions: dict[str, Any], resident: list[tuple[int, int]],
               fixed: int, sequential: int) -> tuple[int, int, int]:
    """(lowest, highest peak, inter-op threads) over the sequential order (peak ``sequential``, in bytes) and
    the executor's FIFO order one op and :func:`inter_op_threads` ops at a time, in bytes."""
    threads = inter_op_threads()
    keep = [t.name for t in graph.outputs]
    peaks = [sequential, *(_wave_peak(graph, kept, n, functions, keep, resident, fixed)
                           for n in sorted({1, threads}))]
    return min(peaks), max(peaks), threads
