"""The one registry of optimizer names: the state each keeps per parameter, and how each framework builds it.

Importing it imports no framework: classes are named by strings, arguments are plain values. API checks,
CLI choices and the frontends' builders all derive from ``SPECS``. Sources, in the installed torch 2.13
and Keras 3.15: torch/optim/{sgd,adam,adamw,rmsprop,adagrad}.py (``_init_group``, ``Adagrad.__init__``) for
PyTorch's state; torch/optim/optimizer.py ``_default_to_fused_or_foreach`` with
torch/utils/_foreach_utils.py for its default implementation; keras/src/optimizers/base_optimizer.py
(``__init__``: iteration and learning rate; ``add_variable_from_reference``: a slot has its variable's shape
and dtype) and each optimizer's ``build`` for Keras's state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any

from nnmem.errors import ConfigError

__all__ = ["FRAMEWORKS", "SPECS", "TORCH_LR", "Build", "Counter", "Dtype", "Implementation", "OptimizerSpec",
           "Per", "Shape", "Slot", "State", "find", "get", "names", "split_implementation",
           "torch_default_implementation"]

FRAMEWORKS = ("torch", "keras")
"""The frameworks the registry describes: ``"torch"`` (torch.optim) and ``"keras"`` (keras.optimizers)."""

TORCH_LR = 1e-3
"""Learning rate nnmem gives a torch optimizer (torch's RMSprop and Adagrad default to 1e-2; state is the same)."""

_LABELS = {"torch": "PyTorch", "keras": "Keras"}
_CLASS_HINTS = {"torch": "a torch.optim.Optimizer subclass", "keras": "a keras.optimizers.Optimizer",
                None: "an optimizer class"}
# torch/utils/_foreach_utils.py _get_foreach_kernels_supported_devices (plus a registered privateuse1
# backend); torch/optim/optimizer.py _default_to_fused_or_foreach is always called with use_fused=False.
_FOREACH_DEVICES = ("cuda", "xpu", "mtia")


class Dtype(str, Enum):
    """The dtype rule of a state tensor."""

    PARAMETER = "same as the parameter"
    FLOAT32 = "float32"  # torch: float64 when the default dtype is float64 (_get_scalar_dtype); Keras: floatx
    INT = "int"  # Keras "int": int64 on TensorFlow, int32 on torch and JAX (backend/common/dtypes.py)

    def itemsize(self, parameter_itemsize: int, backend: str = "") -> int:
        """Bytes per element for a parameter of ``parameter_itemsize`` bytes on a Keras ``backend``."""
        if self is Dtype.PARAMETER:
            return parameter_itemsize
        if self is Dtype.INT:
            return 8 if backend == "tensorflow" else 4
        return 4


class Shape(str, Enum):
    """The shape rule of a per-parameter slot."""

    PARAMETER = "parameter"  # the parameter's shape
    ROWS = "rows"  # shape[:-1]; for a parameter of rank < 2, a float32 scalar placeholder (Keras Adafactor)
    COLUMNS = "columns"  # shape[:-2] + shape[-1:]; the same placeholder for rank < 2


class Per(str, Enum):
    """How many of a counter an optimizer keeps."""

    PARAMETER = "per parameter"
    OPTIMIZER = "per optimizer"


class Implementation(str, Enum):
    """How a torch optimizer's step runs: one kernel per tensor, per op over all tensors, or one fused kernel."""

    FOR_LOOP = "for-loop"
    FOREACH = "foreach"
    FUSED = "fused"


@dataclass(frozen=True, slots=True)
class Slot:
    """A tensor an optimizer keeps for each parameter.

    Attributes:
        name: the framework's name for it (a torch ``state`` key, a Keras variable-name suffix).
        dtype: its dtype rule.
        shape: its shape rule.
    """

    name: str
    dtype: Dtype = Dtype.PARAMETER
    shape: Shape = Shape.PARAMETER

    def nbytes(self, shape: Sequence[int], itemsize: int) -> int:
        """Bytes of this slot for a parameter of ``shape`` and ``itemsize`` bytes per element."""
        if self.shape is Shape.PARAMETER:
            return math.prod(shape) * self.dtype.itemsize(itemsize)
        if len(shape) < 2:
            return Dtype.FLOAT32.itemsize(itemsize)
        kept = shape[:-1] if self.shape is Shape.ROWS else (*shape[:-2], shape[-1])
        return math.prod(kept) * self.dtype.itemsize(itemsize)


@dataclass(frozen=True, slots=True)
class Counter:
    """A scalar an optimizer keeps: a step count, a learning rate, a running product.

    Attributes:
        name: the framework's name for it.
        dtype: its dtype rule (``PARAMETER`` for a per-optimizer counter: the first parameter's dtype).
        per: one per parameter or one per optimizer.
        host: kept in host memory by default, not on the parameters' device.
    """

    name: str
    dtype: Dtype
    per: Per
    host: bool = False


@dataclass(frozen=True, slots=True)
class State:
    """What an optimizer keeps between steps, in one framework, with its default arguments.

    Attributes:
        slots: tensors kept for each parameter.
        counters: scalars, per parameter or per optimizer.
        source: where in the framework's source this was read.
    """

    slots: tuple[Slot, ...]
    counters: tuple[Counter, ...]
    source: str

    @property
    def slots_per_parameter(self) -> int:
        """Number of parameter-shaped slots: the state is this many times the parameters' bytes, plus counters."""
        return sum(1 for s in self.slots if s.shape is Shape.PARAMETER)

    def nbytes(self, parameters: Iterable[tuple[Sequence[int], int]], *, backend: str = "",
               host: bool = True) -> int:
        """Bytes of state for ``parameters``, each ``(shape, itemsize in bytes)``.

        Args:
            parameters: the trainable parameters' shapes and element sizes.
            backend: the Keras backend ("tensorflow", "torch", "jax"); it sets the size of an ``INT`` counter.
            host: include counters kept in host memory (False: only what lives on the parameters' device).
        """
        params = [(tuple(shape), itemsize) for shape, itemsize in parameters]
        counted = [c for c in self.counters if host or not c.host]
        total = 0
        for shape, itemsize in params:
            total += sum(s.nbytes(shape, itemsize) for s in self.slots)
            total += sum(c.dtype.itemsize(itemsize, backend) for c in counted if c.per is Per.PARAMETER)
        first = params[0][1] if params else Dtype.FLOAT32.itemsize(0)
        return total + sum(c.dtype.itemsize(first, backend) for c in counted if c.per is Per.OPTIMIZER)


@dataclass(frozen=True, slots=True)
class Build:
    """How one framework builds an optimizer.

    Attributes:
        module: ``"torch.optim"`` or ``"keras.optimizers"``.
        class_name: the class in that module, e.g. ``"SGD"``.
        kwargs: the arguments nnmem passes (besides the parameters); the framework's defaults otherwise.
        state: what it keeps between steps.
        implementations: the step implementations it offers (torch only).
    """

    module: str
    class_name: str
    kwargs: Mapping[str, Any] = field(hash=False)
    state: State
    implementations: tuple[Implementation, ...] = ()

    @property
    def path(self) -> str:
        """Qualified class name, e.g. ``"torch.optim.SGD"``."""
        return f"{self.module}.{self.class_name}"


@dataclass(frozen=True, slots=True)
class OptimizerSpec:
    """One optimizer name and what it means in each framework.

    Attributes:
        name: nnmem's name, e.g. ``"momentum"`` (lower case).
        summary: one line on what the optimizer keeps.
        torch: how PyTorch builds it, or None when only Keras has it.
        keras: how Keras builds it, or None when only PyTorch has it.

    Example:
        >>> spec = get("adam")
        >>> spec.torch.class_name, spec.torch.state.slots_per_parameter, spec.frameworks
        ('Adam', 2, ('torch', 'keras'))
    """

    name: str
    summary: str
    torch: Build | None
    keras: Build | None

    @property
    def frameworks(self) -> tuple[str, ...]:
        """The frameworks that build it, in ``FRAMEWORKS`` order."""
        return tuple(fw for fw in FRAMEWORKS if self._build(fw) is not None)

    def build(self, framework: str) -> Build:
        """How ``framework`` builds it; ConfigError when that framework has no such optimizer."""
        build = self._build(_check_framework(framework))
        if build is None:
            raise ConfigError(_unknown(self.name, framework))
        return build

    def torch_implementation(self, device_type: str) -> Implementation:
        """The implementation torch picks when neither ``foreach`` nor ``fused`` is given, on ``device_type``."""
        self.build("torch")
        return torch_default_implementation(device_type)

    def _build(self, framework: str) -> Build | None:
        return self.torch if framework == "torch" else self.keras


def torch_default_implementation(device_type: str) -> Implementation:
    """Foreach on the devices with foreach kernels (CUDA, XPU, MTIA), the for-loop elsewhere (CPU); never fused.

    Args:
        device_type: a torch device type, e.g. "cpu" or "cuda".
    """
    return Implementation.FOREACH if device_type in _FOREACH_DEVICES else Implementation.FOR_LOOP


def _torch(class_name: str, slots: tuple[Slot, ...], counters: tuple[Counter, ...], source: str,
           implementations: tuple[Implementation, ...], **kwargs: Any) -> Build:
    return Build("torch.optim", class_name, MappingProxyType({"lr": TORCH_LR, **kwargs}),
                 State(slots, counters, f"torch/optim/{source}"), implementations)


def _keras(class_name: str, slots: tuple[Slot, ...], source: str, *, extra: tuple[Counter, ...] = (),
           **kwargs: Any) -> Build:
    return Build("keras.optimizers", class_name, MappingProxyType(kwargs),
                 State(slots, (*_KERAS_COUNTERS, *extra), f"keras/src/optimizers/{source}"))


_ALL = (Implementation.FOR_LOOP, Implementation.FOREACH, Implementation.FUSED)
_NO_FUSED = (Implementation.FOR_LOOP, Implementation.FOREACH)
# A 0-d step tensor per parameter, on the CPU unless capturable=True or fused=True (Adam._init_group:
# "Deliberately host `step` on CPU if both capturable and fused are off").
_TORCH_STEP = (Counter("step", Dtype.FLOAT32, Per.PARAMETER, host=True),)
# base_optimizer.py BaseOptimizer.__init__: one "iteration" variable (dtype "int") and, for a float learning
# rate, one "learning_rate" variable (floatx).
_KERAS_COUNTERS = (Counter("iteration", Dtype.INT, Per.OPTIMIZER),
                   Counter("learning_rate", Dtype.FLOAT32, Per.OPTIMIZER))
_ADAM_SOURCE = "adam.py Adam._init_group"

SPECS: tuple[OptimizerSpec, ...] = (
    OptimizerSpec(
        "sgd", "plain SGD: no state",
        _torch("SGD", (), (), "sgd.py SGD.step (state only when momentum != 0)", _ALL),
        _keras("SGD", (), "sgd.py SGD.build (momentums only when momentum != 0)"),
    ),
    OptimizerSpec(
        "momentum", "SGD with momentum 0.9: one momentum buffer",
        _torch("SGD", (Slot("momentum_buffer"),), (), "sgd.py _single_tensor_sgd (buf = grad.detach().clone())",
               _ALL, momentum=0.9),
        _keras("SGD", (Slot("momentum"),), "sgd.py SGD.build", momentum=0.9),
    ),
    OptimizerSpec(
        "adam", "Adam: first and second moments",
        _torch("Adam", (Slot("exp_avg"), Slot("exp_avg_sq")), _TORCH_STEP, _ADAM_SOURCE, _ALL),
        _keras("Adam", (Slot("momentum"), Slot("velocity")), "adam.py Adam.build"),
    ),
    OptimizerSpec(
        "adamw", "AdamW: Adam's moments, decoupled weight decay",
        _torch("AdamW", (Slot("exp_avg"), Slot("exp_avg_sq")), _TORCH_STEP, f"adamw.py AdamW(Adam), {_ADAM_SOURCE}",
               _ALL),
        _keras("AdamW", (Slot("momentum"), Slot("velocity")), "adamw.py AdamW(Adam), adam.py Adam.build"),
    ),
    OptimizerSpec(
        "rmsprop", "RMSprop: a running mean of squared gradients",
        _torch("RMSprop", (Slot("square_avg"),), _TORCH_STEP, "rmsprop.py RMSprop._init_group", _NO_FUSED),
        _keras("RMSprop", (Slot("velocity"),), "rmsprop.py RMSprop.build (momentum 0, not centered)"),
    ),
    OptimizerSpec(
        "adagrad", "Adagrad: a sum of squared gradients",
        _torch("Adagrad", (Slot("sum"),), _TORCH_STEP, "adagrad.py Adagrad.__init__ (state built eagerly)", _ALL),
        _keras("Adagrad", (Slot("accumulator"),), "adagrad.py Adagrad.build"),
    ),
    OptimizerSpec(
        "adadelta", "Adadelta: running means of squared gradients and of squared updates", None,
        _keras("Adadelta", (Slot("accumulated_grad"), Slot("accumulated_delta_var")), "adadelta.py Adadelta.build"),
    ),
    OptimizerSpec(
        "adamax", "Adamax: first moment and infinity norm", None,
        _keras("Adamax", (Slot("momentum"), Slot("norm")), "adamax.py Adamax.build"),
    ),
    OptimizerSpec(
        "nadam", "Nadam: Adam's moments with Nesterov momentum", None,
        _keras("Nadam", (Slot("momentum"), Slot("velocity")), "nadam.py Nadam.build",
               extra=(Counter("u_product", Dtype.PARAMETER, Per.OPTIMIZER),)),
    ),
    OptimizerSpec(
        "lion", "Lion: one momentum", None,
        _keras("Lion", (Slot("momentum"),), "lion.py Lion.build"),
    ),
    OptimizerSpec(
        "ftrl", "FTRL: an accumulator and a linear term", None,
        _keras("Ftrl", (Slot("accumulator"), Slot("linear")), "ftrl.py Ftrl.build"),
    ),
    OptimizerSpec(
        "adafactor", "Adafactor: a factored second moment (rows and columns) and a velocity", None,
        _keras("Adafactor", (Slot("r", shape=Shape.ROWS), Slot("c", shape=Shape.COLUMNS), Slot("velocity")),
               "adafactor.py Adafactor.build"),
    ),
)

_BY_NAME = {spec.name: spec for spec in SPECS}


def _check_framework(framework: str) -> str:
    if framework not in FRAMEWORKS:
        raise ConfigError(f"unknown framework {framework!r}: expected one of {', '.join(FRAMEWORKS)}")
    return framework


def names(framework: str | None = None) -> tuple[str, ...]:
    """nnmem's optimizer names, those ``framework`` builds ("torch" or "keras") or all of them.

    Example:
        >>> names("torch")
        ('sgd', 'momentum', 'adam', 'adamw', 'rmsprop', 'adagrad')
    """
    if framework is None:
        return tuple(_BY_NAME)
    _check_framework(framework)
    return tuple(spec.name for spec in SPECS if spec._build(framework) is not None)


def _unknown(name: str, framework: str | None) -> str:
    if framework is None:
        common = [n for n in names() if len(_BY_NAME[n].frameworks) == len(FRAMEWORKS)]
        extra = "".join(f" ({_LABELS[fw]} also: {', '.join(n for n in names(fw) if n not in common)})"
                        for fw in FRAMEWORKS if set(names(fw)) - set(common))
        expected = ", ".join(common) + extra
    else:
        expected = ", ".join(names(framework))
    text = f"unknown optimizer {name!r}: expected one of {expected} or {_CLASS_HINTS[framework]}"
    spec = _BY_NAME.get(name.lower())
    if spec is not None and framework is not None:
        text += f" ({name!r} is {' and '.join(_LABELS[fw] for fw in spec.frameworks)}-only)"
    return text


def get(name: str, framework: str | None = None) -> OptimizerSpec:
    """The spec an optimizer name stands for (case-insensitive).

    Args:
        name: an optimizer name, e.g. "adam".
        framework: "torch" or "keras" to also require that framework to build it; None accepts any name.

    Raises:
        ConfigError: an unknown name (or one the framework lacks); the message lists the valid names.
    """
    if framework is not None:
        _check_framework(framework)
    spec = _BY_NAME.get(name.lower())
    if spec is None or (framework is not None and spec._build(framework) is None):
        raise ConfigError(_unknown(name, framework))
    return spec


def split_implementation(text: str) -> tuple[str, Implementation | None]:
    """An optimizer text "NAME" or "NAME:IMPLEMENTATION" (torch: "adam:foreach", "adam:fused",
    "sgd:for-loop") as (name, implementation or None). The name is checked by :func:`get`, the implementation
    against what the optimizer offers.

    Raises:
        ConfigError: an unknown name, or an implementation the optimizer does not offer.
    """
    name, sep, impl = text.partition(":")
    if not sep:
        return name, None
    offered = [i.value for i in (get(name, "torch").build("torch").implementations)]
    if impl not in offered:
        raise ConfigError(f"expected {name}:{'|'.join(offered)} (torch.optim's step implementations). "
                          f"Received: {text!r}")
    return name, Implementation(impl)


def find(framework: str, class_name: str, setting: Callable[[str], Any]) -> OptimizerSpec | None:
    """The spec a framework's optimizer object stands for, or None when the registry has none.

    Its class must be named ``class_name`` and each of the spec's arguments must be set (non-zero) on the
    object, as ``setting(argument)`` reads it; the spec with the most such arguments wins (an SGD with
    momentum is "momentum", without it "sgd").
    """
    _check_framework(framework)
    found = [s for s in SPECS if (b := s._build(framework)) is not None and b.class_name == class_name
             and all(setting(key) for key in b.kwargs if key != "lr")]
    return max(found, key=lambda s: len(s.build(framework).kwargs), default=None)
