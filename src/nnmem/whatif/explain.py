"""Why training fits a smaller batch than inference, in figures."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from nnmem.simulate import _live_at
from nnmem.trace import Category, Trace
from nnmem.whatif.batch import BatchCurve, FitResult, batch_ratio

__all__ = ["ModeFigures", "Explanation", "deciding_op", "mode_figures", "reading_batches"]

_FIXED = ("parameters", "buffers", "gradients", "optimizer state")


@dataclass(frozen=True, slots=True)
class ModeFigures:
    """One mode's memory as a function of batch, at the level that decides an OOM.

    Attributes:
        mode: "train" or "infer".
        fixed_bytes: bytes at the peak that do not depend on the batch.
        per_sample_bytes: bytes per sample at the peak: at ``at_batch``, the rest of the peak there divided by
            it; without one, the slope of the deciding segment.
        per_sample_by_category: the per-sample bytes split by category, at the peak; they sum to
            ``per_sample_bytes``.
        fixed_by_category: the fixed bytes split by category, at the peak; they sum to ``fixed_bytes``.
        fit: the largest batch within the budget, when one was given.
        peak_phase: the phase of the op that decides the peak ("forward", "backward", "optimizer"; "" before
            the first op).
        peak_layer: the layer that op ran for ("" when none).
        at_batch: the batch the figures were read at (the peak there is fixed + at_batch × per-sample), or
            None where they are the deciding segment's intercept and slope between two small batches.
    """

    mode: str
    fixed_bytes: int
    per_sample_bytes: int
    per_sample_by_category: dict[str, int]
    fixed_by_category: dict[str, int]
    fit: FitResult | None
    peak_phase: str = ""
    peak_layer: str = ""
    at_batch: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"mode": self.mode, "fixed_bytes": self.fixed_bytes, "per_sample_bytes": self.per_sample_bytes,
                "per_sample_by_category": dict(self.per_sample_by_category),
                "fixed_by_category": dict(self.fixed_by_category),
                "fit": self.fit.to_dict() if self.fit is not None else None,
                "peak_phase": self.peak_phase, "peak_layer": self.peak_layer, "at_batch": self.at_batch}


@dataclass(frozen=True, slots=True)
class Explanation:
    """Training next to inference for one model.

    Attributes:
        train: training figures.
        infer: inference figures.
        gradient_bytes: bytes of gradients — the size of the trainable parameters, whatever the batch.
        saved_per_sample: per layer, bytes saved for backward per sample (largest first).
        budget_bytes: the budget the fits answer to, if any.
        model: the model's name.
        gradients_labelled: the trace tells gradients from other buffers (not on JAX, where XLA's buffers of the
            compiled step carry no such label: its gradients are among its temporaries).
        notes: what the figures rest on (a GPU's figures modelled, not measured).
        level: the level the fits were searched at ("reserved": PyTorch's caching allocator on a GPU).
    """

    train: ModeFigures
    infer: ModeFigures
    gradient_bytes: int
    saved_per_sample: tuple[tuple[str, int], ...]
    budget_bytes: int | None
    model: str = ""
    gradients_labelled: bool = True
    notes: tuple[str, ...] = ()
    level: str = "allocator"

    def __repr__(self) -> str:
        return (f"Explanation({self.model}: train {self.train.fixed_bytes:,} B + {self.train.per_sample_bytes:,} B "
                f"per sample, infer {self.infer.fixed_bytes:,} B + {self.infer.per_sample_bytes:,} B per sample)")

    def _repr_html_(self) -> str | None:
        """The charts, in a notebook (None without Plotly: the plain repr)."""
        from nnmem.report.output import repr_html

        return repr_html(self)

    @property
    def batch_ratio(self) -> float | None:
        """Inference max batch / training max batch, when both are known, non-zero and below any upper limit."""
        return batch_ratio(self.train.fit, self.infer.fit)

    @property
    def per_sample_ratio(self) -> float:
        """Training bytes per sample / inference bytes per sample."""
        return self.train.per_sample_bytes / max(self.infer.per_sample_bytes, 1)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (strict JSON: a ratio that is not finite is None)."""
        ratio = self.batch_ratio
        return {"model": self.model, "train": self.train.to_dict(), "infer": self.infer.to_dict(),
                "gradient_bytes": self.gradient_bytes,
                "per_sample_ratio": self.per_sample_ratio if math.isfinite(self.per_sample_ratio) else None,
                "batch_ratio": ratio if ratio is None or math.isfinite(ratio) else None,
                "budget_bytes": self.budget_bytes, "saved_per_sample": dict(self.saved_per_sample),
                "gradients_labelled": self.gradients_labelled, "notes": list(self.notes)}


def deciding_op(curve: BatchCurve, batch: int | None) -> int:
    """Index into the curve's series of the op that decides the peak at ``batch``.

    With ``batch`` None, the op whose live bytes grow fastest with the batch: the one that decides the
    peak at large batches, where the question "what is my largest batch" is answered.
    """
    if batch is not None:
        return curve.peak_op(batch)
    return max(range(len(curve.slopes)), key=lambda i: (round(curve.slopes[i], 6), curve.intercepts[i]))


def _categories_at(trace: Trace, series_index: int, level: str) -> dict[str, int]:
    """Bytes per category live at the curve's series index (0: before the first op), at ``level``."""
    op = series_index - 1
    cats = dict(_live_at(trace, op)[0])
    if level != "tensor" and op >= 0 and trace.ops[op].workspace:
        cats[Category.WORKSPACE.value] = cats.get(Category.WORKSPACE.value, 0) + trace.ops[op].workspace
    return cats


def reading_batches(fit: FitResult | None, batch: int | None, default: tuple[int, int]) -> tuple[int, int]:
    """The two batches a mode's figures are read from: half and all of the batch they explain.

    At the largest batch that fits (or the ``batch`` asked about) when it is at least twice ``default``'s
    larger one, so that the per-sample and fixed bytes are the slope and intercept where the answer lies, not
    at batch 2 and 4, where an allocator's rounding of small tensors weighs as much as the tensors themselves;
    else ``default``.
    """
    at = fit.batch if fit is not None and fit.batch else batch
    if at is None or at < 2 * default[1]:
        return default
    return at // 2, at


def mode_figures(mode: str, curve: BatchCurve, first: Trace, second: Trace, batch: int | None,
                 fit: FitResult | None) -> ModeFigures:
    """Figures of one mode from its fitted curve and the two traces it was fitted from.

    At the batch explained (the largest that fits, or ``batch``) when ``second`` was traced at it: the fixed
    bytes are the parameters, buffers, gradients and optimizer state live at the deciding op, the same at every
    batch, and the per-sample bytes the rest of the peak there divided by the batch, so that fixed + batch ×
    per-sample is the peak. Otherwise the slope and intercept of the deciding segment. Either way the categories
    add up to the figures, to the byte: what the level holds beyond the blocks' bytes (the allocator's rounding,
    chunks handed out whole or reused) is :attr:`Category.ALLOCATOR_CACHE`'s share.

    Args:
        batch: read the segment that decides the peak at this batch; None: the steepest segment.
    """
    at = fit.batch if fit is not None and fit.batch else batch
    index = deciding_op(curve, at)
    b1, b2 = curve.batches
    c2 = _categories_at(second, index, curve.level)
    if at == b2:
        total = curve.intercepts[index] + curve.slopes[index] * b2
        fixed_cat = {cat: v for cat, v in c2.items() if cat in _FIXED and v}
        fixed_bytes = sum(fixed_cat.values())
        per_sample = int(round((total - fixed_bytes) / b2))
        per_cat = _summing({cat: v / b2 for cat, v in c2.items() if cat not in _FIXED}, per_sample)
    else:
        c1 = _categories_at(first, index, curve.level)
        slopes: dict[str, float] = {}
        fixed: dict[str, float] = {}
        for cat in dict.fromkeys([*c1, *c2]):
            v1, v2 = c1.get(cat, 0), c2.get(cat, 0)
            slopes[cat] = (v2 - v1) / (b2 - b1)
            fixed[cat] = v1 - slopes[cat] * b1
        per_sample, fixed_bytes = int(round(curve.slopes[index])), int(round(curve.intercepts[index]))
        per_cat, fixed_cat = _summing(slopes, per_sample), _summing(fixed, fixed_bytes)
    op = first.ops[index - 1] if index > 0 else None
    return ModeFigures(mode, fixed_bytes, per_sample, per_cat, fixed_cat, fit,
                       op.phase.value if op is not None else "", op.layer if op is not None else "",
                       at if at == b2 else None)


def _summing(parts: dict[str, float], total: int) -> dict[str, int]:
    """``parts`` rounded to bytes, the difference to ``total`` in :attr:`Category.ALLOCATOR_CACHE`; zeros left
    out."""
    out = {cat: int(round(v)) for cat, v in parts.items()}
    rest = total - sum(out.values())
    cache = Category.ALLOCATOR_CACHE.value
    out[cache] = out.get(cache, 0) + rest
    return {cat: v for cat, v in out.items() if v}
