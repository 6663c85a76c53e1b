"""The optimal checkpointing of blocks that do not form a chain, solved exactly as a MILP (HiGHS).

The chain's model (:mod:`.chain_dp`) holds where, at every point of the step, the blocks whose saved activations
are held are a prefix of the chain. Where they are not — branches whose backward runs in another order than
their forward's reverse, blocks beside each other, skip connections between them — each *segment* of the step
holds an arbitrary set of blocks (forward done, backward not yet begun). The memory is still linear in the
choice: with ``x_j = 1`` when block ``j`` is checkpointed::

    peak(x) = max over segments g of
              base_g + (base_checkpointed_g - base_g) * x_own(g) + sum(delta[j] * x_j for j in held_g)

so the cheapest plan under a budget is the integer program ``min sum(flops[j] * x_j)`` subject to every
segment's term ``<= budget``: solved exactly by HiGHS (``scipy.optimize.milp``). :func:`graph_front` gives the
whole Pareto front of peak against recomputed FLOPs by the epsilon-constraint method (the cheapest plan, then the
cheapest strictly below its peak, and so on, each tie broken toward the lower peak); :func:`solve_front` picks
the chain's dynamic programme or this one by the model's kind.
"""

from __future__ import annotations

from dataclasses import dataclass

from nnmem.whatif.chain_dp import ChainModel, Choice, _cheapest_first, brute_force, solve

__all__ = ["GraphModel", "GraphSegment", "brute_force_graph", "graph_front", "solve_front"]

_MAX_FRONT = 256
"""Points of the front :func:`graph_front` finds at most (each one two small MILPs)."""


@dataclass(frozen=True)
class GraphSegment:
    """A run of ops holding the blocks ``held``; ``own`` the block the ops belong to (None: none).

    Attributes:
        base: highest live bytes in the segment with ``own`` not checkpointed and no held block checkpointed.
        base_checkpointed: the same with ``own`` checkpointed (``base`` where ``own`` is None).
    """

    held: frozenset[int]
    own: int | None
    base: int
    base_checkpointed: int


@dataclass(frozen=True)
class GraphModel:
    """The blocks' memory as a function of the checkpointed ones (module docstring)."""

    segments: tuple[GraphSegment, ...]
    delta: tuple[int, ...]
    flops: tuple[int, ...]

    def peak(self, chosen: frozenset[int] | set[int]) -> int:
        """The predicted peak with the blocks ``chosen`` checkpointed."""
        return max((s.base_checkpointed if s.own in chosen else s.base)
                   + sum(self.delta[j] for j in s.held if j in chosen) for s in self.segments)

    def cost(self, chosen: frozenset[int] | set[int]) -> int:
        return sum(self.flops[j] for j in chosen)


def _milp(model: GraphModel, limit: float, flops_cap: float | None) -> tuple[int, ...] | None:
    """The blocks of the plan with the fewest recomputed FLOPs whose peak is at most ``limit`` (with
    ``flops_cap``: the plan of lowest peak among those recomputing at most that many), or None: infeasible."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp

    n = len(model.delta)
    rows, upper = [], []
    for s in model.segments:  # base + (bc - base) x_own + sum delta_j x_j - z <= 0 (z: the peak)
        row = np.zeros(n + 1)
        for j in s.held:
            row[j] += model.delta[j]
        if s.own is not None:
            row[s.own] += s.base_checkpointed - s.base
        row[n] = -1.0
        rows.append(row)
        upper.append(-float(s.base))
    flops = np.array([*map(float, model.flops), 0.0])
    constraints = [LinearConstraint(np.array(rows), -np.inf, np.array(upper))]
    if flops_cap is None:
        cost = flops + np.eye(n + 1)[n] * 1e-9  # among equal FLOPs, the lower peak
    else:
        cost = np.eye(n + 1)[n]
        constraints.append(LinearConstraint(flops.reshape(1, -1), -np.inf, flops_cap))
    result = milp(cost, constraints=constraints, integrality=np.array([1] * n + [0]),
                  bounds=Bounds([0] * n + [-np.inf], [1] * n + [limit]))
    if not result.success or result.x is None:
        return None
    return tuple(j for j in range(n) if result.x[j] > 0.5)


def graph_front(model: GraphModel, *, budget: int | None = None) -> list[Choice]:
    """The Pareto front of peak against recomputed FLOPs, cheapest first (with ``budget``: only choices whose
    peak fits it), by the epsilon-constraint method on :func:`_milp`."""
    front: list[Choice] = []
    limit = float(budget if budget is not None else model.peak(frozenset()))  # no plan: the step as it is
    for _ in range(_MAX_FRONT):
        cheapest = _milp(model, limit, None)
        if cheapest is None:
            break
        cost = model.cost(frozenset(cheapest))
        blocks = _milp(model, limit, cost + 0.5) or cheapest  # the lowest peak at that cost
        chosen = frozenset(blocks)
        choice = Choice(tuple(sorted(chosen)), model.peak(chosen), model.cost(chosen))
        front.append(choice)
        limit = choice.peak - 1
    return _cheapest_first(front)


def brute_force_graph(model: GraphModel, *, budget: int | None = None) -> list[Choice]:
    """The same front as :func:`graph_front`, from every subset (2**n of them: tests only)."""
    return brute_force(model, budget=budget)  # type: ignore[arg-type]  # only peak, cost and delta are read


def solve_front(model: ChainModel | GraphModel, *, budget: int | None = None) -> list[Choice]:
    """The exact Pareto front of either model: the chain's dynamic programme, or the MILP."""
    if isinstance(model, GraphModel):
        return graph_front(model, budget=budget)
    return solve(model, budget=budget)
