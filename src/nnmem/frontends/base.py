"""The one interface every framework implements, and ``resolve(model)``, the one dispatcher.

A frontend recognises its models and MODEL specs, builds them without allocating, traces a step into a
framework-neutral :class:`~nnmem.trace.Trace` (at any batch: the batch is the first transformation a
what-if applies), and measures the same step for real in a child process. ``resolve`` picks the frontend
from the model's class (by the package that defines it, so no framework is imported to ask) or from the
spec, and imports that frontend only then; a missing framework is a one-line error naming the extra.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from nnmem.errors import ConfigError, MissingFrameworkError
from nnmem.report.model import Report
from nnmem.trace import Trace

__all__ = ["Frontend", "StepRequest", "resolve", "FRONTENDS"]


@dataclass(frozen=True, slots=True)
class StepRequest:
    """One step to estimate or measure, its arguments checked (see ``nnmem.estimate``).

    Attributes:
        model: a model object, or a MODEL spec string (built-in name, ``file.py:factory``, ``.keras`` file).
        inputs: what the model is called with (None: the spec's own inputs, or zeros of ``input_shape``).
        mode: "train" or "infer".
        optimizer: a registry name, an optimizer class or instance, or None for the frontend's default.
        loss_fn: ``loss_fn(out, target)``, or None for the default.
        target: the loss target.
        device: "cpu", "cuda" or a catalog device name.
        batch: the batch a spec's factory is called with (and the report shows).
        input_shape: shapes without the batch, one per input.
        name: what the report calls the model.
        accumulate: training with gradient accumulation over this many micro-batches (``inputs`` and
            ``batch`` are one micro-batch); 1: none.
        checkpoint: a gradient-checkpointing plan applied to the model for the step ("blocks", "every:K",
            "sqrt", "NAME[,NAME...]"); None: none.
        set_to_none: the step starts with ``optimizer.zero_grad(set_to_none=...)``: True frees the gradients
            (PyTorch's default), False zeroes them in place, so they stay allocated between steps.
        optimizer_in_backward: each parameter is updated, and its gradient freed, inside backward (one
            optimizer per parameter, ``register_post_accumulate_grad_hook``).
        precision: lower precision applied to the model for the step: "autocast:bf16|fp16" (the forward under
            ``torch.autocast``) or "half:bf16|fp16" (parameters and buffers in that dtype); None: as it is.
    """

    model: Any
    inputs: Any = None
    mode: str = "train"
    optimizer: Any = None
    loss_fn: Callable[..., Any] | None = None
    target: Any = None
    device: str = "cpu"
    batch: int | None = None
    input_shape: tuple[tuple[int, ...], ...] | None = None
    name: str = ""
    accumulate: int = 1
    checkpoint: str | None = None
    optimizer_in_backward: bool = False
    precision: str | None = None
    set_to_none: bool = True

    def with_(self, **changes: Any) -> StepRequest:
        """A copy with ``changes`` (requests are immutable)."""
        return replace(self, **changes)


class Frontend(Protocol):
    """What each framework implements (``nnmem.frontends.pytorch``, ``nnmem.frontends.keras``)."""

    name: str

    def load(self, request: StepRequest) -> StepRequest:
        """Load what must be loaded once per call (a ``.keras`` file), leaving the rest to ``build``."""

    def estimate(self, request: StepRequest) -> Report:
        """The step's memory, traced without allocating model-sized memory."""

    def tracer(self, request: StepRequest) -> Callable[[int], Trace]:
        """batch → the Trace of the same step at that batch (the model built once where it can be)."""

    def peak_of(self, request: StepRequest) -> Callable[[Trace], int] | None:
        """The peak that decides an OOM on ``request.device`` when it is not the trace's allocator level."""

    def device_notes(self, request: StepRequest) -> tuple[str, ...]:
        """What answers on ``request.device`` rest on (a GPU's figures modelled, not measured); () on the CPU."""

    def measure(self, request: StepRequest, *, timeout_s: float | None) -> Report:
        """The real step, run in a fresh child process."""


@dataclass(frozen=True, slots=True)
class _Entry:
    """A frontend as ``resolve`` sees it before importing it."""

    name: str
    module: str
    packages: tuple[str, ...]  # top-level packages whose classes this frontend takes
    install: str  # what to pip install when the framework is missing


# Keras first: a Keras model on the torch backend is also a torch.nn.Module.
FRONTENDS = (
    _Entry("keras", "nnmem.frontends.keras.frontend", ("keras", "tf_keras"),
           "pip install 'nnmem[keras]' and the backend's extra ('nnmem[jax]', 'nnmem[tensorflow]' or 'nnmem[torch]')"),
    _Entry("pytorch", "nnmem.frontends.pytorch.frontend", ("torch",), "pip install 'nnmem[torch]'"),
)
_BY_NAME = {entry.name: entry for entry in FRONTENDS}
_FRAMEWORK_PACKAGES = frozenset({"keras", "jax", "jaxlib", "tensorflow", "torch", "tf_keras"})


def _load(entry: _Entry) -> Frontend:
    try:
        module = importlib.import_module(entry.module)
    except ModuleNotFoundError as err:
        if (err.name or "").split(".")[0] in _FRAMEWORK_PACKAGES:
            raise MissingFrameworkError(f"{err.name} is not installed: {entry.install}") from err
        raise
    return module.FRONTEND  # type: ignore[no-any-return]


def _defined_in(model: Any, packages: tuple[str, ...]) -> bool:
    return any(cls.__module__.split(".")[0] in packages for cls in type(model).__mro__)


def framework_of(model: Any) -> str:
    """The name of the frontend that takes ``model`` (an object or a MODEL spec), without importing it."""
    if isinstance(model, str):
        return _spec_framework(model)
    for entry in FRONTENDS:
        if _defined_in(model, entry.packages):
            return entry.name
    raise ConfigError(f"expected a torch.nn.Module, a Keras model or a MODEL spec string. "
                      f"Received: {type(model).__name__}")


def _spec_framework(spec: str) -> str:
    """A MODEL spec's framework: a ``.keras`` file, a built-in, or the modules its factory's file imports."""
    from nnmem import zoo
    from nnmem.loader import resolve_factory

    if spec.endswith(".keras") or spec in zoo.KERAS:
        return "keras"
    factory = resolve_factory(spec)  # a built-in PyTorch example, or the user's factory (imported once)
    module_globals = getattr(factory, "__globals__", {})
    uses_keras = any(getattr(v, "__name__", "").split(".")[0] == "keras" for v in module_globals.values())
    return "keras" if uses_keras else "pytorch"


def resolve(model: Any) -> Frontend:
    """The frontend that estimates and measures ``model``, imported now.

    Raises:
        ConfigError: ``model`` is neither a model of a supported framework nor a MODEL spec.
        ModelLoadError: a spec names no built-in, file or factory.
        MissingFrameworkError: the model's framework is not installed.
    """
    return _load(_BY_NAME[framework_of(model)])
