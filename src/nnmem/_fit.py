"""The public batch-size analyses: batch_curve, max_batch, fit (both modes) and explain. Imports no framework."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from nnmem._api import step_request
from nnmem.errors import ConfigError, UnsupportedError
from nnmem.frontends.base import Frontend, StepRequest, resolve
from nnmem.report.model import report_from_trace
from nnmem.simulate import simulate
from nnmem.trace import Category, Trace
from nnmem.units import parse_size
from nnmem.whatif.accumulation import Accumulation, fewest_micro_steps
from nnmem.whatif.batch import BatchCurve, FitResult, Fits, fit_curve, search_max_batch
from nnmem.whatif.explain import Explanation, mode_figures, reading_batches

__all__ = ["batch_curve", "max_batch", "fit", "explain", "micro_batches"]

CURVE_BATCHES = (2, 4)
Progress = Callable[[str], None]


def _budget(budget: Any, device: str, request: StepRequest | None = None) -> tuple[int, str]:
    """The budget in bytes and the level that decides an OOM on ``device`` (budget None: the memory the
    request's framework may use on the device: its frontend's ``device_budget`` where it has one, else the
    device's usable memory)."""
    from nnmem.cuda import cuda_target

    own = getattr(resolve(request.model), "device_budget", None) if request is not None else None
    found = own(request) if own is not None else None
    level = found[1] if found is not None else "reserved" if cuda_target(device) is not None else "allocator"
    if budget is None:
        if device.lower() == "cpu":
            raise ConfigError("expected a budget (e.g. budget='16GiB') for device 'cpu', or a catalog --device")
        if found is not None:
            return found[0], level
        from nnmem.devices import get_device

        return get_device(device).usable_bytes, level
    return parse_size(budget), level


def _device_notes(request: StepRequest | None) -> tuple[str, ...]:
    """What an answer on the request's device rests on, from its frontend (a GPU's figures are modelled)."""
    return () if request is None else tuple(resolve(request.model).device_notes(request))


def _tracer(request: StepRequest) -> tuple[Frontend, Callable[[int], Trace]]:
    """The request's frontend and its batch → Trace function, each batch traced once."""
    frontend = resolve(request.model)
    return frontend, functools.lru_cache(maxsize=None)(frontend.tracer(request))


def batch_curve(model: Any, inputs: Any = None, *, mode: str = "train", optimizer: Any = None,
                loss_fn: Callable[..., Any] | None = None, target: Any = None, input_shape: Any = None,
                level: str = "allocator") -> BatchCurve:
    """Peak memory as a function of batch, fitted from two traces (batch 2 and 4).

    Raises:
        UnsupportedError: the step's ops differ between the two batch sizes, so no single curve holds.
    """
    request = step_request(model, inputs, mode=mode, optimizer=optimizer, loss_fn=loss_fn, target=target,
                           input_shape=input_shape)
    _, trace_at = _tracer(request)
    b1, b2 = CURVE_BATCHES
    curve = fit_curve(trace_at(b1), trace_at(b2), b1, b2, level)
    if curve is None:
        raise UnsupportedError("the step runs different ops at batch 2 and 4; use max_batch, which traces each batch")
    return curve


def max_batch(model: Any, inputs: Any = None, *, budget: Any = None, device: str = "cpu", mode: str = "train",
              optimizer: Any = None, loss_fn: Callable[..., Any] | None = None, target: Any = None,
              input_shape: Any = None, upper: int | None = None, progress: Progress | None = None,
              accumulate: int = 1, optimizer_in_backward: bool = False,
              precision: str | None = None, set_to_none: bool = True) -> FitResult:
    """The largest batch whose step peak fits ``budget`` (or the device's usable memory).

    Args:
        model: a model with example ``inputs`` (their first dimension is the batch) or a MODEL spec.
        budget: bytes or a size text such as "16GiB".
        device: "cpu", "cuda" or a catalog name (``nnmem devices``) whose usable memory is the budget. On a
            CUDA device the batch is searched at the reserved level of nnmem's caching-allocator model.
        upper: the largest batch considered (None: no limit; the search extrapolates and verifies by trace).
        progress: called with a short message before each trace.
        accumulate: search the micro-batch of a step with gradient accumulation over this many micro-batches.
        optimizer_in_backward: the step updates each parameter inside backward (PyTorch).
        precision: the step in lower precision (PyTorch; :func:`nnmem.estimate`'s ``precision``).
        set_to_none: ``optimizer.zero_grad(set_to_none=...)`` at the start of the step (PyTorch).

    Returns:
        The batch, the peak there and at the next batch, both from traces.
    """
    request = step_request(model, inputs, mode=mode, optimizer=optimizer, loss_fn=loss_fn, target=target,
                           device=device, input_shape=input_shape, accumulate=accumulate,
                           optimizer_in_backward=optimizer_in_backward, precision=precision,
                           set_to_none=set_to_none)
    return _search(request, *_budget(budget, device, request), upper=upper, progress=progress)


def _search(request: StepRequest, budget_bytes: int, level: str, *, upper: int | None = None,
            progress: Progress | None = None) -> FitResult:
    """The largest batch of a checked request within ``budget_bytes`` at ``level``."""
    frontend, trace_at = _tracer(request)
    return search_max_batch(trace_at, budget_bytes, level, upper=upper, progress=progress,
                            peak_of=frontend.peak_of(request))


def fit(model: Any, inputs: Any = None, *, budget: Any = None, device: str = "cpu",
        modes: tuple[str, ...] = ("train", "infer"), optimizer: Any = None, loss_fn: Callable[..., Any] | None = None,
        target: Any = None, input_shape: Any = None, progress: Progress | None = None) -> Fits:
    """The largest batch that fits, for each of ``modes`` (training and inference side by side).

    Takes the arguments of :func:`max_batch`; returns each mode's answer and the level it was searched at.
    """
    requests = [step_request(model, inputs, mode=mode, optimizer=optimizer, loss_fn=loss_fn, target=target,
                             device=device, input_shape=input_shape) for mode in modes]
    budget_bytes, level = _budget(budget, device, requests[0] if requests else None)
    results = tuple((r.mode, _search(r, budget_bytes, level, progress=progress)) for r in requests)
    optimizer_name = optimizer if isinstance(optimizer, str) or optimizer is None else type(optimizer).__name__
    return Fits(model=requests[0].name if requests else str(model), device=device, level=level,
                optimizer=optimizer_name, results=results, budget_bytes=budget_bytes,
                notes=_device_notes(requests[0] if requests else None))


def explain(model: Any, inputs: Any = None, *, budget: Any = None, device: str = "cpu", optimizer: Any = None,
            loss_fn: Callable[..., Any] | None = None, target: Any = None, input_shape: Any = None,
            batch: int | None = None, progress: Progress | None = None) -> Explanation:
    """Training next to inference: what grows per sample in each, and the largest batch of each.

    Args:
        batch: read each mode's figures at the segment that decides the peak at this batch. Default: at the
            largest batch within the budget when one is given, else the segment that grows fastest with the
            batch (the one deciding at large batches). The figures are read at that batch, traced there and
            at half of it (:func:`~nnmem.whatif.explain.reading_batches`): the fixed bytes plus the batch times
            the per-sample bytes is the peak there.
        budget: optional; with it (or a catalog device) both max batches are searched.
    """
    first = step_request(model, inputs, optimizer=optimizer, loss_fn=loss_fn, target=target, device=device,
                         batch=batch, input_shape=input_shape)
    budget_bytes, level = _budget(budget, device, first) if budget is not None or device.lower() != "cpu" \
        else (None, "allocator")
    figures = {}
    saved: dict[str, int] = {}
    gradient_bytes, labelled = 0, True
    b1, b2 = CURVE_BATCHES
    for mode in ("train", "infer"):
        request = step_request(model, inputs, mode=mode, optimizer=optimizer, loss_fn=loss_fn, target=target,
                               device=device, batch=batch, input_shape=input_shape)
        frontend, trace_at = _tracer(request)
        curve = fit_curve(trace_at(b1), trace_at(b2), b1, b2, "allocator")
        if curve is None:
            raise UnsupportedError(f"{mode}: the step runs different ops at batch {b1} and {b2}")
        result = (search_max_batch(trace_at, budget_bytes, "allocator", progress=progress,
                                   peak_of=frontend.peak_of(request))
                  if budget_bytes is not None else None)
        lo, hi = reading_batches(result, batch, (b1, b2))
        near = fit_curve(trace_at(lo), trace_at(hi), lo, hi, "allocator") if (lo, hi) != (b1, b2) else None
        if near is None:  # the kernels change between the two batches: read at the small ones
            lo, hi, near = b1, b2, curve
        figures[mode] = mode_figures(mode, near, trace_at(lo), trace_at(hi), batch, result)
        if mode == "train":
            gradient_bytes = _saved_per_sample(trace_at(b1), trace_at(b2), b2 - b1, device, saved)
            labelled = any(b.category is Category.GRADIENTS for b in trace_at(b1).blocks)
    ordered = tuple(sorted(saved.items(), key=lambda item: -item[1]))
    return Explanation(figures["train"], figures["infer"], gradient_bytes, ordered, budget_bytes,
                       model=request.name, gradients_labelled=labelled, notes=_device_notes(first), level=level)


def _saved_per_sample(first: Trace, second: Trace, step: int, device: str, saved: dict[str, int]) -> int:
    """Fill ``saved`` with each layer's saved-for-backward bytes per sample; return the gradients' bytes."""
    r1 = report_from_trace(first, source="estimate", model="", device=device)
    r2 = report_from_trace(second, source="estimate", model="", device=device)
    for row1, row2 in zip(r1.layers, r2.layers):
        per_sample = (row2.saved_bytes - row1.saved_bytes) // step
        if per_sample > 0:
            saved[row1.path or "(model)"] = per_sample
    if "trainable_bytes" in first.meta:  # the trace's framework knows which weights train (Keras)
        return int(first.meta["trainable_bytes"])  # type: ignore[call-overload]
    return sum(row.parameter_bytes for row in r1.layers if row.parameters) if "gradients" in r1.breakdown else 0


def micro_batches(model: Any, inputs: Any = None, *, batch: int, budget: Any = None, device: str = "cpu",
                  optimizer: Any = None, loss_fn: Callable[..., Any] | None = None, target: Any = None,
                  input_shape: Any = None, progress: Progress | None = None) -> Accumulation:
    """The fewest micro-batch steps an effective training ``batch`` fits the budget in, with gradient accumulation.

    The largest batch without accumulation and the largest micro-batch with it (the first micro-batch's
    gradients live through the others: the same peak for any count of 2 or more) are searched by trace; the
    answer is the smallest count that divides ``batch`` into micro-batches within the latter, and its peak is
    traced.

    Raises:
        ConfigError: a batch that is not a positive integer.
    """
    if isinstance(batch, bool) or not isinstance(batch, int) or batch <= 0:
        raise ConfigError(f"expected the effective batch as a positive integer. Received: {batch!r}")
    kwargs: dict[str, Any] = {"mode": "train", "optimizer": optimizer, "loss_fn": loss_fn, "target": target,
                              "device": device, "input_shape": input_shape}
    request = step_request(model, inputs, **kwargs)
    budget_bytes, level = _budget(budget, device, request)
    plain = _search(request, budget_bytes, level, progress=progress)
    if plain.batch >= batch:
        return Accumulation(batch, 1, batch, _search_peak(model, inputs, batch, 1, kwargs, level), budget_bytes,
                            plain.batch, 0)
    accumulated = _search(step_request(model, inputs, accumulate=2, **kwargs), budget_bytes, level,
                          progress=progress)
    k = fewest_micro_steps(batch, plain.batch, accumulated.batch)
    peak = _search_peak(model, inputs, batch // k, k, kwargs, level) if k else 0
    return Accumulation(batch, k, batch // k if k else 0, peak, budget_bytes, plain.batch, accumulated.batch)


def _search_peak(model: Any, inputs: Any, batch: int, accumulate: int, kwargs: dict[str, Any], level: str) -> int:
    """The peak at ``level`` of the training step at ``batch`` (one micro-batch when ``accumulate`` > 1)."""
    request = step_request(model, inputs, accumulate=accumulate, **kwargs)
    frontend, trace_at = _tracer(request)
    trace = trace_at(batch)
    peak_of = frontend.peak_of(request)
    return peak_of(trace) if peak_of is not None else simulate(trace).peaks[level]
