"""The optimal checkpoint plan against brute force: every subset of a chain's blocks traced.

For chains of 2 to 12 blocks drawn at random (seeded: block widths, sequence length, residual or not,
optimizer), every subset of blocks is checkpointed and the step traced — 2**n traces per chain, the truth the
search must match (above ``--exhaustive`` subsets: a seeded sample of them, plus every subset that is the cheapest
to fit one of the budgets by the model). Printed per chain: subsets where the
chain model (three traces) differs from the subset's own trace, and for five budgets between the lowest and the
highest peak whether ``nnmem.optimal_checkpointing`` recomputes exactly as few FLOPs as the cheapest traced subset
that fits and whether its traced peak fits.

    python benchmarks/checkpoint_optimal.py [--seed 0] [--max-blocks 12] [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import time
from typing import Any

import torch
from torch import nn

import nnmem
from nnmem.frontends.pytorch.checkpoint_search import calibrate
from nnmem.whatif.plan import _flop_counts


class Block(nn.Module):
    def __init__(self, d: int, width: int, residual: bool, act: str) -> None:
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, width), nn.Linear(width, d)
        self.act = {"relu": nn.ReLU(), "gelu": nn.GELU(), "tanh": nn.Tanh()}[act]
        self.residual = residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.down(self.act(self.up(self.norm(x))))
        return x + y if self.residual else y


class Chain(nn.Module):
    def __init__(self, d: int, widths: list[int], residual: bool, act: str) -> None:
        super().__init__()
        self.embed = nn.Linear(8, d)
        self.blocks = nn.ModuleList(Block(d, w, residual, act) for w in widths)
        self.head = nn.Linear(d, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x).mean(1)


def chain_case(rng: random.Random, n: int) -> dict[str, Any]:
    d = rng.choice([16, 32, 48])
    widths = [rng.choice([16, 32, 64, 96, 128, 192]) for _ in range(n)]
    return {"n": n, "d": d, "widths": widths, "seq": rng.choice([8, 16, 24]), "batch": rng.choice([4, 8]),
            "residual": rng.random() < 0.7, "act": rng.choice(["relu", "gelu", "tanh"]),
            "optimizer": rng.choice(["sgd", "adam", "adamw"])}


def run(case: dict[str, Any], exhaustive: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = Chain(case["d"], case["widths"], case["residual"], case["act"])
    inputs = (torch.randn(case["batch"], case["seq"], 8),)
    step = {"optimizer": case["optimizer"], "target": torch.randint(0, 5, (case["batch"],)),
            "loss_fn": nn.CrossEntropyLoss()}

    def trace(plan: Any) -> nnmem.Report:
        names = ",".join(plan.modules) if plan is not None and plan.modules else None
        return nnmem.estimate(model, inputs, checkpoint=names, **step)

    cal = calibrate(model, trace, lambda p: _flop_counts(lambda: trace(p)))
    every = [s for r in range(case["n"] + 1) for s in itertools.combinations(range(case["n"]), r)]
    shares = (1.0, 0.75, 0.5, 0.25, 0.0)
    if len(every) <= exhaustive:
        traced = every
    else:  # a seeded sample, plus every subset that is cheapest for a budget by the model
        predicted = {s: cal.model.peak(set(s)) for s in every}
        low, high = min(predicted.values()), max(predicted.values())
        picks = set(random.Random(case["n"]).sample(every, exhaustive))
        for share in shares:  # the same budgets as below
            budget = int(low + share * (high - low))
            fitting = [s for s, p in predicted.items() if p <= budget]
            cheapest = min(cal.model.cost(set(s)) for s in fitting)
            picks |= {s for s in fitting if cal.model.cost(set(s)) == cheapest}
        traced = sorted(picks, key=lambda s: (len(s), s))
    started = time.perf_counter()
    peaks = {}
    for subset in traced:
        names = ",".join(cal.blocks[j] for j in subset) or None
        peaks[subset] = nnmem.estimate(model, inputs, checkpoint=names, **step).peak_bytes
    brute_s = time.perf_counter() - started
    model_misses = sum(cal.model.peak(set(s)) != p for s, p in peaks.items())
    predicted_all = [cal.model.peak(set(s)) for s in every]  # the budgets span every subset's peak, traced or not
    lowest, highest = min(predicted_all), max(predicted_all)
    optimal, fits, search_s = 0, 0, []
    for share in shares:
        budget = int(lowest + share * (highest - lowest))
        cheapest = min(sum(cal.model.flops[j] for j in s) for s, p in peaks.items() if p <= budget)
        started = time.perf_counter()
        best = nnmem.optimal_checkpointing(model, inputs, budget=budget, **step)
        search_s.append(time.perf_counter() - started)
        optimal += best.extra_flops == cheapest
        if best.extra_flops != cheapest:
            print(f"  budget {budget:,}: the plan recomputes {best.extra_flops:,} FLOPs, the cheapest traced subset "
                  f"that fits {cheapest:,}", flush=True)
        fits += best.peak_bytes <= budget
    return {**case, "subsets": len(every), "traced": len(peaks), "model_misses": model_misses, "optimal": optimal,
            "fits": fits, "budgets": 5, "brute_force_s": brute_s, "search_s": statistics.median(search_s)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-blocks", type=int, default=2)
    parser.add_argument("--max-blocks", type=int, default=12)
    parser.add_argument("--exhaustive", type=int, default=256,
                        help="trace every subset of chains with at most this many; above it, a seeded sample of "
                             "this many plus every subset that fits a budget by the model (default 256)")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    print(f"{'blocks':>6} {'widths':34s} {'opt':6s} {'subsets':>7} {'traced':>6} {'model≠trace':>11} {'optimal':>8} "
          f"{'fits':>5} {'brute s':>8} {'search s':>8}", flush=True)
    results = []
    for n in range(args.min_blocks, args.max_blocks + 1):
        r = run(chain_case(rng, n), args.exhaustive)
        results.append(r)
        widths = ",".join(map(str, r["widths"]))
        print(f"{n:>6} {widths[:34]:34s} {r['optimizer']:6s} {r['subsets']:>7} {r['traced']:>6} "
              f"{r['model_misses']:>11} {r['optimal']:>4}/{r['budgets']} {r['fits']:>3}/{r['budgets']} "
              f"{r['brute_force_s']:>8.1f} {r['search_s']:>8.2f}", flush=True)
    total = sum(r["budgets"] for r in results)
    print(f"chains {len(results)}: subsets where model ≠ trace {sum(r['model_misses'] for r in results)} of "
          f"{sum(r['traced'] for r in results)} traced; optimal plans {sum(r['optimal'] for r in results)}/{total}; "
          f"traced peak within budget {sum(r['fits'] for r in results)}/{total}; median search "
          f"{statistics.median(r['search_s'] for r in results):.2f} s")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
