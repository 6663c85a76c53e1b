"""The max-batch search on hand-made steps whose peak is known exactly at every batch (no framework).

Each step has resident parameters, a batch-sized input, a batch-sized activation and one op whose kernel
scratch follows a rule of batch: affine, or changing regime at some batch (as a kernel that blocks its work
differently past a size does). The answer must equal the brute-force largest batch, with few traces.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from nnmem.errors import UnsupportedError
from nnmem.simulate import simulate
from nnmem.trace import Block, Category, Op, Phase, Trace
from nnmem.whatif.batch import search_max_batch

Scratch = Callable[[int], int]


def _step(batch: int, scratch: Scratch, per_sample: int = 100) -> Trace:
    blocks = (
        Block(0, 40_000, Category.PARAMETERS, "fc", Phase.SETUP, -1, -1),
        Block(1, 12 * batch, Category.INPUTS, "", Phase.SETUP, -1, -1),
        Block(2, per_sample * batch, Category.SAVED_ACTIVATIONS, "fc", Phase.FORWARD, 0, 1),
        Block(3, 40_000, Category.GRADIENTS, "fc", Phase.BACKWARD, 1, -1),
    )
    ops = (
        Op(0, "fwd", Phase.FORWARD, "fc", per_sample * batch, 0),
        Op(1, "bwd", Phase.BACKWARD, "fc", 40_000, per_sample * batch, workspace=scratch(batch)),
    )
    return Trace("test", "train", blocks, ops)


def _brute_force(trace_at: Callable[[int], Trace], budget: int) -> int:
    batch = 0
    while simulate(trace_at(batch + 1)).peaks["allocator"] <= budget:
        batch += 1
    return batch


SCRATCH: dict[str, Scratch] = {
    "affine": lambda b: 64 * b + 1000,
    "regime at 64": lambda b: 64 * b + (30_000 + 150 * b if b >= 64 else 0),
    "per-thread blocks": lambda b: 4096 * -(-b // 16),  # whole blocks of 16 samples
    "capped": lambda b: 80 * min(b, 300),
}


@pytest.mark.parametrize("name", list(SCRATCH))
@pytest.mark.parametrize("budget", [95_000, 150_000, 400_000, 1_000_000])
def test_search_equals_brute_force(name: str, budget: int) -> None:
    scratch = SCRATCH[name]
    result = search_max_batch(lambda b: _step(b, scratch), budget, "allocator")
    expected = _brute_force(lambda b: _step(b, scratch), budget)
    assert result.batch == expected
    # an affine step: 3 traces; a kernel whose scratch changes regime, or steps, right at the answer needs the
    # bracket bisected (the zoo's steps take at most 6: benchmarks/fit.py)
    assert result.traces <= (3 if name == "affine" else 14)
    assert not result.at_limit
    if expected:
        assert result.peak_bytes == simulate(_step(expected, scratch)).peaks["allocator"] <= budget
    assert result.next_peak_bytes == simulate(_step(expected + 1, scratch)).peaks["allocator"] > budget


def test_affine_step_takes_three_traces() -> None:
    result = search_max_batch(lambda b: _step(b, SCRATCH["affine"]), 1_000_000, "allocator")
    assert result.traces == 3


def test_no_search_limit() -> None:
    """A budget a million times the step's batch-1 peak: the answer is found by extrapolation, not capped."""
    budget = 10**15
    result = search_max_batch(lambda b: _step(b, SCRATCH["affine"]), budget, "allocator")
    per_sample = 12 + 100 + 64
    assert result.batch == (budget - 40_000 - 40_000 - 1000) // per_sample
    assert result.traces == 3 and not result.at_limit


def test_user_limit_is_reported() -> None:
    result = search_max_batch(lambda b: _step(b, SCRATCH["affine"]), 10**9, "allocator", upper=50)
    assert result.batch == 50 and result.at_limit


def test_nothing_fits() -> None:
    result = search_max_batch(lambda b: _step(b, SCRATCH["affine"]), 60_000, "allocator")
    assert result.batch == 0 and result.next_peak_bytes > 60_000


def test_memory_that_does_not_grow_is_refused() -> None:
    with pytest.raises(UnsupportedError, match="does not grow"):
        search_max_batch(lambda b: _step(1, SCRATCH["affine"]), 10**9, "allocator")


def test_scalar_peaks_are_searched_by_secant() -> None:
    """With ``peak_of`` (CUDA's reserved level: whole 2 MiB segments) the crossing is found on traced peaks."""
    def reserved(trace: Trace) -> int:
        return -(-simulate(trace).peaks["allocator"] // 2**21) * 2**21

    budget = 2**21 * 40
    result = search_max_batch(lambda b: _step(b, SCRATCH["affine"], per_sample=10_000), budget, "allocator",
                              peak_of=reserved)
    expected = 0
    while reserved(_step(expected + 1, SCRATCH["affine"], per_sample=10_000)) <= budget:
        expected += 1
    assert result.batch == expected and result.traces <= 2 * expected.bit_length() + 4


@pytest.mark.parametrize("budget_mib", [1_000, 14_000])
def test_a_staircase_level_far_above_the_allocator_level_is_found_in_few_traces(budget_mib: int) -> None:
    """A level that moves in whole segments and grows faster than the allocator level (caching, as on a GPU
    with a batch in the millions) stays flat over thousands of batches: the search must not creep across them."""
    def reserved(trace: Trace) -> int:
        return -(-simulate(trace).peaks["allocator"] * 13 // 10 // 2**21) * 2**21

    def step(batch: int) -> Trace:
        return _step(batch, SCRATCH["affine"], per_sample=1_000)

    budget = budget_mib << 20
    lo, hi = 1, 2
    while reserved(step(hi)) <= budget:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:  # the answer by bisection on the level itself
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if reserved(step(mid)) <= budget else (lo, mid)
    result = search_max_batch(step, budget, "allocator", peak_of=reserved)
    assert result.batch == lo and result.next_peak_bytes > budget
    assert result.traces <= lo.bit_length(), result.traces  # fewer than a bisection from batch 1 takes
