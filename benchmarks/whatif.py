"""Each what-if technique's predicted peak against the technique applied for real and measured, on the zoo.

Run:  python benchmarks/whatif.py [--models gpt,resnet] [--batch 16] [--optimizer adam] [--json out.json]

For each PyTorch model of the zoo, ``nnmem.what_if`` traces the baseline step and each checkpoint plan that
applies (``blocks``, ``every:2``, ``sqrt``); every plan is then applied for real
(``nnmem.apply_checkpointing`` inside a factory the measuring child runs) and measured with ``nnmem.measure``.
A row gives the plan, the predicted and measured allocator-level peaks, the error, the bytes saved against the
baseline and the extra FLOPs. The last lines give the median and maximum |error| over the plans.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))

from _common import zoo_parser  # noqa: E402

FACTORY = """
import nnmem
from nnmem import zoo


def make(batch):
    built = zoo.resolve({model!r})(batch)
    model = built[0] if isinstance(built, tuple) else built
    if {plan!r}:
        nnmem.apply_checkpointing(model, {plan!r})
    return built
"""


def _measured(model: str, plan: str | None, batch: int, optimizer: str, folder: str) -> int:
    import nnmem

    path = os.path.join(folder, f"{model}_{(plan or 'baseline').replace(':', '_')}.py")
    with open(path, "w") as f:
        f.write(FACTORY.format(model=model, plan=plan))
    return nnmem.measure(f"{path}:make", batch=batch, optimizer=optimizer).peaks["allocator"]


def rows(model: str, batch: int, optimizer: str, folder: str) -> list[dict[str, Any]]:
    import nnmem

    result = nnmem.what_if(model, batch=batch, optimizer=optimizer)
    out = []
    for row in (result.baseline, *result.rows):
        plan = row.technique.split(":", 1)[1] if row is not result.baseline else None
        measured = _measured(model, plan, batch, optimizer, folder)
        predicted = row.report.peaks["allocator"]
        out.append({"model": model, "technique": row.technique, "predicted": predicted, "measured": measured,
                    "error": (predicted - measured) / measured, "saved": result.saved(row),
                    "extra_compute": result.extra_compute(row)})
        print(f"{model:22s} {row.technique:20s} {predicted:>14,} {measured:>14,} {100 * out[-1]['error']:+8.2f}% "
              f"{out[-1]['saved']:>13,} {100 * out[-1]['extra_compute']:+7.1f}%", flush=True)
    for technique, why in result.skipped:
        print(f"{model:22s} {technique:20s} not applied: {why}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    from nnmem import zoo

    parser = zoo_parser(__doc__)
    parser.add_argument("--optimizer", default="adam")
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m in zoo.names() and not m.startswith("keras_")]
    print(f"{'model':22s} {'technique':20s} {'predicted':>14s} {'measured':>14s} {'error':>9s} {'saved':>13s} "
          f"{'FLOPs':>8s}")
    table: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        for model in models:
            table += rows(model, args.batch, args.optimizer, folder)
    plans = [abs(r["error"]) for r in table if r["technique"] != "baseline"]
    if plans:
        print(f"\n{len(plans)} plans: |error| median {100 * statistics.median(plans):.2f} %, "
              f"max {100 * max(plans):.2f} %")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(table, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
