"""The range a step's BFC peak spans over the op orders TensorFlow's default executor can run it in.

The default executor (``common_runtime/executor.cc``) runs ready kernels concurrently on its inter-op pool, in an
order that follows timing, on the graph Grappler rewrote (``grappler/optimizers/meta_optimizer.cc``, run by the
function runtime before the executor starts). The range is the lowest and highest peak over the graph as traced
and as Grappler's default passes rewrite it (:func:`grappler_graph`), each in the sequential order the estimate
replays (:mod:`.schedule` ``execution_order``) and the executor's orders one op and ``threads`` ops at a time
(``executor_waves``) and in seeded timelines where ``threads`` workers run ops of unequal durations
(``executor_timeline``: one worker runs a chain of ops while another holds a slow kernel's inputs): replayed
(:mod:`.replay`) and handed to the BFC allocator model (:mod:`nnmem.allocators.bfc`) with the same resident
blocks. The low end is the bytes requested (no allocator waste), each order replayed also with its ``While`` loops
lowered to frames as the default executor runs them (a loop variable carries on in its initial buffer:
:meth:`.Replay._carried_on`); the high end the BFC chunks' bytes with the functional ``While``'s copies and each
``While`` running as many iterations at once as its ``parallel_iterations`` allows (:attr:`.Replay.overlap`),
each pool timeline's step replayed after steps of every pool timeline (the free chunks a step is handed are those
the steps before it left, in their own orders).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from typing import Any

import numpy as np
import tensorflow as tf

from nnmem.allocators.bfc import BFC_STEPS, BFCAllocator, StepBuffers, bfc_round, resident_state
from nnmem.cpu import schedulable_cpus
from nnmem.errors import TraceError
from nnmem.frontends.keras.tensorflow.replay import WHILES, Replay, functions_of
from nnmem.frontends.keras.tensorflow.schedule import PICKS, executor_pool_timeline, executor_timeline, executor_waves
from nnmem.frontends.keras.tensorflow.scratch import tensor_bytes
from nnmem.trace import Phase

__all__ = ["GRAPPLER_MAX_ELEMENTS", "GpuBfc", "POOL_TIMELINES", "QUICK_POOL_TIMELINES", "TIMELINES", "const_bytes",
           "grappler_graph", "inter_op_threads", "oversized", "peak_in_use", "peak_range"]

GpuBfc = Callable[[], BFCAllocator]
"""A fresh GPU BFC allocator (its memory limit and growth), for each replay of a step on a GPU."""

TIMELINES = 16
"""Seeded timelines of unequal op durations (:func:`~.schedule.executor_timeline`) each graph is replayed in."""

POOL_TIMELINES = 8
"""Seeded timelines of the executor's thread pool, each worker running a chain depth-first
(:func:`~.schedule.executor_pool_timeline`)."""

QUICK_POOL_TIMELINES = 2
"""Pool timelines of the quick range (``peak_range(quick=True)``, for batch searches), beside the waves of
``threads`` ops at a time, on each graph (as traced and as Grappler rewrites it)."""


def inter_op_threads() -> int:
    """Threads of TensorFlow's inter-op pool in this process: the configured number, else TensorFlow's
    default, the CPUs the process may run on (``port::MaxParallelism``, ``NumSchedulableCPUs``)."""
    configured = tf.config.threading.get_inter_op_parallelism_threads()
    return int(configured) if configured > 0 else schedulable_cpus()


def peak_in_use(resident: int, chunks: list[int], alloc_at: list[int], free_at: list[int],
                workspace: list[int], end_at: list[int] | None = None) -> int:
    """Bytes in use at the peak: ``resident`` plus the step's live chunks plus the running ops' scratch.

    With ``end_at`` (for each op, the last op started before it ends) ops run at the same time: each one's
    scratch is held until it ends, as its inputs are.
    """
    n = len(workspace)
    if n == 0:
        return resident
    alloc_ = np.asarray(alloc_at, np.int64)
    free_ = np.asarray(free_at, np.int64)
    size = np.asarray(chunks, np.int64)
    born = np.zeros(n, np.int64)
    np.add.at(born, alloc_, size)
    dying = np.zeros(n + 1, np.int64)  # freed after op i: gone from op i + 1 on
    freed = free_ >= 0
    np.add.at(dying, free_[freed] + 1, size[freed])
    scratch = np.asarray(workspace, np.int64)
    ending = np.zeros(n + 1, np.int64)  # an op's scratch is held through op end_at[i]
    np.add.at(ending, (np.arange(n) if end_at is None else np.asarray(end_at, np.int64)) + 1, scratch)
    live = np.cumsum(born) - np.cumsum(dying)[:n] + np.cumsum(scratch) - np.cumsum(ending)[:n]
    return int(resident + max(0, int(live.max())))


GRAPPLER_MAX_ELEMENTS = (1 << 31) - 1
"""Tensors above this many elements (int32 indexing) make Grappler's optimizer segfault (TensorFlow 2.21: an
MLP's step at batch 27,301,101, 7.0e9-element activations); such graphs are left as traced."""


def oversized(graph: Any) -> bool:
    """Whether a tensor of the graph has more than :data:`GRAPPLER_MAX_ELEMENTS` elements."""
    for op in graph.get_operations():
        for t in op.outputs:
            if t.shape.is_fully_defined() and t.shape.num_elements() > GRAPPLER_MAX_ELEMENTS:
                return True
    return False


def grappler_graph(graph: Any, fetch: list[str]) -> Any | None:
    """The graph as Grappler's default passes rewrite it for the function runtime, or None where it fails.

    Args:
        graph: the step's function graph.
        fetch: names of the ops whose results or side effects the step needs (Grappler prunes the rest).
    """
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
    from tensorflow.python.grappler import tf_optimizer

    if oversized(graph):  # Grappler's passes crash the process on such a graph (a batch search's far probes)
        return None
    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(graph.as_graph_def())
    meta.collection_def["train_op"].node_list.value.extend(fetch)
    try:
        rewritten = tf_optimizer.OptimizeGraph(config_pb2.ConfigProto(), meta)
        out = tf.Graph()
        with out.as_default():
            tf.graph_util.import_graph_def(rewritten, name="")
    except (ValueError, TypeError, tf.errors.OpError):
        return None
    for op in out.get_operations():  # a variable's shape lives in the traced graph's handle data, not the GraphDef
        for t in op.outputs:
            if not t.shape.is_fully_defined():
                try:
                    t.set_shape(graph.get_tensor_by_name(t.name).shape)
                except (KeyError, ValueError):
                    continue
    return out


def _peaks(graph: Any, kept: set[str], inputs: set[str], keep: list[str], threads: int,
           resident: list[tuple[int, int]], handles: dict[str, int], quick: bool = False,
           gpu: GpuBfc | None = None) -> list[tuple[int, int]]:
    """(requested, BFC) peaks of the executor's orders: in waves 1 and ``threads`` ops at a time, each of
    ``PICKS``, ``TIMELINES`` seeded timelines of ``threads`` workers and ``POOL_TIMELINES`` of the thread pool;
    ``quick``: the waves of ``threads`` ops and ``QUICK_POOL_TIMELINES`` pool timelines.

    An order's BFC peak is its step's after two steps in the same order (the free chunks a step finds are those
    the steps before it left) and, for a pool timeline, the highest after two steps of any pool timeline: the
    executor's order changes from step to step, and so do the free chunks it leaves (keras_two_branch_cnn: a
    1 MiB output handed a whole 1.75 MiB chunk, 72.6 MB in a plain run against 71.9 MB after steps of its own
    order)."""
    if quick:
        orders = [executor_waves(graph, kept, threads, pick) for pick in PICKS]
        orders += [executor_pool_timeline(graph, kept, threads, seed) for seed in range(QUICK_POOL_TIMELINES)]
        pool = list(range(len(PICKS), len(orders)))
    else:
        orders = [executor_waves(graph, kept, n, pick) for n in sorted({1, threads}) for pick in PICKS]
        pool = []
        if threads > 1:
            orders += [executor_timeline(graph, kept, threads, seed) for seed in range(TIMELINES)]
            pool = list(range(len(orders), len(orders) + POOL_TIMELINES))
            orders += [executor_pool_timeline(graph, kept, threads, seed) for seed in range(POOL_TIMELINES)]
    functions = functions_of(graph)
    loops = any(op.type in WHILES for op in graph.get_operations())
    facts: dict[Any, Any] = {}  # each op's order-independent facts, read once for every order
    replays: list[tuple[Replay, list[int], list[int] | None]] = []  # (replay, workspace of the high end, end_at)
    steps: list[StepBuffers] = []
    requested: list[int] = []
    for ops, end_at in orders:
        replay = Replay(functions, kernel_scratch=gpu is None, facts=facts)
        replay.run(ops, inputs, [(Phase.FORWARD, "")] * len(ops), keep=keep, end_at=end_at)
        workspace = [w for *_, w in replay.ops]
        high = [w + o for w, o in zip(workspace, replay.overlap)]  # a loop's iterations overlapping: high end only
        replays.append((replay, high, end_at))
        steps.append(StepBuffers(replay.sizes, replay.alloc_at, replay.free_at, high, replay.adoptions(handles)))
        low = _requested_peak(replay, resident, end_at)
        if loops:  # the low end: the same order with the loops lowered, as the default executor runs them
            lowered = Replay(functions, kernel_scratch=gpu is None, facts=facts, lowered=True)
            lowered.run(ops, inputs, [(Phase.FORWARD, "")] * len(ops), keep=keep, end_at=end_at)
            low = min(low, _requested_peak(lowered, resident, end_at))
        requested.append(low)
    highest = [0] * len(orders)
    for a, before in enumerate(steps):  # the steps before in one order, the step measured in the same or another
        state, held = resident_state(resident, bfc=None if gpu is None else gpu())
        for _ in range(BFC_STEPS - 1):
            state.step(before)
        for k in (pool if a in pool else [a]):
            replay, high, ends = replays[k]
            chunks, scratch = state.copy().step(steps[k])
            highest[k] = max(highest[k], peak_in_use(sum(held), chunks, replay.alloc_at, replay.free_at,
                                                     replay.scratch_chunks(scratch, high), ends))
    return list(zip(requested, highest))


def _requested_peak(replay: Replay, resident: list[tuple[int, int]], end_at: list[int] | None) -> int:
    """Bytes requested at the peak of a replayed order (the low end's measure: no allocator waste)."""
    return peak_in_use(sum(b for b, _ in resident), replay.sizes, replay.alloc_at, replay.free_at,
                       [w for *_, w in replay.ops], end_at)


def const_bytes(graph: Any, names: set[str] | None = None) -> int:
    """BFC bytes the graph's ``Const`` ops (among ``names``; None: all) hold (a ``ConstantOp`` keeps its tensor)."""
    return sum(bfc_round(tensor_bytes(op.outputs[0])) for op in graph.get_operations()
               if op.type == "Const" and (names is None or op.name in names))


def _fetch(graph: Any, kept: set[str]) -> list[str]:
    """What the function runtime hands Grappler as fetch and keep nodes: the function's results and its side
    effects (``GrapplerFunctionItem``: ``_Retval`` inputs and control returns). Every other node may be removed,
    e.g. the ``IdentityN`` of ``tf.custom_gradient`` that Keras's optimizer puts over all gradients (the
    dependency optimizer's ``SafeToRemoveIdentity``): without it each variable's update starts as soon as its
    gradient is ready."""
    outs = {t.op.name for t in graph.outputs} | {op.name for op in getattr(graph, "control_outputs", [])}
    outs |= {op.name for op in graph.get_operations()
             if op.name in kept and op.type.startswith(("Assign", "ResourceApply"))}
    return sorted(outs)


def peak_range(graph: Any, kept: set[str], resident: list[tuple[int, int]], sequential: tuple[int, int],
               handles: dict[str, int] | None = None, grappler: bool = True,
               quick: bool = False, gpu: GpuBfc | None = None) -> tuple[int, int, int]:
    """(lowest, highest peak, inter-op threads), in bytes, over the step's op orders (module docstring).

    Args:
        graph: the step's function graph.
        kept: names of the ops the function runs.
        resident: (bytes, initializer temporaries) of the blocks live before the step (BFC requests).
        sequential: (requested, BFC) peak of the sequential order, in bytes.
        handles: the resident index of each variable by its handle placeholder's name (a variable that adopts a
            step buffer moves there: :func:`~nnmem.allocators.bfc.steady_state_chunks`).
        grappler: include the graph as Grappler rewrites it.
        quick: a few orders per graph (the waves of ``threads`` ops, :data:`QUICK_POOL_TIMELINES` pool
            timelines): 14 replays instead of some 70, a batch search's high end, at most the full range's.
        gpu: on a GPU, a fresh GPU BFC allocator per replay (no CPU kernel scratch); None: the CPU's.
    """
    threads = inter_op_threads()
    keep = [t.name for t in graph.outputs]
    inputs = {t.name for t in graph.inputs}
    handles = handles or {}
    peaks = [sequential, *_peaks(graph, kept, inputs, keep, threads, resident, handles, quick, gpu)]
    rewritten = grappler_graph(graph, _fetch(graph, kept)) if grappler else None
    high = max(b for _, b in peaks)
    if rewritten is not None:
        names = {op.name for op in rewritten.get_operations()}
        consts = const_bytes(rewritten, names)
        folded = max(0, consts - const_bytes(graph, kept))
        if folded > 0:  # constants Grappler's folding made: each ConstantOp holds its tensor, like the traced ones
            resident = [*resident, (folded, 0)]
        with suppress(TraceError):  # a loop lowered to v1 control flow (NextIteration) is a cycle: left out
            more = _peaks(rewritten, names, {n for n in inputs if n.split(":")[0] in names},
                          [n for n in keep if n.split(":")[0] in names], threads, resident, handles, gpu=gpu)
            peaks += more
            # The function runtime runs this graph and may keep the traced graph's ConstantOps beside its own for
            # the process's life: an inference process held both sets (keras_two_branch_cnn: 6 and 5, eleven
            # 256 B chunks "from Proto"), a training one fewer than the traced graph's alone (124 of 152 and 27).
            # Which it keeps is not modelled: the high end of its orders counts both sets, live through the step.
            high = max(high, max(b for _, b in more) + consts - folded)
    return min(p for p, _ in peaks), high + _body_const_bytes(graph), threads


def _body_const_bytes(graph: Any) -> int:
    """BFC bytes of the ``Const`` ops inside the functions the step calls (``If`` branches, ``While`` bodies): the
    function runtime inlines them into the graph it runs, where each ``ConstantOp`` holds its tensor for the
    process's life (keras_two_branch_cnn with gradient accumulation: the update branch's 112 constants, 31,232 B,
    a plain run 1,536 B above the high end without them). The high end counts them; the sequential estimate, of
    the functional graph, does not."""
    bodies = (getattr(function, "graph", None) for function in functions_of(graph).values())
    return sum(const_bytes(body) for body in bodies if body is not None)
