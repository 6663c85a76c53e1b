"""Memory as a function of batch, and the largest batch that fits a budget.

Every tensor of a step is either batch-sized (activations, inputs) or not (parameters, gradients,
optimizer state), so the live bytes after op ``i`` are affine in the batch: ``a_i + c_i·b``, and the
peak ``max_i(a_i + c_i·b)`` is convex and piecewise affine. Two traces whose ops line up give every
``a_i`` and ``c_i``, hence the whole curve; a third trace at the answer verifies the segment used.
When the op sequences differ (the framework picks other kernels at other batches) the search falls
back to tracing each candidate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nnmem.errors import ConfigError
from nnmem.simulate import Simulation, simulate
from nnmem.trace import Trace

__all__ = ["BatchCurve", "FitResult", "Fits", "fit_curve", "search_max_batch"]

TraceAt = Callable[[int], Trace]


@dataclass(frozen=True, slots=True)
class BatchCurve:
    """Peak bytes as ``max_i(intercepts[i] + slopes[i]·batch)`` at one level.

    Attributes:
        level: "tensor" or "allocator".
        intercepts: per op, bytes that do not depend on the batch.
        slopes: per op, bytes per sample.
        batches: the batch sizes the curve was fitted from.
        categories: per category at the peak, (bytes at batch 0, bytes per sample), taken from the
            fitted traces' breakdowns at their peaks.
    """

    level: str
    intercepts: tuple[float, ...]
    slopes: tuple[float, ...]
    batches: tuple[int, int]
    categories: dict[str, tuple[float, float]]

    def peak(self, batch: int) -> int:
        """Predicted peak at ``batch``, in bytes."""
        return int(round(max(a + c * batch for a, c in zip(self.intercepts, self.slopes))))

    def peak_op(self, batch: int) -> int:
        """Index of the op that decides the peak at ``batch``."""
        values = [a + c * batch for a, c in zip(self.intercepts, self.slopes)]
        return max(range(len(values)), key=values.__getitem__)

    def largest_batch_within(self, budget: int, upper: int) -> int:
        """Largest batch in [0, upper] whose predicted peak is <= budget (0 when none fits)."""
        lo, hi = 0, upper
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.peak(mid) <= budget:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (per-op intercepts and slopes in bytes and bytes per sample)."""
        return {"level": self.level, "batches": list(self.batches), "intercepts": list(self.intercepts),
                "slopes": list(self.slopes), "categories": {k: list(v) for k, v in self.categories.items()}}


@dataclass(frozen=True, slots=True)
class FitResult:
    """The answer of a max-batch search.

    Attributes:
        batch: the largest batch whose peak is <= budget (0 when even batch 1 does not fit).
        peak_bytes: the peak at ``batch``, in bytes (from a trace at that batch).
        next_peak_bytes: the peak at ``batch + 1``, in bytes (from a trace).
        budget_bytes: the budget, in bytes.
        traces: how many traces the search took.
        curve: the fitted curve, when the ops lined up.
        at_limit: the search stopped at its ``upper`` batch with the peak still within the budget: the
            largest batch is at least ``batch``.
    """

    batch: int
    peak_bytes: int
    next_peak_bytes: int
    budget_bytes: int
    traces: int
    curve: BatchCurve | None
    at_limit: bool = False

    @property
    def headroom_bytes(self) -> int:
        """Budget left at ``batch``, in bytes."""
        return self.budget_bytes - self.peak_bytes

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the answer (the fitted curve is left out: ``curve.to_dict()`` has it)."""
        return {"batch": self.batch, "peak_bytes": self.peak_bytes, "next_peak_bytes": self.next_peak_bytes,
                "budget_bytes": self.budget_bytes, "headroom_bytes": self.headroom_bytes, "traces": self.traces,
                "at_limit": self.at_limit}


@dataclass(frozen=True, slots=True)
class Fits:
    """The largest batch of one model for several modes (``nnmem.fit``).

    Attributes:
        model: the model's name.
        device: the device whose memory (or the budget) was searched against.
        level: the level the peaks were compared at ("allocator" on the CPU, "reserved" on CUDA).
        optimizer: the optimizer asked for (None: the framework's default or the compiled one).
        results: (mode, answer) in the order asked.
    """

    model: str
    device: str
    level: str
    optimizer: str | None
    results: tuple[tuple[str, FitResult], ...]

    def __getitem__(self, mode: str) -> FitResult:
        return dict(self.results)[mode]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the search's terms, then one entry per mode."""
        return {"model": self.model, "device": self.device, "level": self.level, "optimizer": self.optimizer,
                **{mode: result.to_dict() for mode, result in self.results}}


def batch_ratio(train: FitResult | None, infer: FitResult | None) -> float | None:
    """Inference max batch / training max batch, when both are known, non-zero and not at the search limit."""
    if train is None or infer is None or not train.batch or not infer.batch or train.at_limit or infer.at_limit:
        return None
    return infer.batch / train.batch


def _series(sim: Simulation, level: str) -> tuple[int, ...]:
    return sim.tensor_live if level == "tensor" else sim.allocator_live


def fit_curve(first: Trace, second: Trace, b1: int, b2: int, level: str) -> BatchCurve | None:
    """Fit the per-op affine curve from traces at two batch sizes; None when their ops differ."""
    if len(first.ops) != len(second.ops) or any(x.name != y.name for x, y in zip(first.ops, second.ops)):
        return None
    s1, s2 = simulate(first), simulate(second)
    resident1, resident2 = first.resident_bytes, second.resident_bytes
    y1 = (resident1, *_series(s1, level))
    y2 = (resident2, *_series(s2, level))
    slopes = tuple((v2 - v1) / (b2 - b1) for v1, v2 in zip(y1, y2))
    intercepts = tuple(v1 - c * b1 for v1, c in zip(y1, slopes))
    cats = {}
    for cat in dict.fromkeys([*s1.breakdown[level], *s2.breakdown[level]]):
        v1, v2 = s1.breakdown[level].get(cat, 0), s2.breakdown[level].get(cat, 0)
        slope = (v2 - v1) / (b2 - b1)
        cats[cat] = (v1 - slope * b1, slope)
    return BatchCurve(level, intercepts, slopes, (b1, b2), cats)


def search_max_batch(trace_at: TraceAt, budget: int, level: str, *, upper: int = 1 << 20,
                     progress: Callable[[str], None] | None = None,
                     peak_of: Callable[[Trace], int] | None = None) -> FitResult:
    """Find the largest batch whose peak at ``level`` is <= ``budget``.

    Args:
        trace_at: traces the step at a batch size.
        budget: bytes available.
        level: the level that decides an OOM ("allocator" on CPU).
        upper: largest batch considered.
        progress: called with a short message before each trace.
        peak_of: the peak of a trace when it is not a simulated level (CUDA's reserved level, which
            moves in whole segments and is not affine in the batch): the search then bisects over traces.

    Returns:
        The answer, checked by traces at ``batch`` and ``batch + 1``.
    """
    if budget <= 0:
        raise ConfigError(f"expected a positive budget in bytes. Received: {budget}")
    cache: dict[int, Trace] = {}

    def peak(batch: int) -> int:
        if batch not in cache:
            if progress:
                progress(f"tracing batch {batch}")
            cache[batch] = trace_at(batch)
        return peak_of(cache[batch]) if peak_of is not None else simulate(cache[batch]).peaks[level]

    if peak_of is not None:
        return _bisect(peak, budget, upper, None, cache)
    b1, b2 = 2, 4  # batch 1 is avoided: some kernels special-case it
    peak(b1)
    peak(b2)
    curve = fit_curve(cache[b1], cache[b2], b1, b2, level)
    if curve is not None:
        guess = max(curve.largest_batch_within(budget, upper), 1)
        peak(guess)
        if _matches(curve, cache[guess], guess, level):
            # three traces agree op by op, so every op is affine here and the curve gives b + 1 exactly
            next_peak = curve.peak(guess + 1)
            if peak(guess) <= budget < next_peak:
                return FitResult(guess, peak(guess), next_peak, budget, len(cache), curve)
            if guess == 1 and peak(1) > budget:
                return FitResult(0, 0, peak(1), budget, len(cache), curve)
    return _bisect(peak, budget, upper, curve, cache)


def _matches(curve: BatchCurve, trace: Trace, batch: int, level: str) -> bool:
    """Whether a trace at ``batch`` has the curve's ops and, op by op, the curve's live bytes."""
    if len(trace.ops) + 1 != len(curve.slopes):
        return False
    series = (trace.resident_bytes, *_series(simulate(trace), level))
    return all(abs(a + c * batch - v) < 1.0 for a, c, v in zip(curve.intercepts, curve.slopes, series))


def _bisect(peak: Callable[[int], int], budget: int, upper: int, curve: BatchCurve | None,
            cache: dict[int, Trace]) -> FitResult:
    """Exponential then binary search over traced peaks (the curve did not answer exactly)."""
    if peak(1) > budget:
        return FitResult(0, 0, peak(1), budget, len(cache), curve)
    lo, hi = 1, 2
    while hi <= upper and peak(hi) <= budget:
        lo, hi = hi, hi * 2
    hi = min(hi, upper + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if peak(mid) <= budget:
            lo = mid
        else:
            hi = mid
    if lo >= upper:
        return FitResult(upper, peak(upper), peak(upper), budget, len(cache), curve, at_limit=True)
    return FitResult(lo, peak(lo), peak(lo + 1), budget, len(cache), curve)
