"""Each what-if technique's predicted peak against the technique applied for real and measured, on the zoo.

Run:  python benchmarks/whatif.py [--models gpt,resnet] [--modes train,infer] [--batch 16] [--optimizer adam]
      [--json out.json]

For each PyTorch model of the zoo (and HuggingFace GPT-2, BERT and Llama built from configs:
``benchmarks/hf_models.py``) and each mode, ``nnmem.what_if`` traces the baseline step and each technique
that applies (``nnmem.whatif.compare.DEFAULT_TECHNIQUES``: checkpoint plans, gradient accumulation, the optimizer
in backward and its fused / foreach steps in training; in-place activations, ``prune:0.5``,
``prune-channels:0.5``, ``autocast:bf16`` and ``half:bf16`` in both modes, ``quantize:int8`` in inference,
``zero-grad:zeros`` in training; plus
``autocast:fp16`` and ``half:fp16``); every technique is then applied for real
(``nnmem.apply_technique`` inside a factory the measuring child runs; accumulation, the optimizer in backward and
its implementation, and zero_grad: ``nnmem.measure(..., accumulate=K)`` on one micro-batch,
``optimizer_in_backward=True``, ``optimizer="adam:fused"``, ``set_to_none=False``) and measured with ``nnmem.measure``.
A row gives the technique, the predicted and measured allocator-level peaks, the error, the bytes saved against the
baseline and the extra FLOPs. A row whose estimate is a range (``quantize:int8``: FBGEMM's per-thread buffers
overlap in time or not) says whether the measurement lies inside it and is scored by the nearer end. A row whose
report says a kernel path is not modelled on this CPU (bfloat16 through oneDNN on AVX-512) is marked "noted" and left
out of the score; the last lines give the median and maximum |error| over the scored techniques and the noted ones
apart.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))

from _common import print_score, zoo_parser  # noqa: E402

EXTRA = ("autocast:fp16", "half:fp16")
"""Techniques measured besides what_if's defaults: float16 runs ATen's own kernels on every CPU."""

FACTORY = """
import nnmem
from nnmem.loader import resolve_factory


def make(batch):
    built = resolve_factory({model!r})(batch)
    model = built[0] if isinstance(built, tuple) else built
    if {technique!r}:
        nnmem.apply_technique(model, {technique!r})
    return built
"""


def _measured(model: str, technique: str | None, mode: str, batch: int, optimizer: str | None, folder: str) -> int:
    import nnmem

    stem = model.rsplit(":", 1)[-1]
    path = os.path.join(folder, f"{stem}_{(technique or 'baseline').replace(':', '_').replace(',', '_')}.py")
    with open(path, "w") as f:
        f.write(FACTORY.format(model=model, technique=technique))
    return nnmem.measure(f"{path}:make", mode=mode, batch=batch, optimizer=optimizer).peaks["allocator"]


def rows(model: str, mode: str, batch: int, optimizer: str | None, folder: str) -> list[dict[str, Any]]:
    import nnmem

    result = nnmem.what_if(model, mode=mode, batch=batch, optimizer=optimizer)
    shown = model.rsplit(":", 1)[-1]  # a file spec by its factory's name
    extra = []
    for technique in EXTRA:
        try:
            extra += nnmem.what_if(model, mode=mode, batch=batch, optimizer=optimizer, techniques=[technique]).rows
        except nnmem.UnsupportedError as err:
            print(f"{shown:22s} {mode:5s} {technique:28s} not applied: {err}", flush=True)
    out = []
    for row in (result.baseline, *result.rows, *extra):
        technique = row.technique if row is not result.baseline else None
        if technique and technique.startswith("accumulate:"):  # the step changes, not the model
            measured = nnmem.measure(model, mode=mode, batch=row.report.batch, optimizer=optimizer,
                                     accumulate=int(technique.split(":")[1])).peaks["allocator"]
        elif technique and technique.startswith("optimizer:"):  # the optimizer changes, not the model
            measured = nnmem.measure(model, mode=mode, batch=batch,
                                     optimizer=f"{optimizer}:{technique.split(':')[1]}").peaks["allocator"]
        elif technique == "zero-grad:zeros":  # the step's zero_grad changes, not the model
            measured = nnmem.measure(model, mode=mode, batch=batch, optimizer=optimizer,
                                     set_to_none=False).peaks["allocator"]
        elif technique == "optimizer-in-backward":
            measured = nnmem.measure(model, mode=mode, batch=batch, optimizer=optimizer,
                                     optimizer_in_backward=True).peaks["allocator"]
        else:
            measured = _measured(model, technique, mode, batch, optimizer, folder)
        predicted = row.report.peaks["allocator"]
        noted = any("not modelled" in n for n in row.report.notes)
        low, high = row.report.peak_range or (predicted, predicted)
        nearest = min(max(measured, low), high)  # a ranged row's error: to the nearer end, 0 inside
        r = {"model": shown, "mode": mode, "technique": row.technique, "predicted": predicted, "measured": measured,
             "error": (nearest - measured) / measured, "error_peak": (predicted - measured) / measured,
             "saved": result.saved(row),
             "extra_compute": result.extra_compute(row), "noted": noted, "low": low, "high": high,
             "inside": low <= measured <= high if row.report.peak_range else None}
        out.append(r)
        inside = f"  {'inside' if r['inside'] else 'OUTSIDE'} {low:,}-{high:,}" if row.report.peak_range else ""
        print(f"{shown:22s} {mode:5s} {row.technique:28s} {predicted:>14,} {measured:>14,} {100 * r['error']:+8.2f}% "
              f"{r['saved']:>13,} {100 * r['extra_compute']:+7.1f}%{inside}{'  noted' if noted else ''}", flush=True)
    for technique, why in result.skipped:
        print(f"{shown:22s} {mode:5s} {technique:28s} not applied: {why}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    from nnmem import zoo

    parser = zoo_parser(__doc__)
    parser.add_argument("--optimizer", default="adam")
    parser.add_argument("--modes", default="train,infer")
    parser.add_argument("--no-third-party", dest="third_party", action="store_false",
                        help="leave out the HuggingFace models (benchmarks/hf_models.py; on when transformers is "
                             "installed)")
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if ":" in m or (m in zoo.names() and not m.startswith("keras_"))]
    if args.third_party:
        try:
            import transformers  # noqa: F401
            from hf_models import SPECS

            models += list(SPECS)
        except ImportError:
            print("transformers is not installed: the HuggingFace models are left out")
    print(f"{'model':22s} {'mode':5s} {'technique':28s} {'predicted':>14s} {'measured':>14s} {'error':>9s} "
          f"{'saved':>13s} {'FLOPs':>8s}")
    table: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        for mode in args.modes.split(","):
            for model in models:
                table += rows(model, mode, args.batch, args.optimizer if mode == "train" else None, folder)
    scored = print_score(table, "techniques applied and")
    ranged = [r for r in scored if r["inside"] is not None]
    if ranged:
        widths = sorted((r["high"] - r["low"]) / r["high"] for r in ranged)
        print(f"{len(ranged)} rows with a range (FBGEMM's threads overlap or not; scored by the nearer end): "
              f"measured inside in {sum(bool(r['inside']) for r in ranged)}, median width "
              f"{100 * widths[len(widths) // 2]:.1f} %")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(table, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
