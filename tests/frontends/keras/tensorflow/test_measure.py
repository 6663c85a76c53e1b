"""The Keras frontend on TensorFlow, measured: the BFC allocator's real peak against the estimate of the same step."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import pytest

if os.environ.get("KERAS_BACKEND") != "tensorflow":
    pytest.skip("needs KERAS_BACKEND=tensorflow", allow_module_level=True)
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

import tensorflow as tf  # noqa: E402

from nnmem.errors import MeasureError  # noqa: E402
from nnmem.frontends.keras.tensorflow import measure  # noqa: E402
from nnmem.frontends.keras.tensorflow.scratch import onednn_enabled  # noqa: E402
from nnmem.runner.child import run_in_child  # noqa: E402
from nnmem.zoo.keras_models import FACTORIES  # noqa: E402
from tests.frontends.keras.sampled import unless_sampled  # noqa: E402

BATCH = 8
LIMIT = 0.15  # the per-case maximum error against the BFC peak (sequential executor)

_QUICK = {("keras_mlp", "train"), ("keras_two_branch_cnn", "infer"), ("keras_lstm", "train"),
          ("keras_transformer_block", "train"), ("keras_separable_cnn", "infer"), ("keras_conv1d_gru", "train"),
          ("keras_mixed_float16", "train"), ("keras_partly_frozen", "train"), ("keras_subclassed", "infer")}
"""The cases ``make test`` measures: one mode per zoo model, each ~25 s on 2 cores (a TensorFlow process's imports
and its pinned step), for CI's 30 minutes. ``NNMEM_ACCURACY_ALL=1`` measures both modes of every model
(``benchmarks/accuracy.py --keras tensorflow`` measures both, as users run them);
:func:`test_pinned_schedule_repeats_between_processes` measures keras_separable_cnn's training step in two
processes."""

CASES = [pytest.param(name, mode, id=f"{name}-{mode}",
                      marks=unless_sampled((name, mode) in _QUICK, "one mode per model in make test"))
         for name in FACTORIES for mode in ("train", "infer")]

RUNS = 1
"""Fresh processes each accuracy case is measured in. With the schedule pinned most peaks repeat to the byte;
a few still move by a chunk or two with the holes the setup leaves (keras_separable_cnn infer: 3,043,840 or
3,142,144 B, 3 % apart, well inside :data:`LIMIT`), so one process decides a case (two did until stop 39: each
TensorFlow process costs some 10 s of imports, and CI has 30 minutes on 2 cores);
:func:`test_pinned_schedule_repeats_between_processes` measures in :data:`REPEAT_RUNS`."""

REPEAT_RUNS = 2
"""Fresh processes the repeatability test compares."""


@functools.cache
def _measured(name: str, mode: str, runs: int = RUNS) -> tuple[int, tuple[int, ...], str, list[str]]:
    """(estimated peak, each run's measured peak, schedule, the estimate's "not modelled on this CPU" lines) of
    one zoo step, ``runs`` fresh processes."""
    import nnmem

    os.environ[measure.SCHEDULE_ENV] = "pinned"  # the repeatable diagnostic; test_range.py checks plain steps
    try:
        report = nnmem.measure(name, mode=mode, optimizer="adam" if mode == "train" else None, batch=BATCH,
                               runs=runs, timeout_s=240)
    finally:
        del os.environ[measure.SCHEDULE_ENV]
    unmodelled = [line for line in str(report.meta.get("unmodelled") or "").splitlines()
                  if line.startswith("not modelled on this CPU")]
    peaks = tuple(int(p) for p in report.meta.get("runs_peaks", [report.peak_bytes]))  # one run: its own peak
    return int(report.meta["estimated_peak"]), peaks, str(report.meta["schedule"]), unmodelled


def test_bfc_allocator_is_on() -> None:
    ones = tf.ones((1024,)) * 2.0  # computed on the CPU device: allocated by its allocator
    assert tf.config.experimental.get_memory_info("CPU:0")["current"] >= ones.shape[0] * 4, "BFC not in use"


@pytest.mark.accuracy
@pytest.mark.parametrize(("name", "mode"), CASES)
def test_estimate_matches_bfc_peak(name: str, mode: str) -> None:
    estimated, peaks, schedule, unmodelled = _measured(name, mode)
    if unmodelled:  # a kernel path this CPU takes that no rule models: the estimate says so to the user
        pytest.skip(unmodelled[0])
    assert schedule == "pinned"
    closest = min(peaks, key=lambda p: abs(estimated - p) / p)
    assert abs(estimated - closest) <= LIMIT * closest, (
        f"estimated {estimated:,} B, measured {', '.join(f'{p:,}' for p in peaks)} B in {RUNS} processes "
        f"({(estimated - closest) / closest:+.1%} from the closest)")


def test_measure_refuses_a_runtime_with_parallel_kernels(zoo_step: Callable[..., Any]) -> None:
    tf.constant(1.0) + 1.0  # this process started TensorFlow with its default thread pools
    if tf.config.threading.get_intra_op_parallelism_threads() == measure.MEASURE_INTRA_OP_THREADS:
        pytest.skip("this process runs the measurement's thread pools")
    with pytest.raises(MeasureError, match="intra-op thread"):
        measure.measure_step(zoo_step("keras_mlp", "infer", BATCH), name="keras_mlp", meta={}, schedule="pinned")


def test_measure_refuses_a_pool_too_small_for_nested_calls(zoo_step: Callable[..., Any]) -> None:
    """The sequential executor blocks an inter-op thread per nested call: too few threads would deadlock."""

    def work() -> str:
        os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
        os.environ["KERAS_BACKEND"] = "tensorflow"
        import tensorflow as tf_child

        from nnmem.errors import MeasureError as Refused
        from nnmem.frontends.keras.tensorflow import measure as backend

        tf_child.config.threading.set_inter_op_parallelism_threads(1)
        tf_child.config.threading.set_intra_op_parallelism_threads(1)
        try:
            backend.measure_step(zoo_step("keras_mixed_float16", "train", BATCH), name="keras_mixed_float16",
                                 meta={}, schedule="pinned")
        except Refused as err:
            return str(err)
        return "measured"

    message: str = run_in_child(work, timeout_s=240)
    assert "nests function calls" in message
    assert "nnmem.frontends.keras.tensorflow.measure.sequential_runtime()" in message


@pytest.mark.accuracy
def test_pinned_schedule_repeats_between_processes() -> None:
    """Unpinned, this step peaked anywhere from 6.30 to 8.14 MB at batch 8 (16 processes): its backward kernels
    ran in an order that followed heap addresses. Pinned, every process runs the same order. Checked where
    TensorFlow runs oneDNN's kernels: with oneDNN off (an AVX2-only CPU, IsMKLEnabled) the separable convolutions
    run Eigen's depthwise kernels, whose memory is not modelled (the estimate's note), and the pinned peaks differed
    by more than 1 % in one of two suite runs there (cause not investigated)."""
    if not onednn_enabled():
        pytest.skip("TensorFlow's oneDNN is off here: Eigen's depthwise kernels, not modelled (the estimate's note)")
    _, peaks, _, _ = _measured("keras_separable_cnn", "train", REPEAT_RUNS)
    assert len(peaks) == REPEAT_RUNS
    assert max(peaks) - min(peaks) <= 0.01 * min(peaks), peaks


_MANY_SMALL_VARIABLES = '''
import keras
import numpy as np


def deep(batch):
    inputs = keras.Input((4,))
    x = inputs
    for _ in range(10):
        x = keras.layers.Dense(4)(x)
    model = keras.Model(inputs, x)
    model.compile(optimizer="adam", loss="mse")
    return model, np.ones((batch, 4), np.float32), np.ones((batch, 4), np.float32)
'''


def test_every_variable_holds_a_handle_chunk(tmp_path: Any) -> None:
    """Ten Dense layers of 4 units: 20 variables whose values are 256 B chunks, each with a 256 B handle, and a
    compiled model's optimizer and loss-tracker variables, which an inference step does not use but the process
    holds: the BFC's bytes in use before the step, and its peak, as estimated."""
    import re

    import nnmem

    path = tmp_path / "many_small.py"
    path.write_text(_MANY_SMALL_VARIABLES)
    report = nnmem.measure(f"{path}:deep", batch=8, mode="infer", timeout_s=240)
    found = re.search(r"([\d,]+) B in use before the step \(estimated resident: ([\d,]+) B\)", " ".join(report.notes))
    assert found is not None, report.notes
    assert found.group(1) == found.group(2)  # was 12,544 B measured against 5,376 B estimated, without the handles
    assert report.peak_bytes == report.meta["estimated_peak"]
