"""The optimal checkpointing of a chain of blocks, solved exactly by dynamic programming.

A step's memory over time is a sequence of *segments* (runs of ops). In each, some blocks' saved activations
are held: in forward the blocks already run, in backward the blocks whose backward has not begun — always a
prefix of the chain (blocks ``0 .. prefix-1``). Checkpointing block ``j`` changes what it holds by ``delta[j]``
bytes (its input and generator state instead of its activations: usually negative) and changes the segments of
the block itself (its forward keeps nothing, its backward first recomputes it). So with ``S`` the checkpointed
blocks::

    peak(S) = max over segments g of  base_g(own_g in S) + sum(delta[j] for j in S if j < prefix_g)

The blocks' recomputation costs ``flops[j]`` each. :func:`solve` walks the chain once, keeping the states
(bytes the decided blocks change, FLOPs, highest segment so far) that no other state beats on all three — the
exact Pareto front of peak against recomputed FLOPs, no rounding, no heuristic. :func:`brute_force` evaluates
every subset (tests and benchmarks compare the two).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

__all__ = ["ChainModel", "Choice", "Segment", "brute_force", "solve"]


@dataclass(frozen=True)
class Segment:
    """A run of ops: blocks ``0 .. prefix-1`` are held; ``own`` is the block the ops belong to (None: none).

    Attributes:
        base: highest live bytes in the segment with ``own`` not checkpointed and no held block checkpointed.
        base_checkpointed: the same with ``own`` checkpointed (``base`` where ``own`` is None).
    """

    prefix: int
    own: int | None
    base: int
    base_checkpointed: int


@dataclass(frozen=True)
class ChainModel:
    """The chain's memory as a function of the checkpointed blocks (module docstring)."""

    segments: tuple[Segment, ...]
    delta: tuple[int, ...]
    flops: tuple[int, ...]

    def peak(self, chosen: frozenset[int] | set[int]) -> int:
        """The predicted peak with the blocks ``chosen`` checkpointed."""
        prefix_sum = [0]
        for j, d in enumerate(self.delta):
            prefix_sum.append(prefix_sum[-1] + (d if j in chosen else 0))
        return max((s.base_checkpointed if s.own in chosen else s.base) + prefix_sum[s.prefix]
                   for s in self.segments)

    def cost(self, chosen: frozenset[int] | set[int]) -> int:
        return sum(self.flops[j] for j in chosen)


@dataclass(frozen=True)
class Choice:
    """One point of the front: the blocks checkpointed, the predicted peak, the recomputed FLOPs."""

    blocks: tuple[int, ...]
    peak: int
    flops: int


def _dominated(a: tuple[int, int, int], b: tuple[int, int, int]) -> bool:
    return b[0] <= a[0] and b[1] <= a[1] and b[2] <= a[2] and b != a


def _front(states: dict[tuple[int, int, int], tuple[int, ...]]) -> dict[tuple[int, int, int], tuple[int, ...]]:
    """The states no other state beats on (bytes changed, FLOPs, highest segment)."""
    keys = sorted(states)  # by bytes changed, then FLOPs, then highest
    kept: list[tuple[int, int, int]] = []
    for key in keys:
        if not any(_dominated(key, other) for other in kept):
            kept.append(key)
    return {k: states[k] for k in kept}


def solve(model: ChainModel, *, budget: int | None = None) -> list[Choice]:
    """The Pareto front of peak against recomputed FLOPs, cheapest first (with ``budget``: only choices whose
    predicted peak fits it). Exact: every subset's peak is max of its segments' terms, and a state is dropped
    only when another is no worse in bytes changed so far, FLOPs and highest segment so far."""
    n = len(model.delta)
    by_prefix: dict[int, list[Segment]] = {}
    for s in model.segments:
        if s.own is not None and s.own != s.prefix:
            raise ValueError(f"a segment of block {s.own} must hold blocks 0..{s.own - 1}; it holds {s.prefix}")
        by_prefix.setdefault(s.prefix, []).append(s)
    limit = budget if budget is not None else None
    states: dict[tuple[int, int, int], tuple[int, ...]] = {(0, 0, -(1 << 62)): ()}
    for j in range(n + 1):
        here = by_prefix.get(j, [])
        grown: dict[tuple[int, int, int], tuple[int, ...]] = {}
        for (changed, flops, high), blocks in states.items():
            for take in ((False, True) if j < n else (False,)):
                top = high
                for s in here:
                    base = s.base_checkpointed if (take and s.own == j) else s.base
                    top = max(top, base + changed)
                if limit is not None and top > limit:
                    continue
                key = (changed + (model.delta[j] if take else 0), flops + (model.flops[j] if take else 0), top)
                if key not in grown:
                    grown[key] = (*blocks, j) if take else blocks
        states = _front(grown)
    finals: dict[tuple[int, int], tuple[int, ...]] = {}
    for (_, flops, high), blocks in states.items():
        if (high, flops) not in finals:
            finals[(high, flops)] = blocks
    return _cheapest_first([Choice(b, p, f) for (p, f), b in finals.items()])


def _cheapest_first(choices: list[Choice]) -> list[Choice]:
    """The choices no other beats on both FLOPs and peak, cheapest first."""
    front: list[Choice] = []
    for c in sorted(choices, key=lambda c: (c.flops, c.peak)):
        if not front or c.peak < front[-1].peak:
            front.append(c)
    return front


def brute_force(model: ChainModel, *, budget: int | None = None) -> list[Choice]:
    """The same front as :func:`solve`, from every subset of the chain (2**n of them: tests only)."""
    n = len(model.delta)
    choices = []
    for r in range(n + 1):
        for blocks in itertools.combinations(range(n), r):
            chosen = frozenset(blocks)
            peak = model.peak(chosen)
            if budget is None or peak <= budget:
                choices.append(Choice(blocks, peak, model.cost(chosen)))
    return _cheapest_first(choices)
