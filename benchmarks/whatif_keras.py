"""Keras what-if rows (dtype policies, rematerialization, quantization, accumulation) against the model built that
way and measured, on one backend.

Run:  KERAS_BACKEND=torch python benchmarks/whatif_keras.py [--models keras_mlp,keras_lstm] [--modes train,infer]
      [--techniques policy:mixed_float16,remat:full] [--batch 8]
      [--runs 3] [--json out.json]

For each Keras zoo model (but keras_mixed_float16, already under a policy) and mode, ``nnmem.what_if`` traces
the baseline and each row (the model's factory called under ``keras.config.set_dtype_policy`` or inside a
``keras.RematScope``, or built and then quantized with ``Model.quantize``; rematerialization and gradient
accumulation in training only, quantization in inference only); each row is then measured with ``nnmem.measure``
on a factory that builds the model the same way in the measuring process (``accumulate:K``: the model as it is, one
micro-batch, ``accumulate=K``: each cycle's highest step). A row gives the predicted and measured
peaks and the error. On TensorFlow the truth is a plain ``train_on_batch`` whose peak differs between
processes: it is measured in ``--runs`` processes and the row says whether every run lies inside the
estimate's range. A row whose report says a kernel path is not
modelled on this CPU is marked "noted" and left out of the score.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))

from _common import print_score, zoo_parser  # noqa: E402

FACTORY = """
import keras  # a factory file that imports keras is a Keras spec

import nnmem
from nnmem.whatif.keras_policy import built_under
from nnmem.zoo.keras_models import FACTORIES


def make(batch):
    if {technique!r} == "baseline" or {technique!r}.startswith("accumulate:"):  # the loop's, not the model's
        return FACTORIES[{model!r}](batch)
    if {technique!r}.startswith("quantize:"):  # Model.quantize on the built model
        built = FACTORIES[{model!r}](batch)
        if isinstance(built, tuple):
            return (nnmem.apply_technique(built[0], {technique!r}), *built[1:])
        return nnmem.apply_technique(built, {technique!r})
    with built_under({technique!r}):
        return FACTORIES[{model!r}](batch)
"""


def rows(model: str, mode: str, batch: int, techniques: list[str], runs: int, folder: str) -> list[dict[str, Any]]:
    import keras

    import nnmem

    optimizer = "adam" if mode == "train" else None
    other_mode = ("remat:", "accumulate:") if mode == "infer" else ("quantize:",)  # which train, which infer
    try:
        result = nnmem.what_if(model, mode=mode, batch=batch, optimizer=optimizer,
                               techniques=[t for t in techniques if not t.startswith(other_mode)]
                               if techniques else None)
    except nnmem.UnsupportedError as err:
        print(f"{model:24s} {mode:5s} not applied: {err}", flush=True)
        return []
    tf = keras.backend.backend() == "tensorflow"
    out = []
    for row in (result.baseline, *result.rows):
        path = os.path.join(folder, f"{model}_{row.technique.replace(':', '_').replace(',', '_')}.py")
        with open(path, "w") as f:
            f.write(FACTORY.format(technique=row.technique, model=model))
        k = int(row.report.meta.get("accumulate", 1))  # one micro-batch, the optimizer accumulating over k
        report = nnmem.measure(f"{path}:make", mode=mode, batch=row.report.batch or batch, optimizer=optimizer,
                               accumulate=k, runs=runs if tf else 1, timeout_s=600)
        peaks = [int(p) for p in report.meta.get("runs_peaks", [report.peak_bytes])]
        predicted, measured = row.report.peak_bytes, report.peak_bytes
        low, high = row.report.peak_range or (predicted, predicted)
        noted = any("not modelled" in n for n in row.report.notes)
        r = {"model": model, "mode": mode, "technique": row.technique, "predicted": predicted, "low": low,
             "high": high, "measured": measured, "runs": peaks, "error": (predicted - measured) / measured,
             "inside": all(low <= p <= high for p in peaks) if row.report.peak_range else None,
             "saved": result.saved(row),
             "noted": noted}
        out.append(r)
        inside = f" {'inside' if r['inside'] else 'OUTSIDE'} {low:,}-{high:,}" if row.report.peak_range else ""
        print(f"{model:24s} {mode:5s} {row.technique:22s} {predicted:>12,} {measured:>12,} {100 * r['error']:+8.2f}% "
              f"{r['saved']:>11,}{inside}{'  noted' if noted else ''}", flush=True)
    for technique, why in result.skipped:
        print(f"{model:24s} {mode:5s} {technique:22s} not applied: {why}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    import keras

    from nnmem.zoo.keras_models import FACTORIES

    parser = zoo_parser(__doc__)
    parser.set_defaults(models=",".join(m for m in FACTORIES if m != "keras_mixed_float16"), batch=8)
    parser.add_argument("--modes", default="train,infer")
    parser.add_argument("--techniques", default="",
                        help="comma-separated; default: what_if's defaults (those a model refuses are listed)")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per TensorFlow measurement")
    args = parser.parse_args(argv)
    techniques = [t for t in args.techniques.split(",") if t]
    print(f"Keras {keras.__version__} on {keras.backend.backend()}, batch {args.batch}")
    print(f"{'model':24s} {'mode':5s} {'technique':22s} {'predicted':>12s} {'measured':>12s} {'error':>9s} "
          f"{'saved':>11s}")
    table: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        for mode in args.modes.split(","):
            for model in args.models.split(","):
                table += rows(model, mode, args.batch, techniques, args.runs, folder)
    scored = print_score(table, "technique rows")
    ranged = [r for r in scored if r["inside"] is not None]
    if ranged:
        print(f"{len(ranged)} rows with a range (the step takes one of several peaks): every run inside in "
              f"{sum(bool(r['inside']) for r in ranged)}")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(table, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
