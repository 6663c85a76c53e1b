"""Why training fits a smaller batch than inference, in figures."""

from __future__ import annotations

from dataclasses import dataclass

from nnmem.whatif.batch import BatchCurve, FitResult

__all__ = ["ModeFigures", "Explanation", "mode_figures"]

_FIXED = ("parameters", "buffers", "gradients", "optimizer state")


@dataclass(frozen=True, slots=True)
class ModeFigures:
    """One mode's memory as a function of batch, at the level that decides an OOM.

    Attributes:
        mode: "train" or "infer".
        fixed_bytes: bytes at the peak that do not depend on the batch.
        per_sample_bytes: bytes the peak grows by per sample (the slope of the deciding segment).
        per_sample_by_category: the per-sample bytes split by category, at the peak.
        fixed_by_category: the fixed bytes split by category, at the peak.
        fit: the largest batch within the budget, when one was given.
    """

    mode: str
    fixed_bytes: int
    per_sample_bytes: int
    per_sample_by_category: dict[str, int]
    fixed_by_category: dict[str, int]
    fit: FitResult | None


@dataclass(frozen=True, slots=True)
class Explanation:
    """Training next to inference for one model.

    Attributes:
        train: training figures.
        infer: inference figures.
        gradient_bytes: bytes of gradients — the size of the trainable parameters, whatever the batch.
        saved_per_sample: per layer, bytes saved for backward per sample (largest first).
        budget_bytes: the budget the fits answer to, if any.
    """

    train: ModeFigures
    infer: ModeFigures
    gradient_bytes: int
    saved_per_sample: tuple[tuple[str, int], ...]
    budget_bytes: int | None

    @property
    def batch_ratio(self) -> float | None:
        """Inference max batch / training max batch, when both are known and non-zero."""
        if self.train.fit is None or self.infer.fit is None or not self.train.fit.batch:
            return None
        return self.infer.fit.batch / self.train.fit.batch

    @property
    def per_sample_ratio(self) -> float:
        """Training bytes per sample / inference bytes per sample."""
        return self.train.per_sample_bytes / max(self.infer.per_sample_bytes, 1)


def mode_figures(mode: str, curve: BatchCurve, batch: int, fit: FitResult | None) -> ModeFigures:
    """Figures of one mode at ``batch`` from its fitted curve."""
    op = curve.peak_op(batch)
    fixed, slope = curve.intercepts[op], curve.slopes[op]
    per_cat = {c: int(round(s)) for c, (a, s) in curve.categories.items() if round(s)}
    fixed_cat = {c: int(round(a)) for c, (a, s) in curve.categories.items() if c in _FIXED and round(a)}
    return ModeFigures(mode, int(round(fixed)), int(round(slope)), per_cat, fixed_cat, fit)
