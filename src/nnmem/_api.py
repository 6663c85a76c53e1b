"""The public entry points estimate and measure: check the arguments once, here, then hand the step to the
frontend ``resolve`` picks. Imports no framework."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nnmem import optimizers
from nnmem.errors import ConfigError, UnsupportedError
from nnmem.frontends.base import StepRequest, framework_of, resolve
from nnmem.report.model import Report

__all__ = ["estimate", "measure", "MODES", "step_request"]

MODES = ("train", "infer")


def _check(mode: str, optimizer: Any, batch: int | None, device: str) -> None:
    if mode not in MODES:
        raise ConfigError(f"unknown mode {mode!r}: expected 'train' or 'infer'")
    if isinstance(optimizer, str):
        optimizers.get(optimizer.partition(":")[0])  # an unknown name fails here, listing the names
        if ":" in optimizer:
            optimizers.split_implementation(optimizer)
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch <= 0):
        raise ConfigError(f"expected batch as a positive integer. Received: batch={batch!r}")
    if not isinstance(device, str):
        raise ConfigError(f"expected device as a name ('cpu', 'cuda' or a catalog GPU). Received: {device!r}")
    from nnmem.cuda import cuda_target

    cuda_target(device)  # an unknown name or a non-CUDA accelerator fails here, with the reason


def _shapes(input_shape: Any) -> tuple[tuple[int, ...], ...] | None:
    if not input_shape:
        return None
    if isinstance(input_shape, (tuple, list)) and all(isinstance(d, int) for d in input_shape):
        input_shape = (tuple(input_shape),)
    shapes = tuple(tuple(s) for s in input_shape)
    if any(not s or any(isinstance(d, bool) or not isinstance(d, int) or d <= 0 for d in s) for s in shapes):
        raise ConfigError(f"expected input shapes of positive integers without the batch, e.g. (3, 224, 224). "
                          f"Received: {input_shape!r}")
    return shapes


def _display_name(model: Any) -> str:
    """The name a report shows: the spec as given, a Keras model's own name, else the class name."""
    if isinstance(model, str):
        return model
    named = getattr(model, "name", None) if framework_of(model) == "keras" else None
    return str(named or type(model).__name__)


def _accumulate(accumulate: Any, mode: str) -> int:
    if isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate < 1:
        raise ConfigError(f"expected accumulate as a positive integer (micro-batches per optimizer step). "
                          f"Received: accumulate={accumulate!r}")
    if accumulate > 1 and mode != "train":
        raise ConfigError("accumulate applies to training: inference has no gradients to accumulate")
    return accumulate


PRECISIONS = ("fp32", "bf16", "fp16", "autocast:bf16", "autocast:fp16", "half:bf16", "half:fp16")


def _precision(precision: Any) -> str | None:
    """The precision a step runs in: None for float32 as it is, else "autocast:DTYPE" or "half:DTYPE" ("bf16" and
    "fp16" alone mean autocast, mixed precision)."""
    if precision is None:
        return None
    text = precision.strip().lower() if isinstance(precision, str) else None
    if text not in PRECISIONS:
        raise ConfigError(f"expected precision as one of {', '.join(PRECISIONS)} (bf16 and fp16 alone: "
                          f"torch.autocast). Received: precision={precision!r}")
    if text == "fp32":
        return None
    return text if ":" in text else f"autocast:{text}"


def step_request(model: Any, inputs: Any = None, *, mode: str = "train", optimizer: Any = None,
                 loss_fn: Callable[..., Any] | None = None, target: Any = None, device: str = "cpu",
                 batch: int | None = None, input_shape: Any = None, accumulate: int = 1,
                 checkpoint: str | None = None, optimizer_in_backward: bool = False,
                 precision: str | None = None, set_to_none: bool = True) -> StepRequest:
    """The checked request for one step (the arguments of :func:`estimate`).

    Raises:
        ConfigError: an argument is malformed (unknown mode or optimizer name, bad batch or shapes, ...).
    """
    _check(mode, optimizer, batch, device)
    if checkpoint is not None and (not isinstance(checkpoint, str) or mode != "train"):
        raise ConfigError(f"expected checkpoint as a plan ('blocks', 'every:K', 'sqrt' or module names) for a "
                          f"training step. Received: checkpoint={checkpoint!r} with mode={mode!r}")
    if optimizer_in_backward and (mode != "train" or accumulate != 1):
        raise ConfigError("optimizer_in_backward applies to a training step without gradient accumulation (the "
                          "update happens as each gradient is ready, so there is nothing to accumulate into)")
    if not isinstance(set_to_none, bool):
        raise ConfigError(f"expected set_to_none as True or False (optimizer.zero_grad(set_to_none=...)). "
                          f"Received: set_to_none={set_to_none!r}")
    if not set_to_none and (mode != "train" or optimizer_in_backward):
        raise ConfigError("set_to_none=False keeps the gradients of a training step allocated between steps; it "
                          "needs mode='train' and no optimizer_in_backward (which frees each gradient itself)")
    return StepRequest(model=model, inputs=inputs, mode=mode, optimizer=optimizer, loss_fn=loss_fn, target=target,
                       device=device, batch=batch, input_shape=_shapes(input_shape), name=_display_name(model),
                       accumulate=_accumulate(accumulate, mode), checkpoint=checkpoint,
                       optimizer_in_backward=bool(optimizer_in_backward), precision=_precision(precision),
                       set_to_none=set_to_none)


def estimate(model: Any, inputs: Any = None, *, mode: str = "train", optimizer: Any = None,
             loss_fn: Callable[..., Any] | None = None, target: Any = None, device: str = "cpu",
             batch: int | None = None, input_shape: Any = None, accumulate: int = 1,
             checkpoint: str | None = None, optimizer_in_backward: bool = False,
             precision: str | None = None, set_to_none: bool = True) -> Report:
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
        optimizer: a name from ``nnmem.optimizers.names()`` or an optimizer class; None means "sgd" for
            PyTorch and the compiled optimizer for a Keras model (which also takes Keras optimizer instances).
        loss_fn: ``loss_fn(out, target)``; default: mean of the output.
        target: the loss target, live throughout the step.
        device: the target device: "cpu", "cuda" or a CUDA GPU from the catalog (``nnmem devices``). On CUDA
            ``peak_bytes`` is the reserved level from nnmem's caching-allocator model (not yet GPU-validated).
        batch: batch size for a MODEL spec (and for display).
        input_shape: shape(s) without the batch, for a spec whose factory returns only a model.
        accumulate: gradient accumulation: one optimizer step over this many micro-batches, each ``inputs``
            (or ``batch``); the gradients of the first live through the others. On a Keras model the optimizer
            (given or compiled) gets ``gradient_accumulation_steps`` = this, and the estimate is the cycle's
            update step, the highest (the measurement: each cycle's highest step).
        checkpoint: a gradient-checkpointing plan (PyTorch) applied to the model for the step: "blocks",
            "every:K", "sqrt" or "NAME[,NAME...]" (``nnmem.checkpoint_plan``).
        optimizer_in_backward: the optimizer steps inside backward (PyTorch): each parameter is updated and
            its gradient freed as soon as backward has accumulated it (one optimizer per parameter).
        precision: (PyTorch) "bf16" / "fp16" or "autocast:bf16|fp16": the forward under ``torch.autocast``
            (float32 master weights); "half:bf16|fp16": parameters, buffers and optimizer state in that dtype;
            "fp32" or None: as it is.
        set_to_none: (PyTorch) the step starts with ``optimizer.zero_grad(set_to_none=set_to_none)``: True (the
            default, PyTorch's) frees the gradients; False zeroes them in place, so they stay allocated through
            the next forward.

    Returns:
        A Report whose ``peak_bytes`` is the level that decides an OOM on ``device``.

    Example:
        >>> report = nnmem.estimate("mlp", batch=32, optimizer="adam")  # doctest: +SKIP
        >>> report.peak_bytes  # doctest: +SKIP
    """
    request = step_request(model, inputs, mode=mode, optimizer=optimizer, loss_fn=loss_fn, target=target,
                           device=device, batch=batch, input_shape=input_shape, accumulate=accumulate,
                           checkpoint=checkpoint, optimizer_in_backward=optimizer_in_backward,
                           precision=precision, set_to_none=set_to_none)
    return resolve(model).estimate(request)


def measure(model: Any, inputs: Any = None, *, mode: str = "train", optimizer: Any = None,
            loss_fn: Callable[..., Any] | None = None, target: Any = None, device: str = "cpu",
            batch: int | None = None, input_shape: Any = None, timeout_s: float | None = None,
            runs: int = 1, accumulate: int = 1, checkpoint: str | None = None,
            optimizer_in_backward: bool = False, precision: str | None = None,
            set_to_none: bool = True, progress: Callable[[str], None] | None = None) -> Report:
    """Run the step for real in a child process and report what it used, at every level.

    Takes the same arguments as :func:`estimate`. The child's death (OOM kill, crash) raises
    ``MeasureError`` here; the caller survives.

    Args:
        timeout_s: seconds before the measuring child is killed; None waits.
        runs: fresh child processes to measure the step in (each warms up and measures on its own); the
            report is the run with the median peak, its ``meta`` and notes give every run's peak. Use more
            than one where the peak differs between processes (TensorFlow's BFC chunk layout).
        progress: called with a short message before each measuring process starts.
    """
    from nnmem.report.runs import MAX_RUNS, median_run

    request = step_request(model, inputs, mode=mode, optimizer=optimizer, loss_fn=loss_fn, target=target,
                           device=device, batch=batch, input_shape=input_shape, accumulate=accumulate,
                           checkpoint=checkpoint, optimizer_in_backward=optimizer_in_backward,
                           precision=precision, set_to_none=set_to_none)
    if isinstance(runs, bool) or not isinstance(runs, int) or not 1 <= runs <= MAX_RUNS:
        raise ConfigError(f"expected runs as an integer from 1 to {MAX_RUNS} (fresh processes to measure in). "
                          f"Received: runs={runs!r}")
    if device.strip().lower() != "cpu":
        raise UnsupportedError(f"measuring on device {device!r}: this version measures CPU steps only "
                               "(device='cpu'); benchmarks/cuda_validate.py measures on a GPU")
    frontend = resolve(model)
    request = frontend.load(request)  # a .keras file is read once, not once per run
    measured = []
    for run in range(runs):
        if progress:
            progress(f"measuring in a child process (run {run + 1} of {runs})" if runs > 1
                     else "measuring in a child process")
        measured.append(frontend.measure(request, timeout_s=timeout_s))
    return median_run(measured)
