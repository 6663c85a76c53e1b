"""Measure a real Keras step on JAX (CPU): live arrays before the step plus the step's malloc high-water rise.

XLA:CPU and YNNPACK take their buffers straight from glibc ``malloc`` and ``jax.devices()[0].memory_stats()`` is
``None`` on CPU, so the measuring child runs with :mod:`nnmem.runner.mallocpeak` preloaded, counting every malloc
and free: peak = bytes of the live JAX arrays before the step (the variables, and the data, put on the device
first) + the step's rise of the malloc high-water mark, median of :data:`MEASURED_STEPS` real ``train_on_batch`` /
``predict_on_batch`` calls after the warm-up. Without the counter: the rise of the resident-set high-water mark
(``VmHWM`` after ``clear_refs``, glibc's mmap threshold pinned; ``proc(5)``, ``mallopt(3)``), which misses what
malloc reuses from resident pages. The ``memory_analysis()`` of the executable Keras cached goes to the meta.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Callable
from typing import Any

import jax
import keras

from nnmem.errors import UnsupportedError
from nnmem.frontends.keras.common import (
    KerasStep,
    cycle_peaks,
    layer_infos,
    measured_cycle,
    skipped_updates_note,
    warm_up,
)
from nnmem.frontends.keras.jax.trace import backend_meta, state_variables, step_data, variable_blocks
from nnmem.report.model import Report, report_from_trace
from nnmem.trace import Block, Category, Op, Phase, Trace

__all__ = ["MEASURED_STEPS", "measure_step"]

MEASURED_STEPS = 5
"""Steps measured after the warm-up; the report takes the median (YNNPACK spreads tiles over a varying number
of worker threads, each with its own scratch, so a step's peak varies by a few tiles)."""

# glibc malloc.h: M_TRIM_THRESHOLD = -1, M_MMAP_THRESHOLD = -3.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD = 16 * 1024
"""Allocations from this size up get fresh pages from mmap, so the resident-set rise sees them, in bytes."""


def _device_put(value: Any) -> Any:
    return keras.tree.map_structure(lambda a: None if a is None else jax.device_put(a), value)


def measure_step(step: KerasStep, *, name: str, meta: dict[str, object]) -> Report:
    """Run the real Keras step (call it inside a child process) and report its measured peak.

    The peak is the bytes of the live JAX arrays before the step (the variables and the data) plus the step's
    rise of the malloc high-water mark, when the process was started with :mod:`nnmem.runner.mallocpeak` preloaded
    (median of :data:`MEASURED_STEPS`); otherwise the rise of the resident-set high-water mark (min of 3, see
    the module docstring), which misses memory malloc reuses from pages already resident.

    Args:
        step: the prepared step.
        name: the model's display name.
        meta: facts for the report.
    """
    from nnmem.runner.mallocpeak import counters

    model = step.model
    # The data go to the device first, live before the step like the variables (as the estimate counts them):
    # jax may take a NumPy array without a copy when its buffer happens to be 64-byte aligned, so handing
    # NumPy arrays to the step would count the input copy in some processes and not in others.
    x, y = _device_put(step.x), _device_put(step.y)
    run: Callable[[], Any] = ((lambda: model.train_on_batch(x, y)) if step.mode == "train"
                              else (lambda: model.predict_on_batch(x)))
    malloc = counters()
    cycle = measured_cycle(step)  # with gradient accumulation: each cycle's highest step
    if malloc is None:
        live, rises, notes, extra = _rss_rises(run, step, cycle)
        rise = max(min(cycle_peaks(rises, cycle)), 0)
    else:
        applied = warm_up(step, run)
        rises = []
        for _ in range(MEASURED_STEPS * cycle):
            gc.collect()
            live = sum(int(a.nbytes) for a in jax.live_arrays())
            before = malloc.current()
            malloc.reset_peak()
            run()
            rises.append(malloc.peak() - before)
        highest = cycle_peaks(rises, cycle)
        rise = max(sorted(highest)[len(highest) // 2], 0)
        notes = (f"measured: JAX arrays live before the step plus the step's rise of the malloc high-water mark "
                 f"(every malloc and free counted by a preloaded library), median of {MEASURED_STEPS} steps"
                 + (f" (each the highest of an accumulation cycle of {cycle})" if cycle > 1 else ""),)
        extra = {"measure.method": "jax.live_arrays before the step + malloc high-water rise during it"}
        notes += skipped_updates_note(step, applied, MEASURED_STEPS * cycle)
    peak = live + rise
    trace = _measured_trace(step, rise, meta)
    extra = {**extra, "measure.live_array_bytes": live, "measure.rise_bytes": rise,
             "measure.rises": ",".join(str(r) for r in rises)}
    extra.update(_cached_executable_stats(model, step))
    trace = Trace(trace.framework, trace.mode, trace.blocks, trace.ops, trace.layers, {**trace.meta, **extra})
    return report_from_trace(trace, source="measure", model=name, device="cpu",
                             overrides={"allocator": peak, "tensor": peak}, notes=notes)


def _rss_rises(run: Callable[[], Any], step: KerasStep,
               cycle: int = 1) -> tuple[int, list[int], tuple[str, ...], dict[str, object]]:
    """The fallback without the malloc counter: resident-set high-water rises of three steps (of three
    accumulation cycles of ``cycle`` steps)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
    libc.mallopt(_M_TRIM_THRESHOLD, _MMAP_THRESHOLD)
    applied = warm_up(step, run)
    rises = []
    live = 0
    for _ in range(3 * cycle):  # the smallest of three (cycles): a stray Python arena or thread stack touched once
        # is not the step's
        gc.collect()
        libc.malloc_trim(0)
        live = sum(int(a.nbytes) for a in jax.live_arrays())
        before = _status_bytes("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        run()
        rises.append(_status_bytes("VmHWM") - before)
    notes: tuple[str, ...] = ("measured (fallback: no C compiler to build the malloc counter): JAX arrays live "
                              "before the step plus the process's resident-set rise during the real step (glibc "
                              "mmap threshold pinned at 16 KiB; 4 KiB pages); it misses memory malloc reuses "
                              "from resident pages",)
    notes += skipped_updates_note(step, applied, 3 * cycle)
    if max(rises) - min(rises) > 0.10 * max(min(rises), 1):
        notes += (f"noisy: the three runs' rises spread over {min(rises)}-{max(rises)} bytes (over 10 %); the "
                  "smallest is reported",)
    return live, rises, notes, {"measure.method": "jax.live_arrays before the step + VmHWM rise during it"}


def _measured_trace(step: KerasStep, rise: int, meta: dict[str, object]) -> Trace:
    """The variables resident (as Keras holds them), then the measured rise as one block of temporaries."""
    blocks = variable_blocks(step)
    phase = Phase.FORWARD if step.mode == "infer" else Phase.BACKWARD
    blocks.append(Block(len(blocks), rise, Category.TEMPORARIES, "", phase, 0, 0))
    op = Op(0, "train_on_batch" if step.mode == "train" else "predict_on_batch", phase, "", rise, rise)
    return Trace("keras-jax", step.mode, tuple(blocks), (op,), layer_infos(step.model), backend_meta(step, meta))


def _status_bytes(key: str) -> int:
    """A ``kB`` field of ``/proc/self/status``, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise UnsupportedError(f"/proc/self/status has no {key}: measuring the JAX backend needs Linux")


def _cached_executable_stats(model: Any, step: KerasStep) -> dict[str, object]:
    """memory_analysis() of the executable Keras compiled for the step (found in its step function's closure)."""
    jitted = _find_jitted(model.train_function if step.mode == "train" else model.predict_function, depth=4)
    if jitted is None:
        return {}
    state = tuple([v.value for v in group] for group in state_variables(model, step.mode))
    data = _device_put(step_data(step))
    try:  # same avals as the call Keras made: a compilation-cache hit, nothing runs
        stats = jitted.lower(state, data).compile().memory_analysis()
    except Exception:  # a cross-check only; the measurement stands without it
        return {}
    return {"keras_executable.temp_bytes": int(stats.temp_size_in_bytes),
            "keras_executable.output_bytes": int(stats.output_size_in_bytes),
            "keras_executable.alias_bytes": int(stats.alias_size_in_bytes)}


def _find_jitted(fn: Any, depth: int) -> Any:
    if fn is None or depth < 0:
        return None
    if hasattr(fn, "lower") and hasattr(fn, "_cache_size"):
        return fn
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            found = _find_jitted(cell.cell_contents, depth - 1)
        except ValueError:  # an empty cell
            continue
        if found is not None:
            return found
    return None
