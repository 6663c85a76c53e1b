"""What every Keras backend shares: building the optimizer, preparing a model for a step, its variables.

A Keras step is ``model.train_on_batch(x, y)`` with the model's compiled optimizer and loss (or the ones
given), or ``model.predict_on_batch(x)``. Steady state means the model is built, the optimizer has built
its state for the trainable variables and the compiled metrics exist — as after a first ``fit`` batch.
Building the optimizer's state allocates it for real (a Keras optimizer creates its variables eagerly);
everything batch-sized is left to the backend's tracer.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np

from nnmem import optimizers
from nnmem.errors import ConfigError, TraceError, first_line
from nnmem.trace import Category, LayerInfo

__all__ = ["KerasStep", "accumulating", "accumulation_steps", "array_nbytes", "backend_name", "cycle_peaks",
           "flat_arrays", "is_keras_model", "layer_infos", "make_optimizer", "measured_cycle", "no_gc",
           "optimizer_label", "prepare", "resident_variables", "settle_loss_scale", "skipped_updates_note",
           "updates_applied", "variable_nbytes", "warm_up"]

def backend_name() -> str:
    """The Keras backend in this process: "torch", "jax" or "tensorflow"."""
    return str(keras.backend.backend())


def is_keras_model(model: Any) -> bool:
    return isinstance(model, keras.Model)


def make_optimizer(optimizer: Any) -> keras.optimizers.Optimizer:
    """A Keras optimizer for a name (class and arguments from ``nnmem.optimizers``), a class or an instance."""
    if isinstance(optimizer, keras.optimizers.Optimizer):
        return optimizer
    if isinstance(optimizer, str):
        build = optimizers.get(optimizer, "keras").build("keras")
        return getattr(keras.optimizers, build.class_name)(**build.kwargs)
    if isinstance(optimizer, type) and issubclass(optimizer, keras.optimizers.Optimizer):
        return optimizer()
    raise ConfigError(f"expected an optimizer name ({', '.join(optimizers.names('keras'))}) or a "
                      f"keras.optimizers.Optimizer. Received: {optimizer!r}")


def accumulating(optimizer: Any, steps: int) -> keras.optimizers.Optimizer:
    """A fresh copy of ``optimizer`` (a name, class or instance; a ``LossScaleOptimizer``'s inner one, which
    ``compile`` wraps again under ``mixed_float16``) with ``gradient_accumulation_steps=steps``: Keras's gradient
    accumulation, one update every ``steps`` calls of ``train_on_batch`` (1: every call, no accumulation)."""
    opt = make_optimizer(optimizer)
    opt = getattr(opt, "inner_optimizer", None) or opt
    return type(opt).from_config({**opt.get_config(), "gradient_accumulation_steps": steps if steps > 1 else None})


def accumulation_steps(model: Any) -> int:
    """How many ``train_on_batch`` calls the compiled optimizer accumulates gradients over before it updates the
    variables (``gradient_accumulation_steps``; 1: it updates on every call)."""
    opt = getattr(model, "optimizer", None)
    for o in (opt, getattr(opt, "inner_optimizer", None)):
        steps = getattr(o, "gradient_accumulation_steps", None)
        if steps:
            return int(steps)
    return 1


def measured_cycle(step: KerasStep) -> int:
    """Steps a measurement takes together as one: a training step's accumulation cycle, else 1."""
    return accumulation_steps(step.model) if step.mode == "train" else 1


SETTLE_STEPS = 20
"""Warm-up steps a loss-scaled step may take beyond the usual ones until one applies its update (its scale starts at
2**15 and halves on each overflow)."""


def updates_applied(model: Any) -> int | None:
    """How many updates a ``LossScaleOptimizer`` has applied (its ``iterations``); None for any other optimizer.

    Such an optimizer skips the update of a step whose scaled float16 gradients are not finite and halves its
    scale: that step holds no update temporaries and peaks lower than the steps training runs once the scale has
    settled, the ones that decide an OOM."""
    opt = getattr(model, "optimizer", None)
    if not isinstance(opt, keras.optimizers.LossScaleOptimizer):
        return None
    return int(np.asarray(keras.ops.convert_to_numpy(opt.iterations)))


def warm_up(step: KerasStep, run: Callable[[], Any], first: Callable[[], Any] | None = None) -> int | None:
    """The steps before a measured one: 2 training steps (1 inference step; the first builds and compiles), then
    :func:`settle_loss_scale`. ``first`` runs the first of them where it differs from ``run`` (TensorFlow's pinned
    diagnostic traces the step's function afresh there). Returns :func:`updates_applied` after them."""
    for i in range(2 if step.mode == "train" else 1):
        (first if i == 0 and first is not None else run)()
    return settle_loss_scale(step, run)


def settle_loss_scale(step: KerasStep, run: Callable[[], Any]) -> int | None:
    """Under a ``LossScaleOptimizer``, training steps until one applies its update (at most
    :data:`SETTLE_STEPS`). Returns :func:`updates_applied` after them (None: no loss scale, or inference)."""
    before = updates_applied(step.model) if step.mode == "train" else None
    for _ in range(SETTLE_STEPS if before is not None else 0):
        run()
        after = updates_applied(step.model)
        if after is not None and before is not None and after > before:
            return after
        before = after
    return before


def skipped_updates_note(step: KerasStep, before: int | None, calls: int) -> tuple[str, ...]:
    """A note when measured steps skipped their update (loss scale overflow): ``before`` is
    :func:`updates_applied` before the ``calls`` measured steps."""
    after = updates_applied(step.model)
    if before is None or after is None or step.mode != "train":
        return ()
    expected = calls // accumulation_steps(step.model)  # `iterations` counts updates, one per cycle
    if after - before >= expected:
        return ()
    return (f"{expected - (after - before)} of the {expected} measured updates were skipped: the loss scale "
            "overflowed float16 there, and a skipped step peaks lower than the ones training runs",)


def cycle_peaks(peaks: list[int], steps: int) -> list[int]:
    """The highest of each run of ``steps`` consecutive steps' ``peaks`` (an accumulation cycle holds one
    update step and ``steps - 1`` that only add to the accumulators; the update decides an OOM); ``peaks`` as
    they are for 1."""
    if steps <= 1:
        return list(peaks)
    return [max(peaks[i:i + steps]) for i in range(0, len(peaks) - steps + 1, steps)]


def optimizer_label(model: keras.Model) -> str:
    """Display name of the compiled optimizer, e.g. "adam" or "LossScaleOptimizer(adam)".

    A registry optimizer is shown by its ``nnmem.optimizers`` name (an SGD with momentum is "momentum"),
    any other by its lower-cased class name.
    """
    opt = getattr(model, "optimizer", None)
    if opt is None:
        return ""
    inner = getattr(opt, "inner_optimizer", None)
    if inner is not None:
        return f"LossScaleOptimizer({type(inner).__name__.lower()})"
    spec = optimizers.find("keras", type(opt).__name__, lambda key: getattr(opt, key, None))
    return spec.name if spec is not None else type(opt).__name__.lower()


@dataclass(frozen=True, slots=True)
class KerasStep:
    """A prepared step: the model (compiled, built, optimizer state built) and its data.

    Attributes:
        model: the Keras model.
        x: the inputs as given (numpy arrays or backend tensors, a structure of them).
        y: the targets (None for inference).
        mode: "train" or "infer".
        batch: the leading dimension of the inputs.
    """

    model: Any
    x: Any
    y: Any
    mode: str
    batch: int | None


def flat_arrays(value: Any) -> list[Any]:
    """The array leaves of a structure (anything with ``shape`` and ``dtype``)."""
    return [leaf for leaf in keras.tree.flatten(value) if hasattr(leaf, "shape") and hasattr(leaf, "dtype")]


def array_nbytes(value: Any) -> int:
    """Bytes of an array-like (numpy, backend tensor, Keras variable, shape struct)."""
    shape = tuple(int(d) for d in value.shape)
    dtype = keras.backend.standardize_dtype(value.dtype)
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype if dtype != "bfloat16" else "float16").itemsize


def variable_nbytes(variable: Any) -> int:
    return array_nbytes(variable)


def _batch_of(x: Any) -> int | None:
    leaves = flat_arrays(x)
    return int(leaves[0].shape[0]) if leaves and len(leaves[0].shape) else None


def prepare(model: Any, x: Any, y: Any, *, mode: str, optimizer: Any = None, loss: Any = None,
            accumulate: int = 1) -> KerasStep:
    """Compile (when needed), build the model and the optimizer's state; nothing batch-sized is allocated.

    Args:
        model: a Keras 3 model (Sequential, functional or subclassed).
        x: the inputs; y: the targets (required for a train step).
        mode: "train" or "infer".
        optimizer: overrides the compiled optimizer (a name, class or instance); None keeps it.
        loss: overrides the compiled loss; None keeps it.
        accumulate: above 1, the optimizer (given or compiled) accumulates gradients over this many
            ``train_on_batch`` calls (``gradient_accumulation_steps``); ``x`` and ``y`` are one micro-batch.
            1 keeps an optimizer's own accumulation.

    Raises:
        ConfigError: a train step of a model with no loss, no target or no trainable variables.
    """
    if x is None:
        raise ConfigError("expected inputs x: an array (or a structure of arrays) the model is called with")
    if mode == "train":
        if y is None:
            raise ConfigError("a Keras train step needs a target: pass target=y (the y of train_on_batch)")
        if optimizer is not None or loss is not None or not model.compiled or \
                accumulate not in (1, accumulation_steps(model)):
            compiled_loss = getattr(model, "loss", None) if model.compiled else None
            use_loss = loss if loss is not None else compiled_loss
            if use_loss is None:
                raise ConfigError("the Keras model is not compiled with a loss: compile it, or pass loss_fn= "
                                  "(a Keras loss name such as 'mse' or a loss object)")
            chosen = optimizer if optimizer is not None else (
                model.optimizer if model.compiled and model.optimizer is not None else "sgd")
            use_opt = accumulating(chosen, accumulate) if accumulate > 1 else make_optimizer(chosen)
            model.compile(optimizer=use_opt, loss=use_loss)
        if not model.trainable_variables and model.built:
            raise ConfigError("mode='train' needs trainable variables, but every layer of the model is frozen")
    _build(model, x)
    if mode == "train":
        if not model.trainable_variables:
            raise ConfigError("mode='train' needs trainable variables, but every layer of the model is frozen")
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        # What the first train_on_batch builds from the data's shapes (compiled loss and metrics), built
        # now with symbolic tensors so that a traced step is a steady-state one.
        try:
            model._symbolic_build(data_batch=(x, y))
        except (ValueError, TypeError, IndexError, RuntimeError) as err:
            raise TraceError(f"the Keras model rejected inputs [{_shapes_text(x)}]: {first_line(err, 300)}") from err
    return KerasStep(model, x, y, mode, _batch_of(x))


def _shapes_text(x: Any) -> str:
    return ", ".join(f"{tuple(int(d) for d in a.shape)} {keras.backend.standardize_dtype(a.dtype)}"
                     for a in flat_arrays(x))


def _build(model: Any, x: Any) -> None:
    if model.built and all(getattr(layer, "built", True) for layer in model._flatten_layers()):
        return
    shapes = keras.tree.map_structure(lambda a: tuple(int(d) for d in a.shape), x)
    try:  # a symbolic call builds every layer (allocating its variables only), also in subclassed models
        model(keras.tree.map_structure(lambda a: keras.KerasTensor((None, *a.shape[1:]), dtype=str(a.dtype)), x))
    except Exception as err:  # a subclassed model whose build() cannot infer the graph
        raise TraceError(f"the Keras model could not be built for inputs {shapes}: {type(err).__name__}: "
                         f"{str(err).strip().splitlines()[0] if str(err).strip() else ''} — call the model once "
                         "(or model.build(input_shape)) before estimating") from err


def _walk(model: Any) -> Iterator[tuple[str, Any]]:
    """(path, layer) for the model's layers, outermost first; paths are Keras layer paths."""
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if isinstance(layer, keras.layers.InputLayer):
            continue
        yield str(getattr(layer, "path", None) or layer.name), layer


def layer_infos(model: Any) -> tuple[LayerInfo, ...]:
    """Per-layer static facts: the variables each layer owns directly (shared ones counted once)."""
    seen: set[int] = set()
    infos = []
    for path, layer in _walk(model):
        count = nbytes = 0
        shapes = []
        own = [*layer._trainable_variables, *layer._non_trainable_variables]
        for v in own:
            if id(v) in seen:
                continue
            seen.add(id(v))
            n = int(np.prod(v.shape, dtype=np.int64))
            count += n
            nbytes += variable_nbytes(v)
            shapes.append(tuple(int(d) for d in v.shape))
        infos.append(LayerInfo(path, type(layer).__name__, count, nbytes, 0, tuple(shapes)))
    return tuple(infos)


def variable_owner(model: Any) -> dict[int, str]:
    """id of each variable → path of the layer that owns it directly."""
    owner: dict[int, str] = {}
    for path, layer in _walk(model):
        for v in [*layer._trainable_variables, *layer._non_trainable_variables]:
            owner.setdefault(id(v), path)
    return owner


def resident_variables(model: Any, mode: str) -> list[tuple[Any, Category, str]]:
    """Every variable live before the step: (variable, category, owning layer path), each once.

    Trainable variables are parameters; non-trainable ones (BatchNorm moving statistics, frozen
    layers' weights, the seed generator's state) are buffers; the optimizer's variables (slots,
    iteration counter, learning rate, loss scale) are optimizer state; metric variables are buffers.
    """
    owner = variable_owner(model)
    seen: set[int] = set()
    out: list[tuple[Any, Category, str]] = []

    def add(v: Any, category: Category, layer: str = "") -> None:
        if id(v) not in seen:
            seen.add(id(v))
            out.append((v, category, layer or owner.get(id(v), "")))

    for v in model.trainable_variables:
        add(v, Category.PARAMETERS)
    for v in model.non_trainable_variables:
        add(v, Category.BUFFERS)
    if mode == "train" and getattr(model, "optimizer", None) is not None:
        for v in model.optimizer.variables:
            add(v, Category.OPTIMIZER_STATE)
    if mode == "train":
        for v in model.metrics_variables:
            add(v, Category.BUFFERS)
    return out


@contextmanager
def no_gc(*, collect: bool = True) -> Iterator[None]:
    """Collect cyclic garbage (``collect``), then keep the collector off for the duration.

    Keras leaves some step outputs in reference cycles: freed whenever the collector happens to run, they
    move a measured peak from run to run by their size. A step on fake tensors need not collect first: the
    garbage of earlier steps holds none of the storages its tracker counts (and a collection over every
    framework's objects takes about half a second).
    """
    enabled = gc.isenabled()
    if collect:
        gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
