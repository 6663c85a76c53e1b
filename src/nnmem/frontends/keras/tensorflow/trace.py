"""The Keras frontend on the TensorFlow backend: the graph of the step's ``tf.function``, replayed.

On a CPU-only machine Keras 3 resolves ``jit_compile="auto"`` to False (``Trainer._resolve_auto_jit_compile``:
"Disable XLA on CPU-only machines"), so ``train_on_batch`` runs ``one_step_on_data`` — a plain ``tf.function``
around ``train_step`` — on TensorFlow's graph executor, and ``predict_on_batch`` a ``tf.function`` around
``predict_step``. The estimate traces that same function for ``tf.TensorSpec`` s of the data (no tensor is
allocated) and replays its graph the way the executor frees memory:

* every output is a buffer of its static shape, rounded up to the BFC allocator's 256-byte granularity;
* a buffer is freed after its last consumer has run; outputs nobody consumes die at once;
* view ops (Identity, Reshape, ReadVariableOp, ...) share their input's buffer, element-wise kernels
  write into an input buffer they hold the last reference to (``OpKernelContext::forward_input``);
* control flow: an ``If`` / ``While`` body is replayed on its own and its rise counted as the op's
  workspace (the executor the truth runs keeps control flow functional: a loop runs one iteration at a
  time); a forward ``While`` whose body pushes onto gradient accumulators keeps ``iterations ×`` the pushed
  tensors until the gradient loop has consumed them — a pushed loop variable the body recomputes (an RNN's
  ``h`` and ``c``) one per iteration after the first, a pushed variable read or list element none
  (:func:`_carried_state`); ``TensorListFromTensor`` copies every row into its own chunk;
* ``Einsum`` transposes operands into temporary copies and, when the output's label order needs it, the
  batch-matmul result into the output (:func:`_einsum_scratch`), counted as the op's workspace;
* the allocator: the BFC allocator is replayed (:class:`_BFC`) from the model's build — each variable after
  its random initializer's temporaries (:func:`_initializer_temporaries`), which leave holes the next
  variables land in whole (keras_lstm: the (64, 512) kernel in a 249,600 B chunk) — over three steps, and each
  block gets the chunk it is handed in the last one. BFC splits a free chunk only when it is at least twice the
  request, so a 1 MiB activation often gets a whole 1.8 MiB chunk left by the step before; measured with the profiler's
  allocator events (``tf.profiler.experimental``, ``MemoryAllocation`` ``allocation_bytes`` against
  ``requested_bytes``), that waste is the whole gap of the conv nets (keras_separable_cnn infer: 910,080 B of
  a 927 KB gap; keras_partly_frozen infer: 622,080 B of 639 KB), while oneDNN kernel scratch (``temp``
  allocations) is 12,336 B per fused convolution and is left out.

Ops run in graph-construction order, one at a time (:func:`_execution_order`: an op that got a control input
after construction waits for it; the halves of a kernel oneDNN may merge run back to back). The truth it is
compared with (:func:`measure_step`) runs the step on TensorFlow's sequential executor with one intra-op thread,
Grappler off and the ops chained in that same order by control edges: TensorFlow's own order is a reverse
post-order whose ties follow heap addresses, so it changes from process to process and the peak with it
(keras_separable_cnn train at batch 32: 20.1 to 30.5 MB in 22 processes); pinned, the peak repeats.
TensorFlow's default executor orders ready ops by their measured cost and runs up to ``parallel_iterations``
iterations of a lowered while loop at once, so its peak moves with timing — least in feed-forward steps,
most in recurrent training (keras_lstm train on one inter-op thread: 3.3 to 15.6 MB against 4.7 MB on the
sequential executor); that spread is not modelled, nor are Grappler's rewrites. Not modelled either: the
temporaries of initializers other than the random ones (zeros, ones, orthogonal), and the order of the
optimizer's slot creation.
"""

from __future__ import annotations

import heapq
import os
from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from nnmem.errors import ConfigError, TraceError
from nnmem.frontends.keras.common import (
    KerasStep,
    array_nbytes,
    flat_arrays,
    layer_infos,
    no_gc,
    optimizer_label,
    resident_variables,
)
from nnmem.report.model import Report, report_from_trace
from nnmem.trace import Block, Category, Op, Phase, Trace

__all__ = ["trace_step", "measure_step", "sequential_runtime", "bfc_round"]

BFC_MIN_ALLOCATION = 256
"""tensorflow/core/common_runtime/bfc_allocator.h: ``kMinAllocationSize = 256``; every chunk is a multiple."""

# Ops whose outputs share the buffer of an input (output i ↔ input i, or output 0 ↔ input 0).
_VIEWS = frozenset({
    "Identity", "IdentityN", "Reshape", "Squeeze", "ExpandDims", "ReadVariableOp", "StopGradient",
    "PreventGradient", "EnsureShape", "Snapshot", "_Arg", "Placeholder", "Bitcast",
})
# Ops that allocate nothing batch-sized on the step's allocator (constants are resident kernel state).
_NO_BUFFER = frozenset({
    "Const", "NoOp", "VarHandleOp", "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
    "EmptyTensorList", "TensorListReserve", "TensorListPushBack", "TensorListSetItem", "TensorListLength",
    "TensorListElementShape", "VariableShape", "Shape", "ShapeN", "Size", "Rank",
})
# Element-wise kernels that call ``forward_input_or_allocate_output`` (cwise_ops_common.h, relu_op.h, ...).
_FORWARDING = frozenset({
    "Relu", "Relu6", "Elu", "Selu", "ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad", "Sigmoid", "Tanh",
    "SigmoidGrad", "TanhGrad", "Softplus", "Mul", "AddV2", "Add", "Sub", "RealDiv", "Div", "DivNoNan",
    "Maximum", "Minimum", "Sqrt", "Rsqrt", "Square", "Pow", "Neg", "Exp", "Log", "Abs", "Sign", "Erf",
    "Reciprocal", "SquaredDifference", "BiasAdd", "AddN", "Softmax", "LogSoftmax", "SelectV2", "Select",
    "Cast", "Floor", "Round", "MulNoNan", "OnesLike", "ZerosLike", "Inv", "Xdivy", "Xlogy", "Erfc", "Log1p",
    "Expm1", "Sin", "Cos", "Tan", "Sinh", "Cosh", "Asinh", "Atan", "Softsign", "LeakyRelu", "LeakyReluGrad",
    "Ceil", "Rint", "Lgamma", "Digamma", "FloorDiv", "FloorMod", "Mod", "Atan2", "SoftplusGrad", "SoftsignGrad",
    "RsqrtGrad", "SqrtGrad", "ReciprocalGrad", "InvGrad",
})
_CALLS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
_IFS = frozenset({"If", "StatelessIf"})
_WHILES = frozenset({"While", "StatelessWhile"})


def bfc_round(nbytes: int) -> int:
    """Bytes the BFC allocator hands out for a request: a multiple of 256, 0 for an empty tensor."""
    if nbytes <= 0:
        return 0
    return -(-nbytes // BFC_MIN_ALLOCATION) * BFC_MIN_ALLOCATION


class _BFC:
    """TensorFlow's BFC allocator, replayed: which chunk each request gets, and so the bytes in use.

    tensorflow/core/common_runtime/bfc_allocator.cc: a request is rounded up to 256 B and served by the
    smallest free chunk that fits (ties: lowest address); the chunk is split only when it is at least twice the
    request (``kMaxInternalFragmentation`` is 128 MiB), otherwise the whole chunk is handed out and counts as
    in use. Freed chunks merge with free neighbours of the same region. With no fitting chunk a new region is
    added: ``curr_region_allocation_bytes_`` (2 MiB at first with ``allow_growth``, doubled until the request
    fits, and doubled after each extension that did not need doubling).
    """

    def __init__(self) -> None:
        self.chunks: dict[int, list[int]] = {}  # addr -> [size, in_use, region]
        self.ends: dict[int, int] = {}  # end addr -> addr
        self.free: list[tuple[int, int]] = []  # (size, addr), sorted
        self.region = 2 << 20
        self.regions = 0
        self.in_use = 0

    def _add_free(self, addr: int, size: int, region: int) -> None:
        self.chunks[addr] = [size, 0, region]
        self.ends[addr + size] = addr
        insort(self.free, (size, addr))

    def _take_free(self, addr: int) -> tuple[int, int]:
        size, _, region = self.chunks.pop(addr)
        del self.ends[addr + size]
        self.free.pop(bisect_left(self.free, (size, addr)))
        return size, region

    def alloc(self, nbytes: int) -> tuple[int, int]:
        """Serve a request of ``nbytes``; returns (address, chunk bytes)."""
        want = max(BFC_MIN_ALLOCATION, bfc_round(nbytes))
        at = bisect_left(self.free, (want, -1))
        if at == len(self.free):
            grew = False
            while want > self.region:
                self.region *= 2
                grew = True
            self.regions += 1
            self._add_free(self.regions << 44, self.region, self.regions)
            if not grew:
                self.region *= 2
            at = bisect_left(self.free, (want, -1))
        size, addr = self.free[at]
        size, region = self._take_free(addr)
        if size >= 2 * want:
            self._add_free(addr + want, size - want, region)
            size = want
        self.chunks[addr] = [size, 1, region]
        self.ends[addr + size] = addr
        self.in_use += size
        return addr, size

    def release(self, addr: int) -> None:
        size, _, region = self.chunks.pop(addr)
        del self.ends[addr + size]
        self.in_use -= size
        nxt = self.chunks.get(addr + size)
        if nxt is not None and not nxt[1] and nxt[2] == region:
            size += self._take_free(addr + size)[0]
        prev = self.ends.get(addr)
        if prev is not None and not self.chunks[prev][1] and self.chunks[prev][2] == region:
            size += self._take_free(prev)[0]
            addr = prev
        self._add_free(addr, size, region)


BFC_STEPS = 3
"""Steps the allocator replay runs; chunk sizes come from the last (the free chunks a step finds are those the
previous step left: 2 warm-up steps and a measured one, as in :func:`measure_step`)."""


def _bfc_chunks(resident: list[tuple[int, int]], sizes: list[int], alloc_at: list[int], free_at: list[int],
                workspace: list[int]) -> tuple[list[int], list[int]]:
    """The chunk bytes each resident block and each step block gets from the BFC allocator in a steady-state
    step, in bytes: (resident chunks, step chunks).

    ``resident`` lists (bytes, temporaries) of each block live before the step, in creation order: a variable
    is created after ``temporaries`` buffers of its size (its initializer's, see :func:`_initializer_temporaries`)
    and they are freed after it, which leaves the holes that later requests are fitted into.
    """
    bfc = _BFC()
    kept: list[int] = []
    for nbytes, temporaries in resident:
        held = [bfc.alloc(nbytes)[0] for _ in range(temporaries)]
        kept.append(bfc.alloc(nbytes)[1])
        for addr in reversed(held):
            bfc.release(addr)
    born: dict[int, list[int]] = {}
    dying: dict[int, list[int]] = {}
    for b, (a, f) in enumerate(zip(alloc_at, free_at)):
        born.setdefault(a, []).append(b)
        dying.setdefault(f if f >= 0 else len(workspace) - 1, []).append(b)
    chunks = [0] * len(sizes)
    for _ in range(BFC_STEPS):
        addrs: dict[int, int] = {}
        for i, scratch in enumerate(workspace):
            for b in born.get(i, ()):
                addrs[b], chunks[b] = bfc.alloc(sizes[b])
            if scratch:
                bfc.release(bfc.alloc(scratch)[0])
            for b in dying.get(i, ()):
                bfc.release(addrs[b])
    return kept, chunks


def _tensor_bytes(t: Any) -> int:
    if t.dtype in (tf.resource, tf.variant, tf.string):
        return 0
    shape = t.shape
    if shape.rank is None or not shape.is_fully_defined():
        return 0
    return int(np.prod(shape.as_list(), dtype=np.int64)) * t.dtype.size


@dataclass
class _Buf:
    """A buffer during the replay: its size, its block, and how many consumers still hold it."""

    nbytes: int
    block: int
    holders: int
    owned: bool  # allocated by the step (not a variable, input or constant), so it can be freed/forwarded


class _Replay:
    """Replays one graph: which op allocates which buffer and after which op each buffer dies."""

    def __init__(self, functions: dict[str, Any]) -> None:
        self.functions = functions
        self.sizes: list[int] = []
        self.alloc_at: list[int] = []
        self.free_at: list[int] = []
        self.cats: list[Category] = []
        self.layers: list[str] = []
        self.ops: list[tuple[str, Phase, str, int]] = []  # (name, phase, layer, workspace)

    def run(self, ops: list[Any], external: set[str], where: list[tuple[Phase, str]],
            keep: Iterable[str] = ()) -> None:
        """Replay ``ops`` in order.

        Args:
            ops: the graph's ops in execution order.
            external: names of tensors owned outside the graph (arguments).
            where: each op's (phase, layer).
            keep: names of the graph's results, live after the last op.
        """
        consumers: dict[str, int] = dict.fromkeys(keep, 1)
        for op in ops:
            for t in op.inputs:
                consumers[t.name] = consumers.get(t.name, 0) + 1
        bufs: dict[str, _Buf] = {}
        for index, op in enumerate(ops):
            phase, layer = where[index]
            workspace = self._workspace(op)
            ins = [bufs.get(t.name) for t in op.inputs]
            for k, t in enumerate(op.outputs):
                bufs[t.name] = self._output(op, k, t, ins, consumers.get(t.name, 0), index, phase, layer, external)
            for buf in ins:
                if buf is not None:
                    buf.holders -= 1
                    self._maybe_free(buf, index)
            for t in op.outputs:
                self._maybe_free(bufs[t.name], index)
            self.ops.append((op.name, phase, layer, workspace))

    def _maybe_free(self, buf: _Buf, index: int) -> None:
        if buf.owned and buf.holders <= 0 and self.free_at[buf.block] < 0:
            self.free_at[buf.block] = index

    def _new(self, nbytes: int, index: int, category: Category, layer: str) -> int:
        self.sizes.append(bfc_round(nbytes))
        self.alloc_at.append(index)
        self.free_at.append(-1)
        self.cats.append(category)
        self.layers.append(layer)
        return len(self.sizes) - 1

    def _output(self, op: Any, k: int, t: Any, ins: list[_Buf | None], uses: int, index: int,
                phase: Phase, layer: str, external: set[str]) -> _Buf:
        kind = op.type
        if t.name in external or kind in ("Placeholder", "_Arg", "Const") or kind in _NO_BUFFER:
            return _Buf(0, -1, uses, False)
        if kind in _VIEWS:
            src = ins[k] if kind == "IdentityN" and k < len(ins) else (ins[0] if ins else None)
            if src is None or not src.owned:
                return _Buf(0, -1, uses, False)
            src.holders += uses  # the view keeps the source alive through its own consumers
            return src
        if kind in _WHILES:
            nbytes = self._accumulated(op, k)
        elif kind == "TensorListFromTensor":
            nbytes = _list_copy_bytes(op.inputs[0])
        else:
            nbytes = _tensor_bytes(t)
        if kind in _FORWARDING and k == 0:
            for buf in ins:
                if buf is not None and buf.owned and buf.holders == 1 and buf.nbytes == bfc_round(nbytes):
                    buf.holders += uses  # written in place: this op held the last reference
                    return buf
        if nbytes == 0:
            return _Buf(0, -1, uses, False)
        category = _category(phase)
        return _Buf(bfc_round(nbytes), self._new(nbytes, index, category, layer), uses, True)

    def _accumulated(self, op: Any, k: int) -> int:
        """Bytes a While output holds: its static size, or iterations × what the body pushes onto it."""
        t = op.outputs[k]
        if t.dtype != tf.variant:
            return _tensor_bytes(t)
        body = self._body(op, "body")
        if body is None:
            return 0
        out = body.outputs[k] if k < len(body.outputs) else None
        if out is None or out.op.type != "TensorListPushBack":
            return 0
        pushed = out.op.inputs[1]
        carried = _carried_state(body, pushed)
        if carried:  # a loop variable the body recomputes: each iteration pushes the previous one's value
            return (_iterations(op) - 1) * bfc_round(_tensor_bytes(pushed))
        if _is_alias_of_variable(pushed):
            return 0
        return _iterations(op) * bfc_round(_tensor_bytes(pushed))

    def _body(self, op: Any, attr: str) -> Any:
        try:
            name = op.get_attr(attr).name
        except (ValueError, AttributeError):
            return None
        fn = self.functions.get(name)
        return getattr(fn, "graph", None) if fn is not None else None

    def _workspace(self, op: Any) -> int:
        """The rise of a called graph (If branch, While body, function) over its arguments, in bytes."""
        attrs = _CALLERS.get(op.type, ())  # a While's cond rises too, by a scalar
        rise = _einsum_scratch(op) if op.type == "Einsum" else 0
        for attr in attrs:
            graph = self._body(op, attr)
            if graph is not None:
                rise = max(rise, _graph_rise(graph, self.functions))
        return rise


def _einsum_scratch(op: Any) -> int:
    """Temporaries of TensorFlow's two-operand ``Einsum`` kernel (``einsum_op_impl.h``), in bytes.

    The kernel runs a batch matmul on ``[batch, free, contracted]`` (or ``[batch, contracted, free]``) views of
    its operands: an operand whose labels are in neither order is transposed into a temporary copy, and when
    the output's labels are not in ``[batch, free 0, free 1]`` order (or with the operands swapped) the matmul
    writes a temporary that is transposed into the output. Measured (profiler allocator events, Keras
    MultiHeadAttention, (8, 64, 4, 16) operands): ``aecd,abcd->acbe`` copies both operands (2 x 131,072 B),
    ``acbe,aecd->abcd`` copies the second and transposes the result (2 x 131,072 B).
    """
    try:
        equation = op.get_attr("equation").decode()
    except (ValueError, AttributeError):
        return 0
    if "->" not in equation or "." in equation or len(op.inputs) != 2:
        return 0
    lhs, out = equation.split("->")
    parts = lhs.split(",")
    if len(parts) != 2:
        return 0
    a, b = parts
    batch = [c for c in out if c in a and c in b]
    contracted = [c for c in a if c in b and c not in out]
    free_a, free_b = [c for c in a if c not in b], [c for c in b if c not in a]

    def fits(labels: str, free: list[str]) -> bool:
        return list(labels) in ([*batch, *free, *contracted], [*batch, *contracted, *free])

    scratch = sum(bfc_round(_tensor_bytes(t)) for t, labels, free in zip(op.inputs, (a, b), (free_a, free_b))
                  if not fits(labels, free))
    if list(out) not in ([*batch, *free_a, *free_b], [*batch, *free_b, *free_a]):
        scratch += bfc_round(_tensor_bytes(op.outputs[0]))
    return scratch


def _list_copy_bytes(t: Any) -> int:
    """Bytes ``TensorListFromTensor`` allocates: it copies each row of ``t`` into its own aligned element.

    (``list_kernels.h``: ``allocate_temp`` per element, so every row is its own BFC chunk.)
    """
    shape = t.shape
    if t.dtype in (tf.resource, tf.variant, tf.string) or shape.rank is None or shape.rank < 1 or \
            not shape.is_fully_defined():
        return 0
    rows = int(shape[0])
    return rows * bfc_round(int(np.prod(shape.as_list()[1:], dtype=np.int64)) * t.dtype.size)


def _carried_state(body: Any, t: Any) -> bool:
    """Whether ``t`` is (a view of) a loop variable of ``body`` whose next value the body computes.

    Such a variable (an RNN's ``h`` and ``c``) is a new tensor every iteration, so pushing it onto a gradient
    accumulator keeps one per iteration after the first (whose value is the loop's input, live anyway);
    a loop invariant passed through unchanged is one buffer.
    """
    while t.op.type in ("Identity", "Reshape", "ExpandDims", "Squeeze"):
        t = t.op.inputs[0]
    names = [x.name for x in body.inputs]
    if t.op.type != "Placeholder" or t.name not in names:
        return False
    k = names.index(t.name)
    if k >= len(body.outputs):
        return False
    nxt = body.outputs[k]
    while nxt.op.type in ("Identity", "IdentityN") and nxt.name != t.name:
        nxt = nxt.op.inputs[0] if nxt.op.type == "Identity" else nxt.op.inputs[nxt.value_index]
    return nxt.name != t.name


def _is_alias_of_variable(t: Any) -> bool:
    while t.op.type in ("Identity", "Reshape", "ExpandDims", "Squeeze"):
        t = t.op.inputs[0]
    return bool(t.op.type in ("ReadVariableOp", "Placeholder", "Const", "TensorListGetItem"))


def _iterations(op: Any) -> int:
    """A While op's trip count: its ``maximum_iterations`` loop variable (index 1) when constant."""
    from tensorflow.python.framework import tensor_util

    try:
        value = tensor_util.constant_value(op.inputs[1])
    except (TypeError, ValueError, IndexError):
        value = None
    if value is None:
        src = op.inputs[1].op
        if src.type == "Max" and src.inputs:  # Keras rnn: max(time_steps) over a constant
            value = tensor_util.constant_value(src.inputs[0])
            value = None if value is None else np.max(value)
    return int(value) if value is not None and int(value) > 0 else 1


def _category(phase: Phase) -> Category:
    return Category.ACTIVATIONS if phase is Phase.FORWARD else Category.TEMPORARIES


def _graph_rise(graph: Any, functions: dict[str, Any]) -> int:
    """Peak bytes a function body allocates on top of its arguments, replayed once."""
    replay = _Replay(functions)
    ops = graph.get_operations()
    replay.run(ops, {t.name for t in graph.inputs}, [(Phase.FORWARD, "")] * len(ops))
    live = peak = 0
    for index in range(len(replay.ops)):
        live += sum(s for s, a in zip(replay.sizes, replay.alloc_at) if a == index)
        peak = max(peak, live)
        live -= sum(s for s, f in zip(replay.sizes, replay.free_at) if f == index)
    return peak


_CALLERS = {"If": ("then_branch", "else_branch"), "StatelessIf": ("then_branch", "else_branch"),
            "While": ("cond", "body"), "StatelessWhile": ("cond", "body"), "PartitionedCall": ("f",),
            "StatefulPartitionedCall": ("f",), "Case": (), "StatelessCase": ()}


def _call_depth(graph: Any, functions: dict[str, Any], seen: frozenset[str] = frozenset()) -> int:
    """How deep the graph nests function calls (an ``If`` in a ``PartitionedCall``: 2)."""
    depth = 0
    for op in graph.get_operations():
        if op.type not in _CALLERS:
            continue
        names = [op.get_attr(a).name for a in _CALLERS[op.type]] if _CALLERS[op.type] else \
            [f.name for f in op.get_attr("branches")]
        inner = 0
        for name in names:
            fn = functions.get(name)
            if fn is not None and name not in seen and getattr(fn, "graph", None) is not None:
                inner = max(inner, _call_depth(fn.graph, functions, seen | {name}))
        depth = max(depth, 1 + inner)
    return depth


def _functions_of(graph: Any) -> dict[str, Any]:
    """Every function the graph calls, nested ones included (name → AtomicFunction)."""
    out: dict[str, Any] = {}
    pending = [graph]
    while pending:
        g = pending.pop()
        for name, fn in getattr(g, "_functions", {}).items():
            if name not in out:
                out[name] = fn
                if getattr(fn, "graph", None) is not None:
                    pending.append(fn.graph)
    return out


@dataclass
class _Spans:
    """What each created graph op ran for: layer calls (op index ranges) and where the phases begin."""

    layers: list[tuple[int, int, str]]
    optimizer_start: int = -1


@contextmanager
def _recording(model: Any) -> Iterator[_Spans]:
    """Record, while the step's function is traced, which ops each ``Layer.__call__`` and the optimizer create."""
    spans = _Spans([])
    original = keras.layers.Layer.__call__

    def count() -> int:
        return len(tf.compat.v1.get_default_graph().get_operations())

    def call(layer: Any, *args: Any, **kwargs: Any) -> Any:
        start = count()
        try:
            return original(layer, *args, **kwargs)
        finally:
            spans.layers.append((start, count(), str(getattr(layer, "path", None) or layer.name)))

    opt = getattr(model, "optimizer", None)
    keras.layers.Layer.__call__ = call  # type: ignore[method-assign]
    if opt is not None:
        apply = opt.apply_gradients

        def traced_apply(*args: Any, **kwargs: Any) -> Any:
            if spans.optimizer_start < 0:
                spans.optimizer_start = count()
            return apply(*args, **kwargs)

        opt.apply_gradients = traced_apply
    try:
        yield spans
    finally:
        keras.layers.Layer.__call__ = original  # type: ignore[method-assign]
        if opt is not None:
            del opt.apply_gradients


def _spec(a: Any) -> Any:
    return tf.TensorSpec(tuple(int(d) for d in a.shape), tf.as_dtype(keras.backend.standardize_dtype(a.dtype)))


def _step_function(step: KerasStep) -> tuple[Any, tuple[Any, ...]]:
    """Keras's own ``tf.function`` for the step and the arguments it is called with (as specs)."""
    model = step.model
    x = keras.tree.map_structure(_spec, step.x)
    if step.mode == "infer":
        model.make_predict_function()
        return model.predict_function, ([(x,)],)
    y = keras.tree.map_structure(_spec, step.y)
    model._maybe_symbolic_build(data_batch=(step.x, step.y, None))
    model.make_train_function()
    for cell in model.train_function.__closure__ or ():  # function(iterator) → _autoconvert_optionals(one_step)
        inner = getattr(cell.cell_contents, "__wrapped__", None)
        if isinstance(inner, tf.types.experimental.PolymorphicFunction):
            return inner, ((x, y, None),)
    raise TraceError("could not find the tf.function of Keras's train step (model.train_function); "
                     "was the model compiled with run_eagerly=True? Compile it without run_eagerly")


def _concrete(step: KerasStep) -> tuple[Any, _Spans]:
    fn, args = _step_function(step)
    if getattr(step.model, "jit_compile", False):
        raise ConfigError("the model is compiled with jit_compile=True (XLA); the TensorFlow estimate models the "
                          "graph executor: compile with jit_compile=False (Keras's default on CPU)")
    try:
        with _recording(step.model) as spans:
            # a fresh tracing of the Python function: exact static shapes, no cached relaxed signature
            cf = tf.function(fn.python_function, autograph=False).get_concrete_function(*args)
    except (ValueError, TypeError, tf.errors.InvalidArgumentError) as err:
        shapes = ", ".join(f"{tuple(a.shape)} {keras.backend.standardize_dtype(a.dtype)}"
                           for a in flat_arrays(step.x))
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise TraceError(f"the Keras model rejected inputs [{shapes}]: {first}") from err
    return cf, spans


def _reachable(graph: Any) -> set[str]:
    """Names of the ops the function runs: those its results or its side effects depend on.

    The function runtime prunes the rest (``PruneFunctionBody``), e.g. gradients toward frozen layers.
    """
    pending = [t.op for t in graph.outputs] + list(getattr(graph, "control_outputs", []))
    pending += [op for op in graph.get_operations() if op.type.startswith(("Assign", "ResourceApply"))]
    seen: set[str] = set()
    while pending:
        op = pending.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        pending.extend(t.op for t in op.inputs)
        pending.extend(op.control_inputs)
    return seen


_FUSED_PRODUCERS = frozenset({"Conv2D", "DepthwiseConv2dNative", "Conv3D", "MatMul", "Pad", "_FusedConv2D"})
_FUSED_CONSUMERS = frozenset({"BiasAdd", "Conv2D", "DepthwiseConv2dNative", "_FusedConv2D"})
_FUSED_FILTER_GRADS = frozenset({"Conv2DBackpropFilter", "DepthwiseConv2dNativeBackpropFilter",
                                 "Conv3DBackpropFilterV2", "MatMul"})
"""Kernels oneDNN's graph rewrite (``MklLayoutRewritePass``, TensorFlow's default on x86) may merge into one:
a convolution or matmul with the ``BiasAdd`` (or a ``Pad`` with the convolution) that alone consumes its
output, and a filter gradient with the ``BiasAddGrad`` of the same incoming gradient. They run back to back
here: a merged kernel with another op ordered between its halves would close a cycle."""


def _fusion_groups(ops: list[Any]) -> list[int]:
    """For each op, the index of the first op of the group it runs with (itself when alone)."""
    index = {op.name: i for i, op in enumerate(ops)}
    head = list(range(len(ops)))

    def find(i: int) -> int:
        while head[i] != i:
            i = head[i]
        return i

    def join(i: int, j: int) -> None:
        a, b = find(i), find(j)
        head[max(a, b)] = min(a, b)

    for j, op in enumerate(ops):
        if op.type in _FUSED_CONSUMERS and op.inputs:
            producer = op.inputs[0].op
            if producer.type in _FUSED_PRODUCERS and producer.name in index and \
                    sum(len(t.consumers()) for t in producer.outputs) == 1:
                join(index[producer.name], j)
        if op.type == "BiasAddGrad" and op.inputs:
            grad = op.inputs[0]
            for sibling in grad.consumers():
                if sibling.type in _FUSED_FILTER_GRADS and sibling.name in index and \
                        any(t is grad for t in sibling.inputs):
                    join(index[sibling.name], j)
    return [find(i) for i in range(len(ops))]


def _execution_order(graph: Any, kept: set[str]) -> list[Any]:
    """The ops in ``kept`` in construction order, each moved after its inputs and control inputs, and the
    halves of a kernel oneDNN may merge (:data:`_FUSED_PRODUCERS`) back to back.

    Construction order is topological but for the few ops that get a control input afterwards (the function's
    output ``Identity`` waits on the ``NoOp`` that groups its side effects): Kahn's sort over the groups of
    :func:`_fusion_groups`, the earliest constructed ready group first. Groups that would close a cycle are
    taken apart.
    """
    ops = [op for op in graph.get_operations() if op.name in kept]
    for group_of in (_fusion_groups(ops), list(range(len(ops)))):
        order = _kahn(ops, group_of)
        if order is not None:
            return order
    raise TraceError(f"the graph of {graph.name!r} has a cycle")  # a graph TensorFlow traced has none


def _kahn(ops: list[Any], group_of: list[int]) -> list[Any] | None:
    index = {op.name: i for i, op in enumerate(ops)}
    members: dict[int, list[int]] = {}
    for i, g in enumerate(group_of):
        members.setdefault(g, []).append(i)
    users: dict[int, list[int]] = {g: [] for g in members}
    waiting = dict.fromkeys(members, 0)
    for i, op in enumerate(ops):
        before = {t.op.name for t in op.inputs} | {c.name for c in op.control_inputs}
        for name in before:
            if name in index and group_of[index[name]] != group_of[i]:
                users[group_of[index[name]]].append(group_of[i])
                waiting[group_of[i]] += 1
    ready = [g for g, w in waiting.items() if w == 0]
    heapq.heapify(ready)
    order: list[Any] = []
    while ready:
        g = heapq.heappop(ready)
        order.extend(ops[i] for i in members[g])
        for u in users[g]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    return order if len(order) == len(ops) else None


_UNPINNED = frozenset({"Placeholder", "Const"})
"""Ops the pinned schedule leaves out of its chain: a function's arguments and constants run before any kernel."""


def _pin(graph: Any) -> None:
    """Chain the ops of a traced function graph with control edges in :func:`_execution_order`.

    The executor then has one order left. Without the chain TensorFlow's sequential executor runs a reverse
    post-order whose ties follow the hash of ``Edge`` pointers (``EdgeSet`` is a pointer-keyed set past 8 edges),
    so the order of independent kernels — the backward convolutions' input and filter gradients — changes with
    the heap from process to process.
    """
    previous = None
    for op in _execution_order(graph, _reachable(graph)):
        if op.type in _UNPINNED:
            continue
        if previous is not None and previous not in op.control_inputs and \
                all(t.op is not previous for t in op.inputs):
            op._add_control_input(previous)  # the public API adds control edges only while an op is created
        previous = op


@contextmanager
def _pinned_schedule() -> Iterator[None]:
    """While inside, every function graph TensorFlow traces (the step's, its ``If`` branches and ``While`` bodies)
    is chained by :func:`_pin` before it becomes a function."""
    from tensorflow.python.framework import func_graph

    original = func_graph.func_graph_from_py_func

    def traced(*args: Any, **kwargs: Any) -> Any:
        graph = original(*args, **kwargs)
        _pin(graph)
        return graph

    func_graph.func_graph_from_py_func = traced
    try:
        yield
    finally:
        func_graph.func_graph_from_py_func = original


def _where(ops: list[Any], spans: _Spans) -> list[tuple[Phase, str]]:
    """Each op's phase and innermost layer, gradients named after the forward op they differentiate."""
    layer = [""] * len(ops)
    for start, end, path in sorted(spans.layers, key=lambda s: s[0] - s[1]):  # outermost first
        for i in range(start, min(end, len(ops))):
            layer[i] = path
    by_name = {op.name: layer[i] for i, op in enumerate(ops) if layer[i]}
    out: list[tuple[Phase, str]] = []
    for i, op in enumerate(ops):
        if 0 <= spans.optimizer_start <= i:
            out.append((Phase.OPTIMIZER, layer[i]))
        elif op.name.startswith("gradient_tape/"):
            out.append((Phase.BACKWARD, _forward_layer(op.name[len("gradient_tape/"):], by_name)))
        else:
            out.append((Phase.FORWARD, layer[i]))
    return out


def _forward_layer(name: str, by_name: dict[str, str]) -> str:
    parts = name.split("/")
    for end in range(len(parts), 0, -1):
        hit = by_name.get("/".join(parts[:end]))
        if hit is not None:
            return hit
    prefixes = {n.rsplit("/", 1)[0]: p for n, p in by_name.items()}
    for end in range(len(parts), 0, -1):
        hit = prefixes.get("/".join(parts[:end]))
        if hit is not None:
            return hit
    return ""


_RANDOM_INITIALIZERS = (keras.initializers.RandomUniform, keras.initializers.RandomNormal,
                        keras.initializers.TruncatedNormal, keras.initializers.VarianceScaling)
RANDOM_INITIALIZER_TEMPORARIES = 2
"""Buffers of a variable's size a random Keras initializer allocates before the variable's own, on TensorFlow:
the raw random tensor and its scaled copy, freed once the variable holds the shifted result (BFC log of
keras_lstm's build, ``TF_CPP_VMODULE=bfc_allocator=4``: +A +B +C -B -A per GlorotUniform / RandomUniform
variable). Replaying the logged build through :class:`_BFC` gives the 777,216 B the allocator holds after it
(656,896 B of variables: the LSTM kernel lands whole in a 249,600 B hole the embedding's temporaries left);
with this rule the replay gives 775,424 B."""


def _initializer_temporaries(model: Any) -> dict[int, int]:
    """Temporaries of each variable's initializer, by ``id(variable)``: :data:`RANDOM_INITIALIZER_TEMPORARIES`
    for a random initializer, 0 for others (zeros, ones, orthogonal: not calibrated) and unknown ones.

    A layer names a variable's initializer ``<name>_initializer`` (``kernel_initializer``,
    ``embeddings_initializer``) or, for ``recurrent_kernel`` / ``depthwise_kernel`` / ``pointwise_kernel``,
    ``<prefix>_initializer``.
    """
    temps: dict[int, int] = {}
    if not hasattr(model, "_flatten_layers"):  # Keras internals (3.x): without them, no initializer holes
        return temps
    for layer in model._flatten_layers(include_self=True):
        own = [*getattr(layer, "_trainable_variables", ()), *getattr(layer, "_non_trainable_variables", ())]
        for v in own:
            name = str(v.name)
            init = getattr(layer, f"{name}_initializer", None) or getattr(
                layer, f"{name.removesuffix('_kernel')}_initializer", None)
            temps[id(v)] = RANDOM_INITIALIZER_TEMPORARIES if isinstance(init, _RANDOM_INITIALIZERS) else 0
    return temps


def _resident(step: KerasStep, graph: Any) -> tuple[list[Block], list[int]]:
    """Blocks live before the step, and how many initializer temporaries preceded each (creation order)."""
    blocks: list[Block] = []
    temps = _initializer_temporaries(step.model)
    before: list[int] = []
    for v, category, layer in resident_variables(step.model, step.mode):
        blocks.append(Block(len(blocks), bfc_round(array_nbytes(v)), category, layer, Phase.SETUP, -1, -1))
        before.append(temps.get(id(v), 0))
    for leaf in flat_arrays((step.x, step.y) if step.mode == "train" else step.x):
        blocks.append(Block(len(blocks), bfc_round(array_nbytes(leaf)), Category.INPUTS, "", Phase.SETUP, -1, -1))
    consts = sum(bfc_round(_tensor_bytes(op.outputs[0])) for op in graph.get_operations() if op.type == "Const")
    if consts:  # ConstantOp keeps its tensor for the kernel's lifetime: live before and after the step
        blocks.append(Block(len(blocks), consts, Category.BUFFERS, "", Phase.SETUP, -1, -1))
    return blocks, before + [0] * (len(blocks) - len(before))


def _categorize(replay: _Replay, where: list[tuple[Phase, str]], grads: set[int]) -> list[Category]:
    forward_end = max((i for i, (p, _) in enumerate(where) if p is Phase.FORWARD and i < len(where)), default=-1)
    cats: list[Category] = []
    for b, (alloc, free) in enumerate(zip(replay.alloc_at, replay.free_at)):
        phase = where[alloc][0]
        if b in grads:
            cats.append(Category.GRADIENTS)
        elif phase is Phase.FORWARD:
            lives_on = free < 0 or where[free][0] is not Phase.FORWARD or free > forward_end
            cats.append(Category.SAVED_ACTIVATIONS if lives_on and replay.ops else Category.ACTIVATIONS)
        else:
            cats.append(Category.TEMPORARIES)
    return cats


def _gradient_blocks(ops: list[Any], replay: _Replay, where: list[tuple[Phase, str]]) -> set[int]:
    """Blocks of the tensors the optimizer receives: backward outputs consumed by optimizer ops."""
    index = {op.name: i for i, op in enumerate(ops)}
    first_block: dict[int, int] = {}
    for b, a in enumerate(replay.alloc_at):
        first_block.setdefault(a, b)
    out: set[int] = set()
    for i, op in enumerate(ops):
        if where[i][0] is not Phase.OPTIMIZER:
            continue
        for t in op.inputs:
            j = index.get(t.op.name, -1)
            while j >= 0 and ops[j].type in _VIEWS and ops[j].inputs:
                j = index.get(ops[j].inputs[0].op.name, -1)
            if j >= 0 and where[j][0] is Phase.BACKWARD and j in first_block:
                out.add(first_block[j])
    return out


def trace_step(step: KerasStep, *, meta: dict[str, object]) -> Trace:
    """Estimate one Keras step on the TensorFlow backend from the graph of its ``tf.function``.

    Nothing batch-sized is allocated: the function is traced for ``tf.TensorSpec`` s of the data.

    Raises:
        TraceError: the model rejects the inputs' shapes or dtypes.
        ConfigError: the model is compiled with ``jit_compile=True``.
    """
    cf, spans = _concrete(step)
    graph = cf.graph
    every = graph.get_operations()
    where_of = dict(zip((op.name for op in every), _where(every, spans)))
    ops = _execution_order(graph, _reachable(graph))
    where = [where_of[op.name] for op in ops]
    replay = _Replay(_functions_of(graph))
    replay.run(ops, {t.name for t in graph.inputs}, where, keep=[t.name for t in graph.outputs])
    cats = _categorize(replay, where, _gradient_blocks(ops, replay, where) if step.mode == "train" else set())
    blocks, temporaries = _resident(step, graph)
    base = len(blocks)
    held, chunks = _bfc_chunks([(b.nbytes, t) for b, t in zip(blocks, temporaries)], replay.sizes, replay.alloc_at,
                               replay.free_at, [w for *_, w in replay.ops])
    blocks = [replace(b, nbytes=size) for b, size in zip(blocks, held)]  # a variable may hold a larger chunk
    for b, size in enumerate(chunks):
        free = replay.free_at[b]
        blocks.append(Block(base + b, size, cats[b], replay.layers[b] or where[replay.alloc_at[b]][1],
                            where[replay.alloc_at[b]][0], replay.alloc_at[b], free))
    alloc = [0] * len(ops)
    freed = [0] * len(ops)
    for block in blocks[base:]:
        alloc[block.alloc_op] += block.nbytes
        if block.free_op >= 0:
            freed[block.free_op] += block.nbytes
    trace_ops = tuple(Op(i, f"{op.type}:{op.name}", where[i][0], where[i][1], alloc[i], freed[i], replay.ops[i][3])
                      for i, op in enumerate(ops))
    info = {**meta, "tensorflow": tf.__version__, "keras": keras.__version__, "batch": step.batch,
            "executor": "tf.function graph executor (jit_compile=False)",
            "call_depth": _call_depth(graph, replay.functions),
            "while_loops": sum(op.type in _WHILES for g in [graph, *(getattr(f, "graph", None) for f in
                                                                     replay.functions.values())]
                               if g is not None for op in g.get_operations()),
            "allocator_model": "BFC: 256-byte chunks, sequential schedule"}
    if step.mode == "train":
        info["optimizer"] = optimizer_label(step.model)
    return Trace("keras-tensorflow", step.mode, tuple(blocks), trace_ops, layer_infos(step.model), info)


def _memory_info() -> dict[str, int]:
    return dict(tf.config.experimental.get_memory_info("CPU:0"))


def _run(step: KerasStep, x: Any, y: Any) -> None:
    if step.mode == "train":
        step.model.train_on_batch(x, y)
    else:
        step.model.predict_on_batch(x)


MEASURED_STEPS = 5
"""Steps measured after the warm-up; the report takes their median peak. With the schedule pinned most steps
repeat to the byte, in every process (keras_separable_cnn train at batch 32: 20,111,872 B in three processes)."""

MEASURE_EXECUTOR = "SINGLE_THREADED_EXECUTOR"
"""The executor the truth runs the step's function on: TensorFlow's own sequential executor
(``single_threaded_executor.cc``: kernels one at a time in a fixed topological order, each input released after
its last consumer, control flow functional — a while loop runs one iteration at a time). TensorFlow's default
executor picks, per ready op, inline or queued execution by a moving average of its measured cycles
(``KernelStats``: ops start "expensive", become inline under 8000 cycles), so its peak follows timing: on one
inter-op thread keras_lstm train measured 3.3, 4.1, 4.8, then 15.6 MB steady in one process and 7.3 MB steady in
another; its lowered while loops also run up to ``parallel_iterations`` iterations at once. A peak that moves 3x
with CPU load cannot be an accuracy reference; the sequential executor's repeats exactly."""

MEASURE_INTER_OP_THREADS = 16
"""Inter-op threads the measuring process starts TensorFlow with. The sequential executor runs every kernel in
the calling thread, but a kernel that calls a function (``If``, ``While``, ``PartitionedCall``) blocks its thread
until the callee, started on the inter-op pool, is done: each level of nesting holds one pool thread, and a pool
with too few threads deadlocks (keras_mixed_float16 train, a loss-scale ``tf.cond`` inside the train function,
hangs with 2). The threads add no concurrency."""

MEASURE_INTRA_OP_THREADS = 1
"""Intra-op threads of the measuring process. With two, kernels' worker threads allocate in racing order and the
BFC layout — which free chunk a 1 MiB activation lands in — changes from process to process
(keras_partly_frozen train: 2.74 MB in one process, 3.15 MB in the next); with one, three processes measured
3,145,216-3,145,472 B."""


def sequential_runtime() -> None:
    """Start TensorFlow with the thread pools of the measurement (:data:`MEASURE_INTER_OP_THREADS` inter-op,
    :data:`MEASURE_INTRA_OP_THREADS` intra-op).

    Call before TensorFlow runs its first op (building a Keras model runs ops); once TensorFlow has started
    this does nothing and :func:`measure_step` checks the pools.
    """
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


def _owned_tensor(value: Any) -> Any:
    """A tensor in a buffer of TensorFlow's allocator holding ``value``.

    ``tf.convert_to_tensor`` of a NumPy array keeps NumPy's buffer when it happens to be 64-byte aligned and
    copies it otherwise, so the data were on the BFC allocator in some processes and not in others
    (keras_separable_cnn train: 91,904 or 190,208 B in use before the step, peaks 6.6 to 8.2 MB).
    """
    return tf.raw_ops.DeepCopy(x=tf.convert_to_tensor(value))


def _first_step_pinned(step: KerasStep, x: Any, y: Any) -> bool:
    """Trace the step's function afresh with its ops chained (:func:`_pinned_schedule`) and run it once.

    Returns False where TensorFlow refused the chained graph (a kernel merge :data:`_FUSED_PRODUCERS` does
    not know closed a cycle); the step then runs on the executor's own order.
    """
    def remake() -> None:
        if step.mode == "train":
            step.model.make_train_function(force=True)
        else:
            step.model.make_predict_function(force=True)

    try:
        with _pinned_schedule():
            remake()
            _run(step, x, y)
        return True
    except tf.errors.InvalidArgumentError as err:
        if "cycle" not in str(err):
            raise
    remake()
    _run(step, x, y)
    return False


def measure_step(step: KerasStep, *, name: str, meta: dict[str, object]) -> Report:
    """Run the real step on TensorFlow's sequential executor and report the BFC allocator's peak (bytes in use).

    Call in a fresh process that set ``TF_CPU_ALLOCATOR_USE_BFC=true`` before TensorFlow was imported and
    called :func:`sequential_runtime` before TensorFlow ran its first op. The step's function is traced afresh
    with its ops chained in the order the estimate replays (:func:`_pinned_schedule`), Grappler off (its
    constant folding and dependency pruning would drop links of the chain; the estimate replays the graph as
    traced), and runs on :data:`MEASURE_EXECUTOR` with oneDNN's kernels and graph rewrite as TensorFlow ships
    them; the data become tensors first (live before the step, like the variables); 2 train steps (1 inference
    step) warm up the function and the allocator; then each measured step runs between ``reset_memory_stats``
    and a read of ``peak``.

    Why pinned: left to itself the sequential executor runs a reverse post-order whose ties follow the hash of
    ``Edge`` pointers, so the order of independent kernels changes with the heap from process to process, and
    the peak with it — keras_separable_cnn train at batch 32: 20.1, 21.8, 22.2, 24.3, 24.5, 28.2, 29.5 and
    30.5 MB in 22 processes on TensorFlow's own order (Grappler on), 20,111,872 B in every pinned one.

    Raises:
        MeasureError: the BFC allocator is not in use (its statistics read 0), or TensorFlow started with
            other thread pools than :func:`sequential_runtime` sets (too few inter-op threads for the step's
            nested function calls, more than one intra-op thread).
    """
    from tensorflow.python.eager.context import function_executor_type

    from nnmem.errors import MeasureError

    sequential_runtime()
    trace = trace_step(step, meta=meta)
    depth = int(trace.meta.get("call_depth", 0))  # type: ignore[call-overload]
    intra = tf.config.threading.get_intra_op_parallelism_threads()
    if intra != MEASURE_INTRA_OP_THREADS:
        raise MeasureError(f"expected TensorFlow to run {MEASURE_INTRA_OP_THREADS} intra-op thread (kernels allocate "
                           f"in one fixed order), it runs {intra or 'the default number of'}: call "
                           "nnmem.frontends.keras.tensorflow.trace.sequential_runtime() before TensorFlow runs its "
                           "first "
                           "op (building the model runs ops)")
    threads = _inter_op_threads()
    if threads is not None and threads <= depth:
        raise MeasureError(f"the step nests function calls {depth} deep (tf.cond, while loops, ...) and the "
                           f"sequential executor holds an inter-op thread per level, but TensorFlow runs {threads}: "
                           "call nnmem.frontends.keras.tensorflow.trace.sequential_runtime() before TensorFlow runs "
                           "its first op (building the model runs ops)")
    x = keras.tree.map_structure(_owned_tensor, step.x)
    y = keras.tree.map_structure(_owned_tensor, step.y) if step.y is not None else None
    if _memory_info()["current"] <= 0:
        raise MeasureError("TensorFlow's CPU allocator keeps no statistics: set TF_CPU_ALLOCATOR_USE_BFC=true "
                           "in the environment before TensorFlow is imported")
    grappler = tf.config.optimizer.get_experimental_options()
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    try:
        with function_executor_type(MEASURE_EXECUTOR):
            pinned = _first_step_pinned(step, x, y)
            if step.mode == "train":
                _run(step, x, y)
            peaks, before = [], []
            for _ in range(MEASURED_STEPS):
                with no_gc():  # cyclic garbage of the step before collected, none collected during the step
                    tf.config.experimental.reset_memory_stats("CPU:0")
                    before.append(_memory_info()["current"])
                    _run(step, x, y)
                    peaks.append(_memory_info()["peak"])
    finally:
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": False, **grappler})
    peak = int(sorted(peaks)[len(peaks) // 2])
    resident = int(sorted(before)[len(before) // 2])
    schedule = ("ops pinned to the graph's construction order, Grappler off" if pinned else
                "TensorFlow refused the pinned order (a kernel merge closed a cycle): the executor's own order, "
                "which can change from process to process")
    notes = (f"allocator peak: TensorFlow BFC bytes in use on the sequential executor ({MEASURE_EXECUTOR}; "
             f"{schedule}), median of {MEASURED_STEPS} steps ({', '.join(f'{p:,}' for p in peaks)} B); "
             f"{resident:,} B in use before the step (estimated resident: {trace.resident_bytes:,} B)",
             "a plain train_on_batch runs Grappler's rewrites and an op order that follows heap addresses: its "
             "peak can differ from this one and between processes (keras_separable_cnn train at batch 32: "
             "20.1 to 30.5 MB in 22 processes, 20.1 MB pinned)",
             "TensorFlow's default executor orders ready ops by their measured cost and runs while-loop "
             "iterations concurrently: its peak moves with timing, most in recurrent training steps "
             "(keras_lstm train: 3.3 to 15.6 MB against 4.7 MB here)")
    estimated = report_from_trace(trace, source="estimate", model=name, device="cpu").peak_bytes
    info = {**trace.meta, "method": "bfc_peak", "executor": MEASURE_EXECUTOR, "resident_measured": resident,
            "schedule": "pinned" if pinned else "executor",
            "peak_min": min(peaks), "peak_max": max(peaks), "estimated_peak": estimated}
    trace = Trace(trace.framework, trace.mode, trace.blocks, trace.ops, trace.layers, info)
    return report_from_trace(trace, source="measure", model=name, device="cpu",
                             overrides={"allocator": peak}, notes=notes)
