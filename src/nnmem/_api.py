"""The public entry points: estimate, measure, compare. Checks input once, here, then dispatches."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from nnmem.errors import ConfigError, MissingFrameworkError, UnsupportedError
from nnmem.report.model import Report

__all__ = ["estimate", "measure", "MODES", "OPTIMIZERS"]

MODES = ("train", "infer")
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "rmsprop", "adagrad")


def _check(mode: str, optimizer: Any, batch: int | None, device: str) -> None:
    from nnmem.frontends.keras_names import KERAS_OPTIMIZERS

    if mode not in MODES:
        raise ConfigError(f"unknown mode {mode!r}: expected 'train' or 'infer'")
    if isinstance(optimizer, str) and optimizer.lower() not in (*OPTIMIZERS, *KERAS_OPTIMIZERS):
        raise ConfigError(f"unknown optimizer {optimizer!r}: expected one of {', '.join(OPTIMIZERS)} "
                          f"(Keras also: {', '.join(k for k in KERAS_OPTIMIZERS if k not in OPTIMIZERS)}) "
                          "or an optimizer class")
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch <= 0):
        raise ConfigError(f"expected batch as a positive integer. Received: batch={batch!r}")
    if not isinstance(device, str):
        raise ConfigError(f"expected device as a name ('cpu', 'cuda' or a catalog GPU). Received: {device!r}")
    from nnmem.cuda import cuda_target

    cuda_target(device)  # an unknown name or a non-CUDA accelerator fails here, with the reason


def _keras_frontend() -> Any:
    try:
        return importlib.import_module("nnmem.frontends.keras.frontend")
    except ModuleNotFoundError as err:
        if err.name in ("keras", "jax", "jaxlib", "tensorflow"):
            raise MissingFrameworkError(
                f"{err.name} is not installed: pip install 'nnmem[keras]' and the backend's extra "
                "('nnmem[jax]', 'nnmem[tensorflow]' or 'nnmem[torch]')") from err
        raise


def _is_keras(model: Any) -> bool:
    return type(model).__module__.split(".")[0] in ("keras", "tf_keras") or any(
        c.__module__.split(".")[0] == "keras" for c in type(model).__mro__)


def _keras_factory(spec: str) -> Callable[..., Any] | None:
    """The factory of a MODEL spec when it builds a Keras model (its module imports keras), else None."""
    from nnmem import zoo
    from nnmem.loader import resolve_factory

    if spec in zoo.KERAS:
        return zoo.resolve(spec)
    if spec.endswith(".keras"):
        return None
    factory = resolve_factory(spec)
    module_globals = getattr(factory, "__globals__", {})
    uses_keras = any(getattr(v, "__name__", "").split(".")[0] == "keras" for v in module_globals.values())
    return factory if uses_keras else None


def _torch_frontend() -> Any:
    try:
        return importlib.import_module("nnmem.frontends.pytorch.frontend")
    except ModuleNotFoundError as err:
        if err.name == "torch":
            raise MissingFrameworkError("PyTorch is not installed: pip install 'nnmem[torch]'") from err
        raise


def _from_spec(spec: str, batch: int | None, input_shape: Any, *, meta: bool) -> tuple[Any, Any, Any, Any, list[str]]:
    """Build a MODEL spec's model and inputs (under the meta device when ``meta``)."""
    from nnmem.loader import resolve_factory

    factory = resolve_factory(spec)
    torch_frontend = _torch_frontend()
    built, notes = torch_frontend.build_torch(factory, batch or 1, spec, meta=meta)
    if not torch_frontend.is_torch_model(built.model):
        raise ConfigError(f"expected the factory {spec!r} to return a torch.nn.Module (or a tuple starting with one). "
                          f"Received: {type(built.model).__name__}")
    inputs = built.inputs
    if input_shape:
        import torch

        inputs = torch_frontend.shaped_inputs(batch or 1, _shapes(input_shape), device="meta" if meta else "cpu")
        del torch
    if inputs is None:
        raise ConfigError(
            f"the factory {spec!r} returned only a model: give the input shape, e.g. --input-shape 3,224,224"
        )
    return built.model, inputs, built.target, built.loss_fn, notes


def _shapes(input_shape: Any) -> tuple[tuple[int, ...], ...]:
    if isinstance(input_shape, (tuple, list)) and input_shape and all(isinstance(d, int) for d in input_shape):
        input_shape = (tuple(input_shape),)
    shapes = tuple(tuple(s) for s in input_shape)
    if not shapes or any(not s or any(isinstance(d, bool) or not isinstance(d, int) or d <= 0 for d in s)
                         for s in shapes):
        raise ConfigError(f"expected input shapes of positive integers without the batch, e.g. (3, 224, 224). "
                          f"Received: {input_shape!r}")
    return shapes


def estimate(model: Any, inputs: Any = None, *, mode: str = "train", optimizer: Any = None,
             loss_fn: Callable[..., Any] | None = None, target: Any = None, device: str = "cpu",
             batch: int | None = None, input_shape: Any = None) -> Report:
    """Estimate the peak memory of one training or inference step, without allocating it.

    Args:
        model: a ``torch.nn.Module`` (used for its structure only: parameters are replaced by fake
            tensors while tracing), a Keras 3 model (train step = ``train_on_batch(x, y)``, infer =
            ``predict_on_batch(x)``, on this process's ``KERAS_BACKEND``), a ``.keras`` file, or a MODEL
            spec string — a built-in example name,
            ``"file.py:factory"`` or ``"package.module:factory"``, called as ``factory(batch)`` under
            the meta device.
        inputs: a tensor or a tuple of tensors (the model is called as ``model(*inputs)``).
        mode: "train" (zero_grad, forward, loss, backward, optimizer step, in steady state) or "infer".
        optimizer: "sgd", "momentum", "adam", "adamw", "rmsprop", "adagrad" or an optimizer class; None
            means "sgd" for PyTorch and the compiled optimizer for a Keras model (Keras also takes "lion",
            "nadam", "adamax", "adadelta", "ftrl", "adafactor" and Keras optimizer instances).
        loss_fn: ``loss_fn(out, target)``; default: mean of the output.
        target: the loss target, live throughout the step.
        device: the target device: "cpu", "cuda" or a CUDA GPU from the catalog (``nnmem devices``). On CUDA
            ``peak_bytes`` is the reserved level from nnmem's caching-allocator model (not yet GPU-validated).
        batch: batch size for a MODEL spec (and for display).
        input_shape: shape(s) without the batch, for a spec whose factory returns only a model.

    Returns:
        A Report whose ``peak_bytes`` is the level that decides an OOM on ``device``.

    Example:
        >>> report = nnmem.estimate("mlp", batch=32, optimizer="adam")  # doctest: +SKIP
        >>> report.peak_bytes  # doctest: +SKIP
    """
    _check(mode, optimizer, batch, device)
    notes: list[str] = []
    name = _display_name(model)
    if isinstance(model, str) and model.endswith(".keras"):
        model = _load_keras_file(model)
    if isinstance(model, str) and (factory := _keras_factory(model)) is not None:
        keras_frontend = _keras_frontend()
        model, x, y, loss = keras_frontend.from_factory(factory, batch or 1)
        inputs = inputs if inputs is not None else x
        target = target if target is not None else y
        loss_fn = loss_fn if loss_fn is not None else loss
    if _is_keras(model):
        inputs, target, note = _keras_data(model, inputs, target, input_shape, batch, mode)
        notes += [note] if note else []
        return _keras_frontend().estimate_keras(model, inputs, mode=mode, optimizer=optimizer, loss_fn=loss_fn,
                                                target=target, device=device, name=name, batch=batch,
                                                notes=tuple(notes))
    optimizer = "sgd" if optimizer is None else optimizer
    if isinstance(model, str):
        model, inputs_, target_, loss_, notes = _from_spec(model, batch, input_shape, meta=True)
        inputs = inputs if inputs is not None else inputs_
        target = target if target is not None else target_
        loss_fn = loss_fn or loss_
    frontend = _dispatch(model)
    if inputs is None:
        raise ConfigError("expected inputs: a tensor or a tuple of tensors the model is called with")
    return frontend.estimate_torch(model, inputs, mode=mode, optimizer=optimizer, loss_fn=loss_fn, target=target,
                                   device=device, name=name, batch=batch, notes=tuple(notes))


def measure(model: Any, inputs: Any = None, *, mode: str = "train", optimizer: Any = None,
            loss_fn: Callable[..., Any] | None = None, target: Any = None, device: str = "cpu",
            batch: int | None = None, input_shape: Any = None, timeout_s: float | None = None,
            runs: int = 1) -> Report:
    """Run the step for real in a child process and report what it used, at every level.

    Takes the same arguments as :func:`estimate`. The child's death (OOM kill, crash) raises
    ``MeasureError`` here; the caller survives.

    Args:
        runs: fresh child processes to measure the step in (each warms up and measures on its own); the
            report is the run with the median peak, its ``meta`` and notes give every run's peak. Use more
            than one where the peak differs between processes (TensorFlow's BFC chunk layout).
    """
    from nnmem.report.runs import MAX_RUNS, median_run

    _check(mode, optimizer, batch, device)
    if isinstance(runs, bool) or not isinstance(runs, int) or not 1 <= runs <= MAX_RUNS:
        raise ConfigError(f"expected runs as an integer from 1 to {MAX_RUNS} (fresh processes to measure in). "
                          f"Received: runs={runs!r}")
    if device.strip().lower() != "cpu":
        raise UnsupportedError(f"measuring on device {device!r}: this version measures CPU steps only "
                               "(device='cpu'); benchmarks/cuda_validate.py measures on a GPU")
    name = _display_name(model)
    if isinstance(model, str) and model.endswith(".keras"):
        model = _load_keras_file(model)  # once, not once per run
    return median_run([_measure_once(model, inputs, mode=mode, optimizer=optimizer, loss_fn=loss_fn,
                                     target=target, device=device, batch=batch, input_shape=input_shape,
                                     timeout_s=timeout_s, name=name) for _ in range(runs)])


def _measure_once(model: Any, inputs: Any, *, mode: str, optimizer: Any, loss_fn: Callable[..., Any] | None,
                  target: Any, device: str, batch: int | None, input_shape: Any, timeout_s: float | None,
                  name: str) -> Report:
    """One real step in one fresh child process (arguments checked, a ``.keras`` file loaded, by :func:`measure`)."""
    from nnmem.loader import Built
    from nnmem.runner.child import run_in_child

    factory = _keras_factory(model) if isinstance(model, str) else None
    if factory is not None or _is_keras(model):
        if factory is None:
            inputs, target, _ = _keras_data(model, inputs, target, input_shape, batch, mode)
        elif inputs is None and input_shape:
            inputs = _zeros(batch or 1, _shapes(input_shape))
        return _keras_frontend().measure_keras(None if factory else model, inputs, mode=mode, optimizer=optimizer,
                                               loss_fn=loss_fn, target=target, device=device, name=name,
                                               batch=batch, timeout_s=timeout_s, factory=factory)
    optimizer = "sgd" if optimizer is None else optimizer
    spec = model if isinstance(model, str) else None
    frontend = _torch_frontend() if spec else _dispatch(model)
    if spec is None and inputs is None:
        raise ConfigError("expected inputs: a tensor or a tuple of tensors the model is called with")

    def work() -> dict[str, Any]:
        if spec is not None:
            m, i, t, lf, _ = _from_spec(spec, batch, input_shape, meta=False)
            built = Built(m, inputs if inputs is not None else i, target if target is not None else t, loss_fn or lf)
        else:
            built = Built(model, inputs, target, loss_fn)
        return frontend.measure_torch(built, mode=mode, optimizer=optimizer, device=device, name=name,
                                      batch=batch).to_dict()

    return Report.from_dict(run_in_child(work, timeout_s=timeout_s))


def _display_name(model: Any) -> str:
    """The name a report shows: the spec as given, a Keras model's own name, else the class name."""
    if isinstance(model, str):
        return model
    return str((getattr(model, "name", None) if _is_keras(model) else None) or type(model).__name__)


def _keras_data(model: Any, inputs: Any, target: Any, input_shape: Any, batch: int | None,
                mode: str) -> tuple[Any, Any, str | None]:
    """Inputs (and target) for a Keras step: as given, zeros of ``input_shape``, or zeros of the model's own
    declared shapes (with a note saying so)."""
    if inputs is not None:
        return inputs, target, None
    if input_shape:
        return _zeros(batch or 1, _shapes(input_shape)), target, None
    return _keras_example_data(model, batch or 1, mode, target)


def _zeros(batch: int, shapes: tuple[tuple[int, ...], ...]) -> Any:
    import numpy as np

    arrays = [np.zeros((batch, *s), "float32") for s in shapes]
    return arrays[0] if len(arrays) == 1 else arrays


def _keras_example_data(model: Any, batch: int, mode: str, target: Any) -> tuple[Any, Any, str]:
    """Zero inputs (and a zero target) of ``batch`` from a Keras model's own input and output shapes."""
    import numpy as np

    model_inputs = getattr(model, "inputs", None)
    try:
        shapes = [tuple(t.shape) for t in model_inputs] if model_inputs else []
    except (AttributeError, ValueError):
        shapes = []
    if not shapes or any(d is None for s in shapes for d in s[1:]):
        raise ConfigError("the Keras model does not declare its input shape: give inputs, or --input-shape D1,D2,...")
    x = [np.zeros((batch, *s[1:]), dtype=str(t.dtype)) for s, t in zip(shapes, model_inputs or [])]
    if mode == "train" and target is None:
        out = model.outputs[0]
        loss = str(getattr(model, "loss", "") or "")
        if "sparse" in loss.lower():  # class indices, one per sample (and per position)
            target = np.zeros((batch, *tuple(out.shape)[1:-1]), dtype="int32")
        else:
            target = np.zeros((batch, *tuple(out.shape)[1:]), dtype="float32")
    note = (f"inputs: zeros of the model's declared input shape{'s' if len(x) > 1 else ''} at batch {batch}"
            + ("; target: zeros shaped for the compiled loss" if mode == "train" else ""))
    return (x[0] if len(x) == 1 else x), target, note


def _load_keras_file(path: str) -> Any:
    """Load a ``.keras`` file with ``safe_mode=True``: a Lambda layer's code is refused, not run."""
    from pathlib import Path

    from nnmem.errors import ModelLoadError

    if not Path(path).is_file():
        raise ModelLoadError(f"model file not found: {path}")
    _keras_frontend()
    import warnings

    import keras

    try:
        with warnings.catch_warnings():  # Keras warns that a saved optimizer's slots are rebuilt; they are
            warnings.simplefilter("ignore")
            return keras.saving.load_model(path, safe_mode=True, compile=True)
    except ValueError as err:
        text = str(err)
        if "safe_mode" in text or "Lambda" in text or "lambda" in text:
            raise ModelLoadError(f"refusing to load {path}: it contains a Lambda layer whose code would run on "
                                 "load (Keras safe_mode). Rebuild the model in a factory 'file.py:factory' "
                                 "you trust instead") from err
        raise ModelLoadError(f"cannot load {path}: {text.strip().splitlines()[0] if text.strip() else err}") from err
    except Exception as err:
        raise ModelLoadError(f"cannot load {path}: {type(err).__name__}: {err}") from err


def _dispatch(model: Any) -> Any:
    if _is_keras(model):
        return _keras_frontend()
    frontend = _torch_frontend()
    if frontend.is_torch_model(model):
        return frontend
    raise ConfigError(f"expected a torch.nn.Module or a MODEL spec string. Received: {type(model).__name__}")
