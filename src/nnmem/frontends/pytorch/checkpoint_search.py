"""The optimal checkpoint plan of a PyTorch model's blocks, from three traces and an exact search.

The candidates are the blocks of the model's chain (:func:`~nnmem.frontends.pytorch.checkpointing.chain_of`), or,
where it has none, the root's children that hold parameters. Three traces of the step calibrate the memory model:
the step as it is and with the even and the odd blocks (in the order their forwards run) checkpointed. Their
timelines, cut into segments by the block each op belongs to (backward ops are named after the layer whose
forward made them) and by the blocks held there (forward done, backward not begun), give each segment's highest
live bytes with its own block kept or recomputed; the bytes each block leaves held after its forward give what
checkpointing it changes for the segments that hold it; ``FlopCounterMode`` per module gives each block's
recomputed FLOPs. Where every segment holds a prefix of the blocks (a chain run forward in order and backward in
reverse) :func:`~nnmem.whatif.chain_dp.solve` finds the cheapest plan under the budget exactly; otherwise the
MILP of :mod:`nnmem.whatif.graph_milp` does (HiGHS). The plan is then traced once more: the peak reported is that
trace's, never the model's. Where the model and the trace disagree (an allocator's rounding), the search runs
again with the budget lowered by the difference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from nnmem.errors import UnsupportedError
from nnmem.frontends.pytorch.checkpointing import CheckpointPlan, chain_of
from nnmem.report.model import Report, TimelinePoint
from nnmem.whatif.chain_dp import ChainModel, Choice, Segment
from nnmem.whatif.graph_milp import GraphModel, GraphSegment, solve_front

__all__ = ["ChainCalibration", "OptimalCheckpoint", "calibrate", "optimal_checkpoint"]

_RETRIES = 3


@dataclass(frozen=True)
class ChainCalibration:
    """The chain's memory model and what it was drawn from.

    Attributes:
        blocks: qualified names of the chain's blocks (the candidates), in order.
        model: the calibrated :class:`ChainModel` (a chain) or :class:`GraphModel` (any other order).
        baseline: the step as it is. others: the steps with the even and the odd blocks checkpointed.
        baseline_flops: FLOPs of the step as it is (``FlopCounterMode``).
    """

    blocks: tuple[str, ...]
    model: ChainModel | GraphModel
    baseline: Report
    others: tuple[Report, ...]
    baseline_flops: int


@dataclass(frozen=True)
class OptimalCheckpoint:
    """The cheapest checkpoint plan under a budget.

    Attributes:
        plan: the blocks to checkpoint (``plan.modules``; empty: the step fits as it is).
        report: the trace of the step with the plan applied (its ``peak_bytes`` is the prediction).
        extra_flops: FLOPs the plan recomputes. baseline_flops: FLOPs of the step as it is.
        front: the Pareto front of the chain's model, cheapest first (predicted peak, recomputed FLOPs).
        blocks: the chain's blocks (the candidates).
    """

    plan: CheckpointPlan
    report: Report
    extra_flops: int
    baseline_flops: int
    front: tuple[Choice, ...]
    blocks: tuple[str, ...]

    @property
    def peak_bytes(self) -> int:
        return self.report.peak_bytes

    @property
    def extra_compute(self) -> float:
        return self.extra_flops / self.baseline_flops if self.baseline_flops else 0.0


def _own(layer: str, blocks: tuple[str, ...]) -> int | None:
    for i, name in enumerate(blocks):
        if layer == name or layer.startswith(name + "."):
            return i
    return None


_Key = tuple[str, "int | None", frozenset[int]]


def _segments(timeline: tuple[TimelinePoint, ...], blocks: tuple[str, ...]) -> list[tuple[_Key, int, int]]:
    """((phase, own block, blocks held), point index, live bytes) per point. A block is held from its forward
    until its backward begins; the ops of a block's own forward or backward do not count it as held."""
    out = []
    ran: set[int] = set()
    started: set[int] = set()
    for i, point in enumerate(timeline):
        own = _own(point.layer, blocks)
        if point.phase == "forward" and i and timeline[i - 1].phase != "forward":
            ran, started = set(), set()  # the next micro-batch (gradient accumulation)
        if point.phase == "forward":
            held = frozenset(ran - {own})
            if own is not None:
                ran.add(own)
        elif point.phase == "backward":
            if own is not None:
                started.add(own)
            held = frozenset(ran - started)
        else:
            own, held = None, frozenset()
        out.append(((point.phase, own, held), i, point.allocator_bytes))
    return out


def _forward_order(timeline: tuple[TimelinePoint, ...], blocks: tuple[str, ...]) -> tuple[str, ...]:
    """The blocks in the order their forwards first run (blocks that never run are left out)."""
    first: dict[int, int] = {}
    for i, point in enumerate(timeline):
        own = _own(point.layer, blocks) if point.phase == "forward" else None
        if own is not None:
            first.setdefault(own, i)
    return tuple(blocks[j] for j in sorted(first, key=first.__getitem__))


def _candidates(model: nn.Module) -> tuple[str, ...]:
    """The chain's blocks that hold parameters, or where there is no chain the root's children that do.

    Raises:
        UnsupportedError: fewer than two such modules.
    """
    modules = dict(model.named_modules())
    try:
        _, children = chain_of(model)
    except UnsupportedError:
        children = [name for name, _ in model.named_children()]
        if sum(any(True for _ in modules[c].parameters()) for c in children) < 2:
            raise
    return tuple(c for c in children if any(True for _ in modules[c].parameters()))


def _after(timeline: tuple[TimelinePoint, ...], blocks: tuple[str, ...]) -> list[int]:
    """Live tensor bytes at the first forward op after each block's forward (the next block's first op, or
    the first op past the chain): the block's leftovers are what stays live there, its temporaries freed."""
    first_run = []  # the first micro-batch's forward (all of it without gradient accumulation)
    for i, p in enumerate(timeline):
        if p.phase == "forward":
            first_run.append(i)
        elif first_run and p.phase != "forward":
            break
    after = []
    for j, _ in enumerate(blocks):
        points = [i for i in first_run if _own(timeline[i].layer, blocks) == j]
        if not points or points[-1] + 1 >= len(timeline) or timeline[points[-1] + 1].phase != "forward":
            raise UnsupportedError(f"{blocks[j]} is not followed by another forward op; the chain's blocks "
                                   f"cannot be checkpointed one by one")
        after.append(timeline[points[-1] + 1].tensor_bytes)
    return after


def _block_flops(counts: dict[str, dict[Any, int]], root: str, blocks: tuple[str, ...]) -> list[int]:
    return [sum(counts.get(f"{root}.{name}", {}).values()) for name in blocks]


def calibrate(model: nn.Module, estimate: Callable[[CheckpointPlan | None], Report],
              count_flops: Callable[[CheckpointPlan | None], dict[str, dict[Any, int]]]) -> ChainCalibration:
    """The chain's memory model from three traces: the step as it is, and with the even and the odd blocks
    checkpointed. Where block j is checkpointed and block j+1 is not, the first op after block j is the same
    op in both traces, so the difference of live bytes there is exactly what checkpointing the blocks so far
    changed; each block's own segments come from the trace that checkpoints it.

    Args:
        estimate: the step's estimate with a plan applied (None: as it is).
        count_flops: ``FlopCounterMode.get_flop_counts()`` of the step with a plan applied.
    """
    base = estimate(None)
    blocks = _forward_order(base.timeline, _candidates(model))
    n = len(blocks)
    if n < 2:
        raise UnsupportedError(f"{type(model).__name__} runs fewer than two blocks with parameters to checkpoint; "
                               f"name the modules instead")
    parities = [frozenset(range(0, n, 2)), frozenset(range(1, n, 2))]
    plans = [CheckpointPlan("optimal", tuple(blocks[j] for j in sorted(p))) for p in parities]
    traced = [estimate(plan) for plan in plans]
    root = type(model).__name__
    base_counts = count_flops(None)
    flops = [0] * n
    for chosen, plan in zip(parities, plans):
        counts = count_flops(plan)
        for j, (e, b) in enumerate(zip(_block_flops(counts, root, blocks), _block_flops(base_counts, root, blocks))):
            if j in chosen:
                flops[j] = max(0, e - b)
    plain_after = _after(base.timeline, blocks)
    delta = [0] * n
    for chosen, report in zip(parities, traced):
        after = _after(report.timeline, blocks)
        changed = 0  # what the checkpointed blocks before j changed
        for j in sorted(chosen):
            delta[j] = after[j] - plain_after[j] - changed
            changed += delta[j]
    kept: dict[_Key, int] = {}
    recomputed: dict[_Key, int] = {}
    for chosen, report in ((frozenset(), base), *zip(parities, traced)):
        for key, _, live in _segments(report.timeline, blocks):
            high = recomputed if key[1] in chosen else kept
            value = live - sum(delta[j] for j in key[2] if j in chosen)
            high[key] = max(high.get(key, value), value)
    bases = {}
    for key in {*kept, *recomputed}:
        plain, again = kept.get(key), recomputed.get(key)
        plain = again if plain is None else plain
        again = plain if again is None else again
        bases[key] = (plain, again if key[1] is not None else plain)
    total = sum(base_counts.get("Global", {}).values())
    return ChainCalibration(blocks, _memory_model(bases, delta, flops), base, tuple(traced), total)


def _memory_model(bases: dict[_Key, tuple[int | None, int | None]], delta: list[int],
                  flops: list[int]) -> ChainModel | GraphModel:
    """The chain's model where every segment holds a prefix of the blocks and a block's own segments hold the
    blocks before it; the general model otherwise."""
    def prefix(held: frozenset[int]) -> int | None:
        return len(held) if held == frozenset(range(len(held))) else None

    chain = all(prefix(held) is not None and (own is None or own == len(held)) for _, own, held in bases)
    if chain:
        order = sorted(bases, key=lambda k: (k[0], len(k[2]), -1 if k[1] is None else k[1]))
        return ChainModel(tuple(Segment(len(k[2]), k[1], *bases[k]) for k in order),  # type: ignore[arg-type]
                          tuple(delta), tuple(flops))
    order = sorted(bases, key=lambda k: (k[0], sorted(k[2]), -1 if k[1] is None else k[1]))
    return GraphModel(tuple(GraphSegment(k[2], k[1], *bases[k]) for k in order),  # type: ignore[arg-type]
                      tuple(delta), tuple(flops))


def optimal_checkpoint(cal: ChainCalibration, budget: int,
                       estimate: Callable[[CheckpointPlan | None], Report]) -> OptimalCheckpoint | None:
    """The plan of the calibrated chain that recomputes the fewest FLOPs with a traced peak (``estimate``)
    within ``budget`` bytes; None where no plan of the chain's blocks fits."""
    front = tuple(solve_front(cal.model))
    limit = budget
    for _ in range(_RETRIES):
        fitting = [c for c in front if c.peak <= limit]
        if not fitting:
            return None
        best = fitting[0]
        plan = CheckpointPlan("optimal", tuple(cal.blocks[j] for j in best.blocks))
        report = cal.baseline if not plan.modules else estimate(plan)
        if report.peak_bytes <= budget:
            return OptimalCheckpoint(plan, report, best.flops, cal.baseline_flops, front, cal.blocks)
        limit -= report.peak_bytes - budget
    return None
