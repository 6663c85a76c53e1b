"""Accuracy of nnmem's estimate against a real measurement of the same step, on the PyTorch zoo.

Run:  python benchmarks/accuracy.py [--models mlp,vgg] [--batch 8] [--json out.json]

For each model × (SGD, momentum, Adam, AdamW train steps, and inference) it estimates the step under
FakeTensorMode and measures it for real in a child process (protocol: README "Accuracy"), then
prints estimated and measured peaks at the tensor and allocator levels with the signed error, and a
summary (median and max of |error| per level). Exit code 1 when a target is missed:
tensor level within 0.5 % on every case; allocator level median <= 2 %, max <= 10 %.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from _common import zoo_parser  # benchmarks/ is the script's directory, first on sys.path

import nnmem
from nnmem import zoo

CONFIGS = (("train", "sgd"), ("train", "momentum"), ("train", "adam"), ("train", "adamw"), ("infer", "-"))
TENSOR_MAX, ALLOC_MEDIAN, ALLOC_MAX = 0.005, 0.02, 0.10


def run_case(name: str, mode: str, optimizer: str, batch: int = zoo.DEFAULT_BATCH) -> dict[str, object]:
    opt = optimizer if mode == "train" else "sgd"
    t0 = time.perf_counter()
    est = nnmem.estimate(name, mode=mode, optimizer=opt, batch=batch)
    t1 = time.perf_counter()
    meas = nnmem.measure(name, mode=mode, optimizer=opt, batch=batch)
    t2 = time.perf_counter()
    row: dict[str, object] = {"model": name, "mode": mode, "optimizer": optimizer,
                              "estimate_s": t1 - t0, "measure_s": t2 - t1}
    for level in ("tensor", "allocator"):
        e, m = est.peaks[level], meas.peaks[level]
        row[f"est_{level}"], row[f"meas_{level}"] = e, m
        row[f"err_{level}"] = (e - m) / m
    return row


def main(argv: list[str] | None = None) -> int:
    parser = zoo_parser(__doc__)
    args = parser.parse_args(argv)
    rows = []
    header = (f"{'model':22s} {'mode':5s} {'optimizer':9s} {'est tensor':>12s} {'meas tensor':>12s} {'err':>8s}"
              f" {'est alloc':>12s} {'meas alloc':>12s} {'err':>8s}")
    print(header)
    print("-" * len(header))
    for name in args.models.split(","):
        for mode, optimizer in CONFIGS:
            row = run_case(name, mode, optimizer, args.batch)
            rows.append(row)
            print(f"{name:22s} {mode:5s} {optimizer:9s} {row['est_tensor']:>12,} {row['meas_tensor']:>12,} "
                  f"{row['err_tensor']:>+8.2%} {row['est_allocator']:>12,} {row['meas_allocator']:>12,} "
                  f"{row['err_allocator']:>+8.2%}", flush=True)
    summary = {}
    for level in ("tensor", "allocator"):
        errs = [abs(float(r[f"err_{level}"])) for r in rows]  # type: ignore[arg-type]
        summary[level] = {"median": statistics.median(errs), "max": max(errs)}
    print()
    print(f"{len(rows)} cases.  tensor level: median |err| {summary['tensor']['median']:.2%}, "
          f"max {summary['tensor']['max']:.2%} (target max <= {TENSOR_MAX:.1%})")
    print(f"allocator level: median |err| {summary['allocator']['median']:.2%}, max {summary['allocator']['max']:.2%} "
          f"(targets median <= {ALLOC_MEDIAN:.0%}, max <= {ALLOC_MAX:.0%})")
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump({"rows": rows, "summary": summary}, fh, indent=2)
    ok = (summary["tensor"]["max"] <= TENSOR_MAX and summary["allocator"]["median"] <= ALLOC_MEDIAN
          and summary["allocator"]["max"] <= ALLOC_MAX)
    print("targets met" if ok else "TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
