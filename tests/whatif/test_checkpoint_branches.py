"""The optimal checkpoint plan of models without a chain container: their blocks are the root's children, taken in
the order their forwards run (not the order they are registered in). Two branches side by side still hold a
prefix of the blocks at every point (the chain's dynamic programme); a frozen probe on a detached input never
runs backward, so the blocks before it are backpropagated while it is held: not a prefix, and the MILP
(:mod:`nnmem.whatif.graph_milp`) solves it. Either memory model, drawn from three traces, gives every subset's
traced peak to the byte, and the plan recomputes as few FLOPs as the best subset that fits."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

import nnmem
from nnmem.frontends.pytorch.checkpoint_search import calibrate
from nnmem.whatif.chain_dp import ChainModel
from nnmem.whatif.graph_milp import GraphModel
from nnmem.whatif.plan import _flop_counts


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(64), nn.Linear(64, width), nn.Linear(width, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class _Branches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(64, 10)  # registered first, runs last
        self.left = _Block(96)
        self.stem = nn.Linear(16, 64)
        self.right = _Block(160)
        self.mix = _Block(48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        return self.head(self.mix(self.left(h) + self.right(h))).mean(1)


class _Probed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.left, self.probe = nn.Linear(16, 64), _Block(96), _Block(160)
        self.mix, self.head = _Block(48), nn.Linear(64, 10)
        self.probe.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        gate = torch.sigmoid(self.probe(h.detach()))  # no backward: held while stem is backpropagated
        return self.head(self.mix(self.left(h) * gate)).mean(1)


@pytest.fixture(scope="module", params=[_Branches, _Probed], ids=["branches", "probed"])
def truth(request: pytest.FixtureRequest) -> dict[str, object]:
    torch.manual_seed(0)
    model, inputs = request.param(), (torch.randn(16, 50, 16),)
    step = {"optimizer": "adam", "target": torch.randint(0, 10, (16,)), "loss_fn": nn.CrossEntropyLoss()}

    def trace(plan: object) -> nnmem.Report:
        names = ",".join(plan.modules) if plan is not None and plan.modules else None  # type: ignore[attr-defined]
        return nnmem.estimate(model, inputs, checkpoint=names, **step)

    cal = calibrate(model, trace, lambda p: _flop_counts(lambda: trace(p)))
    peaks = {}
    for r in range(len(cal.blocks) + 1):
        for subset in itertools.combinations(range(len(cal.blocks)), r):
            names = ",".join(cal.blocks[j] for j in subset) or None
            peaks[subset] = nnmem.estimate(model, inputs, checkpoint=names, **step).peak_bytes
    return {"model": model, "inputs": inputs, "step": step, "cal": cal, "peaks": peaks}


def test_blocks_are_the_root_children_in_the_order_they_run(truth: dict) -> None:
    if isinstance(truth["model"], _Branches):
        assert truth["cal"].blocks == ("stem", "left", "right", "mix", "head")
        assert isinstance(truth["cal"].model, ChainModel)
    else:
        assert truth["cal"].blocks == ("stem", "probe", "left", "mix", "head")
        assert isinstance(truth["cal"].model, GraphModel)


def test_the_model_gives_every_subsets_traced_peak(truth: dict) -> None:
    cal = truth["cal"]
    wrong = {s: (cal.model.peak(set(s)), p) for s, p in truth["peaks"].items() if cal.model.peak(set(s)) != p}
    assert not wrong, f"model vs trace differs on {len(wrong)} of {len(truth['peaks'])} subsets: {wrong}"


@pytest.mark.parametrize("share", [0.9, 0.6, 0.3])
def test_the_optimal_plan_is_the_cheapest_subset_that_fits(truth: dict, share: float) -> None:
    cal, peaks = truth["cal"], truth["peaks"]
    lowest, highest = min(peaks.values()), max(peaks.values())
    budget = int(lowest + share * (highest - lowest))
    cheapest = min(sum(cal.model.flops[j] for j in s) for s, p in peaks.items() if p <= budget)
    best = nnmem.optimal_checkpointing(truth["model"], truth["inputs"], budget=budget, **truth["step"])
    assert best.peak_bytes <= budget
    assert best.extra_flops == cheapest
