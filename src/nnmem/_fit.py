"""Public batch-size analyses: batch_curve, max_batch, explain."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from nnmem.api import _check, _dispatch, _is_keras, _keras_factory, _keras_frontend, _load_keras_file, _torch_frontend
from nnmem.errors import ConfigError
from nnmem.report.model import report_from_trace
from nnmem.trace import Trace
from nnmem.units import parse_size
from nnmem.whatif.batch import BatchCurve, FitResult, fit_curve, search_max_batch
from nnmem.whatif.explain import Explanation, mode_figures

__all__ = ["batch_curve", "max_batch", "explain", "resolve_budget"]

CURVE_BATCHES = (2, 4)


def resolve_budget(budget: Any, device: str) -> tuple[int, str]:
    """The budget in bytes and the level that decides an OOM on ``device``.

    Args:
        budget: bytes (int) or a size text ("16GiB"); None takes the device's usable memory.
        device: "cpu" or a catalog name.
    """
    from nnmem.cuda import cuda_target

    level = "reserved" if cuda_target(device) is not None else "allocator"
    if budget is None:
        if device.lower() == "cpu":
            raise ConfigError("expected a budget (e.g. budget='16GiB') for device 'cpu', or a catalog --device")
        from nnmem.devices import get_device

        return get_device(device).usable_bytes, level
    return parse_size(budget), level


def _tracer(model: Any, inputs: Any, *, mode: str, optimizer: Any, loss_fn: Any, target: Any,
            input_shape: Any) -> Callable[[int], Trace]:
    if isinstance(model, str) and model.endswith(".keras"):
        model = _load_keras_file(model)
    spec = model if isinstance(model, str) else None
    factory = _keras_factory(spec) if spec else None
    if factory is not None or _is_keras(model):
        keras_trace_at = _keras_frontend().tracer(None if factory else model, inputs, spec=spec,
                                                  input_shape=input_shape, mode=mode, optimizer=optimizer,
                                                  loss_fn=loss_fn, target=target, factory=factory)
        return functools.lru_cache(maxsize=None)(keras_trace_at)
    optimizer = "sgd" if optimizer is None else optimizer
    frontend = _torch_frontend() if spec else _dispatch(model)
    trace_at = frontend.tracer(model, inputs, spec=spec, input_shape=input_shape, mode=mode, optimizer=optimizer,
                               loss_fn=loss_fn, target=target)
    return functools.lru_cache(maxsize=None)(trace_at)


def batch_curve(model: Any, inputs: Any = None, *, mode: str = "train", optimizer: Any = None,
                loss_fn: Callable[..., Any] | None = None, target: Any = None, input_shape: Any = None,
                level: str = "allocator") -> BatchCurve:
    """Peak memory as a function of batch, fitted from two traces (batch 2 and 4).

    Raises:
        UnsupportedError: the step's ops differ between the two batch sizes, so no single curve holds.
    """
    _check(mode, optimizer, None, "cpu")
    trace_at = _tracer(model, inputs, mode=mode, optimizer=optimizer, loss_fn=loss_fn, target=target,
                       input_shape=input_shape)
    b1, b2 = CURVE_BATCHES
    curve = fit_curve(trace_at(b1), trace_at(b2), b1, b2, level)
    if curve is None:
        from nnmem.errors import UnsupportedError

        raise UnsupportedError("the step runs different ops at batch 2 and 4; use max_batch, which traces each batch")
    return curve


def max_batch(model: Any, inputs: Any = None, *, budget: Any = None, device: str = "cpu", mode: str = "train",
              optimizer: Any = None, loss_fn: Callable[..., Any] | None = None, target: Any = None,
              input_shape: Any = None, upper: int = 1 << 20,
              progress: Callable[[str], None] | None = None) -> FitResult:
    """The largest batch whose step peak fits ``budget`` (or the device's usable memory).

    Args:
        model: a torch.nn.Module with example ``inputs`` (their first dimension is the batch) or a MODEL spec.
        budget: bytes or a size text such as "16GiB".
        device: "cpu", "cuda" or a catalog name (``nnmem devices``) whose usable memory is the budget. On a
            CUDA device the batch is searched at the reserved level of nnmem's caching-allocator model.
        upper: the largest batch considered.

    Returns:
        The batch, the peak there and at the next batch, both from traces.
    """
    _check(mode, optimizer, None, device)
    budget_bytes, level = resolve_budget(budget, device)
    trace_at = _tracer(model, inputs, mode=mode, optimizer=optimizer, loss_fn=loss_fn, target=target,
                       input_shape=input_shape)
    return search_max_batch(trace_at, budget_bytes, level, upper=upper, progress=progress,
                            peak_of=_cuda_peak_of(device, model))


def _keras_like(model: Any) -> bool:
    if isinstance(model, str):
        return model.endswith(".keras") or _keras_factory(model) is not None
    return _is_keras(model)


def _cuda_peak_of(device: str, model: Any = None) -> Callable[[Trace], int] | None:
    """On a CUDA device, the reserved peak of a trace (what decides an OOM there); else None."""
    from nnmem.cuda import cuda_target

    cuda_device = cuda_target(device)
    if cuda_device is None:
        return None
    if _keras_like(model):
        from nnmem.errors import UnsupportedError

        raise UnsupportedError("Keras steps are searched for device 'cpu' (with budget=) only in this version; "
                               "the CUDA allocator model covers PyTorch models")
    frontend = _torch_frontend()

    def peak_of(trace: Trace) -> int:
        return int(frontend.cuda_level_peaks(trace, cuda_device)["reserved"])

    return peak_of


def explain(model: Any, inputs: Any = None, *, budget: Any = None, device: str = "cpu", optimizer: Any = None,
            loss_fn: Callable[..., Any] | None = None, target: Any = None, input_shape: Any = None,
            batch: int | None = None, progress: Callable[[str], None] | None = None) -> Explanation:
    """Training next to inference: what grows per sample in each, and the largest batch of each.

    Args:
        batch: read each mode's figures at the segment that decides the peak at this batch. Default: at the
            largest batch within the budget when one is given, else the segment that grows fastest with the
            batch (the one deciding at large batches).
        budget: optional; with it (or a catalog device) both max batches are searched.
    """
    _check("train", optimizer, batch, "cpu")
    budget_bytes = resolve_budget(budget, device)[0] if budget is not None or device.lower() != "cpu" else None
    figures = {}
    saved: dict[str, int] = {}
    gradient_bytes = 0
    for mode in ("train", "infer"):
        trace_at = _tracer(model, inputs, mode=mode, optimizer=optimizer, loss_fn=loss_fn, target=target,
                           input_shape=input_shape)
        b1, b2 = CURVE_BATCHES
        curve = fit_curve(trace_at(b1), trace_at(b2), b1, b2, "allocator")
        if curve is None:
            from nnmem.errors import UnsupportedError

            raise UnsupportedError(f"{mode}: the step runs different ops at batch {b1} and {b2}")
        fit = (search_max_batch(trace_at, budget_bytes, "allocator", progress=progress,
                                peak_of=_cuda_peak_of(device, model))
               if budget_bytes is not None else None)
        figures[mode] = mode_figures(mode, curve, trace_at(b1), trace_at(b2), batch, fit)
        if mode == "train":
            r1 = report_from_trace(trace_at(b1), source="estimate", model="", device=device)
            r2 = report_from_trace(trace_at(b2), source="estimate", model="", device=device)
            for row1, row2 in zip(r1.layers, r2.layers):
                per_sample = (row2.saved_bytes - row1.saved_bytes) // (b2 - b1)
                if per_sample > 0:
                    saved[row1.path or "(model)"] = per_sample
            gradient_bytes = sum(row.parameter_bytes for row in r1.layers
                                 if row.parameters) if "gradients" in r1.breakdown else 0
    ordered = tuple(sorted(saved.items(), key=lambda item: -item[1]))
    return Explanation(figures["train"], figures["infer"], gradient_bytes, ordered, budget_bytes)
