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
    if mode not in MODES:
        raise ConfigError(f"unknown mode {mode!r}: expected 'train' or 'infer'")
    if isinstance(optimizer, str) and optimizer.lower() not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {optimizer!r}: expected one of {', '.join(OPTIMIZERS)} "
                          "or an optimizer class")
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch <= 0):
        raise ConfigError(f"expected batch as a positive integer. Received: batch={batch!r}")
    if not isinstance(device, str):
        raise ConfigError(f"expected device as a name ('cpu', 'cuda' or a catalog GPU). Received: {device!r}")
    from nnmem.cuda import cuda_target

    cuda_target(device)  # an unknown name or a non-CUDA accelerator fails here, with the reason


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


def estimate(model: Any, inputs: Any = None, *, mode: str = "train", optimizer: Any = "sgd",
             loss_fn: Callable[..., Any] | None = None, target: Any = None, device: str = "cpu",
             batch: int | None = None, input_shape: Any = None) -> Report:
    """Estimate the peak memory of one training or inference step, without allocating it.

    Args:
        model: a ``torch.nn.Module`` (used for its structure only: parameters are replaced by fake
            tensors while tracing), or a MODEL spec string — a built-in example name,
            ``"file.py:factory"`` or ``"package.module:factory"``, called as ``factory(batch)`` under
            the meta device.
        inputs: a tensor or a tuple of tensors (the model is called as ``model(*inputs)``).
        mode: "train" (zero_grad, forward, loss, backward, optimizer step, in steady state) or "infer".
        optimizer: "sgd", "momentum", "adam", "adamw", "rmsprop", "adagrad" or an optimizer class.
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
    name = model if isinstance(model, str) else type(model).__name__
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


def measure(model: Any, inputs: Any = None, *, mode: str = "train", optimizer: Any = "sgd",
            loss_fn: Callable[..., Any] | None = None, target: Any = None, device: str = "cpu",
            batch: int | None = None, input_shape: Any = None, timeout_s: float | None = None) -> Report:
    """Run the step for real in a child process and report what it used, at every level.

    Takes the same arguments as :func:`estimate`. The child's death (OOM kill, crash) raises
    ``MeasureError`` here; the caller survives.
    """
    from nnmem.loader import Built
    from nnmem.measure.child import run_in_child

    _check(mode, optimizer, batch, device)
    if device.strip().lower() != "cpu":
        raise UnsupportedError(f"measuring on device {device!r}: this version measures CPU steps only "
                               "(device='cpu'); benchmarks/cuda_validate.py measures on a GPU")
    name = model if isinstance(model, str) else type(model).__name__
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


def _dispatch(model: Any) -> Any:
    module = type(model).__module__.split(".")[0]
    if module in ("keras", "tensorflow", "tf_keras"):
        raise UnsupportedError("Keras models are not supported by this version yet; pass a torch.nn.Module")
    frontend = _torch_frontend()
    if frontend.is_torch_model(model):
        return frontend
    raise ConfigError(f"expected a torch.nn.Module or a MODEL spec string. Received: {type(model).__name__}")
