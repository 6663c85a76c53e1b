"""The Keras frontend's entry points: estimate, measure and the batch tracer, on whichever backend runs.

Keras picks its backend once per process (``KERAS_BACKEND``); each backend has its own tracer and
measurer module with one contract (``trace_step(step, meta=...) -> Trace``, ``measure_step(step, name=...,
meta=...) -> Report``). Estimates and measurements are CPU steps at the allocator level.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

import keras

from nnmem.errors import ConfigError, MeasureError, UnsupportedError
from nnmem.frontends.keras.common import KerasStep, is_keras_model, optimizer_label, prepare
from nnmem.report.model import Report, report_from_trace
from nnmem.trace import Trace

__all__ = ["is_keras_model", "estimate_keras", "measure_keras", "tracer", "backend_module", "from_factory"]

BACKENDS = ("torch", "jax", "tensorflow")


def backend_module(part: str, name: str | None = None) -> Any:
    """A backend's ``trace`` module (``trace_step``) or ``measure`` module (``measure_step``), on this
    process's Keras backend by default."""
    name = name or str(keras.backend.backend())
    if name not in BACKENDS:
        raise UnsupportedError(f"the Keras backend {name!r} is not supported: use torch, jax or tensorflow")
    return importlib.import_module(f"nnmem.frontends.keras.{name}.{part}")


def _unpack(inputs: Any) -> Any:
    """Our API passes inputs as a tuple of positional arguments; Keras takes x (one array, or a list)."""
    if isinstance(inputs, tuple):
        return inputs[0] if len(inputs) == 1 else list(inputs)
    return inputs


def _check_device(device: str) -> None:
    if device.strip().lower() != "cpu":
        raise UnsupportedError(f"Keras steps are estimated for device 'cpu' only in this version "
                               f"(received {device!r}); the CUDA allocator model covers PyTorch models")


def _meta(step: KerasStep, batch: int | None) -> dict[str, object]:
    meta: dict[str, object] = {"batch": batch or step.batch, "keras": keras.__version__,
                               "keras_backend": str(keras.backend.backend()),
                               "dtype_policy": str(step.model.dtype_policy.name)}
    if step.mode == "train":
        meta["optimizer"] = optimizer_label(step.model)
    return meta


def estimate_keras(model: Any, inputs: Any, *, mode: str, optimizer: Any, loss_fn: Any, target: Any,
                   device: str, name: str, batch: int | None, notes: tuple[str, ...] = ()) -> Report:
    """Estimate a Keras ``train_on_batch`` / ``predict_on_batch`` step on this process's backend."""
    _check_device(device)
    step = prepare(model, _unpack(inputs), target, mode=mode, optimizer=optimizer, loss=loss_fn)
    trace = backend_module("trace").trace_step(step, meta=_meta(step, batch))
    if trace.meta.get("while_loops"):
        notes = (*notes, "sequential schedule: TensorFlow's default executor runs while-loop iterations "
                         "concurrently and orders ops by their measured cost, so this step can peak above the "
                         "estimate there (keras_lstm train: up to 3.3x on one inter-op thread)")
    if trace.framework == "keras-tensorflow":
        notes = (*notes, "schedule: ops in the graph's construction order, as `nnmem measure` pins them; a plain "
                         "train_on_batch runs Grappler's rewrites and an op order that follows heap addresses, so "
                         "its peak can differ between processes (keras_separable_cnn train at batch 32: 20.1-30.5 "
                         "MB in 22 processes, 19.9 MB estimated, 20.1 MB pinned)",
                         "BFC layout: the estimate replays TensorFlow's allocator from the model's build; holes "
                         "the rest of the setup leaves can hand a tensor a chunk up to 2x its size")
    return report_from_trace(trace, source="estimate", model=name, device="cpu", notes=notes)


def measure_keras(model: Any, inputs: Any, *, mode: str, optimizer: Any, loss_fn: Any, target: Any,
                  device: str, name: str, batch: int | None, timeout_s: float | None,
                  factory: Callable[[int], Any] | None = None) -> Report:
    """Run the Keras step for real in a child process on this process's backend.

    The model travels to the child as its Keras config (``keras.saving.serialize_keras_object``) with the
    classes of its custom layers, and the child builds it afresh — random initial weights, built the way the
    caller's model was, so TensorFlow's allocator sees the same variables and initializer temporaries (a model
    pickled with its weights arrived with variables re-pointed at the loaded arrays, outside the allocator:
    keras.applications MobileNetV2 inference measured 17 % low). Custom layers need a ``get_config`` when their
    constructor takes more than plain values; or give a factory (a MODEL spec), which the child calls itself.
    """
    from nnmem.runner.child import run_in_child

    _check_device(device)
    backend = str(keras.backend.backend())
    payload = _model_payload(model) if factory is None else None

    def work() -> dict[str, Any]:
        os.environ["KERAS_BACKEND"] = backend
        os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")  # before TensorFlow is first imported
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        from nnmem.frontends.keras import frontend as here

        if backend == "tensorflow":  # the sequential executor's inter-op pool, set before TF starts
            here.backend_module("measure", backend).sequential_runtime()

        if factory is not None:
            m, x, y, loss = here.from_factory(factory, batch or 1)
            x = x if inputs is None else _unpack(inputs)
            y = y if target is None else target
            lf = loss_fn if loss_fn is not None else loss
        else:
            assert payload is not None
            m, x, y, lf = here.model_from_payload(payload), _unpack(inputs), target, loss_fn
        step = here.prepare(m, x, y, mode=mode, optimizer=optimizer, loss=lf)
        measured = here.backend_module("measure", backend).measure_step(step, name=name, meta=here._meta(step, batch))
        return measured.to_dict()

    preload = None
    if backend == "jax":  # the exact malloc peak needs the counting library loaded at the child's start
        from nnmem.runner.mallocpeak import library

        preload = library()
    return Report.from_dict(run_in_child(work, timeout_s=timeout_s, preload=preload,
                                         env={"KERAS_BACKEND": backend}))


def _first_line(err: BaseException) -> str:
    """The first line of an exception's message (up to 200 characters), or its type's name when it has none."""
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__


def _model_payload(model: Any) -> bytes:
    """The model's config, the classes it needs and whether its optimizer has state, pickled for the child."""
    import cloudpickle

    try:
        config = keras.saving.serialize_keras_object(model)
        payload = cloudpickle.dumps((config, _custom_objects(model), _optimizer_built(model)))
    except Exception as err:
        raise MeasureError(f"the Keras model cannot be sent to the measuring child process ({_first_line(err)}): "
                           "give custom layers and models a get_config() (keras.saving.register_keras_serializable), "
                           "or measure a MODEL spec 'file.py:factory'") from err
    return payload  # type: ignore[no-any-return]


def _custom_objects(model: Any) -> dict[str, Any]:
    """The model's own layer and model classes (not Keras's), by class name and by registered name."""
    objects: dict[str, Any] = {}
    for layer in model._flatten_layers(include_self=True, recursive=True):
        cls = type(layer)
        if cls.__module__.split(".")[0] == "keras":
            continue
        objects[cls.__name__] = cls
        objects[keras.saving.get_registered_name(cls)] = cls
    return objects


def _optimizer_built(model: Any) -> bool:
    optimizer = getattr(model, "optimizer", None)
    return bool(optimizer is not None and getattr(optimizer, "built", False))


def model_from_payload(payload: bytes) -> Any:
    """Build the model of :func:`_model_payload` afresh: from its config, compiled as the caller's was, its
    optimizer's state built only where the caller's optimizer had state."""
    import cloudpickle

    config, objects, optimizer_built = cloudpickle.loads(payload)
    config = dict(config)
    compile_config = config.pop("compile_config", None)
    try:
        with keras.saving.custom_object_scope(objects):
            model = keras.saving.deserialize_keras_object(config, custom_objects=objects)
            if compile_config:
                if type(model).compile is keras.Model.compile:
                    model.compile(**keras.saving.deserialize_keras_object(compile_config))
                else:  # a custom compile: Keras's own loading calls it the same way (or warns)
                    model.compile_from_config(compile_config)
    except Exception as err:
        raise MeasureError("the measuring child process cannot rebuild the Keras model from its config "
                           f"({_first_line(err)}): "
                           "register custom classes with keras.saving.register_keras_serializable and give them "
                           "a get_config(), or measure a MODEL spec 'file.py:factory'") from err
    if optimizer_built and getattr(model, "optimizer", None) is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    return model


def from_factory(factory: Callable[[int], Any], batch: int) -> tuple[Any, Any, Any, Any]:
    """Call a Keras factory: ``factory(batch) -> model`` or ``(model, x[, y[, loss]])``."""
    from nnmem.loader import build

    built = build(factory, batch)
    if not is_keras_model(built.model):
        raise ConfigError(f"expected the factory to return a keras.Model. Received: {type(built.model).__name__}")
    x = _unpack(built.inputs) if built.inputs is not None else None
    return built.model, x, built.target, built.loss_fn


def tracer(model: Any, inputs: Any, *, spec: str | None, input_shape: Any, mode: str, optimizer: Any,
           loss_fn: Any, target: Any, factory: Callable[[int], Any] | None = None) -> Callable[[int], Trace]:
    """A function batch → Trace of the Keras step at that batch (inputs and target rebatched as zeros)."""
    import numpy as np

    if factory is not None:
        model, x0, y0, loss0 = from_factory(factory, 1)
        inputs = inputs if inputs is not None else x0
        target = target if target is not None else y0
        loss_fn = loss_fn if loss_fn is not None else loss0
    if input_shape:
        inputs = [np.zeros((1, *s), "float32") for s in input_shape]
    x = _unpack(inputs)
    if x is None:
        raise ConfigError("expected inputs x whose first dimension is the batch, to rescale them")

    def rebatch(value: Any, b: int) -> Any:
        if value is None:
            return None
        return keras.tree.map_structure(lambda a: np.zeros((b, *a.shape[1:]), dtype=_np_dtype(a)), value)

    def trace_at(b: int) -> Trace:
        step = prepare(model, rebatch(x, b), rebatch(target, b), mode=mode, optimizer=optimizer, loss=loss_fn)
        return backend_module("trace").trace_step(step, meta={**_meta(step, b), "batch": b})  # type: ignore[no-any-return]

    return trace_at


def _np_dtype(a: Any) -> Any:
    name = keras.backend.standardize_dtype(a.dtype)
    return "float32" if name == "bfloat16" else name
