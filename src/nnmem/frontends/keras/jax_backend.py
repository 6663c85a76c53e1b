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

Convolution scratch. XLA:CPU runs convolutions either itself (Eigen, which builds an im2col buffer) or
inside YNNPACK fusions (``__ynn_fusion``, which pad or pack their inputs); neither buffer is in
``memory_analysis()``. ``_fusion_workspace`` reads each convolution's geometry from ``compiled.as_text()``
and applies rules calibrated on single jitted convolutions (listed with the rules), added to the
temporaries live at that instruction; the excess over XLA's temporaries is the op's kernel workspace.

Limits: the internal tiled intermediates of YNNPACK fusions that chain several convolutions, dots or
softmaxes are not modelled (keras_separable_cnn infer: estimate 1.3 MiB, measured 3.0 MiB;
keras_transformer_block train -27 %); over the zoo (9 models x train/infer, batch 8, 2 cores) the median
error is 8-10 % (12 % without the convolution rules) and the largest 56 %. The measurement rounds to 4 KiB
pages, includes the few pages Python touches during the call, and varies by 10-20 % between runs for steps
whose YNNPACK work spreads over a varying number of threads (keras_lstm infer: 0.79-0.91 MiB); a report
says so in its notes when its three runs spread over 10 %.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
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
        the step's outputs and XLA temporaries and frees the temporaries; its workspace is the convolution
        scratch XLA's buffer assignment does not see (``_fusion_workspace``).

    Raises:
        TraceError: the model rejects the inputs' shapes.
    """
    compiled = _compiled(step)
    stats = compiled.memory_analysis()
    blocks = _resident_blocks(step)
    data_bytes = sum(array_nbytes(a) for a in flat_arrays(_data(step)))
    new_outputs = int(stats.output_size_in_bytes - stats.alias_size_in_bytes)
    temp = int(stats.temp_size_in_bytes)
    phase = Phase.FORWARD if step.mode == "infer" else Phase.BACKWARD
    n = len(blocks)
    blocks += [Block(n, temp, Category.TEMPORARIES, "", phase, 0, 0),
               Block(n + 1, new_outputs, Category.ACTIVATIONS, "", phase, 0, -1)]
    workspace, scratch = _fusion_workspace(compiled.as_text(), temp)
    ops = (Op(0, "xla.execute", phase, "", temp + new_outputs, temp, workspace),)
    meta = {**meta, "jax": jax.__version__, "keras": keras.__version__,
            "xla.argument_bytes": int(stats.argument_size_in_bytes),
            "xla.output_bytes": int(stats.output_size_in_bytes),
            "xla.alias_bytes": int(stats.alias_size_in_bytes), "xla.temp_bytes": temp,
            "xla.code_bytes": int(stats.generated_code_size_in_bytes), "inputs_bytes": data_bytes,
            "xla.max_conv_scratch_bytes": scratch, "xla.conv_workspace_bytes": workspace}
    if step.mode == "train":
        meta["optimizer"] = optimizer_label(step.model)
    return Trace("keras-jax", step.mode, tuple(blocks), ops, layer_infos(step.model), meta)


def _resident_blocks(step: KerasStep) -> list[Block]:
    blocks = [Block(i, array_nbytes(v), category, layer, Phase.SETUP, -1, -1)
              for i, (v, category, layer) in enumerate(resident_variables(step.model, step.mode))]
    for a in flat_arrays(_data(step)):
        blocks.append(Block(len(blocks), array_nbytes(a), Category.INPUTS, "", Phase.SETUP, -1, -1))
    return blocks


# --- Convolution scratch that XLA:CPU's buffer assignment does not see -------------------------------------
# Calibrated on single jitted convolutions (jax 0.10.2 CPU, 2 cores, the measurement protocol of
# ``measure_step``: VmHWM rise minus outputs minus XLA temps, min of 3), float32, NHWC / HWIO:
#   XLA's own (Eigen) convolution, not in a YNNPACK fusion — scratch vs im2col of the output per group:
#     8x32x32x3 k5 SAME ->16: 2348 vs 2400 KiB; k5 VALID: 1784 vs 1837; k7 SAME: 4564 vs 4704;
#     batch 16 k5: 4736 vs 4800; depthwise 8x32x32x3 k3: 248 vs 295; Conv1D 8x400x8 k5 VALID ->32:
#     424 vs 495, SAME: 356 vs 500; 8x400x32 k5 VALID: 1784 vs 1980.
#   A YNNPACK fusion holding convolutions — scratch vs the largest spatially padded convolution input:
#     8x32x32x32 k3 SAME ->32: 1152 vs 1156 KiB; ->64: 952 vs 1156; 8x32x32x64: 2132 vs 2312;
#     8x64x64x32: 4356 vs 4356; 32x32x32x32: 4596 vs 4624; 8x32x32x32 k5: 1056 vs 1296; k1: 852 vs 1024;
#     8x32x32x3 k5: 116 vs 122; depthwise 8x32x32x32: 916 vs 1156, 8x16x16x32: 172 vs 324; it over-counts
#     narrow inputs (8x32x32x3 k3: 8 vs 108; 8x32x32x16: 288 vs 578) and misses VALID convolutions
#     (8x32x32x32 k3 VALID: 7892 vs 0) — none in the zoo. Dots (YNNPACK) showed no scratch (<= 4 KiB).
_ITEMSIZE = {"f64": 8, "s64": 8, "u64": 8, "f32": 4, "s32": 4, "u32": 4, "f16": 2, "bf16": 2, "s16": 2,
             "u16": 2, "s8": 1, "u8": 1, "pred": 1}
_ARRAY = re.compile(r"\b(" + "|".join(_ITEMSIZE) + r")\[([\d,]*)\]")
_INSTRUCTION = re.compile(r"^\s*(ROOT )?%([\w.\-]+) = (.*?) ([\w\-]+)\((.*)$")
_COMPUTATION = re.compile(r"^(ENTRY )?%([\w.\-]+) \(.*\{\s*$")
_NAME = re.compile(r"%([\w.\-]+)")
_NO_BUFFER = frozenset({"parameter", "bitcast", "get-tuple-element", "tuple", "constant", "after-all"})


@dataclass(frozen=True, slots=True)
class _Instruction:
    name: str
    type: str
    opcode: str
    rest: str
    root: bool

    @property
    def nbytes(self) -> int:
        return sum(math.prod(_dims(d)) * _ITEMSIZE[t] for t, d in _ARRAY.findall(self.type.split("{")[0]
                   if not self.type.startswith("(") else self.type))

    @property
    def operands(self) -> list[str]:
        return _NAME.findall(self.rest.split("metadata=")[0])


def _dims(text: str) -> list[int]:
    return [int(d) for d in text.split(",") if d]


def _computations(hlo: str) -> tuple[dict[str, list[_Instruction]], str]:
    """The computations of ``compiled.as_text()`` and the entry's name (its instructions in schedule order)."""
    comps: dict[str, list[_Instruction]] = {}
    current, entry = "", ""
    for line in hlo.splitlines():
        if (head := _COMPUTATION.match(line)) is not None:
            current = head.group(2)
            comps[current] = []
            entry = current if head.group(1) else entry
        elif line.startswith("}"):
            current = ""
        elif current and (m := _INSTRUCTION.match(line)) is not None:
            comps[current].append(_Instruction(m.group(2), m.group(3), m.group(4), m.group(5), bool(m.group(1))))
    return comps, entry


def _conv_scratch(conv: _Instruction, types: dict[str, str], *, ynn: bool) -> int:
    """Scratch of one convolution, in bytes: see the calibration above."""
    found = _ARRAY.search(types.get(conv.operands[0], ""))
    labels = re.search(r"dim_labels=(\w+)_\w+->(\w+)", conv.rest)
    window = re.search(r"window=\{([^}]*)\}", conv.rest)
    out = _ARRAY.search(conv.type)
    if found is None or labels is None or window is None or out is None:
        return 0
    lhs, out_dims, (lhs_labels, out_labels) = _dims(found.group(2)), _dims(out.group(2)), labels.groups()
    size_match = re.search(r"size=([\dx]+)", window.group(1))
    size = [int(k) for k in size_match.group(1).split("x")] if size_match else []
    pad = re.search(r"pad=([\d_x\-]+)", window.group(1))
    pads = [sum(int(p) for p in s.split("_")) for s in pad.group(1).split("x")] if pad else [0] * len(size)
    groups = re.search(r"feature_group_count=(\d+)", conv.rest)
    batch, channels = lhs[lhs_labels.index("b")], lhs[lhs_labels.index("f")]
    item = _ITEMSIZE[found.group(1)]
    if ynn:  # the spatially padded input
        padded = math.prod(lhs[lhs_labels.index(str(k))] + p for k, p in enumerate(pads))
        return batch * padded * channels * item
    spatial = math.prod(out_dims[out_labels.index(str(k))] for k in range(len(size)))
    per_group = channels // (int(groups.group(1)) if groups else 1)
    return batch * spatial * math.prod(size) * per_group * item  # im2col of the output, one group at a time


def _fusion_workspace(hlo: str, temp: int) -> tuple[int, int]:
    """Convolution scratch above XLA's temporaries at the step's peak, and the largest scratch, in bytes.

    Each top-level instruction of the scheduled entry computation gets the scratch of its convolutions (a
    YNNPACK fusion: the largest of its convolutions'; it frees it before the next instruction). It adds to
    the temporaries live at that instruction: outputs of earlier instructions still to be read (not the
    step's outputs), capped at XLA's ``temp`` since buffer assignment shares buffers that we do not.
    """
    comps, entry = _computations(hlo)
    types = {i.name: i.type for body in comps.values() for i in body}
    body = comps.get(entry, [])
    last_use = {name: k for k, ins in enumerate(body) for name in ins.operands}
    outputs = set(body[-1].operands) if body and body[-1].root else set()
    temps = [(k, i) for k, i in enumerate(body) if i.opcode not in _NO_BUFFER and i.name not in outputs
             and not i.root]
    peak, largest = temp, 0
    for k, ins in enumerate(body):
        called = re.search(r"calls=%([\w.\-]+)", ins.rest)
        convs = [ins] if ins.opcode == "convolution" else [
            c for c in comps.get(called.group(1), []) if c.opcode == "convolution"] if called else []
        scratch = max((_conv_scratch(c, types, ynn="__ynn_fusion" in ins.rest) for c in convs), default=0)
        if scratch:
            live = sum(t.nbytes for j, t in temps if j <= k <= last_use.get(t.name, -1) or j == k)
            peak, largest = max(peak, min(live, temp) + scratch), max(largest, scratch)
    return peak - temp, largest


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
    notes: tuple[str, ...] = ("measured: JAX arrays live before the step plus the process's resident-set rise "
                              "during the real step (glibc mmap threshold pinned at 16 KiB; 4 KiB pages)",)
    if max(rises) - min(rises) > 0.10 * max(min(rises), 1):
        notes += (f"noisy: the three runs' rises spread over {min(rises)}-{max(rises)} bytes (over 10 %); the "
                  "smallest is reported",)
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

