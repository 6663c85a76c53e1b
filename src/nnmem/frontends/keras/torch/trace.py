"""Estimate a Keras step on torch: trace ``train_on_batch`` / ``predict_on_batch`` under fake tensors.

A Keras model cannot be built under FakeTensorMode, so it is built for real (its variables only); for the trace
every Keras variable's torch Parameter (model, optimizer, metrics) is swapped for a fake one and put back
afterwards, the data become fake tensors, and the PyTorch frontend's storage-level :class:`StepTracker` records
the aten ops with the rules of :mod:`.scratch`. Layers are named by wrapping ``Layer.__call__``; phases come from
``Tensor.backward`` and ``optimizer.apply``. A real step starts after ``gc.collect()``, and the collector does not run
inside it (:func:`nnmem.frontends.keras.common.no_gc`): Keras leaves some layer outputs in reference cycles. As the
torch trainer has it (``keras/src/backend/torch/trainer.py``, ``train_step``), gradients are zeroed *after* the
forward pass, so the previous step's gradients are live through it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from typing import Any

import keras
import torch
from torch.utils.flop_counter import FlopCounterMode

from nnmem.errors import TraceError, first_line
from nnmem.frontends.keras.common import KerasStep, flat_arrays, layer_infos, no_gc, resident_variables
from nnmem.frontends.keras.torch.scratch import rules
from nnmem.frontends.pytorch.tracker import OpRules, StepTracker
from nnmem.trace import Category, Phase, Trace

__all__ = ["trace_step", "KerasTracker", "all_variables", "as_torch", "call_step", "trace_call"]

_LOCAL_SCALAR = torch.ops.aten._local_scalar_dense.default


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


def all_variables(model: Any) -> list[Any]:
    """Every Keras variable of the model, its built optimizer and its metrics, once each."""
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
    for v in all_variables(model):
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


def as_torch(value: Any, make: Callable[[Any], torch.Tensor]) -> Any:
    """``make`` applied to each array of a Keras data structure (None stays None)."""
    return keras.tree.map_structure(make, value) if value is not None else None


def _run(step: KerasStep, x: Any, y: Any) -> None:
    model = step.model
    if step.mode == "train":
        model.train_on_batch(x, y)
    else:
        model.make_predict_function()
        with torch.no_grad():
            model.predict_function([(x,)])


def call_step(step: KerasStep, x: Any, y: Any, *, collect: bool = True) -> None:
    """Run the step once on ``x`` and ``y`` with the garbage collector off (after a collection: ``collect``).

    Raises:
        TraceError: the model rejects the inputs.
    """
    try:
        with no_gc(collect=collect):
            _run(step, x, y)
    except (RuntimeError, ValueError, TypeError, IndexError) as err:
        shapes = ", ".join(f"{tuple(a.shape)} {str(a.dtype).replace('torch.', '')}" for a in flat_arrays(x))
        first = first_line(err)
        raise TraceError(f"the Keras model rejected inputs [{shapes}]: {first}") from err


def _register(tracker: StepTracker, step: KerasStep, x: Any, y: Any) -> None:
    for v, category, layer in resident_variables(step.model, step.mode):
        tracker.add_resident(v._value, category, layer)
        if step.mode == "train" and v.trainable and v._value.grad is not None:
            tracker.add_resident(v._value.grad, Category.GRADIENTS, layer)
    for leaf in flat_arrays((x, y)):
        if isinstance(leaf, torch.Tensor):
            tracker.add_resident(leaf, Category.INPUTS)


def trace_call(step: KerasStep, x: Any, y: Any, rules: OpRules | None, meta: dict[str, object], *,
               count_flops: bool = False) -> Trace:
    """Trace one call of the step on ``x`` and ``y`` (fake tensors with ``rules``, or real ones without).

    ``count_flops``: also count the step's FLOPs (``meta["flops"]``) with torch's ``FlopCounterMode``, for a
    fake trace only (its module hooks would add to a measured step).
    """
    tracker = KerasTracker(rules)
    tracker.training = step.mode == "train"
    _register(tracker, step, x, y)
    owner = {id(v._value): layer for v, _, layer in resident_variables(step.model, step.mode)}
    counter = FlopCounterMode(display=False) if count_flops else nullcontext()
    with counter, tracker, tracker.layer_hooks(), _phases(tracker, step.model):
        tracker.begin(Phase.FORWARD)
        call_step(step, x, y, collect=rules is None)  # fake tensors (with rules): no real garbage to collect
    if step.mode == "train":
        for v in step.model.trainable_variables:
            grad = v._value.grad
            if grad is not None:
                tracker.set_category(grad, Category.GRADIENTS, owner.get(id(v._value), ""))
    if isinstance(counter, FlopCounterMode):
        meta = {**meta, "flops": int(counter.get_total_flops()),
                "flops_counter": "torch's FlopCounterMode on the step's aten ops: matmuls, convolutions, attention"}
    trace = tracker.finish(step.mode, layer_infos(step.model), dict(meta))
    return Trace("keras-torch", trace.mode, trace.blocks, trace.ops, trace.layers, trace.meta)


def trace_step(step: KerasStep, *, meta: dict[str, object]) -> Trace:
    """Trace one Keras step under FakeTensorMode; nothing batch-sized is allocated."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from nnmem.frontends.pytorch.checkpointing import traced_rng_states

    model = step.model
    # traced_rng_states: a model built under keras.RematScope checkpoints its layers with torch.utils.checkpoint,
    # which keeps a generator state per region until its backward
    with FakeTensorMode(allow_non_fake_inputs=True), _fake_variables(model, _empty_like), traced_rng_states():
        x = as_torch(step.x, _fake_data)
        y = as_torch(step.y, _fake_data)
        if step.mode == "train":
            for v in model.trainable_variables:  # the previous step's gradients, live until after the forward
                v._value.grad = torch.zeros_like(v._value)
        step_rules = rules()
        try:
            trace = trace_call(step, x, y, step_rules, meta, count_flops=True)
        finally:
            for v in model.trainable_variables:
                v._value.grad = None
    if step_rules.notes:  # kernel paths this CPU takes that no rule models: the report says so
        trace.meta["unmodelled"] = "\n".join(step_rules.notes)
    return trace


def _fake_data(a: Any) -> torch.Tensor:
    dtype = _torch_dtype(a)
    return torch.empty(tuple(int(d) for d in a.shape), dtype=dtype, device="cpu")


def _torch_dtype(a: Any) -> torch.dtype:
    if isinstance(a, torch.Tensor):
        return a.dtype
    name = keras.backend.standardize_dtype(a.dtype)
    return getattr(torch, name)  # type: ignore[no-any-return]
