"""The Keras step on TensorFlow, run for real: the BFC allocator's peak of the step.

The truth (schedule "plain", the default): ``train_on_batch`` / ``predict_on_batch`` as users run them —
TensorFlow's default executor and thread pools, Grappler on — read from the BFC allocator's statistics
(``tf.config.experimental.get_memory_info``), which TensorFlow keeps on the CPU only with
``TF_CPU_ALLOCATOR_USE_BFC=true``. Its peak varies between processes; measure it in several
(``measure(..., runs=N)``). The diagnostic (schedule "pinned", ``NNMEM_TF_MEASURE=pinned``): the step's ops
chained in the estimate's sequential order (:func:`~nnmem.frontends.keras.tensorflow.schedule.pinned_schedule`),
Grappler off, on the sequential executor with one intra-op thread: a peak that repeats to the byte.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import keras
import tensorflow as tf

from nnmem.errors import ConfigError, MeasureError
from nnmem.frontends.keras.common import (
    KerasStep,
    cycle_peaks,
    measured_cycle,
    no_gc,
    skipped_updates_note,
    warm_up,
)
from nnmem.frontends.keras.tensorflow.schedule import pinned_schedule
from nnmem.frontends.keras.tensorflow.trace import trace_step
from nnmem.report.model import Report, report_from_trace
from nnmem.trace import Trace

__all__ = ["MEASURED_STEPS", "MEASURE_EXECUTOR", "MEASURE_INTER_OP_THREADS", "MEASURE_INTRA_OP_THREADS",
           "SCHEDULE_ENV", "SCHEDULES", "measure_step", "schedule_of", "sequential_runtime"]

SCHEDULES = ("plain", "pinned")
"""How the measured step runs: "plain" as users run it (the truth), "pinned" the repeatable diagnostic."""

SCHEDULE_ENV = "NNMEM_TF_MEASURE"
"""Environment variable choosing the measurement's schedule (one of :data:`SCHEDULES`; unset: "plain")."""


def schedule_of(value: str | None = None) -> str:
    """The measurement's schedule: ``value``, else :data:`SCHEDULE_ENV`, else "plain".

    Raises:
        ConfigError: the value is not one of :data:`SCHEDULES`.
    """
    chosen = (value if value is not None else os.environ.get(SCHEDULE_ENV, "") or "plain").strip().lower()
    if chosen not in SCHEDULES:
        raise ConfigError(f"expected {SCHEDULE_ENV} to be one of {', '.join(SCHEDULES)} (how the measured "
                          f"TensorFlow step runs). Received: {chosen!r}")
    return chosen

MEASURED_STEPS = 5
"""Steps measured after the warm-up; the report takes their median peak. With the schedule pinned most steps
repeat to the byte, in every process."""

MEASURE_EXECUTOR = "SINGLE_THREADED_EXECUTOR"
"""The executor the truth runs the step's function on: TensorFlow's own sequential executor
(``single_threaded_executor.cc``: kernels one at a time in a fixed topological order, each input released after
its last consumer, control flow functional — a while loop runs one iteration at a time). TensorFlow's default
executor picks, per ready op, inline or queued execution by a moving average of its measured cycles
(``KernelStats``: ops start "expensive", become inline under 8000 cycles), so its peak follows timing; its
lowered while loops also run up to ``parallel_iterations`` iterations at once. A peak that moves with CPU load
cannot be an accuracy reference; the sequential executor's repeats exactly."""

MEASURE_INTER_OP_THREADS = 16
"""Inter-op threads the measuring process starts TensorFlow with. The sequential executor runs every kernel in
the calling thread, but a kernel that calls a function (``If``, ``While``, ``PartitionedCall``) blocks its thread
until the callee, started on the inter-op pool, is done: each level of nesting holds one pool thread, and a pool
with too few threads deadlocks. The threads add no concurrency."""

MEASURE_INTRA_OP_THREADS = 1
"""Intra-op threads of the measuring process. With more, kernels' worker threads allocate in racing order and
the BFC layout — which free chunk a 1 MiB activation lands in — changes from process to process."""


def sequential_runtime() -> None:
    """Start TensorFlow with the thread pools of the pinned measurement (:data:`MEASURE_INTER_OP_THREADS`
    inter-op, :data:`MEASURE_INTRA_OP_THREADS` intra-op); for a plain one (:func:`schedule_of`) leave
    TensorFlow's defaults.

    Call before TensorFlow runs its first op (building a Keras model runs ops); once TensorFlow has started
    this does nothing and :func:`measure_step` checks the pools.
    """
    if schedule_of() != "pinned":
        return
    with suppress(RuntimeError):  # already started: measure_step checks the pools
        tf.config.threading.set_inter_op_parallelism_threads(MEASURE_INTER_OP_THREADS)
        tf.config.threading.set_intra_op_parallelism_threads(MEASURE_INTRA_OP_THREADS)


def _inter_op_threads() -> int | None:
    """Threads of the started runtime's inter-op pool (named ``tf_Compute``); None where /proc cannot tell."""
    tf.constant(1.0) + 1.0  # starts the runtime with the configured pools (nothing once started)
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    count = 0
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                count += f.read().strip() == "tf_Compute"
        except OSError:
            continue
    return count or None


def _check_pools(depth: int) -> None:
    """Refuse a runtime whose thread pools are not the measurement's (``depth``: the step's call nesting)."""
    intra = tf.config.threading.get_intra_op_parallelism_threads()
    if intra != MEASURE_INTRA_OP_THREADS:
        raise MeasureError(f"expected TensorFlow to run {MEASURE_INTRA_OP_THREADS} intra-op thread (kernels allocate "
                           f"in one fixed order), it runs {intra or 'the default number of'}: call "
                           "nnmem.frontends.keras.tensorflow.measure.sequential_runtime() before TensorFlow runs its "
                           "first op (building the model runs ops)")
    threads = _inter_op_threads()
    if threads is not None and threads <= depth:
        raise MeasureError(f"the step nests function calls {depth} deep (tf.cond, while loops, ...) and the "
                           f"sequential executor holds an inter-op thread per level, but TensorFlow runs {threads}: "
                           "call nnmem.frontends.keras.tensorflow.measure.sequential_runtime() before TensorFlow runs "
                           "its first op (building the model runs ops)")


def _memory_info() -> dict[str, int]:
    return dict(tf.config.experimental.get_memory_info("CPU:0"))


def _owned_tensor(value: Any) -> Any:
    """A tensor in a buffer of TensorFlow's allocator holding ``value``.

    ``tf.convert_to_tensor`` of a NumPy array keeps NumPy's buffer when it happens to be 64-byte aligned and
    copies it otherwise, so the data would be on the BFC allocator in some processes and not in others.
    """
    return tf.raw_ops.DeepCopy(x=tf.convert_to_tensor(value))


def _run(step: KerasStep, x: Any, y: Any) -> None:
    if step.mode == "train":
        step.model.train_on_batch(x, y)
    else:
        step.model.predict_on_batch(x)


def _first_step_pinned(step: KerasStep, x: Any, y: Any) -> bool:
    """Trace the step's function afresh with its ops chained (``pinned_schedule``) and run it once.

    Returns False where TensorFlow refused the chained graph (a kernel merge the schedule does not know closed
    a cycle); the step then runs on the executor's own order.
    """
    def remake() -> None:
        if step.mode == "train":
            step.model.make_train_function(force=True)
        else:
            step.model.make_predict_function(force=True)

    try:
        with pinned_schedule():
            remake()
            _run(step, x, y)
        return True
    except tf.errors.InvalidArgumentError as err:
        if "cycle" not in str(err):
            raise
    remake()
    _run(step, x, y)
    return False


def _steps(step: KerasStep, x: Any, y: Any, first: Callable[[], Any] | None = None,
           ) -> tuple[list[int], list[int], tuple[str, ...]]:
    """Run :data:`MEASURED_STEPS` steps after the warm-up (:func:`warm_up`, its first step ``first``; with
    gradient accumulation, as many cycles): (each step's peak, bytes in use before each, a note if any of them
    skipped its update)."""
    applied = warm_up(step, lambda: _run(step, x, y), first)
    peaks, before = [], []
    for _ in range(MEASURED_STEPS * measured_cycle(step)):
        with no_gc():  # cyclic garbage of the step before collected, none collected during the step
            tf.config.experimental.reset_memory_stats("CPU:0")
            before.append(_memory_info()["current"])
            _run(step, x, y)
            peaks.append(_memory_info()["peak"])
    return peaks, before, skipped_updates_note(step, applied, len(peaks))


def _pinned_steps(step: KerasStep, x: Any, y: Any) -> tuple[bool, tuple[list[int], list[int], tuple[str, ...]]]:
    """The diagnostic: pinned order, Grappler off, sequential executor. (pinned, :func:`_steps`)."""
    from tensorflow.python.eager.context import function_executor_type

    grappler = tf.config.optimizer.get_experimental_options()
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    try:
        with function_executor_type(MEASURE_EXECUTOR):
            pinned: list[bool] = []
            steps = _steps(step, x, y, first=lambda: pinned.append(_first_step_pinned(step, x, y)))
    finally:
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": False, **grappler})
    return pinned[0], steps


def measure_step(step: KerasStep, *, name: str, meta: dict[str, object], schedule: str | None = None) -> Report:
    """Run the real step and report the BFC allocator's peak (bytes in use).

    Call in a fresh process that set ``TF_CPU_ALLOCATOR_USE_BFC=true`` before TensorFlow was imported (and,
    pinned, called :func:`sequential_runtime` before TensorFlow ran its first op). The data become tensors
    first (live before the step, like the variables); 2 train steps (1 inference step) warm up the function
    and the allocator; then each measured step runs between ``reset_memory_stats`` and a read of ``peak``.

    Args:
        schedule: "plain" (``train_on_batch`` as users run it: default executor and thread pools, Grappler
            on) or "pinned" (the diagnostic: the step's function traced afresh with its ops chained in the
            estimate's sequential order, Grappler off, on :data:`MEASURE_EXECUTOR` with one intra-op thread);
            None: :func:`schedule_of`.

    Raises:
        MeasureError: the BFC allocator is not in use (its statistics read 0), or, pinned, TensorFlow started
            with other thread pools than :func:`sequential_runtime` sets.
    """
    schedule = schedule_of(schedule)
    # Neither schedule replays the executor's orders here: the range runs Grappler in this process, which changes
    # the BFC layout the step then lands in (a user's process runs no such pass), and it took most of a plain
    # measurement's time (mobilenet_v2 training: 35 s of 54 s). The caller's estimate has the range.
    trace = trace_step(step, meta=meta, with_range=False)
    if schedule == "pinned":
        sequential_runtime()
        _check_pools(int(trace.meta.get("call_depth", 0)))  # type: ignore[call-overload]
    x = keras.tree.map_structure(_owned_tensor, step.x)
    y = keras.tree.map_structure(_owned_tensor, step.y) if step.y is not None else None
    if _memory_info()["current"] <= 0:
        raise MeasureError("TensorFlow's CPU allocator keeps no statistics: set TF_CPU_ALLOCATOR_USE_BFC=true "
                           "in the environment before TensorFlow is imported")
    if schedule == "pinned":
        pinned, (peaks, before, skipped) = _pinned_steps(step, x, y)
        how = (f"the sequential executor ({MEASURE_EXECUTOR}; "
               + ("ops pinned to the estimate's order, Grappler off)" if pinned else
                  "TensorFlow refused the pinned order, a kernel merge closed a cycle: the executor's own order)"))
    else:
        peaks, before, skipped = _steps(step, x, y)
        how = "a plain step (default executor and thread pools, Grappler on)"
    cycle = measured_cycle(step)
    highest = cycle_peaks(peaks, cycle)  # with gradient accumulation: each cycle's highest step
    peak = int(sorted(highest)[len(highest) // 2])
    resident = int(sorted(before)[len(before) // 2])
    steps = f"{MEASURED_STEPS} steps" if cycle == 1 else f"the highest steps of {MEASURED_STEPS} accumulation cycles"
    notes: tuple[str, ...] = (f"allocator peak: TensorFlow BFC bytes in use on {how}, median of {steps} "
             f"({', '.join(f'{p:,}' for p in highest)} B); {resident:,} B in use before the step (estimated "
             f"resident: {trace.resident_bytes:,} B)",)
    notes += skipped
    if schedule == "plain":
        notes += ("the default executor runs independent ops concurrently in an order that follows timing and "
                  "heap addresses: the peak differs between processes (`nnmem measure --runs N` shows the spread)",)
    estimate = report_from_trace(trace, source="estimate", model=name, device="cpu")
    info = {**{k: v for k, v in trace.meta.items() if k not in ("peak_low", "peak_high", "inter_op_threads")},
            "method": "bfc_peak", "resident_measured": resident, "schedule": schedule,
            "executor": MEASURE_EXECUTOR if schedule == "pinned" else "DEFAULT",
            "peak_min": min(highest), "peak_max": max(highest), "estimated_peak": estimate.peak_bytes}
    if schedule == "pinned" and not pinned:
        info["schedule"] = "executor"
    trace = Trace(trace.framework, trace.mode, trace.blocks, trace.ops, trace.layers, info)
    return report_from_trace(trace, source="measure", model=name, device="cpu",
                             overrides={"allocator": peak}, notes=notes)
