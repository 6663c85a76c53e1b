"""nnmem: how much memory a neural network needs for training and inference, and where it goes.

Example:
    >>> import nnmem
    >>> report = nnmem.estimate("mlp", batch=32, optimizer="adam")  # doctest: +SKIP
    >>> print(report.peak_bytes, report.breakdown)  # doctest: +SKIP
"""

from __future__ import annotations

from nnmem._api import estimate, measure
from nnmem._fit import batch_curve, explain, fit, max_batch, micro_batches
from nnmem.devices import Device, get_device, list_devices
from nnmem.errors import (
    BudgetError,
    ConfigError,
    MeasureError,
    MissingFrameworkError,
    ModelLoadError,
    NnmemError,
    TraceError,
    UnsupportedError,
)
from nnmem.report.compare import Comparison, compare
from nnmem.report.model import LayerRow, Report, TimelinePoint
from nnmem.report.output import write_html, write_png
from nnmem.trace import Category, Level, Phase
from nnmem.units import format_bytes, parse_size
from nnmem.whatif.accumulation import Accumulation
from nnmem.whatif.batch import BatchCurve, FitResult, Fits
from nnmem.whatif.compare import (
    TechniqueRow,
    WhatIf,
    apply_checkpointing,
    apply_technique,
    checkpoint_plan,
    what_if,
)
from nnmem.whatif.explain import Explanation, ModeFigures
from nnmem.whatif.plan import MemoryPlan, PlanRow, optimal_checkpointing, plan

__version__ = "0.1.0"

__all__ = [
    "Accumulation",
    "BatchCurve",
    "BudgetError",
    "Category",
    "Comparison",
    "ConfigError",
    "Device",
    "Explanation",
    "FitResult",
    "Fits",
    "LayerRow",
    "MemoryPlan",
    "Level",
    "MeasureError",
    "MissingFrameworkError",
    "ModeFigures",
    "ModelLoadError",
    "NnmemError",
    "Phase",
    "PlanRow",
    "Report",
    "TechniqueRow",
    "TimelinePoint",
    "TraceError",
    "UnsupportedError",
    "WhatIf",
    "apply_checkpointing",
    "apply_technique",
    "batch_curve",
    "checkpoint_plan",
    "compare",
    "estimate",
    "explain",
    "fit",
    "format_bytes",
    "get_device",
    "list_devices",
    "max_batch",
    "measure",
    "micro_batches",
    "optimal_checkpointing",
    "parse_size",
    "plan",
    "what_if",
    "write_html",
    "write_png",
]
