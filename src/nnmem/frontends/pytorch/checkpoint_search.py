"""The optimal checkpoint plan of a PyTorch model's chain, from two traces and an exact search.

Two traces of the step calibrate :class:`nnmem.whatif.chain_dp.ChainModel`: the step as it is and the step with
every block of the chain (:func:`~nnmem.frontends.pytorch.checkpointing.chain_of`) checkpointed. Their
timelines, cut into segments by the block each op belongs to (backward ops are named after the layer whose
forward made them), give each segment's highest live bytes with its own block kept or recomputed; the bytes
each block leaves held after its forward, in both traces, give what checkpointing it changes for the segments
that follow; ``FlopCounterMode`` per module gives each block's recomputed FLOPs. :func:`~nnmem.whatif.chain_dp.
solve` then finds the cheapest plan under the budget exactly, and the plan is traced once more: the peak
reported is that trace's, never the model's. Where the model and the trace disagree (an allocator's rounding),
the search runs again with the budget lowered by the difference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from nnmem.errors import UnsupportedError
from nnmem.frontends.pytorch.checkpointing import CheckpointPlan, chain_of
from nnmem.report.model import Report, TimelinePoint
from nnmem.whatif.chain_dp import ChainModel, Choice, Segment, solve

__all__ = ["ChainCalibration", "OptimalCheckpoint", "calibrate", "optimal_checkpoint"]

_RETRIES = 3


@dataclass(frozen=True)
class ChainCalibration:
    """The chain's memory model and what it was drawn from.

    Attributes:
        blocks: qualified names of the chain's blocks (the candidates), in order.
        model: the calibrated :class:`ChainModel`.
        baseline: the step as it is. others: the steps with the even and the odd blocks checkpointed.
        baseline_flops: FLOPs of the step as it is (``FlopCounterMode``).
    """

    blocks: tuple[str, ...]
    model: ChainModel
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


def _segments(timeline: tuple[TimelinePoint, ...], blocks: tuple[str, ...]) -> list[tuple[tuple[str, int | None,
                                                                                             int], int, int]]:
    """((phase, own block, held prefix), point index, live bytes) per point; raises where the blocks do not
    run in order (forward 0..n-1, backward n-1..0)."""
    n = len(blocks)
    out = []
    forward_next, backward_low = 0, n
    for i, point in enumerate(timeline):
        own = _own(point.layer, blocks)
        if point.phase == "forward" and i and timeline[i - 1].phase != "forward":
            forward_next, backward_low = 0, n  # the next micro-batch (gradient accumulation)
        if point.phase == "forward":
            if own is not None:
                if own < forward_next - 1:
                    raise UnsupportedError(f"the chain's blocks do not run in order in forward ({blocks[own]} "
                                           f"after {blocks[forward_next - 1]}); name the modules to checkpoint")
                forward_next = max(forward_next, own + 1)
                prefix = own
            else:
                prefix = forward_next
        elif point.phase == "backward":
            if own is not None:
                if own > backward_low:
                    raise UnsupportedError(f"the chain's blocks do not run backward in reverse order "
                                           f"({blocks[own]} after {blocks[backward_low]}); name the modules "
                                           f"to checkpoint")
                backward_low = min(backward_low, own)
                prefix = own
            else:
                prefix = backward_low
        else:
            own, prefix = None, 0
        out.append(((point.phase, own, prefix), i, point.allocator_bytes))
    return out


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
    _, children = chain_of(model)
    modules = dict(model.named_modules())
    blocks = tuple(c for c in children if any(True for _ in modules[c].parameters()))
    n = len(blocks)
    parities = [frozenset(range(0, n, 2)), frozenset(range(1, n, 2))]
    parities = [p for p in parities if p]
    plans = [CheckpointPlan("optimal", tuple(blocks[j] for j in sorted(p))) for p in parities]
    base = estimate(None)
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
    prefix_sum = [0]
    for d in delta:
        prefix_sum.append(prefix_sum[-1] + d)
    kept: dict[tuple[str, int | None, int], int] = {}
    recomputed: dict[tuple[str, int | None, int], int] = {}
    for chosen, report in ((frozenset(), base), *zip(parities, traced)):
        sums = [0]
        for j, d in enumerate(delta):
            sums.append(sums[-1] + (d if j in chosen else 0))
        for key, _, live in _segments(report.timeline, blocks):
            high = recomputed if key[1] in chosen else kept
            value = live - sums[key[2]]
            high[key] = max(high.get(key, value), value)
    segments = []
    for key in sorted({*kept, *recomputed}, key=lambda k: (k[0], k[2], -1 if k[1] is None else k[1])):
        _, own, prefix = key
        plain, again = kept.get(key), recomputed.get(key)
        plain = again if plain is None else plain
        again = plain if again is None else again
        segments.append(Segment(prefix, own, plain, again if own is not None else plain))  # type: ignore[arg-type]
    total = sum(base_counts.get("Global", {}).values())
    return ChainCalibration(blocks, ChainModel(tuple(segments), tuple(delta), tuple(flops)), base,
                            tuple(traced), total)


def optimal_checkpoint(cal: ChainCalibration, budget: int,
                       estimate: Callable[[CheckpointPlan | None], Report]) -> OptimalCheckpoint | None:
    """The plan of the calibrated chain that recomputes the fewest FLOPs with a traced peak (``estimate``)
    within ``budget`` bytes; None where no plan of the chain's blocks fits."""
    front = tuple(solve(cal.model))
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
