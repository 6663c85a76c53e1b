"""Does a plain TensorFlow step's measured peak lie inside the estimate's range? Keras zoo and keras.applications.

Run:  KERAS_BACKEND=tensorflow python benchmarks/tf_range.py [--models keras_mlp,resnet50] [--modes train]
      [--runs 10] [--batch 8] [--cache runs.jsonl]

Each step is estimated (its ``peak_range``: the lowest and highest BFC peak over the op orders TensorFlow's default
executor can run it in) and measured as users run it — plain ``train_on_batch`` / ``predict_on_batch``, default
executor and thread pools, Grappler on — in ``--runs`` fresh processes (``nnmem.measure(..., runs=N)``). A row
gives the range, the measured min / median / max, whether every run lies inside, and the range's width (% of its
low end). ``--cache`` keeps the measured peaks (JSON lines) so a changed estimate is checked without remeasuring.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
sys.path.insert(0, os.path.dirname(__file__))

from applications import APPS, build  # noqa: E402


def _step(name: str, mode: str, batch: int) -> dict[str, Any]:
    """Arguments of ``nnmem.estimate`` / ``nnmem.measure`` for a zoo name or a keras.applications name."""
    if name not in APPS:
        return {"model": name, "mode": mode, "optimizer": "adam" if mode == "train" else None, "batch": batch}
    import numpy as np

    x = np.zeros((batch, *APPS[name][1]), "float32")
    y = np.zeros((batch,), "int32") if mode == "train" else None
    return {"model": build(name), "inputs": x, "target": y, "mode": mode}


def _measured(name: str, mode: str, batch: int, runs: int, cache: str | None) -> list[int]:
    """Each run's measured peak, in bytes: from ``cache`` when it holds ``runs`` of them, else measured."""
    import nnmem

    if cache and os.path.exists(cache):
        with open(cache) as f:
            for line in f:
                row = json.loads(line)
                if (row["name"], row["mode"], row["batch"]) == (name, mode, batch) and len(row["peaks"]) >= runs:
                    return [int(p) for p in row["peaks"][:runs]]
    report = nnmem.measure(**_step(name, mode, batch), runs=runs, timeout_s=900)
    peaks = [int(p) for p in report.meta.get("runs_peaks", [report.peak_bytes])]
    if cache:
        with open(cache, "a") as f:
            f.write(json.dumps({"name": name, "mode": mode, "batch": batch, "peaks": peaks}) + "\n")
    return peaks


def row(name: str, mode: str, batch: int, runs: int, cache: str | None) -> dict[str, Any]:
    """Estimate and measure one step: the range, the measured runs, inside or not, the width."""
    import nnmem

    estimate = nnmem.estimate(**_step(name, mode, batch))
    low, high = estimate.peak_range or (estimate.peak_bytes, estimate.peak_bytes)
    peaks = _measured(name, mode, batch, runs, cache)
    unmodelled = any(n.startswith("not modelled on this CPU") for n in estimate.notes)
    return {"model": name, "mode": mode, "low": low, "high": high, "peak": estimate.peak_bytes, "min": min(peaks),
            "median": int(statistics.median(peaks)), "max": max(peaks), "runs": len(peaks),
            "inside": low <= min(peaks) and max(peaks) <= high, "width": (high - low) / low,
            "unmodelled": unmodelled}


def main(argv: list[str] | None = None) -> int:
    from nnmem.zoo.keras_models import FACTORIES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join([*FACTORIES, *APPS]))
    parser.add_argument("--modes", default="train,infer")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--cache", help="JSON lines of measured peaks, read and appended")
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in FACTORIES and m not in APPS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; expected Keras zoo names or {', '.join(APPS)}")
    print(f"{'model':24s} {'mode':5s} {'estimate':>11s} {'est low':>11s} {'est high':>11s} {'meas min':>11s} "
          f"{'median':>11s} {'max':>11s} {'in':>3s} {'width':>6s}", flush=True)
    rows = []
    for name in models:
        for mode in [m for m in args.modes.split(",") if m]:
            r = row(name, mode, args.batch, args.runs, args.cache)
            rows.append(r)
            print(f"{name:24s} {mode:5s} {r['peak']:>11,} {r['low']:>11,} {r['high']:>11,} {r['min']:>11,} "
                  f"{r['median']:>11,} {r['max']:>11,} {'yes' if r['inside'] else 'no':>3s} {r['width']:>6.1%}"
                  + ("  (kernels not modelled on this CPU: left out)" if r["unmodelled"] else ""), flush=True)
    kept = [r for r in rows if not r["unmodelled"]]
    inside = sum(r["inside"] for r in kept)
    width = statistics.median(r["width"] for r in kept) if kept else 0.0
    print(f"inside: {inside}/{len(kept)}; median width {width:.1%}")
    return 0 if inside == len(kept) else 1


if __name__ == "__main__":
    sys.exit(main())
