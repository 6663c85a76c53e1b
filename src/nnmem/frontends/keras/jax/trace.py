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
XLA:CPU and YNNPACK take their buffers straight from glibc ``malloc``. The measuring child is started with
:mod:`nnmem.runner.mallocpeak` preloaded, which counts every malloc and free of the process; the measured
peak is the bytes of the live JAX arrays before the step (the variables, and the data, put on the device
first) plus the step's rise of the malloc high-water mark, median of five steps after the warm-up (the real
``train_on_batch`` / ``predict_on_batch`` with the executable Keras compiled). It sees what XLA's buffer
assignment does not — convolution im2col and padding buffers, YNNPACK packing and tiles — exactly, and
repeats to the byte for most steps; steps whose YNNPACK tiles spread over a varying number of worker
threads vary by a few 128 KiB tiles. Without a C compiler to build the counter the fallback is the rise of
the resident-set high-water mark (``VmHWM`` after ``clear_refs``, glibc's mmap threshold pinned at 16 KiB),
which misses memory malloc reuses from pages already resident (keras_mlp train: 98 KiB of a 290 KiB rise);
the report says which was used. As a cross-check the executable Keras actually cached (``model.train_function``'s
jitted function) is asked for its ``memory_analysis()``; its figures go to the report's meta.

Kernel scratch. XLA's temporaries are one block live for the whole execution; on top of it an op's scratch
(``_fusion_workspace``): XLA's own convolutions and dots (Eigen) an im2col buffer and a packing buffer,
YNNPACK fusions padded or materialized convolution inputs, packed filters and dot operands, and reduction
tiles — rules read from each instruction's geometry in ``compiled.as_text()`` and calibrated on single jitted
ops with the malloc counter (listed with the rules).

Runtime bookkeeping. An execute call mallocs per buffer as well: the ``jax.Array`` and PjRt buffer of each new
output, a hold per donated argument an output takes over, a little per other argument
(:func:`_runtime_bookkeeping`, calibrated on jitted functions of many small arrays). A Keras step passes every
variable of its state, so on small models this is a visible share of the rise: keras_subclassed inference was
-16.5 % without it, -3.4 % with it; keras_mlp training -6.1 %, -1.7 %.

Limits: not modelled are the intermediates YNNPACK keeps in fusions that chain a dot into a softmax in the
backward pass (keras_transformer_block train: -25 %) and tiles beyond one block per worker thread. Some steps
take one of two values from step to step, as XLA runs independent operations on its threads together or not
(keras_partly_frozen inference: a 1.37 MB or a 2.22 MB peak; the estimate, 2.21 MB, keeps both convolutions'
padded inputs live together).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import math
import os
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
    text = compiled.as_text()
    workspace, scratch = _fusion_workspace(text)
    bookkeeping = _runtime_bookkeeping(text, compiled.out_tree.num_leaves)
    ops = (Op(0, "xla.execute", phase, "", temp + new_outputs, temp, workspace + bookkeeping),)
    meta = {**meta, "jax": jax.__version__, "keras": keras.__version__,
            "xla.argument_bytes": int(stats.argument_size_in_bytes),
            "xla.output_bytes": int(stats.output_size_in_bytes),
            "xla.alias_bytes": int(stats.alias_size_in_bytes), "xla.temp_bytes": temp,
            "xla.code_bytes": int(stats.generated_code_size_in_bytes), "inputs_bytes": data_bytes,
            "xla.max_conv_scratch_bytes": scratch, "xla.conv_workspace_bytes": workspace,
            "xla.runtime_bookkeeping_bytes": bookkeeping}
    if step.mode == "train":
        meta["optimizer"] = optimizer_label(step.model)
    return Trace("keras-jax", step.mode, tuple(blocks), ops, layer_infos(step.model), meta)


# --- The runtime's own allocations during an execute call ---------------------------------------------------
# Calibrated with the malloc counter of ``measure_step`` on jitted functions of k float32[16] arrays (jax 0.10.2
# CPU), median of 5 calls after 2 warm-ups, the output buffers subtracted; least squares over three families:
#   A  jit(lambda s, x: ([a + x for a in s], sum(x)), donate_argnums=0): k aliased pairs, 1 input, 1 output
#      k=4: 7,660 B, k=16: 24,100, k=64: 92,148 (fit: 7,805 / 24,644 / 92,003)
#   B  jit(lambda s: sum(s)): k inputs, 1 output   k=4: 3,184, k=16: 8,904, k=64: 26,088 (3,340 / 7,934 / 26,311)
#   C  jit(lambda x: [x * c for c in ...]): 1 input, k outputs
#      k=4: 7,096, k=16: 27,032, k=64: 106,456 (7,157 / 27,017 / 106,457)
# Not fitted, and over-predicted by 12-18 %: k non-donated inputs each giving a new output (k=64: 110,512 B
# measured, 130,577 modelled) — a Keras step donates its state, so its inputs and outputs are mostly aliased pairs.
# Counted in full on top of the temporaries and scratch: with a 1.33 MB matmul chain peaking inside the call
# the slope is lower (543 B per aliased pair, 438 B per output), but splitting the cost into a mid-execution
# and an end-of-call share fitted the Keras zoo worse (keras_subclassed train -9.4 % against -1.8 %); the
# full count over-estimates steps with a large state a little (keras.applications MobileNetV2 train on JAX:
# +4.9 %, +2.5 % without the term).
_CALL_BASE = 154
"""Bytes an execute call allocates whatever its arguments."""
_PER_INPUT = 383
"""Bytes per executable parameter that no output aliases (the data)."""
_PER_OUTPUT = 1_655
"""Bytes per new output besides its buffer (the ``jax.Array`` and its PjRt buffer, events)."""
_PER_ALIASED = 1_403
"""Bytes per donated parameter whose buffer an output takes over (a variable of the step's state)."""
_ALIAS_ENTRY = re.compile(r"\{[\d,\s]*\}:\s*\(\d+,")


def _runtime_bookkeeping(hlo: str, outputs: int) -> int:
    """Bytes the JAX / PjRt runtime mallocs for its own bookkeeping during one execute call of ``hlo``.

    A per-buffer cost (calibration above): each parameter, each new output and each donated parameter an output
    aliases. On small steps it is a visible share of the rise (keras_mlp inference: 7 parameters, 7 outputs).
    """
    header = hlo.split("\n", 1)[0]
    aliased = len(_ALIAS_ENTRY.findall(header.split("input_output_alias=", 1)[1])) if \
        "input_output_alias=" in header else 0
    comps, entry = _computations(hlo)
    params = sum(ins.opcode == "parameter" for ins in comps.get(entry, []))
    aliased = min(aliased, params, outputs)
    return _CALL_BASE + _PER_ALIASED * aliased + _PER_INPUT * (params - aliased) + _PER_OUTPUT * (outputs - aliased)


def _resident_blocks(step: KerasStep) -> list[Block]:
    blocks = [Block(i, array_nbytes(v), category, layer, Phase.SETUP, -1, -1)
              for i, (v, category, layer) in enumerate(resident_variables(step.model, step.mode))]
    for a in flat_arrays(_data(step)):
        blocks.append(Block(len(blocks), array_nbytes(a), Category.INPUTS, "", Phase.SETUP, -1, -1))
    return blocks


# --- Kernel scratch that XLA:CPU's buffer assignment does not see -----------------------------------------
# Calibrated on single jitted ops (jax 0.10.2 CPU, 2 cores) with the malloc counter of ``measure_step``
# (every block malloc hands out during the call, minus XLA's temp and output buffers), float32, NHWC / HWIO:
#   XLA's own (Eigen) convolution, outside YNNPACK: an im2col buffer of the output, one group at a time, plus
#     74,184 B of contraction packing: 8x32x32x3 k3 SAME ->16: 888,328 B (im2col 884,736); k5: 2,561,032
#     (2,457,600). XLA's own dot (keras_mlp's weight gradients): the same 74,184 B packing buffer.
#   A convolution inside a YNNPACK fusion: its spatially padded input when it pads (8x32x32x32 k3 SAME:
#     1,183,816 B, padded 1,183,744; 8x16x16x16: 165,960 vs 165,888), its input in full when an op of the same
#     fusion produces it (keras_separable_cnn: the depthwise output read by the pointwise convolution,
#     1,048,648 B), all live until the fusion ends; and its packed filter, briefly (3x3x32x32: 36,936 B).
#   A dot inside a YNNPACK fusion writes its result in full when the fusion only reshapes it (keras_conv1d_gru's
#     GRU input projection f32[792,192]: 608,328 B, 608,256 computed) and reads an operand that an op of the
#     fusion computes (the max pooling before it, f32[792,32]: 101,448 B) from a full buffer.
#   A dot inside a YNNPACK fusion with at least 64 rows packs its right operand in blocks of up to 128 KiB, one
#     per worker thread (64x512 @ 512x512: 2 x 131,144 B; 512x64 @ 64x256: one 65,608 B block); with 8 rows
#     nothing. A reduction over an array larger than 128 KiB (softmax of 8x4x64x64) tiles it in 128 KiB
#     blocks, one per worker thread (2 x 131,144 B).
_ITEMSIZE = {"f64": 8, "s64": 8, "u64": 8, "f32": 4, "s32": 4, "u32": 4, "f16": 2, "bf16": 2, "s16": 2,
             "u16": 2, "s8": 1, "u8": 1, "pred": 1}
_ARRAY = re.compile(r"\b(" + "|".join(_ITEMSIZE) + r")\[([\d,]*)\]")
_INSTRUCTION = re.compile(r"^\s*(ROOT )?%([\w.\-]+) = (.*?) ([\w\-]+)\((.*)$")
_COMPUTATION = re.compile(r"^(ENTRY )?%([\w.\-]+) \(.*\{\s*$")
_NAME = re.compile(r"%([\w.\-]+)")
_NO_BUFFER = frozenset({"parameter", "bitcast", "get-tuple-element", "tuple", "constant", "after-all"})
_EIGEN_PACKING = 74_184
"""Bytes of Eigen's contraction packing buffer beside a convolution's im2col buffer (calibration above)."""
_YNN_BLOCK = 128 * 1024
"""Bytes of a YNNPACK packing / tiling block, one per worker thread (calibration above)."""
_DOT_PACK_ROWS = 64
"""Rows from which a YNNPACK dot packs its right operand (8 rows: no packing; 64 and 512: packing)."""


@dataclass(frozen=True, slots=True)
class _Instruction:
    name: str
    type: str
    opcode: str
    rest: str
    root: bool

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


def _threads() -> int:
    """Worker threads of XLA:CPU's pool: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _shape(text: str) -> tuple[list[int], int] | None:
    found = _ARRAY.search(text)
    return (_dims(found.group(2)), _ITEMSIZE[found.group(1)]) if found else None


@dataclass(frozen=True, slots=True)
class _Conv:
    """A convolution's geometry, read from its HLO text."""

    lhs: list[int]  # input dims, in the order of ``lhs_labels``
    lhs_labels: str  # e.g. "b01f": batch, spatial 0, 1, features
    out: list[int]
    out_labels: str
    window: list[int]  # kernel size per spatial dim
    pads: list[int] | None  # total padding per spatial dim; None when the window does not pad
    groups: int
    item: int  # bytes per element

    def dim(self, label: str) -> int:
        return self.lhs[self.lhs_labels.index(label)]


def _conv(conv: _Instruction, types: dict[str, str]) -> _Conv | None:
    lhs, out = _shape(types.get(conv.operands[0], "")), _shape(conv.type)
    labels = re.search(r"dim_labels=(\w+)_\w+->(\w+)", conv.rest)
    window = re.search(r"window=\{([^}]*)\}", conv.rest)
    if lhs is None or out is None or labels is None:
        return None
    size = re.search(r"size=([\dx]+)", window.group(1)) if window else None
    pad = re.search(r"pad=([\d_x\-]+)", window.group(1)) if window else None
    groups = re.search(r"feature_group_count=(\d+)", conv.rest)
    return _Conv(lhs[0], labels.group(1), out[0], labels.group(2),
                 [int(k) for k in size.group(1).split("x")] if size else [],
                 [sum(int(p) for p in s.split("_")) for s in pad.group(1).split("x")] if pad else None,
                 int(groups.group(1)) if groups else 1, lhs[1])


def _eigen_conv_scratch(conv: _Instruction, types: dict[str, str]) -> int:
    """An XLA (Eigen) convolution's im2col buffer of the output, one group at a time, and its packing buffer."""
    c = _conv(conv, types)
    if c is None or not c.window:
        return 0
    spatial = math.prod(c.out[c.out_labels.index(str(k))] for k in range(len(c.window)))
    return c.dim("b") * spatial * math.prod(c.window) * (c.dim("f") // c.groups) * c.item + _EIGEN_PACKING


def _padded_input(c: _Conv) -> int:
    """Bytes of a convolution's input with its spatial padding; its plain size when it does not pad."""
    if c.pads is None:
        return math.prod(c.lhs) * c.item
    spatial = math.prod(c.dim(str(k)) + p for k, p in enumerate(c.pads))
    return c.dim("b") * spatial * c.dim("f") * c.item


_REINTERPRET = frozenset({"bitcast", "reshape", "copy", "transpose"})


def _through_reinterpret(name: str, named: dict[str, _Instruction]) -> _Instruction | None:
    """The instruction of a fusion that produces ``name``, looking through bitcasts and reshapes."""
    ins = named.get(name)
    while ins is not None and ins.opcode in _REINTERPRET and ins.operands:
        ins = named.get(ins.operands[0])
    return ins


def _ynn_scratch(body: list[_Instruction], types: dict[str, str], threads: int) -> int:
    """Scratch of one YNNPACK fusion, in bytes: see the calibration above."""
    produced = {i.name for i in body if i.opcode not in ("parameter", "constant")}
    named = {i.name: i for i in body}
    held = transient = 0
    for ins in body:
        if ins.opcode == "convolution" and (c := _conv(ins, types)) is not None:
            if c.pads is not None or ins.operands[0] in produced:
                held += _padded_input(c)
            weights = _shape(types.get(ins.operands[1], "")) if len(ins.operands) > 1 else None
            if weights is not None:
                transient = max(transient, math.prod(weights[0]) * weights[1])
        elif ins.opcode == "dot" and len(ins.operands) > 1:
            lhs, rhs = _shape(types.get(ins.operands[0], "")), _shape(types.get(ins.operands[1], ""))
            out = _shape(ins.type)
            if lhs is None or rhs is None or out is None or len(out[0]) < 2:
                continue
            users = [u.opcode for u in body if ins.name in u.operands]
            if not ins.root and users and all(u in _REINTERPRET for u in users):
                held += math.prod(out[0]) * out[1]  # a result that is only reshaped is written out in full
            for operand in ins.operands[:2]:
                source = _through_reinterpret(operand, named)
                if source is not None and source.opcode not in ("parameter", "constant", "broadcast", "iota"):
                    found = _shape(source.type)
                    held += math.prod(found[0]) * found[1] if found else 0  # produced in the fusion: in full
            rows = math.prod(out[0][:-1])
            rhs_bytes = math.prod(rhs[0]) * rhs[1]
            if rows >= _DOT_PACK_ROWS:
                transient = max(transient, rhs_bytes if rhs_bytes <= _YNN_BLOCK else threads * _YNN_BLOCK)
        elif ins.opcode == "reduce":
            reduced = _shape(types.get(ins.operands[0], ""))
            if reduced is not None and math.prod(reduced[0]) * reduced[1] > _YNN_BLOCK:
                transient = max(transient, threads * _YNN_BLOCK)
    return held + transient


def _fusion_workspace(hlo: str) -> tuple[int, int]:
    """Kernel scratch above XLA's buffers at the step's peak, and the largest single scratch, in bytes.

    XLA:CPU allocates its temporaries as one block live for the whole execution, so the scratch adds to all
    of it. Each top-level instruction of the scheduled entry computation gets its scratch: an XLA (Eigen)
    convolution its im2col and packing buffers, a YNNPACK fusion what :func:`_ynn_scratch` counts. XLA's
    thunk executor runs independent instructions at once: neighbouring Eigen convolutions that do not read
    each other's results (the two branches of keras_two_branch_cnn) hold their scratch together.
    """
    comps, entry = _computations(hlo)
    types = {i.name: i.type for body in comps.values() for i in body}
    body = comps.get(entry, [])
    threads = _threads()
    peak = largest = 0
    group: list[tuple[str, int]] = []  # neighbouring independent Eigen convolutions
    for ins in body:
        called = re.search(r"calls=%([\w.\-]+)", ins.rest)
        if ins.opcode == "convolution":
            scratch = _eigen_conv_scratch(ins, types)
            if any(name in ins.operands for name, _ in group):
                group = []
            group.append((ins.name, scratch))
            peak = max(peak, sum(s for _, s in group))
        else:
            if ins.opcode not in _NO_BUFFER:
                group = []
            if ins.opcode == "dot":  # XLA's own (Eigen) dot: the contraction's packing buffer
                scratch = _EIGEN_PACKING
            elif called and "__ynn_fusion" in ins.rest:
                scratch = _ynn_scratch(comps.get(called.group(1), []), types, threads)
            else:
                scratch = 0
            peak = max(peak, scratch)
        largest = max(largest, scratch)
    return peak, largest


MEASURED_STEPS = 5
"""Steps measured after the warm-up; the report takes the median (YNNPACK spreads tiles over a varying number
of worker threads, each with its own scratch, so a step's peak varies by a few tiles)."""


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
    x = keras.tree.map_structure(lambda a: None if a is None else jax.device_put(a), step.x)
    y = keras.tree.map_structure(lambda a: None if a is None else jax.device_put(a), step.y)
    run: Callable[[], Any] = ((lambda: model.train_on_batch(x, y)) if step.mode == "train"
                              else (lambda: model.predict_on_batch(x)))
    malloc = counters()
    if malloc is None:
        live, rises, notes, extra = _rss_rises(run, step)
        rise = max(min(rises), 0)
    else:
        for _ in range(2 if step.mode == "train" else 1):
            run()
        rises = []
        for _ in range(MEASURED_STEPS):
            gc.collect()
            live = sum(int(a.nbytes) for a in jax.live_arrays())
            before = malloc.current()
            malloc.reset_peak()
            run()
            rises.append(malloc.peak() - before)
        rise = max(sorted(rises)[len(rises) // 2], 0)
        notes = (f"measured: JAX arrays live before the step plus the step's rise of the malloc high-water mark "
                 f"(every malloc and free counted by a preloaded library), median of {MEASURED_STEPS} steps",)
        extra = {"measure.method": "jax.live_arrays before the step + malloc high-water rise during it"}
    peak = live + rise
    trace = _measured_trace(step, rise, meta)
    extra = {**extra, "measure.live_array_bytes": live, "measure.rise_bytes": rise,
             "measure.rises": ",".join(str(r) for r in rises)}
    extra.update(_cached_executable_stats(model, step))
    trace = Trace(trace.framework, trace.mode, trace.blocks, trace.ops, trace.layers, {**trace.meta, **extra})
    return report_from_trace(trace, source="measure", model=name, device="cpu",
                             overrides={"allocator": peak, "tensor": peak}, notes=notes)


def _rss_rises(run: Callable[[], Any], step: KerasStep) -> tuple[int, list[int], tuple[str, ...], dict[str, object]]:
    """The fallback without the malloc counter: resident-set high-water rises of three steps."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
    libc.mallopt(_M_TRIM_THRESHOLD, _MMAP_THRESHOLD)
    for _ in range(2 if step.mode == "train" else 1):
        run()
    rises = []
    live = 0
    for _ in range(3):  # the smallest of three: a stray Python arena or thread stack touched once is not the step's
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
    if max(rises) - min(rises) > 0.10 * max(min(rises), 1):
        notes += (f"noisy: the three runs' rises spread over {min(rises)}-{max(rises)} bytes (over 10 %); the "
                  "smallest is reported",)
    return live, rises, notes, {"measure.method": "jax.live_arrays before the step + VmHWM rise during it"}


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

