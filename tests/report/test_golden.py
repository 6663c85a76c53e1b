"""Golden files for the terminal and JSON renderers: a change in what a user sees is made deliberately.

The inputs are hand-made (a trace of the classic 256→128→64→10 MLP's first layer, fixed fits and an
explanation), so the files change only when a renderer or a result's ``to_dict`` does. After a deliberate
change: ``NNMEM_UPDATE_GOLDEN=1 pytest tests/report/test_golden.py`` rewrites them; review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nnmem.devices import list_devices
from nnmem.report.compare import compare
from nnmem.report.model import Report, report_from_trace
from nnmem.report.text import render_comparison, render_devices, render_explanation, render_fits, render_report
from nnmem.trace import Block, Category, LayerInfo, Op, Phase, Trace
from nnmem.whatif.batch import FitResult, Fits
from nnmem.whatif.explain import Explanation, ModeFigures

GOLDEN = Path(__file__).with_name("golden")


def _trace() -> Trace:
    # Dense 256→128 at batch 32, one SGD step: weights 131,072 B + bias 512 B, input 32,768 B.
    blocks = (
        Block(0, 131_072, Category.PARAMETERS, "fc1", Phase.SETUP, -1, -1),
        Block(1, 512, Category.PARAMETERS, "fc1", Phase.SETUP, -1, -1),
        Block(2, 32_768, Category.INPUTS, "", Phase.SETUP, -1, -1),
        Block(3, 16_384, Category.SAVED_ACTIVATIONS, "fc1", Phase.FORWARD, 0, 2),
        Block(4, 4, Category.ACTIVATIONS, "", Phase.FORWARD, 1, 3),
        Block(5, 131_072, Category.GRADIENTS, "fc1", Phase.BACKWARD, 2, -1),
        Block(6, 512, Category.GRADIENTS, "fc1", Phase.BACKWARD, 2, -1),
    )
    ops = (
        Op(0, "aten::addmm", Phase.FORWARD, "fc1", 16_384, 0, workspace=65_536),
        Op(1, "aten::mean", Phase.FORWARD, "", 4, 0),
        Op(2, "aten::mm", Phase.BACKWARD, "fc1", 131_584, 16_384),
        Op(3, "aten::add_", Phase.OPTIMIZER, "fc1", 0, 4),
    )
    layers = (LayerInfo("", "MLP", 0, 0, 4), LayerInfo("fc1", "Linear", 32_896, 131_584, 16_384, ((128, 256), (128,))))
    return Trace("torch", "train", blocks, ops, layers, {"optimizer": "sgd", "batch": 32})


def _report(source: str = "estimate", **overrides: int) -> Report:
    return report_from_trace(_trace(), source=source, model="mlp", device="cpu", overrides=overrides or None,
                             notes=("a note the reader must see",))


def _fit(batch: int, peak: int) -> FitResult:
    return FitResult(batch, peak, peak + 40_000, 1 << 30, 3, None)


def _explanation() -> Explanation:
    train = ModeFigures("train", 600_000, 3_000, {"saved activations": 2_000, "activations": 1_000},
                        {"parameters": 200_000, "gradients": 200_000, "optimizer state": 200_000},
                        _fit(1200, 4_200_000))
    infer = ModeFigures("infer", 200_000, 1_000, {"activations": 1_000}, {"parameters": 200_000}, _fit(4200, 4_400_000))
    return Explanation(train, infer, 200_000, (("fc1", 1_024), ("fc2", 512)), 1 << 30, model="mlp")


def _check(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("NNMEM_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    if not path.exists():
        pytest.fail(f"no golden file {path}: run with NNMEM_UPDATE_GOLDEN=1 once and review it")
    assert text == path.read_text(), f"{name} differs from its golden file (NNMEM_UPDATE_GOLDEN=1 to accept)"


def test_report_text() -> None:
    _check("report.txt", render_report(_report(), width=120))


def test_report_json() -> None:
    data = _report().to_dict(budget_bytes=1 << 20)
    assert data["parameters"] == 32_896 and data["fits"] is True
    assert Report.from_dict(json.loads(json.dumps(data))) == _report()
    _check("report.json", json.dumps(data, indent=2) + "\n")


def test_comparison_text_and_json() -> None:
    comparison = compare(_report(), _report("measure", allocator=260_000))
    _check("comparison.txt", render_comparison(comparison, width=120))
    _check("comparison.json", json.dumps(comparison.to_dict(budget_bytes=1 << 20), indent=2) + "\n")


def test_fits_text_and_json() -> None:
    fits = Fits("mlp", "cpu", "allocator", "adam", (("train", _fit(1200, 4_200_000)), ("infer", _fit(4200, 4_400_000))))
    _check("fits.txt", render_fits(list(fits.results), budget_label="1.00 GiB", level=fits.level, width=120))
    _check("fits.json", json.dumps(fits.to_dict(), indent=2) + "\n")


def test_explanation_text_and_json() -> None:
    exp = _explanation()
    _check("explanation.txt", render_explanation(exp, model="mlp", width=120))
    _check("explanation.json", json.dumps(exp.to_dict(), indent=2) + "\n")


def test_devices_text_and_json() -> None:
    devices = list_devices()[:3]
    _check("devices.txt", render_devices(devices, width=120))
    _check("devices.json", json.dumps([d.to_dict() for d in devices], indent=2) + "\n")
