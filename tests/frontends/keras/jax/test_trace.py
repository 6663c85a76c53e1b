"""The Keras frontend on the JAX backend: XLA buffer-assignment estimates against real measurements."""

from __future__ import annotations

import os

import pytest

if os.environ.get("KERAS_BACKEND") != "jax":
    pytest.skip("needs KERAS_BACKEND=jax", allow_module_level=True)

import numpy as np

from nnmem.errors import TraceError
from nnmem.frontends.keras.common import array_nbytes, prepare, resident_variables
from nnmem.frontends.keras.jax import trace as jax_backend
from nnmem.report.model import Report, report_from_trace
from nnmem.runner.child import run_in_child
from nnmem.runner.mallocpeak import library
from nnmem.trace import Category
from nnmem.zoo.keras_models import FACTORIES


def _step(name: str, mode: str, batch: int = 8):
    model, x, y, loss = FACTORIES[name](batch)
    return prepare(model, x, y, mode=mode, optimizer="adam" if mode == "train" else None, loss=loss)


def _estimate(name: str, mode: str) -> Report:
    trace = jax_backend.trace_step(_step(name, mode), meta={"batch": 8})
    return report_from_trace(trace, source="estimate", model=name, device="cpu")


def _estimate_and_measure(name: str, mode: str) -> tuple[Report, Report]:
    """The case's estimate and measurement, both made in a fresh child (~10 s of jax import each).

    A child per case, started with the malloc counter preloaded (the measurement the report gives by default).
    """
    estimate, measured = run_in_child(lambda: (_estimate(name, mode).to_dict(), jax_backend.measure_step(
        _step(name, mode), name=name, meta={}).to_dict()), timeout_s=300, preload=library(),
        env={"KERAS_BACKEND": "jax"})
    return Report.from_dict(estimate), Report.from_dict(measured)


_MODES = ("train", "infer")
# Errors of a full sweep (a fresh child per case, batch 8, 2 CPU cores, jax 0.10.2, malloc-counter truth).
_MISSES = {  # beyond 10 %: what the estimate lacks
    ("keras_transformer_block", "train"): "YNNPACK keeps the attention scores and a 2 MiB buffer of the softmax "
                                          "backward fusion, not modelled; -25 %",
}
_NOISY = {  # within a few points of 10 %
    ("keras_separable_cnn", "infer"): "-9 % to -12 %: YNNPACK spreads its 128 KiB tiles over 2-4 blocks",
    ("keras_partly_frozen", "train"): "+12 % to +14 %: the backward convolutions' padded inputs are not all live "
                                      "at once",
    ("keras_separable_cnn", "train"): "-8 % to 0 %: the step's malloc rise takes two values (15.07 or 16.27 MB)",
    ("keras_partly_frozen", "infer"): "-5 % to +60 %: the step's malloc rise differs between processes (2,306,224 B "
                                      "in one, 1,372,224 and 1,372,240 B in two others); the estimate keeps both "
                                      "convolutions' padded inputs live together",
    ("keras_two_branch_cnn", "infer"): "-1 % to +15 %: the step's malloc rise takes two values (4.75 MB in some "
                                       "steps, 5.65-5.72 MB in others: 4,751,536 / 5,654,824 / 4,826,904 / "
                                       "5,716,912 B in one process), as the two branches' convolutions overlap "
                                       "on XLA's threads or not; the estimate counts them concurrent",
}
_QUICK = {("keras_lstm", "train"), ("keras_lstm", "infer"), ("keras_conv1d_gru", "train"),
          ("keras_two_branch_cnn", "infer")}
_ALL = os.environ.get("NNMEM_ACCURACY_ALL") == "1"


def _case(name: str, mode: str) -> object:
    marks = [] if _ALL or (name, mode) in _QUICK else [pytest.mark.skip(
        reason="the full sweep takes ~6 min on 2 cores: set NNMEM_ACCURACY_ALL=1")]
    if (name, mode) in _MISSES:
        marks.append(pytest.mark.xfail(strict=True, reason=_MISSES[(name, mode)]))
    elif (name, mode) in _NOISY:
        marks.append(pytest.mark.xfail(strict=False, reason="measurement noise: " + _NOISY[(name, mode)]))
    return pytest.param(name, mode, marks=marks)


@pytest.mark.accuracy
@pytest.mark.parametrize(("name", "mode"), [_case(name, mode) for name in FACTORIES for mode in _MODES])
def test_estimate_matches_real_step(name: str, mode: str) -> None:
    estimate, measured = _estimate_and_measure(name, mode)
    assert measured.source == "measure" and measured.meta["measure.rise_bytes"] > 0
    assert "malloc" in measured.meta["measure.method"]
    # The executable Keras cached is the one the estimate compiled.
    assert measured.meta["keras_executable.temp_bytes"] == estimate.meta["xla.temp_bytes"]
    assert estimate.breakdown.get(Category.WORKSPACE.value, 0) == (estimate.meta["xla.conv_workspace_bytes"]
                                                                   + estimate.meta["xla.runtime_bookkeeping_bytes"])
    if (name, mode) == ("keras_two_branch_cnn", "infer"):  # the 5x5 Eigen convolution's im2col, in bytes
        assert estimate.meta["xla.max_conv_scratch_bytes"] == 8 * 32 * 32 * 5 * 5 * 3 * 4 + 74_184
    error = abs(estimate.peak_bytes - measured.peak_bytes) / measured.peak_bytes
    assert error <= 0.10, (estimate.peak_bytes, measured.peak_bytes, measured.meta["measure.rises"])


def test_breakdown_is_the_state_plus_the_step() -> None:
    step = _step("keras_mlp", "train")
    report = report_from_trace(jax_backend.trace_step(step, meta={}), source="estimate", model="m", device="cpu")
    assert report.framework == "keras-jax" and report.optimizer == "adam"
    assert sum(report.breakdown.values()) == report.peak_bytes
    params = 41_802 * 4
    assert report.breakdown[Category.PARAMETERS.value] == params
    assert report.breakdown[Category.OPTIMIZER_STATE.value] >= 2 * params  # Adam: m and v per parameter
    assert report.breakdown[Category.INPUTS.value] == 8 * 256 * 4 + 8 * 4
    assert {"jax", "keras", "xla.temp_bytes"} <= set(report.meta)


def test_frozen_layers_have_no_optimizer_state() -> None:
    frozen = _estimate("keras_partly_frozen", "train")
    model, x, y, loss = FACTORIES["keras_partly_frozen"](8)
    for layer in model.layers:
        layer.trainable = True
    thawed = prepare(model, x, y, mode="train", optimizer="adam", loss=loss)
    thawed_state = sum(array_nbytes(v) for v, category, _ in resident_variables(thawed.model, "train")
                       if category is Category.OPTIMIZER_STATE)
    frozen_params = (3 * 3 * 3 * 32 + 32) + 2 * 32 + (3 * 3 * 32 * 32 + 32)  # conv1, bn1 gamma+beta, conv2
    assert thawed_state - frozen.breakdown["optimizer state"] == 2 * frozen_params * 4  # Adam's m and v
    assert frozen.breakdown["buffers"] >= frozen_params * 4  # the frozen weights stay, as buffers


def test_mixed_float16_carries_loss_scale_state() -> None:
    mixed = jax_backend.trace_step(_step("keras_mixed_float16", "train"), meta={})
    assert str(mixed.meta["optimizer"]).startswith("LossScaleOptimizer")
    assert mixed.meta["xla.temp_bytes"] > 0


def test_shape_mismatch_is_a_trace_error() -> None:
    model, _, _, _ = FACTORIES["keras_mlp"](8)
    x = np.zeros((8, 100), "float32")
    with pytest.raises(TraceError) as info:
        step = prepare(model, x, np.zeros(8, "int32"), mode="infer")
        jax_backend.trace_step(step, meta={})
    assert "\n" not in str(info.value)


def _bookkeeping_rise(k: int) -> list[tuple[int, int]]:
    """(measured malloc rise, modelled bookkeeping + output buffers) of two jitted functions of k arrays: a
    Keras-like step (k donated arrays updated in place, one data input, one scalar output) and k new outputs."""
    import gc
    from functools import partial

    import jax
    import jax.numpy as jnp

    from nnmem.runner.mallocpeak import counters

    counter = counters()
    assert counter is not None, "the malloc counter is not preloaded"

    @partial(jax.jit, donate_argnums=0)
    def step(state, x):  # type: ignore[no-untyped-def]
        return [a + x for a in state], jnp.sum(x)

    fan_out = jax.jit(lambda x: [x * float(i + 2) for i in range(k)])
    x = jnp.ones((16,))
    out = []
    for f, args, donate in ((step, ([jnp.ones((16,)) for _ in range(k)], x), True), (fan_out, (x,), False)):
        compiled = f.lower(*args).compile()
        stats = compiled.memory_analysis()
        buffers = int(stats.output_size_in_bytes - stats.alias_size_in_bytes)
        modelled = jax_backend._runtime_bookkeeping(compiled.as_text(), compiled.out_tree.num_leaves) + buffers
        rises = []
        for i in range(7):
            gc.collect()
            before = counter.current()
            counter.reset_peak()
            result = f(*args)
            jax.block_until_ready(result)
            if i >= 2:
                rises.append(counter.peak() - before)
            if donate:
                args = (result[0], x)
            del result
        out.append((sorted(rises)[2], modelled))
    return out


@pytest.mark.accuracy
def test_runtime_bookkeeping_matches_calls_it_was_not_fitted_on() -> None:
    """The per-buffer cost of an execute call at k=24 (the fit used 4, 16 and 64): within 10 %."""
    pairs = run_in_child(lambda: _bookkeeping_rise(24), timeout_s=120, preload=library(),
                         env={"KERAS_BACKEND": "jax"})
    for measured, modelled in pairs:
        assert abs(modelled - measured) <= 0.10 * measured, pairs


def test_runtime_bookkeeping_counts_parameters_outputs_and_aliases() -> None:
    hlo = ("HloModule jit_step, input_output_alias={ {0}: (1, {}, may-alias), {1}: (0, {}, may-alias) }, x=y\n"
           "ENTRY %main (p0: f32[4], p1: f32[4], p2: f32[8]) -> (f32[4], f32[4], f32[]) {\n"
           "  %p0 = f32[4]{0} parameter(0)\n  %p1 = f32[4]{0} parameter(1)\n  %p2 = f32[8]{0} parameter(2)\n"
           "  ROOT %t = (f32[4]{0}, f32[4]{0}, f32[]) tuple(%p1, %p0, %p2)\n}\n")
    expected = (jax_backend._CALL_BASE + 2 * jax_backend._PER_ALIASED + jax_backend._PER_INPUT
                + jax_backend._PER_OUTPUT)
    assert jax_backend._runtime_bookkeeping(hlo, outputs=3) == expected

