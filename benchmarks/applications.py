"""Accuracy on models nobody wrote for nnmem: keras.applications architectures, estimated and measured.

Run:  python benchmarks/applications.py [--keras torch,jax,tensorflow] [--models mobilenet_v2,resnet50] [--batch 8]

Each architecture (``weights=None``: random weights, nothing downloaded; small inputs so a 2-core CPU measures
them in seconds) is compiled with Adam and sparse categorical cross-entropy, then estimated and measured —
passed as a model object, the way users call ``nnmem.measure(model, x, target=y)`` — for an Adam train step and
for inference. Every backend runs in its own process (Keras fixes its backend at import). The table gives the
estimated and measured peaks (allocator level, each backend's truth: see docs/accuracy.md) and the signed
error; the summary gives the median and max |error| per backend.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import Any

APPS: dict[str, tuple[str, tuple[int, int, int], dict[str, Any]]] = {
    "mobilenet_v2": ("MobileNetV2", (64, 64, 3), {"alpha": 0.35}),
    "resnet50": ("ResNet50", (32, 32, 3), {}),
    "densenet121": ("DenseNet121", (32, 32, 3), {}),
    "efficientnet_b0": ("EfficientNetB0", (32, 32, 3), {}),
    "xception": ("Xception", (71, 71, 3), {}),
}


def build(name: str) -> Any:
    """The compiled keras.applications model ``name`` with random weights."""
    import keras

    cls, shape, kwargs = APPS[name]
    model: Any = getattr(keras.applications, cls)(input_shape=shape, weights=None, classes=10, **kwargs)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def rows(models: list[str], batch: int, log: Callable[[str], None]) -> list[dict[str, object]]:
    """Estimate and measure each model × mode on this process's Keras backend."""
    import keras
    import numpy as np

    import nnmem

    out: list[dict[str, object]] = []
    for name in models:
        for mode in ("train", "infer"):
            model = build(name)
            x = np.zeros((batch, *APPS[name][1]), "float32")
            y = np.zeros((batch,), "int32") if mode == "train" else None
            est = nnmem.estimate(model, x, target=y, mode=mode).peak_bytes
            meas = nnmem.measure(model, x, target=y, mode=mode, timeout_s=900).peak_bytes
            row = {"model": name, "backend": keras.backend.backend(), "mode": mode, "est": est, "meas": meas,
                   "err": (est - meas) / meas}
            out.append(row)
            log(f"  {name:16s} {row['backend']:10s} {mode:5s} {est:>13,} {meas:>13,} {row['err']:>+8.2%}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keras", default="torch,jax,tensorflow", help="Keras backends, each in its own process")
    parser.add_argument("--models", default=",".join(APPS), help=f"architectures (of {', '.join(APPS)})")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in APPS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; expected some of {', '.join(APPS)}")
    if args.worker:
        print(json.dumps(rows(models, args.batch, lambda line: print(line, file=sys.stderr, flush=True))))
        return 0
    print(f"{'model':16s} {'backend':10s} {'mode':5s} {'estimate':>13s} {'measured':>13s} {'err':>8s}", flush=True)
    for backend in [b for b in args.keras.split(",") if b]:
        env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2"}
        done = subprocess.run([sys.executable, __file__, "--worker", backend, "--models", ",".join(models),
                               "--batch", str(args.batch)], env=env, stdout=subprocess.PIPE, text=True)
        if done.returncode != 0:
            print(f"  {backend}: the worker failed (exit {done.returncode})")
            return 1
        found = json.loads(done.stdout.strip().splitlines()[-1])
        errors = [abs(float(r["err"])) for r in found]
        print(f"  {backend}: {len(found)} cases, median |err| {statistics.median(errors):.2%}, "
              f"max {max(errors):.2%}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
