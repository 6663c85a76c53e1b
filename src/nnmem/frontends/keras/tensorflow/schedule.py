"""The order a TensorFlow function graph's ops run in, as the estimate replays it and the measurement pins it.

Ops run in graph-construction order, one at a time, each after its inputs and control inputs, the halves of a
kernel oneDNN may merge (``MklLayoutRewritePass``) back to back; ops nothing depends on are pruned as the
function runtime does (``PruneFunctionBody``). Left alone, TensorFlow's sequential executor runs a reverse
post-order whose ties follow the hash of ``Edge`` pointers (``EdgeSet`` is a pointer-keyed set past 8 edges),
so independent kernels swap places from process to process; :func:`pinned_schedule` chains the ops of every
traced function with control edges in this order, leaving the executor one order.
"""

from __future__ import annotations

import heapq
import random
import weakref
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from nnmem.errors import TraceError
from nnmem.frontends.keras.tensorflow.scratch import tensor_bytes

__all__ = ["PICKS", "UNPINNED", "executor_pool_timeline", "executor_timeline", "executor_waves", "execution_order",
           "pin", "pinned_schedule", "reachable"]

_FUSED_PRODUCERS = frozenset({"Conv2D", "DepthwiseConv2dNative", "Conv3D", "MatMul", "Pad", "_FusedConv2D"})
_FUSED_CONSUMERS = frozenset({"BiasAdd", "Conv2D", "DepthwiseConv2dNative", "_FusedConv2D"})
_FUSED_FILTER_GRADS = frozenset({"Conv2DBackpropFilter", "DepthwiseConv2dNativeBackpropFilter",
                                 "Conv3DBackpropFilterV2", "MatMul"})
"""Kernels oneDNN's graph rewrite (``MklLayoutRewritePass``, TensorFlow's default on x86) may merge into one:
a convolution or matmul with the ``BiasAdd`` (or a ``Pad`` with the convolution) that alone consumes its
output, and a filter gradient with the ``BiasAddGrad`` of the same incoming gradient. They run back to back
here: a merged kernel with another op ordered between its halves would close a cycle."""

UNPINNED = frozenset({"Placeholder", "Const"})
"""Ops the pinned schedule leaves out of its chain: a function's arguments and constants run before any kernel."""


def reachable(graph: Any) -> set[str]:
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


def execution_order(graph: Any, kept: set[str]) -> list[Any]:
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
    raise TraceError(f"the graph of {getattr(graph, 'name', 'the step')!r} has a cycle")  # none when traced


def _group_edges(ops: list[Any], group_of: list[int]) -> tuple[dict[int, list[int]], dict[int, list[int]],
                                                                  dict[int, int]]:
    """Per group: its ops' indices, the groups that wait on it, and how many groups it waits on."""
    index = {op.name: i for i, op in enumerate(ops)}
    members: dict[int, list[int]] = {}
    for i, g in enumerate(group_of):
        members.setdefault(g, []).append(i)
    users: dict[int, list[int]] = {g: [] for g in members}
    waiting = dict.fromkeys(members, 0)
    for i, op in enumerate(ops):
        for name in {t.op.name for t in op.inputs} | {c.name for c in op.control_inputs}:
            if name in index and group_of[index[name]] != group_of[i]:
                users[group_of[index[name]]].append(group_of[i])
                waiting[group_of[i]] += 1
    return members, users, waiting


_SCHEDULABLE: weakref.WeakKeyDictionary[Any, dict[frozenset[str], tuple[Any, ...]]] = weakref.WeakKeyDictionary()
"""What :func:`_schedulable` found per graph and op set: the range asks for it once per order (some 35)."""


def _schedulable(graph: Any, kept: set[str]) -> tuple[list[Any], dict[int, list[int]], dict[int, list[int]],
                                                      dict[int, int], dict[int, int]]:
    """The ops in ``kept``, and per group (:func:`_group_edges`): its ops' indices, the groups that wait on it,
    how many groups it waits on (a fresh copy: the caller counts it down), and its outputs' bytes."""
    known = _SCHEDULABLE.setdefault(graph, {})
    key = frozenset(kept)
    if key not in known:
        ops = [op for op in graph.get_operations() if op.name in kept]
        members, users, waiting = _group_edges(ops, _fusion_groups(ops))
        size = {g: sum(tensor_bytes(t) for i in m for t in ops[i].outputs) for g, m in members.items()}
        known[key] = (ops, members, users, waiting, size)
    ops, members, users, waiting, size = known[key]
    return ops, members, users, dict(waiting), size


def _kahn(ops: list[Any], group_of: list[int]) -> list[Any] | None:
    """Kahn's topological sort of the groups, lowest group index first; None when the groups form a cycle."""
    members, users, waiting = _group_edges(ops, group_of)
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


PICKS = ("fifo", "lifo", "largest", "leanest", "fattest")
"""Which ready ops :func:`executor_waves` starts first: the oldest, the newest, the largest outputs, the ones that
add the fewest (most) bytes net of the inputs they free."""


def executor_waves(graph: Any, kept: set[str], threads: int, pick: str = "fifo") -> tuple[list[Any], list[int]]:
    """An order TensorFlow's default executor can run the ops in with ``threads`` inter-op threads, in waves.

    ``common_runtime/executor.cc`` (``ExecutorState::ScheduleReady``): the ops a finished op makes ready join
    a FIFO (``inline_ready``, popped from the front) or, while their kernel counts as expensive (every kernel
    does until ``KernelStats`` has timed it), start at once on the inter-op pool, so up to ``threads`` ready
    ops run at the same time, each holding its inputs until it finishes. Here every tick starts the first
    ``threads`` ready groups (:func:`_fusion_groups`) of that FIFO together and finishes them together
    (``pick="fifo"``). With "lifo" the newest ready groups start first, as a pool thread runs the tasks it
    scheduled itself: Eigen's ``NonBlockingThreadPool`` pushes a worker's own task to the front of its queue
    and pops from the front. Which ready op a thread starts next follows timing, so any of them can: with
    "largest" the groups with the largest outputs start first, a greedy stand-in for the worst order.

    Returns:
        (the ops in order, for each op the index of the last op of its wave: where its inputs are freed).
    """
    ops, members, users, waiting, size = _schedulable(graph, kept)
    ready = _Ready(pick, [g for g in members if waiting[g] == 0], size,
                   _NetBytes(ops, members, size) if pick in ("leanest", "fattest") else None)
    order: list[Any] = []
    wave_end: list[int] = []
    while ready:
        wave = [ready.take() for _ in range(min(max(threads, 1), len(ready)))]
        start = len(order)
        for g in wave:
            order.extend(ops[i] for i in members[g])
            ready.started(g)
        wave_end.extend([len(order) - 1] * (len(order) - start))
        for g in wave:
            for u in users[g]:
                waiting[u] -= 1
                if waiting[u] == 0:
                    ready.add(u)
    if len(order) != len(ops):  # a merged pair closed a cycle: no waves, the sequential order
        order = execution_order(graph, kept)
        wave_end = list(range(len(order)))
    return order, wave_end


def executor_timeline(graph: Any, kept: set[str], threads: int, seed: int) -> tuple[list[Any], list[int]]:
    """An order the default executor can run the ops in when they take unequal times: ``threads`` workers each
    start a ready group as soon as they are free, and each group holds its inputs until it ends.

    Unlike :func:`executor_waves` the workers do not start together: while one runs a slow kernel, the other
    may run a chain of ops whose outputs pile up beside the slow kernel's inputs. Each group's duration is drawn
    from a seeded ``random.Random(seed)`` (exponential, scaled by its output bytes: a larger kernel tends to take
    longer) and a free worker takes a ready group at random (which one it takes follows timing).

    Returns:
        (the ops in the order they start, for each op the index of the last op started before it ends: where
        its inputs are freed).
    """
    ops, members, users, waiting, size = _schedulable(graph, kept)
    rng = random.Random(seed)
    ready = [g for g in members if waiting[g] == 0]
    running: list[tuple[float, int, int]] = []  # (end time, start order, group)
    order: list[Any] = []
    started: dict[int, tuple[int, int]] = {}  # group -> (first, last op index in order)
    ends: list[tuple[int, int]] = []  # (group, ops started before it ended)
    now = 0.0
    while ready or running:
        while ready and len(running) < max(threads, 1):
            g = ready.pop(rng.randrange(len(ready)))
            first = len(order)
            order.extend(ops[i] for i in members[g])
            started[g] = (first, len(order) - 1)
            duration = rng.expovariate(1.0) * (1.0 + size[g] / 65536)
            heapq.heappush(running, (now + duration, first, g))
        now, _, g = heapq.heappop(running)
        ends.append((g, len(order)))
        for u in users[g]:
            waiting[u] -= 1
            if waiting[u] == 0:
                ready.append(u)
    if len(order) != len(ops):  # a merged pair closed a cycle: the sequential order
        order = execution_order(graph, kept)
        return order, list(range(len(order)))
    return order, _ends(len(order), started, ends)


def executor_pool_timeline(graph: Any, kept: set[str], threads: int, seed: int) -> tuple[list[Any], list[int]]:
    """An order the default executor runs the ops in on its thread pool, with unequal op durations.

    ``executor.cc`` (``ExecutorState::ScheduleReady``, every kernel expensive until ``KernelStats`` has timed it
    over some ninety runs): of the ops a finished op makes ready, the last runs next on the same thread and the
    others go to the pool (``RunTask``), which a pool thread pushes to the front of its own queue (Eigen's
    ``NonBlockingThreadPool::Schedule``: ``PushFront``). A free worker pops the front of its own queue, else steals
    from the back of another's. So each worker runs a chain depth-first — after a weight's gradient, the
    optimizer's update of that weight — while the ops beside it wait in the queues: an update can overtake the
    backward op that still reads the weight (the variable is then copied, :class:`.replay.Replay`). Durations as
    in :func:`executor_timeline`, from ``random.Random(seed)``, which also picks the queue a steal comes from.
    """
    ops, members, users, waiting, size = _schedulable(graph, kept)
    rng = random.Random(seed)
    workers = max(threads, 1)
    queues: list[deque[int]] = [deque() for _ in range(workers)]
    for g in members:
        if waiting[g] == 0:  # scheduled from outside the pool: the back of a random queue
            queues[rng.randrange(workers)].append(g)
    idle = list(range(workers))
    running: list[tuple[float, int, int, int]] = []  # (end time, start order, group, worker)
    order: list[Any] = []
    started: dict[int, tuple[int, int]] = {}
    ends: list[tuple[int, int]] = []
    now = 0.0
    while True:
        for w in list(idle):
            if queues[w]:
                g = queues[w].popleft()
            else:
                others = [q for q in queues if q]  # its own queue is empty
                if not others:
                    continue
                g = rng.choice(others).pop()
            idle.remove(w)
            first = len(order)
            order.extend(ops[i] for i in members[g])
            started[g] = (first, len(order) - 1)
            heapq.heappush(running, (now + rng.expovariate(1.0) * (1.0 + size[g] / 65536), first, g, w))
        if not running:
            break
        now, _, g, w = heapq.heappop(running)
        idle.append(w)
        ends.append((g, len(order)))
        for u in users[g]:
            waiting[u] -= 1
            if waiting[u] == 0:  # the last one made ready ends up first: it runs next on this thread
                queues[w].appendleft(u)
    if len(order) != len(ops):  # a merged pair closed a cycle: the sequential order
        order = execution_order(graph, kept)
        return order, list(range(len(order)))
    return order, _ends(len(order), started, ends)


def _ends(count: int, started: dict[int, tuple[int, int]], ends: list[tuple[int, int]]) -> list[int]:
    """For each op of a timeline, the index of the last op started before its group ended."""
    end_at = [0] * count
    for g, started_before in ends:
        first, last = started[g]
        for i in range(first, last + 1):
            end_at[i] = started_before - 1
    return end_at


class _Ready:
    """The ready groups of :func:`executor_waves`, taken in ``pick``'s order.

    "fifo" and "lifo" take the oldest or newest; "largest" the largest outputs first (ties: the oldest), "leanest"
    and "fattest" the fewest or most net bytes (:class:`_NetBytes`; ties: the lowest group). The last three keep a
    heap whose stale entries (a group's net bytes change when a group sharing one of its inputs starts) are
    skipped: the same order as sorting the ready groups at every wave, without the sort.
    """

    def __init__(self, pick: str, groups: list[int], size: dict[int, int], net: _NetBytes | None) -> None:
        self.pick, self.size, self.net = pick, size, net
        self.queue: deque[int] = deque()
        self.heap: list[tuple[int, int, int]] = []
        self.key: dict[int, tuple[int, int, int]] = {}  # ready group -> its current heap entry
        self.count = 0
        for g in groups:
            self.add(g)

    def __len__(self) -> int:
        return len(self.queue) if self.pick in ("fifo", "lifo") else len(self.key)

    def add(self, g: int) -> None:
        if self.pick in ("fifo", "lifo"):
            self.queue.append(g)
            return
        if self.net is None:
            entry = (-self.size[g], self.count, g)
            self.count += 1
        else:
            entry = ((1 if self.pick == "leanest" else -1) * self.net.of(g), g, g)
        self.key[g] = entry
        heapq.heappush(self.heap, entry)

    def take(self) -> int:
        if self.pick == "fifo":
            return self.queue.popleft()
        if self.pick == "lifo":
            return self.queue.pop()
        while True:
            entry = heapq.heappop(self.heap)
            if self.key.get(entry[2]) == entry:
                del self.key[entry[2]]
                return entry[2]

    def started(self, g: int) -> None:
        if self.net is None:
            return
        for u in self.net.started(g):
            if u in self.key:  # a ready group whose net bytes changed: a fresh entry supersedes the stale one
                self.add(u)


class _NetBytes:
    """Bytes a group of ops would add if started now: its outputs less the inputs it is the last consumer of.

    Only buffers a kernel allocates count (:mod:`.scratch` ``Memory.NEW`` / ``IN_PLACE``); a view's consumers
    are its source's (``Memory.VIEW`` outputs are followed back to the buffer they share).
    """

    def __init__(self, ops: list[Any], members: dict[int, list[int]], size: dict[int, int]) -> None:
        from nnmem.frontends.keras.tensorflow.scratch import Memory, rule_of

        self.members, self.size = members, size
        index = {op.name: i for i, op in enumerate(ops)}
        self.source: dict[str, str] = {}  # tensor -> the buffer's tensor (through views)
        for op in ops:
            viewing = rule_of(op.type).memory is Memory.VIEW
            for k, t in enumerate(op.outputs):
                src = op.inputs[k if op.type == "IdentityN" else 0] if viewing and op.inputs else None
                self.source[t.name] = self.source.get(src.name, src.name) if src is not None else t.name
        self.owned = {t.name: tensor_bytes(t) for op in ops for t in op.outputs
                      if rule_of(op.type).memory in (Memory.NEW, Memory.IN_PLACE) and op.name in index}
        self.uses: dict[int, dict[str, int]] = {}
        self.left: dict[str, int] = {}
        for g, m in members.items():
            uses: dict[str, int] = {}
            for i in m:
                for t in ops[i].inputs:
                    buf = self.source.get(t.name, t.name)
                    if buf in self.owned:
                        uses[buf] = uses.get(buf, 0) + 1
            self.uses[g] = uses
            for buf, n in uses.items():
                self.left[buf] = self.left.get(buf, 0) + n
        self.users: dict[str, list[int]] = {}  # buffer -> the groups that consume it
        for g, uses in self.uses.items():
            for buf in uses:
                self.users.setdefault(buf, []).append(g)
        self.known: dict[int, int] = {}  # of(g), until a group sharing one of g's inputs starts

    def of(self, g: int) -> int:
        known = self.known.get(g)
        if known is None:
            freed = sum(self.owned[b] for b, n in self.uses[g].items() if self.left[b] == n)
            known = self.known[g] = self.size[g] - freed
        return known

    def started(self, g: int) -> set[int]:
        """Count ``g``'s inputs as consumed; the groups whose net bytes this may change."""
        changed: set[int] = set()
        for buf, n in self.uses[g].items():
            self.left[buf] -= n
            for user in self.users[buf]:
                self.known.pop(user, None)
                changed.add(user)
        return changed


def pin(graph: Any) -> None:
    """Chain the ops of a traced function graph with control edges in :func:`execution_order`."""
    previous = None
    for op in execution_order(graph, reachable(graph)):
        if op.type in UNPINNED:
            continue
        if previous is not None and previous not in op.control_inputs and \
                all(t.op is not previous for t in op.inputs):
            op._add_control_input(previous)  # the public API adds control edges only while an op is created
        previous = op


@contextmanager
def pinned_schedule() -> Iterator[None]:
    """While inside, every function graph TensorFlow traces (the step's, its ``If`` branches and ``While`` bodies)
    is chained by :func:`pin` before it becomes a function."""
    from tensorflow.python.framework import func_graph

    original = func_graph.func_graph_from_py_func

    def traced(*args: Any, **kwargs: Any) -> Any:
        graph = original(*args, **kwargs)
        pin(graph)
        return graph

    func_graph.func_graph_from_py_func = traced
    try:
        yield
    finally:
        func_graph.func_graph_from_py_func = original
