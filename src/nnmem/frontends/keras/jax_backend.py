"""The Keras frontend on the JAX backend: XLA's own buffer assignment of the step Keras jits.

Estimate. ``model.train_on_batch(x, y)`` on JAX runs ``jax.jit(model.train_step, donate_argnums=0)`` on
``state = (trainable, non_trainable, optimizer, metrics)`` variable values and ``data = (x, y, None)``
(``keras/src/backend/jax/trainer.py``: ``make_train_function``, ``_get_jax_state``); ``predict_on_batch``
jits ``predict_step`` on ``(trainable, non_trainable)`` the same way. We jit the same functions with the
same donation, lower them from ``jax.ShapeDtypeStruct`` s (nothing batch-sized is allocated) and compile.
``memory_analysis()`` of the executable gives the arguments, the outputs, the outputs that alias donated
arguments and XLA's temporary buffers. Live during the step: every argument (the state and the data,
which ``train_on_batch`` puts on the device before the call), every output that does not reuse a donated
buffer (the logs, the predictions) and the temporaries. mixed_float16 (the LossScaleOptimizer's
variables), frozen layers (no optimizer slots), BatchNorm statistics and the iteration counters come with
the real Keras state structures.

Measurement (truth on CPU). ``jax.devices()[0].memory_stats()`` is ``None`` on CPU in jax 0.10, and
XLA:CPU's buffers come straight from glibc ``malloc``, so the step is measured at the operating system:
the real ``train_on_batch`` / ``predict_on_batch`` (after warm-up, with the executable Keras compiled) runs
between a reset of the resident-set high-water mark (``"5"`` written to ``/proc/self/clear_refs``) and a
read of ``VmHWM`` in ``/proc/self/status``. The measured peak is the bytes of the live JAX arrays before
the step (``jax.live_arrays()``: the variables) plus that rise. Before the warm-up the glibc mmap
threshold is pinned at 16 KiB (``mallopt(M_MMAP_THRESHOLD)``, which also stops glibc raising it
dynamically) and ``malloc_trim(0)`` runs before the step: otherwise buffers reuse pages freed by the
previous step that are still resident and the rise misses them (we saw 1.4 MiB instead of 10.4 MiB).
With it, repeated runs agree to within a few pages. This catches memory that XLA's buffer assignment does
not see — the internal buffers of YNNPACK fusions (``__ynn_fusion`` custom fusions that run several
convolutions or matmuls as one op) — so the two are truly independent. Sampling
``mallinfo2()`` from a thread was tried and rejected: the step holds the GIL, so the sampler sees one or
two points per step. As a cross-check the executable Keras actually cached (``model.train_function``'s
jitted function) is asked for its ``memory_analysis()``; its figures go to the report's meta.

Limits: the estimate misses YNNPACK's internal buffers, up to 3 MiB on the zoo's CNNs at batch 8 (e.g.
keras_separable_cnn infer: estimate 0.2 MiB, measured 3.1 MiB); over the zoo (9 models x train/infer,
batch 8) the median error is about 7 %. The measurement rounds to 4 KiB pages, includes the few pages
Python touches during the call, and varies by 10-20 % between runs for steps whose YNNPACK work spreads
over a varying number of threads (keras_transformer_block infer: 1.8-2.3 MiB).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Callable
from typing import Any

import jax
import keras

from nnmem.errors import TraceError, UnsupportedError
from nnmem.frontends.keras.common import (
    KerasStep,
    array_nbytes,
    flat_arrays,
    layer_infos,
    optimizer_label,
    resident_variables,
)
from nnmem.report.model import Report, report_from_trace
from nnmem.trace import Block, Category, Op, Phase, Trace

__all__ = ["trace_step", "measure_step"]

# glibc malloc.h: M_TRIM_THRESHOLD = -1, M_MMAP_THRESHOLD = -3.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD = 16 * 1024
"""Allocations from this size up get fresh pages from mmap, so the resident-set rise sees them, in bytes."""


def _struct(a: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(int(d) for d in a.shape), jax.dtypes.canonicalize_dtype(a.dtype))


def _structs(value: Any) -> Any:
    return keras.tree.map_structure(lambda a: None if a is None else _struct(a), value)


def _state_variables(model: Any, mode: str) -> tuple[list[Any], ...]:
    """The variable lists Keras passes as ``state``, in ``_get_jax_state``'s order."""
    if mode == "train":
        return (list(model.trainable_variables), list(model.non_trainable_variables),
                list(model.optimizer.variables), list(model.metrics_variables))
    return list(model.trainable_variables), list(model.non_trainable_variables)


def _step_function(model: Any, mode: str) -> Callable[..., Any]:
    """The function Keras jits for the step (``make_train_function`` / ``make_predict_function``)."""
    if mode == "train":
        return model.train_step  # type: ignore[no-any-return]

    def predict_step(state: Any, data: Any) -> Any:
        outputs, non_trainable = model.predict_step(state, data)
        return outputs, (state[0], non_trainable)

    return predict_step


def _data(step: KerasStep) -> tuple[Any, ...]:
    return (step.x, step.y, None) if step.mode == "train" else (step.x,)


def _compiled(step: KerasStep) -> Any:
    model = step.model
    if getattr(model, "jit_compile", True) is False or getattr(model, "run_eagerly", False):
        raise UnsupportedError("the Keras model is compiled with jit_compile=False or run_eagerly=True; the JAX "
                               "estimate reads XLA's buffer assignment: compile it with jit_compile=True")
    state = tuple([_struct(v.value) for v in group] for group in _state_variables(model, step.mode))
    data = _structs(_data(step))
    fn = jax.jit(_step_function(model, step.mode), donate_argnums=0)
    try:
        lowered = fn.lower(state, data)
    except (ValueError, TypeError, IndexError) as err:
        shapes = ", ".join(str(tuple(a.shape)) for a in flat_arrays(step.x))
        first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise TraceError(f"the Keras model rejected inputs of shape {shapes}: {first[:300]} — pass inputs "
                         "shaped as the model's Input") from err
    return lowered.compile()


def trace_step(step: KerasStep, *, meta: dict[str, object]) -> Trace:
    """Estimate the step from the buffer assignment of its compiled XLA executable.

    Nothing batch-sized is allocated: the executable is compiled from shape structs.

    Args:
        step: the prepared step.
        meta: facts for the report (batch, ...); JAX and Keras versions and the optimizer are added.

    Returns:
        A trace of framework "keras-jax": the variables and the data resident, then one op that allocates
        the step's outputs and XLA temporaries, one that frees the temporaries and the replaced state.

    Raises:
        TraceError: the model rejects the inputs' shapes.
    """
    stats = _compiled(step).memory_analysis()
    blocks = _resident_blocks(step)
    data_bytes = sum(array_nbytes(a) for a in flat_arrays(_data(step)))
    new_outputs = int(stats.output_size_in_bytes - stats.alias_size_in_bytes)
    temp = int(stats.temp_size_in_bytes)
    phase = Phase.FORWARD if step.mode == "infer" else Phase.BACKWARD
    n = len(blocks)
    blocks += [Block(n, temp, Category.TEMPORARIES, "", phase, 0, 0),
               Block(n + 1, new_outputs, Category.ACTIVATIONS, "", phase, 0, -1)]
    ops = (Op(0, "xla.execute", phase, "", temp + new_outputs, temp),)
    meta = {**meta, "jax": jax.__version__, "keras": keras.__version__,
            "xla.argument_bytes": int(stats.argument_size_in_bytes),
            "xla.output_bytes": int(stats.output_size_in_bytes),
            "xla.alias_bytes": int(stats.alias_size_in_bytes), "xla.temp_bytes": temp,
            "xla.code_bytes": int(stats.generated_code_size_in_bytes), "inputs_bytes": data_bytes}
    if step.mode == "train":
        meta["optimizer"] = optimizer_label(step.model)
    return Trace("keras-jax", step.mode, tuple(blocks), ops, layer_infos(step.model), meta)


def _resident_blocks(step: KerasStep) -> list[Block]:
    blocks = [Block(i, array_nbytes(v), category, layer, Phase.SETUP, -1, -1)
              for i, (v, category, layer) in enumerate(resident_variables(step.model, step.mode))]
    for a in flat_arrays(_data(step)):
        blocks.append(Block(len(blocks), array_nbytes(a), Category.INPUTS, "", Phase.SETUP, -1, -1))
    return blocks


def measure_step(step: KerasStep, *, name: str, meta: dict[str, object]) -> Report:
    """Run the real Keras step (call it inside a child process) and report its measured peak.

    The allocator peak is the bytes of the live JAX arrays before the step plus the rise of the process's
    resident-set high-water mark during it (see the module docstring). This pins glibc's mmap threshold
    for the rest of the process.

    Args:
        step: the prepared step.
        name: the model's display name.
        meta: facts for the report.
    """
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
    libc.mallopt(_M_TRIM_THRESHOLD, _MMAP_THRESHOLD)
    model = step.model
    run: Callable[[], Any] = ((lambda: model.train_on_batch(step.x, step.y)) if step.mode == "train"
                              else (lambda: model.predict_on_batch(step.x)))
    for _ in range(2 if step.mode == "train" else 1):
        run()
    rises = []
    for _ in range(3):  # the smallest of three: a stray Python arena or thread stack touched once is not the step's
        gc.collect()
        libc.malloc_trim(0)
        live = sum(int(a.nbytes) for a in jax.live_arrays())
        before = _status_bytes("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        run()
        rises.append(_status_bytes("VmHWM") - before)
    rise = max(min(rises), 0)
    peak = live + rise
    trace = _measured_trace(step, rise, meta)
    extra: dict[str, object] = {"measure.method": "jax.live_arrays before the step + VmHWM rise during it",
                                "measure.live_array_bytes": live, "measure.rss_rise_bytes": rise,
                                "measure.rss_rises": ",".join(str(r) for r in rises)}
    extra.update(_cached_executable_stats(model, step))
    trace = Trace(trace.framework, trace.mode, trace.blocks, trace.ops, trace.layers, {**trace.meta, **extra})
    notes = ("measured: JAX arrays live before the step plus the process's resident-set rise during the real "
             "step (glibc mmap threshold pinned at 16 KiB; 4 KiB pages)",)
    return report_from_trace(trace, source="measure", model=name, device="cpu",
                             overrides={"allocator": peak, "tensor": peak}, notes=notes)


def _measured_trace(step: KerasStep, rise: int, meta: dict[str, object]) -> Trace:
    """The variables resident (as Keras holds them), then the measured rise as one block of temporaries."""
    blocks = [Block(i, array_nbytes(v), category, layer, Phase.SETUP, -1, -1)
              for i, (v, category, layer) in enumerate(resident_variables(step.model, step.mode))]
    phase = Phase.FORWARD if step.mode == "infer" else Phase.BACKWARD
    blocks.append(Block(len(blocks), rise, Category.TEMPORARIES, "", phase, 0, 0))
    meta = {**meta, "jax": jax.__version__, "keras": keras.__version__}
    if step.mode == "train":
        meta["optimizer"] = optimizer_label(step.model)
    return Trace("keras-jax", step.mode, tuple(blocks), (Op(0, "train_on_batch" if step.mode == "train"
                                                             else "predict_on_batch", phase, "", rise, rise),),
                 layer_infos(step.model), meta)


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
    state = tuple([v.value for v in group] for group in _state_variables(model, step.mode))
    data = keras.tree.map_structure(lambda a: None if a is None else jax.device_put(a), _data(step))
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

