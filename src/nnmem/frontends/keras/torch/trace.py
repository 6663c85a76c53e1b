"""The Keras frontend on the torch backend: trace ``train_on_batch`` / ``predict_on_batch`` under fake tensors.

A Keras model cannot be built under FakeTensorMode, so it is built for real (its variables only) and its
step is traced with fake tensors: every Keras variable's torch Parameter (model, optimizer, metrics) is
swapped for a fake one for the trace and put back afterwards, the data become fake tensors, and the same
storage-level :class:`StepTracker` as the PyTorch frontend records the step, with the same CPU kernel
workspace rules (the ops are aten ops either way). Layers are named by wrapping ``Layer.__call__``;
phases come from ``Tensor.backward`` and ``optimizer.apply``.

Python's cyclic garbage collector: Keras leaves some layer outputs in reference cycles (closures of the
functional graph), which CPython frees only when the collector runs, so the peak of a step varies between
runs by up to the size of those outputs. Estimate and measurement therefore use one convention: the step
starts after ``gc.collect()`` and the collector does not run inside it (:func:`nnmem.frontends.keras.common.no_gc`).

Steady state as Keras has it on torch: the torch trainer zeroes gradients *after* the forward pass
(``self.zero_grad()`` in ``train_step``), so the previous step's gradients are live through the forward.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import keras
import torch

from nnmem.errors import TraceError
from nnmem.frontends.keras.common import KerasStep, flat_arrays, layer_infos, no_gc, resident_variables
from nnmem.frontends.pytorch.measure import _quiet_stderr, allocator_rise, storage_bytes
from nnmem.frontends.pytorch.tracker import OpRules, StepTracker
from nnmem.report.model import Report, report_from_trace
from nnmem.trace import Category, Phase, Trace

__all__ = ["trace_step", "measure_step"]


def _rules() -> OpRules | None:
    from nnmem.frontends.pytorch import workspace

    return workspace.RULES  # type: ignore[return-value]


class KerasTracker(StepTracker):
    """A StepTracker whose layer names are Keras layer paths."""

    def __init__(self, rules: OpRules | None = None) -> None:
        super().__init__(torch.nn.Module(), rules)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is _LOCAL_SCALAR and _is_fake(args[0]):
            # A fake tensor has no value. Keras reads one in ``ops.cond`` (the loss-scale optimizer's "are the
            # gradients finite?"): the step nnmem traces is the usual one, where they are (True / 1).
            return True if args[0].dtype == torch.bool else 1
        return super().__torch_dispatch__(func, types, args, kwargs)

    @contextmanager
    def layer_hooks(self) -> Iterator[None]:
        original = keras.layers.Layer.__call__
        tracker = self

        @functools.wraps(original)
        def call(layer: Any, *args: Any, **kwargs: Any) -> Any:
            path = str(getattr(layer, "path", None) or layer.name)
            tracker._stack.append(path)
            try:
                out = original(layer, *args, **kwargs)
            finally:
                tracker._stack.pop()
            if tracker.phase is Phase.FORWARD:
                nbytes = sum(t.untyped_storage().nbytes() for t in _tensors(out))
                tracker._layer_out[path] = tracker._layer_out.get(path, 0) + nbytes
            return out

        keras.layers.Layer.__call__ = call  # type: ignore[method-assign]
        try:
            yield
        finally:
            keras.layers.Layer.__call__ = original  # type: ignore[method-assign]


_LOCAL_SCALAR = torch.ops.aten._local_scalar_dense.default


def _is_fake(t: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in keras.tree.flatten(value) if isinstance(t, torch.Tensor)]


@contextmanager
def _phases(tracker: StepTracker, model: Any) -> Iterator[None]:
    """Move the tracker to BACKWARD at ``loss.backward()`` and to OPTIMIZER at ``optimizer.apply``."""
    backward = torch.Tensor.backward

    def traced_backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        tracker.begin(Phase.BACKWARD)
        return backward(self, *args, **kwargs)

    opt = getattr(model, "optimizer", None)
    with ExitStack() as stack:
        torch.Tensor.backward = traced_backward  # type: ignore[method-assign]
        stack.callback(setattr, torch.Tensor, "backward", backward)
        if opt is not None:
            apply = opt.apply

            def traced_apply(*args: Any, **kwargs: Any) -> Any:
                tracker.begin(Phase.OPTIMIZER)
                return apply(*args, **kwargs)

            opt.apply = traced_apply
            stack.callback(delattr, opt, "apply")
        yield


def _all_variables(model: Any) -> list[Any]:
    seen: dict[int, Any] = {}
    opt = getattr(model, "optimizer", None)
    for v in [*model.variables, *(opt.variables if opt is not None and opt.built else []),
              *model.metrics_variables]:
        seen.setdefault(id(v), v)
    return list(seen.values())


@contextmanager
def _fake_variables(model: Any, make: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[None]:
    """Swap every Keras variable's torch value (and the modules' registered Parameters) for ``make(value)``."""
    swapped: dict[int, torch.nn.Parameter] = {}
    restore: list[tuple[Any, Any]] = []
    for v in _all_variables(model):
        old = v._value
        if not isinstance(old, torch.Tensor):
            continue
        new = torch.nn.Parameter(make(old.detach()), requires_grad=old.requires_grad)
        swapped[id(old)] = new
        restore.append((v, old))
        v._value = new
    tables: list[tuple[dict[str, Any], str, Any]] = []
    for module in model.modules():
        for name, value in module._parameters.items():
            if value is not None and id(value) in swapped:
                tables.append((module._parameters, name, value))
                module._parameters[name] = swapped[id(value)]
    try:
        yield
    finally:
        for v, old in restore:
            v._value = old
        for table, name, value in tables:
            table[name] = value


def _empty_like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")


def _as_torch(value: Any, make: Callable[[Any], torch.Tensor]) -> Any:
    return keras.tree.map_structure(make, value) if value is not None else None


def _run(step: KerasStep, x: Any, y: Any) -> None:
    model = step.model
    if step.mode == "train":
        model.train_on_batch(x, y)
    else:
        model.make_predict_function()
        with torch.no_grad():
            model.predict_function([(x,)])


def _call(step: KerasStep, x: Any, y: Any) -> None:
    try:
        with no_gc():
            _run(step, x, y)
    except (RuntimeError, ValueError, TypeError, IndexError) as err:
        shapes = ", ".join(f"{tuple(a.shape)} {str(a.dtype).replace('torch.', '')}" for a in flat_arrays(x))
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise TraceError(f"the Keras model rejected inputs [{shapes}]: {first}") from err


def _register(tracker: StepTracker, step: KerasStep, x: Any, y: Any) -> None:
    for v, category, layer in resident_variables(step.model, step.mode):
        tracker.add_resident(v._value, category, layer)
        if step.mode == "train" and v.trainable and v._value.grad is not None:
            tracker.add_resident(v._value.grad, Category.GRADIENTS, layer)
    for leaf in flat_arrays((x, y)):
        if isinstance(leaf, torch.Tensor):
            tracker.add_resident(leaf, Category.INPUTS)


def _traced(step: KerasStep, x: Any, y: Any, rules: OpRules | None, meta: dict[str, object]) -> Trace:
    tracker = KerasTracker(rules)
    tracker.training = step.mode == "train"
    _register(tracker, step, x, y)
    owner = {id(v._value): layer for v, _, layer in resident_variables(step.model, step.mode)}
    with tracker, tracker.layer_hooks(), _phases(tracker, step.model):
        tracker.begin(Phase.FORWARD)
        _call(step, x, y)
    if step.mode == "train":
        for v in step.model.trainable_variables:
            grad = v._value.grad
            if grad is not None:
                tracker.set_category(grad, Category.GRADIENTS, owner.get(id(v._value), ""))
    trace = tracker.finish(step.mode, layer_infos(step.model), dict(meta))
    return Trace("keras-torch", trace.mode, trace.blocks, trace.ops, trace.layers, trace.meta)


def trace_step(step: KerasStep, *, meta: dict[str, object]) -> Trace:
    """Trace one Keras step under FakeTensorMode; nothing batch-sized is allocated."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    model = step.model
    with FakeTensorMode(allow_non_fake_inputs=True), _fake_variables(model, _empty_like):
        x = _as_torch(step.x, _fake_data)
        y = _as_torch(step.y, _fake_data)
        if step.mode == "train":
            for v in model.trainable_variables:  # the previous step's gradients, live until after the forward
                v._value.grad = torch.zeros_like(v._value)
        try:
            return _traced(step, x, y, _rules(), meta)
        finally:
            for v in model.trainable_variables:
                v._value.grad = None


def _fake_data(a: Any) -> torch.Tensor:
    dtype = _torch_dtype(a)
    return torch.empty(tuple(int(d) for d in a.shape), dtype=dtype, device="cpu")


def _torch_dtype(a: Any) -> torch.dtype:
    if isinstance(a, torch.Tensor):
        return a.dtype
    name = keras.backend.standardize_dtype(a.dtype)
    return getattr(torch, name)  # type: ignore[no-any-return]


def measure_step(step: KerasStep, *, name: str, meta: dict[str, object]) -> Report:
    """Run the Keras step for real (call inside a child process): tensor level by the tracker, allocator by the
    profiler's ``[memory]`` events (the profiled steps run without the tracker)."""
    from torch.profiler import ProfilerActivity, profile

    x = _as_torch(step.x, lambda a: torch.as_tensor(a))
    y = _as_torch(step.y, lambda a: torch.as_tensor(a))
    for _ in range(2 if step.mode == "train" else 1):
        _call(step, x, y)
    trace = _traced(step, x, y, None, meta)
    resident = _live_bytes(step, x, y)
    with _quiet_stderr():
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
            _call(step, x, y)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            _call(step, x, y)
    notes: tuple[str, ...] = ()
    if resident != trace.resident_bytes:
        notes = (f"live storages before the step: {resident} B counted directly, "
                 f"{trace.resident_bytes} B by the tracker",)
    return report_from_trace(trace, source="measure", model=name, device="cpu",
                             overrides={"allocator": resident + allocator_rise(prof)}, notes=notes)


def live_variable_bytes(model: Any) -> int:
    """Bytes of the storages of every Keras variable (model, optimizer, metrics) and their gradients."""
    return storage_bytes(_variable_tensors(model))


def _variable_tensors(model: Any) -> list[Any]:
    tensors: list[Any] = []
    for v in _all_variables(model):
        tensors.append(v._value)
        if v._value.grad is not None:
            tensors.append(v._value.grad)
    return tensors


def _live_bytes(step: KerasStep, x: Any, y: Any) -> int:
    return storage_bytes([*_variable_tensors(step.model), *flat_arrays((x, y))])

