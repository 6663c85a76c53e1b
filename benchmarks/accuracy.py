"""Accuracy of nnmem's estimate against a real measurement of the same step, on the PyTorch and Keras zoos.

Run:  python benchmarks/accuracy.py [--models mlp,vgg] [--batch 8] [--keras torch,jax,tensorflow] [--json out.json]

A case whose estimate says a kernel path of this CPU is not modelled is shown but left out of the targets.

For each model × (SGD, momentum, Adam, AdamW train steps, and inference) it estimates the step under
FakeTensorMode and measures it for real in a child process (protocol: docs/accuracy.md), then
prints estimated and measured peaks at the tensor and allocator levels with the signed error, and a
summary (median and max of |error| per level). Exit code 1 when a target is missed:
tensor level within 0.5 % on every case; allocator level median <= 2 %, max <= 10 %.

Keras rows (``--keras``, default all three backends; ``--keras none`` skips them): each Keras zoo model
(nnmem.zoo.KERAS) × (Adam train step, inference) on each backend, every backend in its own process
(Keras fixes its backend at import). Truth per backend: torch — the profiler's allocator events;
tensorflow — the BFC allocator peak; jax — see nnmem.frontends.keras.jax.measure. Targets (|error| of
the peak): torch median <= 2 %, max <= 10 %; tensorflow median <= 5 %, max <= 15 %; jax median <= 5 %.
Each Keras case is measured in ``--runs`` fresh processes and compared with the median run (default: 3 on
tensorflow, where the holes the setup leaves in the BFC allocator can move a peak by a chunk or two between
processes; 1 on torch and jax, whose measurements repeat); the table shows the runs' range.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
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
                              "estimate_s": t1 - t0, "measure_s": t2 - t1, "unmodelled": _unmodelled(est)}
    for level in ("tensor", "allocator"):
        e, m = est.peaks[level], meas.peaks[level]
        row[f"est_{level}"], row[f"meas_{level}"] = e, m
        row[f"err_{level}"] = (e - m) / m
    return row


KERAS_TARGETS = {"torch": (0.02, 0.10), "tensorflow": (0.05, 0.15), "jax": (0.05, None)}
KERAS_RUNS = {"torch": 1, "jax": 1, "tensorflow": 3}  # fresh processes per case (see the module docstring)


def keras_rows(backend: str, models: list[str], batch: int, runs: int) -> list[dict[str, object]]:
    """Estimate and measure the Keras zoo on one backend (call in a process whose KERAS_BACKEND is it)."""
    rows: list[dict[str, object]] = []
    for name in models:
        for mode in ("train", "infer"):
            opt = "adam" if mode == "train" else None
            est = nnmem.estimate(name, mode=mode, optimizer=opt, batch=batch)
            meas = nnmem.measure(name, mode=mode, optimizer=opt, batch=batch, runs=runs)
            e, m = est.peak_bytes, meas.peak_bytes
            low, high = int(meas.meta.get("runs_peak_min", m)), int(meas.meta.get("runs_peak_max", m))
            rows.append({"model": name, "backend": backend, "mode": mode, "level": meas.level, "est": e,
                         "meas": m, "err": (e - m) / m, "runs": runs, "meas_min": low, "meas_max": high,
                         "unmodelled": _unmodelled(est)})
            print(f"  {name:26s} {backend:10s} {mode:5s} {e:>12,} {m:>12,} {(e - m) / m:>+8.2%}",
                  file=sys.stderr, flush=True)
    return rows


def _unmodelled(report: nnmem.Report) -> str:
    """The estimate's note on kernel paths this CPU takes that no rule models ("" when there is none)."""
    return "; ".join(n for n in report.notes if n.startswith("not modelled on this CPU")
                     or "scratch not modelled" in n)


def _keras_section(backends: list[str], batch: int, runs: int | None) -> tuple[list[dict[str, object]], bool]:
    print()
    print("Keras: estimate vs measure of the step peak (allocator level), one process per backend")
    header = (f"{'model':26s} {'backend':10s} {'mode':5s} {'estimate':>12s} {'measured':>12s} {'err':>8s} "
              f"{'runs':>4s} {'runs: min .. max':>25s}")
    print(header)
    print("-" * len(header), flush=True)
    rows: list[dict[str, object]] = []
    ok = True
    for backend in backends:
        env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPP_MIN_LOG_LEVEL": "2"}
        n = runs or KERAS_RUNS[backend]
        out = subprocess.run([sys.executable, __file__, "--keras-worker", backend, "--batch", str(batch),
                              "--runs", str(n)],
                             env=env, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            print(f"{backend}: the worker failed: {out.stderr.strip().splitlines()[-1] if out.stderr else ''}")
            ok = False
            continue
        part = json.loads(out.stdout)
        for r in part:
            print(f"{r['model']:26s} {r['backend']:10s} {r['mode']:5s} {r['est']:>12,} {r['meas']:>12,} "
                  f"{r['err']:>+8.2%} {r['runs']:>4} {r['meas_min']:>12,} .. {r['meas_max']:>10,}"
                  + ("  (not modelled on this CPU: not in the targets)" if r["unmodelled"] else ""))
        errs = [abs(float(r["err"])) for r in part if not r["unmodelled"]]
        median_t, max_t = KERAS_TARGETS[backend]
        med, top = statistics.median(errs), max(errs)
        met = med <= median_t and (max_t is None or top <= max_t)
        ok &= met
        print(f"  {backend}: {len(errs)} cases, median |err| {med:.2%}, max {top:.2%} (targets median <= "
              f"{median_t:.0%}{'' if max_t is None else f', max <= {max_t:.0%}'}) — {'met' if met else 'MISSED'}",
              flush=True)
        rows += part
    return rows, ok


def main(argv: list[str] | None = None) -> int:
    parser = zoo_parser(__doc__)
    parser.add_argument("--keras", default="torch,jax,tensorflow",
                        help="Keras backends to run the Keras zoo on ('none' skips them)")
    parser.add_argument("--keras-worker", dest="keras_worker", help=argparse.SUPPRESS)
    parser.add_argument("--keras-only", action="store_true", help="skip the PyTorch zoo")
    parser.add_argument("--runs", type=int, default=None,
                        help="fresh processes per Keras case (default: 3 on tensorflow, 1 on torch and jax)")
    args = parser.parse_args(argv)
    if args.keras_worker:
        print(json.dumps(keras_rows(args.keras_worker, list(zoo.KERAS), args.batch, args.runs or 1)))
        return 0
    rows = []
    header = (f"{'model':22s} {'mode':5s} {'optimizer':9s} {'est tensor':>12s} {'meas tensor':>12s} {'err':>8s}"
              f" {'est alloc':>12s} {'meas alloc':>12s} {'err':>8s}")
    print(header)
    print("-" * len(header))
    for name in ([] if args.keras_only else args.models.split(",")):
        for mode, optimizer in CONFIGS:
            row = run_case(name, mode, optimizer, args.batch)
            rows.append(row)
            print(f"{name:22s} {mode:5s} {optimizer:9s} {row['est_tensor']:>12,} {row['meas_tensor']:>12,} "
                  f"{row['err_tensor']:>+8.2%} {row['est_allocator']:>12,} {row['meas_allocator']:>12,} "
                  f"{row['err_allocator']:>+8.2%}" + ("  (not modelled on this CPU)" if row["unmodelled"] else ""),
                  flush=True)
    summary = {}
    ok = True
    if rows:
        for level in ("tensor", "allocator"):
            errs = [abs(float(r[f"err_{level}"])) for r in rows if not r["unmodelled"]]  # type: ignore[arg-type]
            summary[level] = {"median": statistics.median(errs), "max": max(errs)}
        ok = _report_torch(rows, summary)
    backends = [] if args.keras == "none" else args.keras.split(",")
    krows, kok = _keras_section(backends, args.batch, args.runs) if backends else ([], True)
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump({"rows": rows, "summary": summary, "keras_rows": krows}, fh, indent=2)
    ok &= kok
    print("targets met" if ok else "TARGETS MISSED")
    return 0 if ok else 1


def _report_torch(rows: list[dict[str, object]], summary: dict[str, dict[str, float]]) -> bool:
    print()
    print(f"{len(rows)} cases.  tensor level: median |err| {summary['tensor']['median']:.2%}, "
          f"max {summary['tensor']['max']:.2%} (target max <= {TENSOR_MAX:.1%})")
    print(f"allocator level: median |err| {summary['allocator']['median']:.2%}, max {summary['allocator']['max']:.2%} "
          f"(targets median <= {ALLOC_MEDIAN:.0%}, max <= {ALLOC_MAX:.0%})")
    return (summary["tensor"]["max"] <= TENSOR_MAX and summary["allocator"]["median"] <= ALLOC_MEDIAN
            and summary["allocator"]["max"] <= ALLOC_MAX)


if __name__ == "__main__":
    sys.exit(main())
