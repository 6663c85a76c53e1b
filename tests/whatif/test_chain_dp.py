"""The chain DP returns exactly the brute-force Pareto front (every subset evaluated) on random chains."""

from __future__ import annotations

import random

import pytest

from nnmem.whatif.chain_dp import ChainModel, Segment, brute_force, solve


def _random_chain(rng: random.Random, n: int) -> ChainModel:
    segments = [Segment(0, None, rng.randint(10, 100), 0)]
    for k in range(n):  # forward of block k, then what runs between blocks
        base = rng.randint(100, 1000) + 50 * k
        segments.append(Segment(k, k, base, base - rng.randint(-20, 80)))
    segments.append(Segment(n, None, rng.randint(500, 2000), 0))
    for k in reversed(range(n)):  # backward of block k: recomputing it may cost more than keeping it
        base = rng.randint(100, 1500)
        segments.append(Segment(k, k, base, base + rng.randint(-50, 300)))
    segments = [s if s.own is not None else Segment(s.prefix, None, s.base, s.base) for s in segments]
    delta = tuple(-rng.randint(0, 400) if rng.random() < 0.9 else rng.randint(0, 20) for _ in range(n))
    flops = tuple(rng.choice([10, 10, 20, rng.randint(1, 50)]) for _ in range(n))
    return ChainModel(tuple(segments), delta, flops)


@pytest.mark.parametrize("seed", range(40))
def test_solve_equals_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    model = _random_chain(rng, rng.randint(1, 12))
    want = [(c.peak, c.flops) for c in brute_force(model)]
    got = solve(model)
    assert [(c.peak, c.flops) for c in got] == want
    for c in got:  # each choice's blocks give the peak and FLOPs it claims
        assert model.peak(set(c.blocks)) == c.peak and model.cost(set(c.blocks)) == c.flops
    budget = rng.randint(min(p for p, _ in want), max(p for p, _ in want))
    assert [(c.peak, c.flops) for c in solve(model, budget=budget)] == \
        [(c.peak, c.flops) for c in brute_force(model, budget=budget)]


def test_a_budget_no_subset_meets_gives_an_empty_front() -> None:
    model = _random_chain(random.Random(1), 4)
    lowest = min(c.peak for c in brute_force(model))
    assert solve(model, budget=lowest - 1) == []
