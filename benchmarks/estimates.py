"""Every zoo estimate's peaks (each level) and breakdown, as one JSON document: a refactor must change none.

Run:  python benchmarks/estimates.py --out now.json [--against before.json]

Covers the PyTorch accuracy zoo (SGD, momentum, Adam, AdamW train steps, inference, and an Adam step on an
A100's caching-allocator model) and the Keras zoo (Adam train step, inference) on each Keras backend, each
backend in its own process. With ``--against`` it prints the cases whose numbers differ and exits 1 if any do.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import nnmem
from nnmem import zoo

TORCH_CONFIGS = (("train", "sgd"), ("train", "momentum"), ("train", "adam"), ("train", "adamw"), ("infer", "sgd"))


def _row(report: nnmem.Report) -> dict[str, object]:
    return {"peaks": dict(report.peaks), "breakdown": dict(report.breakdown)}


def torch_rows() -> dict[str, object]:
    rows: dict[str, object] = {}
    for name in zoo.ACCURACY_ZOO:
        for mode, opt in TORCH_CONFIGS:
            rows[f"{name}/{mode}/{opt}"] = _row(nnmem.estimate(name, mode=mode, optimizer=opt, batch=zoo.DEFAULT_BATCH))
        rows[f"{name}/train/adam/A100-80GB"] = _row(nnmem.estimate(name, optimizer="adam", batch=zoo.DEFAULT_BATCH,
                                                                   device="A100-80GB"))
    return rows


def keras_rows(backend: str) -> dict[str, object]:
    rows: dict[str, object] = {}
    for name in zoo.KERAS:
        for mode in ("train", "infer"):
            report = nnmem.estimate(name, mode=mode, optimizer="adam" if mode == "train" else None,
                                    batch=zoo.DEFAULT_BATCH)
            rows[f"{backend}/{name}/{mode}"] = _row(report)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", required=True, help="where to write the JSON")
    parser.add_argument("--against", help="an earlier output to compare with")
    parser.add_argument("--keras-worker", dest="keras_worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.keras_worker:
        with open(args.out, "w") as f:
            json.dump(keras_rows(args.keras_worker), f)
        return 0
    rows = torch_rows()
    for backend in ("torch", "jax", "tensorflow"):
        part = f"{args.out}.{backend}"
        env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPP_MIN_LOG_LEVEL": "2"}
        subprocess.run([sys.executable, __file__, "--out", part, "--keras-worker", backend], env=env, check=True)
        with open(part) as f:
            rows.update(json.load(f))
        os.remove(part)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1, sort_keys=True)
    print(f"{len(rows)} estimates written to {args.out}")
    if not args.against:
        return 0
    with open(args.against) as f:
        before = json.load(f)
    differ = sorted(k for k in before.keys() | rows.keys() if before.get(k) != rows.get(k))
    for key in differ:
        print(f"differs: {key}: {before.get(key)} -> {rows.get(key)}")
    print(f"{len(rows) - len(differ)} of {len(before.keys() | rows.keys())} estimates identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
