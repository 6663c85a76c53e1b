"""Memory as a function of batch, and the largest batch that fits a budget.

Every tensor of a step is either batch-sized (activations, inputs) or not (parameters, gradients,
optimizer state), so the live bytes after op ``i`` are affine in the batch: ``a_i + c_i·b``, and the
peak ``max_i(a_i + c_i·b)`` is convex and piecewise affine. Two traces whose ops line up give every
``a_i`` and ``c_i``, hence the whole curve; a third trace at the answer verifies the segment used.
When the op sequences differ (the framework picks other kernels at other batches) the search falls
back to tracing each candidate.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nnmem.errors import ConfigError, UnsupportedError
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

    def largest_batch(self, budget: int) -> int:
        """Largest batch whose predicted peak is <= budget, however large (0 when none fits).

        Raises:
            UnsupportedError: no op's bytes grow with the batch, so every batch fits.
        """
        growing = [(a, c) for a, c in zip(self.intercepts, self.slopes) if c > 0]
        if not growing:
            raise UnsupportedError("the step's memory does not grow with the batch, so no largest batch exists "
                                   "(does the model's factory build its inputs from the batch it is given?)")
        if any(a > budget for a, c in zip(self.intercepts, self.slopes) if c <= 0):
            return 0
        batch = max(int(min((budget - a) // c for a, c in growing)), 0)
        while batch > 0 and self.peak(batch) > budget:  # float rounding at the boundary
            batch -= 1
        while self.peak(batch + 1) <= budget:
            batch += 1
        return batch

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
        budget_bytes: the bytes searched against (the budget, or what the framework may use on the device).
        notes: what the answer rests on (a GPU's figures modelled, not measured).
    """

    model: str
    device: str
    level: str
    optimizer: str | None
    results: tuple[tuple[str, FitResult], ...]
    budget_bytes: int | None = None
    notes: tuple[str, ...] = ()

    def __getitem__(self, mode: str) -> FitResult:
        return dict(self.results)[mode]

    def __repr__(self) -> str:
        found = ", ".join(f"{mode} {fit.batch:,}" for mode, fit in self.results)
        return f"Fits({self.model} on {self.device}: largest batch {found})"

    def _repr_html_(self) -> str | None:
        """The batch curve, in a notebook (None without Plotly: the plain repr)."""
        from nnmem.report.output import repr_html

        return repr_html(self)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the search's terms, then one entry per mode."""
        return {"model": self.model, "device": self.device, "level": self.level, "optimizer": self.optimizer,
                "budget_bytes": self.budget_bytes, "notes": list(self.notes),
                **{mode: result.to_dict() for mode, result in self.results}}


def batch_ratio(train: FitResult | None, infer: FitResult | None) -> float | None:
    """Inference max batch / training max batch, when both are known, non-zero and not at the upper limit asked for."""
    if train is None or infer is None or not train.batch or not infer.batch or train.at_limit or infer.at_limit:
        return None
    return infer.batch / train.batch


def _series(sim: Simulation, level: str) -> tuple[int, ...]:
    return sim.tensor_live if level == "tensor" else sim.allocator_live


_UNIQUIFIED = re.compile(r"_\d+(?=/)")
"""A name scope's uniquifying suffix (``adam_1/`` then ``adam_2/``): a framework that builds part of the step
afresh for every trace (Keras on TensorFlow, its optimizer's update ops) numbers the scope anew each time."""


def _same_ops(first: Trace, second: Trace) -> bool:
    """Whether two traces run the same ops in the same order, scope numbering aside."""
    return len(first.ops) == len(second.ops) and all(
        x.name == y.name or _UNIQUIFIED.sub("", x.name) == _UNIQUIFIED.sub("", y.name)
        for x, y in zip(first.ops, second.ops))


def fit_curve(first: Trace, second: Trace, b1: int, b2: int, level: str) -> BatchCurve | None:
    """Fit the per-op affine curve from traces at two batch sizes; None when their ops differ."""
    if not _same_ops(first, second):
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


def search_max_batch(trace_at: TraceAt, budget: int, level: str, *, upper: int | None = None,
                     progress: Callable[[str], None] | None = None,
                     peak_of: Callable[[Trace], int] | None = None) -> FitResult:
    """Find the largest batch whose peak at ``level`` is <= ``budget``, whatever its size.

    Traces at batch 2 and 4 give the piecewise-affine curve; its crossing with the budget is traced. When
    that trace lies on the curve op by op, the answer is exact (3 traces). Where a kernel's scratch is not
    affine over the whole range (it changes regime at some batch), the curve is refitted from the two traced
    batches nearest the crossing, which soon lie in one regime, and the search ends when the largest batch
    that fits and the next one are both traced, or the last trace lies on the refitted curve.

    Args:
        trace_at: traces the step at a batch size.
        budget: bytes available.
        level: the level that decides an OOM ("allocator" on CPU).
        upper: largest batch considered (None: no limit); an answer there has ``at_limit`` set.
        progress: called with a short message before each trace.
        peak_of: the peak of a trace when it is not a simulated level (CUDA's reserved level, which
            moves in whole segments and is not affine in the batch): its crossing is predicted from the
            allocator level's curve plus the gap between the levels, bracketed (:meth:`_Search.run_above`).

    Returns:
        The answer, checked by traces (or by a trace on an op-wise affine curve) at ``batch`` and ``batch + 1``.

    Raises:
        UnsupportedError: the step's memory does not grow with the batch, so no largest batch exists.
    """
    if budget <= 0:
        raise ConfigError(f"expected a positive budget in bytes. Received: {budget}")
    return _Search(trace_at, budget, level, upper, progress, peak_of).run()


class _Search:
    """The state of one max-batch search: every traced batch and its peak, the bracket around the answer."""

    MAX_STEPS = 40  # secant or bisection steps before plain bisection (a bisection halves the bracket)

    def __init__(self, trace_at: TraceAt, budget: int, level: str, upper: int | None,
                 progress: Callable[[str], None] | None, peak_of: Callable[[Trace], int] | None) -> None:
        self.trace_at, self.budget, self.level, self.upper = trace_at, budget, level, upper
        self.progress, self.peak_of = progress, peak_of
        self.traces: dict[int, Trace] = {}
        self.peaks: dict[int, int] = {}
        self.first_curve: BatchCurve | None = None

    def peak(self, batch: int) -> int:
        if batch not in self.peaks:
            if self.progress:
                self.progress(f"tracing batch {batch:,}")
            trace = self.trace_at(batch)
            self.traces[batch] = trace
            self.peaks[batch] = self.peak_of(trace) if self.peak_of is not None else simulate(trace).peaks[self.level]
        return self.peaks[batch]

    def result(self, batch: int, next_peak: int, curve: BatchCurve | None, at_limit: bool = False) -> FitResult:
        peak = self.peak(batch) if batch else 0
        return FitResult(batch, peak, next_peak, self.budget, len(self.traces), curve or self.first_curve, at_limit)

    def settled(self, lo: int, hi: int | None) -> FitResult | None:
        """The answer when the bracket ``lo``, ``hi`` decides it (adjacent batches, or ``upper`` reached)."""
        if hi is not None and hi == lo + 1:
            return self.result(lo, self.peaks[hi], None)
        if self.upper is not None and lo >= self.upper:
            return self.result(self.upper, self.peak(self.upper), None, at_limit=True)
        return None

    def bracket(self) -> tuple[int, int | None]:
        """The largest traced batch that fits (0: none) and the smallest traced one that does not (None)."""
        fits = [b for b, p in self.peaks.items() if p <= self.budget]
        over = [b for b, p in self.peaks.items() if p > self.budget]
        return max(fits, default=0), min(over, default=None)

    def run(self) -> FitResult:
        b1, b2 = 2, 4  # batch 1 is avoided: some kernels special-case it
        if self.upper is not None and self.upper < b2:
            return self.bisect()
        self.peak(b1)
        self.peak(b2)
        if self.peak_of is not None:
            below = fit_curve(self.traces[b1], self.traces[b2], b1, b2, "allocator")
            if below is not None:
                return self.run_above(below, b2)
        order = [b1, b2]  # traced batches, oldest first
        slow = False  # the last step did not halve the bracket: the next one bisects (as Dekker's method does)
        for _ in range(self.MAX_STEPS):
            lo, hi = self.bracket()
            done = self.settled(lo, hi)
            if done is not None:
                return done
            curve = None
            if hi is not None and slow:
                guess = (lo + hi) // 2
            else:  # secant through the two latest traces: they come to lie in the regime of the crossing
                a, b = sorted(order[-2:])
                guess, curve = self.predict(a, b)
                if curve is not None and self.first_curve is None:
                    self.first_curve = curve
            guess = max(guess, lo + 1)
            if hi is not None:
                guess = min(guess, hi - 1)
            if self.upper is not None:
                guess = min(guess, self.upper)
            if guess in self.peaks:  # the clamped prediction is traced already: bisect instead
                guess = (lo + hi) // 2 if hi is not None else 2 * lo
            fits = self.peak(guess) <= self.budget
            order.append(guess)
            new_lo, new_hi = self.bracket()
            halved = hi is not None and new_hi is not None and 2 * (new_hi - new_lo) <= hi - lo
            slow = hi is not None and not halved and not slow
            if fits and curve is not None and self.peak_of is None \
                    and _matches(curve, self.traces[guess], guess, self.level):
                next_peak = curve.peak(guess + 1)  # three traces agree op by op: every op is affine here
                if next_peak > self.budget:
                    return self.result(guess, next_peak, curve)
            if guess == 1 and not fits:
                return self.result(0, self.peaks[1], curve)
        return self.bisect()

    def run_above(self, below: BatchCurve, last: int) -> FitResult:
        """The search of a level that moves in steps above the allocator level (``peak_of``: whole segments).

        The level is the allocator level's op-wise curve ``below`` plus a gap (rounding to segments, caching)
        that grows with the batch; the gap is taken as affine through the two latest traces (constant after
        the first), and the crossing of the curve plus it is traced next. A secant through peaks that stay flat
        for thousands of batches would creep one batch at a time; here a prediction outside the bracket, or one
        after a step that did not halve it, gives way to a bisection, so the search ends within about twice the
        bisection's traces at worst.
        """
        order, slow = [last], False
        for _ in range(self.MAX_STEPS):
            lo, hi = self.bracket()
            done = self.settled(lo, hi)
            if done is not None:
                return done
            guess = self.predict_above(below, order[-2:])
            if hi is not None and (slow or not lo < guess < hi or guess in self.peaks):
                guess = (lo + hi) // 2
            elif guess <= lo or guess in self.peaks:  # no bracket yet: look further out
                guess = 2 * lo
            if self.upper is not None:
                guess = min(guess, self.upper)
            self.peak(guess)
            new_lo, new_hi = self.bracket()
            slow = hi is not None and new_hi is not None and 2 * (new_hi - new_lo) > hi - lo and not slow
            order.append(guess)
        return self.bisect()

    def predict_above(self, below: BatchCurve, latest: list[int]) -> int:
        """The largest batch within the budget on ``below`` plus the gap through the ``latest`` traces."""
        gaps = [self.peaks[b] - below.peak(b) for b in latest]
        per_sample = (gaps[-1] - gaps[0]) / (latest[-1] - latest[0]) if len(latest) == 2 else 0.0
        if max(below.slopes) + per_sample <= 0:  # the gap's fall outpaces the curve's growth: keep it constant
            per_sample = 0.0
        at_zero = gaps[-1] - per_sample * latest[-1]
        raised = BatchCurve(below.level, tuple(a + at_zero for a in below.intercepts),
                            tuple(c + per_sample for c in below.slopes), below.batches, below.categories)
        return raised.largest_batch(self.budget)

    def predict(self, a: int, b: int) -> tuple[int, BatchCurve | None]:
        """The largest batch within the budget on the line through traced batches ``a`` < ``b``: op by op
        when their ops line up (and the level is simulated), else on their peaks."""
        curve = None if self.peak_of is not None else fit_curve(self.traces[a], self.traces[b], a, b, self.level)
        if curve is not None:
            return curve.largest_batch(self.budget), curve
        pa, pb = self.peaks[a], self.peaks[b]
        if pb <= pa:  # a whole-segment level can stay flat between two batches: look further out, or bisect
            lo, hi = self.bracket()
            return (2 * b if hi is None else (lo + hi) // 2), None
        return a + int((self.budget - pa) * (b - a) // (pb - pa)), None

    def bisect(self) -> FitResult:
        """Exponential then binary search over traced peaks (the curves did not settle the answer)."""
        if self.peak(1) > self.budget:
            return self.result(0, self.peaks[1], None)
        lo, hi = self.bracket()
        lo = max(lo, 1)
        while hi is None:
            step = lo * 2
            if self.upper is not None and step > self.upper:
                if self.peak(self.upper) <= self.budget:
                    return self.result(self.upper, self.peaks[self.upper], None, at_limit=True)
                hi = self.upper
            elif self.peak(step) <= self.budget:
                lo = step
            else:
                hi = step
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.peak(mid) <= self.budget:
                lo = mid
            else:
                hi = mid
        return self.result(lo, self.peaks[hi], None)


def _matches(curve: BatchCurve, trace: Trace, batch: int, level: str) -> bool:
    """Whether a trace at ``batch`` has the curve's ops and, op by op, the curve's live bytes."""
    if len(trace.ops) + 1 != len(curve.slopes):
        return False
    series = (trace.resident_bytes, *_series(simulate(trace), level))
    return all(abs(a + c * batch - v) < 1.0 for a, c, v in zip(curve.intercepts, curve.slopes, series))
