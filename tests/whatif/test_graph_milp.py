"""The MILP for blocks that do not form a chain: its front equals every subset's, and on a chain the dynamic
programme's."""

from __future__ import annotations

import random

import pytest

from nnmem.whatif.chain_dp import ChainModel, Segment, solve
from nnmem.whatif.graph_milp import GraphModel, GraphSegment, brute_force_graph, graph_front, solve_front


def _random_graph(seed: int, n: int) -> GraphModel:
    rng = random.Random(seed)
    segments = []
    for _ in range(3 * n):
        own = rng.choice([None, *range(n)])
        held = frozenset(j for j in range(n) if j != own and rng.random() < 0.5)
        base = rng.randrange(1_000, 100_000)
        segments.append(GraphSegment(held, own, base, base + rng.randrange(-20_000, 30_000) if own is not None
                                     else base))
    delta = tuple(rng.randrange(-40_000, 5_000) for _ in range(n))
    flops = tuple(rng.randrange(1, 10_000) for _ in range(n))
    return GraphModel(tuple(segments), delta, flops)


@pytest.mark.parametrize("seed", range(12))
def test_front_equals_every_subset(seed: int) -> None:
    model = _random_graph(seed, 2 + seed % 7)
    expected = [(c.peak, c.flops) for c in brute_force_graph(model)]
    assert [(c.peak, c.flops) for c in graph_front(model)] == expected
    budget = (expected[0][0] + expected[-1][0]) // 2
    assert [(c.peak, c.flops) for c in graph_front(model, budget=budget)] == [
        (c.peak, c.flops) for c in brute_force_graph(model, budget=budget)]


def test_on_a_chain_it_equals_the_dynamic_programme() -> None:
    rng = random.Random(7)
    n = 8
    segments = []
    for prefix in range(n + 1):
        for own in (None, prefix if prefix < n else None):
            base = rng.randrange(10_000, 90_000)
            segments.append(Segment(prefix, own, base, base + rng.randrange(-5_000, 20_000) if own is not None
                                    else base))
    chain = ChainModel(tuple(segments), tuple(rng.randrange(-30_000, 0) for _ in range(n)),
                       tuple(rng.randrange(1, 999) for _ in range(n)))
    graph = GraphModel(tuple(GraphSegment(frozenset(range(s.prefix)), s.own, s.base, s.base_checkpointed)
                             for s in chain.segments), chain.delta, chain.flops)
    assert [(c.peak, c.flops) for c in solve_front(graph)] == [(c.peak, c.flops) for c in solve(chain)]
    assert solve_front(chain) == solve(chain)
