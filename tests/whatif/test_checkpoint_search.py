"""The optimal checkpoint plan against the truth: every subset of a chain's blocks traced with that subset
checkpointed. The chain model drawn from three traces gives each subset's traced peak to the byte, and the
plan :func:`nnmem.optimal_checkpointing` returns recomputes as few FLOPs as the best subset that fits."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

import nnmem
from nnmem.frontends.pytorch.checkpoint_search import calibrate
from nnmem.whatif.plan import _flop_counts

WIDTHS = (32, 96, 48, 160, 64)  # blocks of different sizes: which ones to recompute matters


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(64), nn.Linear(64, width), nn.Linear(width, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class _Chain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 64)
        self.blocks = nn.ModuleList(_Block(w) for w in WIDTHS)
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x).mean(1)


@pytest.fixture(scope="module")
def truth() -> dict[str, object]:
    torch.manual_seed(0)
    model, inputs = _Chain(), (torch.randn(16, 50, 16),)
    step = {"optimizer": "adam", "target": torch.randint(0, 10, (16,)), "loss_fn": nn.CrossEntropyLoss()}

    def trace(plan: object) -> nnmem.Report:
        names = ",".join(plan.modules) if plan is not None and plan.modules else None  # type: ignore[attr-defined]
        return nnmem.estimate(model, inputs, checkpoint=names, **step)

    cal = calibrate(model, trace, lambda p: _flop_counts(lambda: trace(p)))
    peaks = {}
    for r in range(len(WIDTHS) + 1):
        for subset in itertools.combinations(range(len(WIDTHS)), r):
            names = ",".join(cal.blocks[j] for j in subset) or None
            peaks[subset] = nnmem.estimate(model, inputs, checkpoint=names, **step).peak_bytes
    return {"model": model, "inputs": inputs, "step": step, "cal": cal, "peaks": peaks}


def test_the_chain_model_gives_every_subsets_traced_peak(truth: dict) -> None:
    cal = truth["cal"]
    wrong = {s: (cal.model.peak(set(s)), p) for s, p in truth["peaks"].items() if cal.model.peak(set(s)) != p}
    assert not wrong, f"model vs trace differs on {len(wrong)} of {len(truth['peaks'])} subsets: {wrong}"


@pytest.mark.parametrize("share", [1.0, 0.9, 0.8, 0.7, 0.6])
def test_the_optimal_plan_is_the_cheapest_subset_that_fits(truth: dict, share: float) -> None:
    cal, peaks = truth["cal"], truth["peaks"]
    lowest, highest = min(peaks.values()), max(peaks.values())
    budget = int(lowest + share * (highest - lowest))
    cheapest = min(sum(cal.model.flops[j] for j in s) for s, p in peaks.items() if p <= budget)
    best = nnmem.optimal_checkpointing(truth["model"], truth["inputs"], budget=budget, **truth["step"])
    assert best.peak_bytes <= budget
    assert best.extra_flops == cheapest
    chosen = tuple(cal.blocks.index(name) for name in best.plan.modules)
    assert peaks[chosen] == best.peak_bytes  # the plan's peak is its own trace's


def test_a_budget_below_every_plan_is_a_clear_error(truth: dict) -> None:
    budget = min(truth["peaks"].values()) - 1
    with pytest.raises(nnmem.ConfigError, match="no checkpoint plan of _Chain's 5 blocks fits"):
        nnmem.optimal_checkpointing(truth["model"], truth["inputs"], budget=budget, **truth["step"])
