"""A TensorFlow function graph replayed the way the executor frees memory: the buffers of a step, op by op.

Every output is a buffer of its static shape rounded to the BFC allocator's 256 B, freed after its last
consumer has run (outputs nobody consumes die at once); :mod:`.scratch` says which ops alias, forward or
allocate nothing. Control flow stays functional, as on TensorFlow's sequential executor
(``common_runtime/single_threaded_executor.cc``): an ``If`` / ``While`` body is replayed on its own and its
rise is the op's workspace; a forward ``While`` whose body pushes onto gradient accumulators
(``TensorListPushBack``) keeps ``iterations ×`` the pushed tensors until the gradient loop consumes them.
``Replay(lowered=True)`` runs each ``While`` as the default executor does, lowered to frames, where a loop variable
carries on in its initial buffer (:meth:`Replay._carried_on`): the range's low end.

The default executor runs a ``While`` lowered to frames (``lower_while_op.cc``, ``executor.cc``: up to the loop's
``parallel_iterations`` iterations in flight). An iteration's ops run as soon as their inputs exist, so a tensor
that meets a loop-carried value of the previous iteration (an RNN's gradient of its kernel, ``h_t^T dz_t``,
waiting for the sum of the earlier ones) can be made by up to ``parallel_iterations`` iterations before the
chain reaches them. :attr:`Replay.overlap` is that bound per op: ``(in flight - 1) ×`` those waiting bytes, what
the range's high end adds on top of the sequential rise.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from nnmem.allocators.bfc import bfc_round
from nnmem.frontends.keras.tensorflow.scratch import Memory, rule_of, scratch_bytes, tensor_bytes
from nnmem.trace import Phase

__all__ = ["CALLERS", "WHILES", "Replay", "call_depth", "functions_of", "graph_rises", "in_flight", "loop_weight_casts",
           "waiting_bytes", "while_loops"]

WHILES = frozenset({"While", "StatelessWhile"})

_UPDATES = frozenset({"AssignAddVariableOp", "AssignSubVariableOp"})
"""In-place updates of a resource variable (``resource_variable_ops.cc``, ``AssignUpdateVariableOp``)."""

CALLERS = {"If": ("then_branch", "else_branch"), "StatelessIf": ("then_branch", "else_branch"),
           "While": ("cond", "body"), "StatelessWhile": ("cond", "body"), "PartitionedCall": ("f",),
           "StatefulPartitionedCall": ("f",), "Case": (), "StatelessCase": ()}
"""Ops that call functions, and the attributes naming them (a ``Case`` names its ``branches``)."""


@dataclass
class _Buf:
    """A buffer during the replay: its size, its block, and how many consumers still hold it."""

    nbytes: int
    block: int
    holders: int
    owned: bool  # allocated by the step (not a variable, input or constant), so it can be freed/forwarded
    until: int = -1  # the latest op index a holder of it runs until
    var: str = ""  # a read of this variable (its handle's tensor name), or a view of one


@dataclass(frozen=True, slots=True)
class _Facts:
    """What the replay needs of one op that does not depend on the order it runs in, read from the graph once:
    TensorFlow's Python accessors (``op.inputs``, ``t.name``, ``t.shape``) cost more than the replay itself, and a
    step's range replays the same ops in some 70 orders."""

    type: str
    memory: Memory  # where its outputs live (scratch.rule_of)
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    workspace: tuple[int, int]  # (rise, high): Replay._workspace
    out_bytes: tuple[int, ...]  # bytes each output would allocate as a new buffer
    update_bytes: int  # bytes of the value an in-place variable update writes (0 for other ops)


class Replay:
    """Replays one graph: which op allocates which buffer and after which op each buffer dies.

    Attributes:
        sizes: bytes of each block (a BFC request, rounded to 256 B).
        alloc_at: the index of the op that allocates each block.
        free_at: the index of the op after which each block is freed (-1: live after the last op).
        layers: the layer of the op that allocates each block.
        ops: (name, phase, layer, workspace in bytes) of each op replayed.
        overlap: bytes each op may hold beyond its workspace when a loop's iterations overlap (module docstring).
        single: for each op, whether its workspace is its kernel's own scratch, one allocation (the allocator hands
            it one chunk), rather than the rise of a called graph (many buffers).
        adopted: (op index, block, variable handle's tensor name) of each ``AssignVariableOp`` that adopts its
            value's buffer: the variable holds the block from then on and its previous buffer is freed
            (``resource_variable_ops.cc``, ``AssignVariableOp::Compute``: "Copying is unnecessary if we are the
            last user of the value tensor", ``forward_input``). The block's ``free_at`` stays the op's index:
            the bytes in use are the same, what moves is where the variable lives (the BFC layout). An
            ``AssignAddVariableOp`` / ``AssignSubVariableOp`` that runs while a read of its variable is still held
            copies the variable first (``training_op_helpers.h``, ``PrepareToUpdateVariable``: "Tensor's buffer
            is in use by some read"): a new block from that op until the reads are done, which the variable
            adopts (an order where an optimizer's update overtakes the backward op that still reads the weight).
    """

    def __init__(self, functions: dict[str, Any], *, kernel_scratch: bool = True,
                 facts: dict[Any, _Facts] | None = None, lowered: bool = False) -> None:
        """``facts``: a cache of each op's order-independent facts, shared by replays of the same graph (and the same
        ``kernel_scratch``); filled as ops are met. ``lowered``: each ``While`` runs as the default executor runs it,
        lowered to frames (:meth:`_carried_on`), instead of as the functional ``While`` kernel."""
        self.functions = functions
        self.kernel_scratch = kernel_scratch  # False on a GPU: the CPU kernels' scratch rules do not apply
        self.lowered = lowered
        self.facts = facts if facts is not None else {}
        self.sizes: list[int] = []
        self.alloc_at: list[int] = []
        self.free_at: list[int] = []
        self.layers: list[str] = []
        self.ops: list[tuple[str, Phase, str, int]] = []  # (name, phase, layer, workspace)
        self.overlap: list[int] = []
        self.single: list[bool] = []
        self.adopted: list[tuple[int, int, str]] = []
        self._reads: dict[str, list[_Buf]] = {}

    def run(self, ops: list[Any], external: set[str], where: list[tuple[Phase, str]],
            keep: Iterable[str] = (), end_at: list[int] | None = None) -> None:
        """Replay ``ops`` in order.

        Args:
            ops: the graph's ops in execution order.
            external: names of tensors owned outside the graph (arguments).
            where: each op's (phase, layer).
            keep: names of the graph's results, live after the last op.
            end_at: for each op, the index of the last op started before it ends (ops running at the same
                time); a block is then freed after the latest end of the ops that hold it. None: each op ends
                before the next starts.
        """
        end = end_at if end_at is not None else range(len(ops))
        facts = [self._facts(op) for op in ops]
        consumers: dict[str, int] = dict.fromkeys(keep, 1)
        for f in facts:
            for name in f.inputs:
                consumers[name] = consumers.get(name, 0) + 1
        bufs: dict[str, _Buf] = {}
        copies: list[tuple[int, list[_Buf]]] = []
        for index, (op, f) in enumerate(zip(ops, facts)):
            phase, layer = where[index]
            workspace, high = f.workspace
            ins = [bufs.get(name) for name in f.inputs]
            if f.type == "AssignVariableOp" and len(ins) > 1:
                value = ins[1]
                if value is not None and value.owned and value.holders == 1 and value.block >= 0:
                    self.adopted.append((index, value.block, f.inputs[0]))
            elif f.type in _UPDATES and len(f.inputs) > 1:
                self._copy_on_write(f, index, layer, copies)
            outs = [self._output(f, k, name, ins, consumers.get(name, 0), index, layer, external)
                    for k, name in enumerate(f.outputs)]
            bufs.update(zip(f.outputs, outs))
            for buf in ins:
                if buf is not None:
                    buf.holders -= 1
                    buf.until = max(buf.until, end[index])
                    self._maybe_free(buf)
            for out in outs:
                out.until = max(out.until, end[index])
                self._maybe_free(out)
            self.ops.append((op.name, phase, layer, workspace))
            self.overlap.append(high - workspace)
            self.single.append(f.type not in CALLERS and f.type not in WHILES)
        for block, reads in copies:  # the variable's previous buffer is held until its last read is done
            if all(r.holders <= 0 for r in reads):
                self.free_at[block] = max(r.until for r in reads)

    def scratch_chunks(self, chunks: list[int], requests: list[int]) -> list[int]:
        """Each op's scratch in the allocator: the chunk its one request got (``chunks``, from
        :func:`~nnmem.allocators.bfc.steady_state_chunks`) where the workspace is the kernel's own scratch, else
        the bytes requested (``requests``: a called graph's rise is many buffers, each rounded already)."""
        return [c if one else r for c, r, one in zip(chunks, requests, self.single)]

    def adoptions(self, handles: dict[str, int]) -> list[tuple[int, int, int]]:
        """(op index, block, resident index) of each buffer a variable adopts (:attr:`adopted`), the variables
        numbered by ``handles`` (handle tensor name -> resident index); variables not in it are left out."""
        return [(i, b, handles[name]) for i, b, name in self.adopted if name in handles]

    def _facts(self, op: Any) -> _Facts:
        f = self.facts.get(op)  # keyed by the op object: its name is a call into TensorFlow
        if f is None:
            rule = rule_of(op.type)
            out_bytes = tuple(self._new_bytes(op, k, rule) if rule.memory in (Memory.NEW, Memory.IN_PLACE) else 0
                              for k in range(len(op.outputs)))
            update = tensor_bytes(op.inputs[1]) if op.type in _UPDATES and len(op.inputs) > 1 else 0
            f = _Facts(op.type, rule.memory, tuple(t.name for t in op.inputs), tuple(t.name for t in op.outputs),
                       self._workspace(op), out_bytes, update)
            self.facts[op] = f
        return f

    def _new_bytes(self, op: Any, k: int, rule: Any) -> int:
        """Bytes output ``k`` allocates when it is a new buffer."""
        if op.type in WHILES:
            return self._accumulated(op, k)
        if rule.output_bytes is not None:
            return int(rule.output_bytes(op, k))
        return tensor_bytes(op.outputs[k])

    def _copy_on_write(self, f: _Facts, index: int, layer: str, copies: list[tuple[int, list[_Buf]]]) -> None:
        """An in-place update of a variable some read still holds: the variable is copied to a new block."""
        handle = f.inputs[0]
        held = [r for r in self._reads.get(handle, ()) if r.holders > 0 or r.until >= index]  # waiting or running
        nbytes = f.update_bytes
        if held and nbytes:
            block = self._new(nbytes, index, layer)
            self.adopted.append((index, block, handle))
            copies.append((block, held))

    def _maybe_free(self, buf: _Buf) -> None:
        if buf.owned and buf.holders <= 0 and self.free_at[buf.block] < 0:
            self.free_at[buf.block] = buf.until

    def _new(self, nbytes: int, index: int, layer: str) -> int:
        self.sizes.append(bfc_round(nbytes))
        self.alloc_at.append(index)
        self.free_at.append(-1)
        self.layers.append(layer)
        return len(self.sizes) - 1

    def _output(self, f: _Facts, k: int, name: str, ins: list[_Buf | None], uses: int, index: int, layer: str,
                external: set[str]) -> _Buf:
        kind, memory = f.type, f.memory
        if name in external or memory is Memory.NONE:
            return _Buf(0, -1, uses, False)
        if memory is Memory.VIEW:
            src = ins[k] if kind == "IdentityN" and k < len(ins) else (ins[0] if ins else None)
            var = f.inputs[0] if kind == "ReadVariableOp" and f.inputs else (src.var if src else "")
            if var:  # a read of a variable, or a view of one: tracked for the updates that must copy
                read = _Buf(0, -1, uses, False, var=var)
                self._reads.setdefault(var, []).append(read)
                return read
            if src is None or not src.owned:
                return _Buf(0, -1, uses, False)
            src.holders += uses  # the view keeps the source alive through its own consumers
            return src
        nbytes = f.out_bytes[k]
        if self.lowered and kind in WHILES and k < len(ins):
            carried = self._carried_on(ins[k], nbytes, uses)
            if carried is not None:
                return carried
        if memory is Memory.IN_PLACE and k == 0:
            for buf in ins:
                if buf is not None and buf.owned and buf.holders == 1 and buf.nbytes == bfc_round(nbytes):
                    buf.holders += uses  # written in place: this op held the last reference
                    return buf
        if nbytes == 0:
            return _Buf(0, -1, uses, False)
        return _Buf(bfc_round(nbytes), self._new(nbytes, index, layer), uses, True)

    @staticmethod
    def _carried_on(buf: _Buf | None, nbytes: int, uses: int) -> _Buf | None:
        """A lowered loop's variable whose initial value the loop consumed last: the value's buffer, carried on.

        The functional ``While`` kernel (``functional_ops.cc``, what the sequential executor runs) keeps its arguments
        until it returns and hands back each iteration's results as new buffers. The default executor runs the loop
        lowered to frames (``lower_while_op.cc``): the initial value flows ``Enter`` → ``Merge`` → ``Switch`` into
        the body as one reference, so an in-place update there (``AddN`` accumulating a weight's gradient into a
        forwarded input, ``aggregate_ops.cc``) writes into it, and the loop's result is a buffer the body's rise
        already counts or that initial one: the loop's zeros and its result are one buffer, not two. A shared or
        constant initial value (Grappler folds the zeros into a ``Const``) is not forwarded: the result is new.
        """
        if buf is None or not buf.owned or buf.holders != 1 or buf.nbytes != bfc_round(nbytes) or nbytes == 0:
            return None
        buf.holders += uses
        return buf

    def _accumulated(self, op: Any, k: int) -> int:
        """Bytes a While output holds: its static size, or iterations × what the body pushes onto it."""
        t = op.outputs[k]
        if t.dtype != tf.variant:
            return tensor_bytes(t)
        body = self._body(op, "body")
        if body is None:
            return 0
        out = body.outputs[k] if k < len(body.outputs) else None
        if out is None or out.op.type != "TensorListPushBack":
            return 0
        pushed = out.op.inputs[1]
        carried = _carried_state(body, pushed)
        if carried:  # a loop variable the body recomputes: each iteration pushes the previous one's value
            return (_iterations(op) - 1) * bfc_round(tensor_bytes(pushed))
        if _is_alias_of_variable(pushed):
            return 0
        return _iterations(op) * bfc_round(tensor_bytes(pushed))

    def _body(self, op: Any, attr: str) -> Any:
        try:
            name = op.get_attr(attr).name
        except (ValueError, AttributeError):
            return None
        fn = self.functions.get(name)
        return getattr(fn, "graph", None) if fn is not None else None

    def _workspace(self, op: Any) -> tuple[int, int]:
        """The kernel's scratch or the rise of a called graph (If branch, While body, function), in bytes: run
        once, and (the high end) with a loop's iterations overlapping as the executor may run them."""
        rise = high = scratch_bytes(op) if self.kernel_scratch else 0
        for attr in CALLERS.get(op.type, ()):  # a While's cond rises too, by a scalar
            graph = self._body(op, attr)
            if graph is not None:
                once, most = graph_rises(graph, self.functions, kernel_scratch=self.kernel_scratch)
                rise, high = max(rise, once), max(high, most)
        if op.type in WHILES:
            body = self._body(op, "body")
            if body is not None:
                high += _loop_overlap(op, body)
        return rise, high


def _through_views(t: Any) -> Any:
    """The tensor ``t`` is a view of, through identities and reshapes."""
    while t.op.type in ("Identity", "Reshape", "ExpandDims", "Squeeze"):
        t = t.op.inputs[0]
    return t


def _carried_state(body: Any, t: Any) -> bool:
    """Whether ``t`` is (a view of) a loop variable of ``body`` whose next value the body computes.

    Such a variable (an RNN's ``h`` and ``c``) is a new tensor every iteration, so pushing it onto a gradient
    accumulator keeps one per iteration after the first (whose value is the loop's input, live anyway);
    a loop invariant passed through unchanged is one buffer.
    """
    t = _through_views(t)
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
    """Whether ``t`` is (a view of) a variable read, an argument, a constant or a list element: held anyway."""
    t = _through_views(t)
    return bool(t.op.type in ("ReadVariableOp", "Placeholder", "Const", "TensorListGetItem"))


def _iterations(op: Any) -> int:
    """A While op's trip count: its ``maximum_iterations`` loop variable (index 1) when constant, else 1."""
    return _trip_count(op) or 1


def in_flight(op: Any) -> int:
    """Iterations of a ``While`` the default executor may run at once: its ``parallel_iterations``, at most its
    trip count where that is known (``executor.cc``: a frame starts a new iteration while fewer than
    ``parallel_iterations`` are outstanding)."""
    try:
        parallel = int(op.get_attr("parallel_iterations"))
    except (ValueError, AttributeError):
        parallel = 1
    trips = _trip_count(op)
    return max(1, min(parallel, trips) if trips else parallel)


def _trip_count(op: Any) -> int | None:
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
    return int(value) if value is not None and int(value) > 0 else None


def waiting_bytes(body: Any) -> int:
    """Bytes one iteration of a ``While`` body may hold while it waits for the previous iteration: the body's
    own tensors an op consumes together with a value that depends on a loop-carried variable (the RNN's
    ``h``, ``c`` or a gradient sum; not the counters and list handles, whose chains are a few host integers).
    """
    return sum(bfc_round(tensor_bytes(t)) for t in _waiting(body, _depends(body)))


def _waiting(body: Any, depends: set[str]) -> list[Any]:
    """The body's tensors an op consumes together with a value in ``depends`` (see :func:`waiting_bytes`)."""
    waiting: dict[str, Any] = {}
    for op in body.get_operations():
        for t in op.inputs:
            src = _through_views(t)
            if src.name in waiting or src.op.type in _HELD or rule_of(src.op.type).memory is Memory.NONE:
                continue
            if any(u.name in depends and u.name != t.name for u in op.inputs):
                waiting[src.name] = src
    return list(waiting.values())


def _depends(body: Any) -> set[str]:
    """Names of the body's tensors that depend on a loop-carried array (the RNN's ``h``, ``c``, a gradient sum)."""
    carried = {t.name for t in body.inputs if t.dtype not in _HANDLES and (t.shape.rank or 0) > 0
               and _carried_state(body, t)}
    depends = set(carried)
    for op in body.get_operations():  # creation order is a topological order
        if any(t.name in depends for t in op.inputs):
            depends.update(t.name for t in op.outputs)
    return depends


def _weight_cast(t: Any) -> bool:
    """Whether ``t`` casts a variable's value (a mixed-precision cell's kernel, read and cast every iteration)."""
    return bool(t.op.type == "Cast" and _through_views(t.op.inputs[0]).op.type == "ReadVariableOp")


def _loop_overlap(op: Any, body: Any) -> int:
    """Bytes a ``While``'s iterations in flight hold beyond the one the replay runs: ``(in flight - 1) ×``
    :func:`waiting_bytes`, and for each iteration's weight casts the chunk beyond their requests.

    A mixed-precision RNN cell casts its float32 kernels every iteration; the cast depends only on the loop's
    invariants, so every iteration in flight makes its copy at once (TensorFlow's allocation log of keras_lstm
    inference under ``mixed_float16``: 29 copies of the recurrent kernel live together, in chunks of up to
    254,208 B for 131,072 B requests). The BFC allocator hands out a free chunk whole when it is under twice the
    request (``bfc_allocator.cc`` ``FindChunkPtr`` splits only from twice the rounded request), so each copy
    occupies at most twice its rounded size less one 256 B unit: the high end counts that much more per copy.
    """
    waiting = [(t, bfc_round(tensor_bytes(t))) for t in _waiting(body, _depends(body))]
    slack = sum(max(b - 256, 0) for t, b in waiting if _weight_cast(t))
    held = sum(b for _, b in waiting) + (_CONDITION if waiting else 0)
    return (in_flight(op) - 1) * held + in_flight(op) * slack


_CONDITION = bfc_round(1)
"""The chunk of an iteration's loop condition. Lowered to frames (``lower_while_op.cc``) the condition's boolean
feeds a ``Switch`` per loop variable, the carried ``h`` too, so an iteration that runs ahead holds its condition
until the previous iteration's ``h`` reaches its ``Switch``: TensorFlow's allocation log of a SimpleRNN inference
step (25 steps) held 19 more 256 B chunks (the cond's ``Less``) at its peak than a step whose iterations did not
overlap, beside 20 iterations' ``BiasAdd`` outputs; without them a step measured 3,072 B above the high end."""


_HANDLES = frozenset({tf.variant, tf.resource})
_HELD = frozenset({"Placeholder", "Const", "ReadVariableOp", "TensorListPopBack", "TensorListGetItem"})
"""Producers of tensors held anyway: arguments, constants, variables, and list elements (``list_kernels.h``: a
popped or read element is the list's buffer, held by the list since it was pushed)."""


def graph_rises(graph: Any, functions: dict[str, Any], *, kernel_scratch: bool = True) -> tuple[int, int]:
    """Peak bytes a function body allocates on top of its arguments, replayed once, and with the overlap of the
    loops it runs (:attr:`Replay.overlap`)."""
    replay = Replay(functions, kernel_scratch=kernel_scratch)
    ops = graph.get_operations()
    replay.run(ops, {t.name for t in graph.inputs}, [(Phase.FORWARD, "")] * len(ops))
    live = peak = high = 0
    for index in range(len(replay.ops)):
        live += sum(s for s, a in zip(replay.sizes, replay.alloc_at) if a == index)
        peak = max(peak, live)
        high = max(high, live + replay.overlap[index])
        live -= sum(s for s, f in zip(replay.sizes, replay.free_at) if f == index)
    return peak, high


def call_depth(graph: Any, functions: dict[str, Any], seen: frozenset[str] = frozenset()) -> int:
    """How deep the graph nests function calls (an ``If`` in a ``PartitionedCall``: 2)."""
    depth = 0
    for op in graph.get_operations():
        if op.type not in CALLERS:
            continue
        names = [op.get_attr(a).name for a in CALLERS[op.type]] if CALLERS[op.type] else \
            [f.name for f in op.get_attr("branches")]
        inner = 0
        for name in names:
            fn = functions.get(name)
            if fn is not None and name not in seen and getattr(fn, "graph", None) is not None:
                inner = max(inner, call_depth(fn.graph, functions, seen | {name}))
        depth = max(depth, 1 + inner)
    return depth


def functions_of(graph: Any) -> dict[str, Any]:
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


def loop_weight_casts(graph: Any, functions: dict[str, Any]) -> tuple[int, int]:
    """(bytes, iterations in flight) of the largest per-iteration weight cast (:func:`_loop_overlap`) of a ``While``
    body in the graph or a function it calls; (0, 0) where no loop casts a variable."""
    largest = (0, 0)
    for g in (graph, *(getattr(f, "graph", None) for f in functions.values())):
        for op in g.get_operations() if g is not None else ():
            body = functions.get(op.get_attr("body").name) if op.type in WHILES else None
            casts = [t for t in _waiting(body.graph, _depends(body.graph)) if _weight_cast(t)] if body else []
            for t in casts:
                largest = max(largest, (bfc_round(tensor_bytes(t)), in_flight(op)))
    return largest


def while_loops(graph: Any, functions: dict[str, Any]) -> int:
    """``While`` ops in the graph and in every function it calls."""
    graphs = [graph, *(getattr(f, "graph", None) for f in functions.values())]
    return sum(op.type in WHILES for g in graphs if g is not None for op in g.get_operations())
