"""`nnmem plan` on the zoo: a budget of a share of each model's training peak, the plan chosen, and its real run.

For every PyTorch model of the accuracy zoo (training, Adam by default), the budget is ``--share`` (default
60 %) of the step's estimated peak; ``nnmem.plan(..., verify=True)`` picks the cheapest combination of
techniques that fits and measures it in a child process. Printed: the plan, its predicted (traced) and
measured peaks, the error, and whether the real run is within the budget. A model no combination brings
under the budget is listed with the lowest peak found.

    python benchmarks/plan.py [--models gpt,resnet] [--batch 8] [--share 0.6] [--techniques checkpoint,inplace]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from _common import zoo_parser  # noqa: E402


def main() -> None:
    import nnmem

    parser = zoo_parser(__doc__)
    parser.add_argument("--share", type=float, default=0.6)
    parser.add_argument("--optimizer", default="adam")
    parser.add_argument("--techniques", default=None, help="the kinds a plan may combine (default: all)")
    args = parser.parse_args()
    print(f"{'model':14s} {'budget':>12s} {'predicted':>12s} {'measured':>12s} {'error':>8s} {'fits':>5s} "
          f"{'extra':>7s} {'s':>5s}  plan", flush=True)
    results = []
    for model in args.models.split(","):
        baseline = nnmem.estimate(model, batch=args.batch, optimizer=args.optimizer).peak_bytes
        budget = int(args.share * baseline)
        started = time.perf_counter()
        try:
            plan = nnmem.plan(model, budget=budget, batch=args.batch, optimizer=args.optimizer,
                              techniques=args.techniques, verify=True)
        except nnmem.ConfigError as err:
            print(f"{model:14s} {budget:>12,} no plan: {err}", flush=True)
            results.append({"model": model, "budget": budget, "plan": None, "reason": str(err)})
            continue
        seconds = time.perf_counter() - started
        predicted, measured = plan.chosen.peak_bytes, plan.measured.peak_bytes  # type: ignore[union-attr]
        error = (predicted - measured) / measured
        r = {"model": model, "baseline": baseline, "budget": budget, "plan": list(plan.chosen.techniques),
             "predicted": predicted, "measured": measured, "error": error, "fits": measured <= budget,
             "extra_compute": plan.chosen.extra_compute, "micro_batches": plan.chosen.micro_batches,
             "seconds": seconds}
        results.append(r)
        print(f"{model:14s} {budget:>12,} {predicted:>12,} {measured:>12,} {100 * error:>+7.2f}% "
              f"{'yes' if r['fits'] else 'NO':>5s} {100 * r['extra_compute']:>+6.1f}% {seconds:>5.0f}  "
              f"{plan.chosen.label()}", flush=True)
    done = [r for r in results if r["plan"] is not None]
    if done:
        errors = [abs(r["error"]) for r in done]
        print(f"{len(done)} of {len(results)} models planned; measured within budget {sum(r['fits'] for r in done)}"
              f"/{len(done)}; |error| median {100 * statistics.median(errors):.2f} %, max {100 * max(errors):.2f} %")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
