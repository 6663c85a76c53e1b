"""Is ``nnmem fit`` exact? The largest batch it returns, checked against real measurements.

Run:  python benchmarks/fit.py [--models mlp,vgg] [--factors 1.3,2.2,3.7] [--budgets 4GiB] [--json out.json]

For each zoo model, mode (train with Adam, infer) and budget, ``nnmem.max_batch`` answers a batch b from
traces; the step is then measured for real (``nnmem.measure``, a child process) at b and at b + 1. The answer
is exact when measured(b) <= budget < measured(b + 1) at the level that decides an OOM on the CPU (the
allocator level). Budgets are the model's estimated peak at batch 2 times each factor, so that each budget
lands at a different batch for every model; the table prints them in bytes, so every row is reproducible.
``--budgets`` gives absolute budgets instead (``--models mlp --budgets 4GiB``: batches beyond a million,
measured for real at b and b + 1 — each measurement then allocates the whole budget).
"""

from __future__ import annotations

import json
import statistics
import sys

from _common import zoo_parser  # benchmarks/ is the script's directory, first on sys.path

import nnmem
from nnmem.units import parse_size

CONFIGS = (("train", "adam"), ("infer", "sgd"))


def run_case(name: str, mode: str, optimizer: str, budget: int) -> dict[str, object]:
    fit = nnmem.max_batch(name, budget=budget, mode=mode, optimizer=optimizer)
    b = fit.batch
    below = nnmem.measure(name, mode=mode, optimizer=optimizer, batch=b).peak_bytes if b > 0 else 0
    above = nnmem.measure(name, mode=mode, optimizer=optimizer, batch=b + 1).peak_bytes
    exact = below <= budget < above
    return {"model": name, "mode": mode, "budget": budget, "batch": b, "traces": fit.traces,
            "est_b": fit.peak_bytes, "meas_b": below, "est_next": fit.next_peak_bytes, "meas_next": above,
            "exact": exact}


def main(argv: list[str] | None = None) -> int:
    parser = zoo_parser(__doc__, batch=False)
    parser.add_argument("--factors", default="1.3,2.2,3.7")
    parser.add_argument("--budgets", default="", help="absolute budgets (e.g. 4GiB,8GiB) instead of --factors")
    args = parser.parse_args(argv)
    factors = [float(f) for f in args.factors.split(",")]
    budgets = [parse_size(b) for b in args.budgets.split(",") if b]
    header = (f"{'model':20s} {'mode':5s} {'budget B':>14s} {'batch':>9s} {'traces':>6s} {'measured(b) B':>14s} "
              f"{'measured(b+1) B':>16s} {'exact':>6s}")
    print(header)
    print("-" * len(header))
    rows = []
    for name in args.models.split(","):
        for mode, optimizer in CONFIGS:
            if budgets:
                chosen = budgets
            else:
                base = nnmem.estimate(name, mode=mode, optimizer=optimizer, batch=2).peak_bytes
                chosen = [int(base * factor) for factor in factors]
            for budget in chosen:
                row = run_case(name, mode, optimizer, budget)
                rows.append(row)
                print(f"{name:20s} {mode:5s} {row['budget']:>14,} {row['batch']:>9,} {row['traces']:>6} "
                      f"{row['meas_b']:>14,} {row['meas_next']:>16,} {'yes' if row['exact'] else 'NO':>6s}",
                      flush=True)
    exact = sum(bool(r["exact"]) for r in rows)
    print(f"\nexact answers: {exact}/{len(rows)} (measured(b) <= budget < measured(b+1), allocator level, CPU)")
    traces = sorted(int(str(r["traces"])) for r in rows)
    if traces:
        print(f"traces per search: median {statistics.median(traces):g}, max {traces[-1]}, "
              f"<= 3 in {sum(t <= 3 for t in traces)} of {len(traces)}")
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0 if exact == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
