"""Lower precision for a PyTorch model: ``torch.autocast`` (mixed) and half-precision parameters (pure).

- ``autocast:bf16`` / ``autocast:fp16``: the forward runs under ``torch.autocast(device, dtype)``. Parameters,
  gradients and optimizer state stay float32 (the master weights); matmuls and convolutions run in the lower
  dtype, on weights autocast casts once per forward and keeps in its cache until the forward ends (in
  training the cast weights are also saved for backward). Activations saved for backward shrink; the fixed
  part of the step grows by the cast copies. The loss is computed on the model's output as autocast leaves it.
- ``half:bf16`` / ``half:fp16``: every floating-point parameter and buffer in the lower dtype (``model.to``),
  so parameters, gradients and optimizer state halve with the activations; floating-point inputs are cast at
  the forward's entrance. No float32 master copy: small updates can vanish in the rounding (bf16 keeps 8 bits
  of mantissa), which is why mixed precision keeps one.

:func:`lowered` applies either for a trace without allocating anything model-sized (the parameters become meta
tensors of the lower dtype; the trace makes them fake); :func:`apply_precision` applies it for real.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from nnmem.errors import ConfigError

__all__ = ["DTYPES", "apply_precision", "describe_precision", "lowered", "precision_dtype"]

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def precision_dtype(kind: str, argument: str) -> torch.dtype:
    """The dtype of "autocast:DTYPE" / "half:DTYPE".

    Raises:
        ConfigError: not bf16 or fp16.
    """
    if argument not in DTYPES:
        raise ConfigError(f"expected {kind}:bf16 or {kind}:fp16. Received: {kind + ':' + argument!r}")
    return DTYPES[argument]


def describe_precision(technique: str) -> str:
    """What "autocast:DTYPE" / "half:DTYPE" changes, in words.

    Raises:
        ConfigError: not bf16 or fp16.
    """
    kind, _, name = technique.partition(":")
    precision_dtype(kind, name)
    if kind == "autocast":
        return (f"forward under torch.autocast: float32 weights, gradients and optimizer state, matmuls and "
                f"convolutions in {name}")
    return f"parameters, buffers, gradients and optimizer state in {name}"


def _autocast_forward(forward: Callable[..., Any], dtype: torch.dtype, *args: Any, **kwargs: Any) -> Any:
    device = next((t.device.type for t in _tensors((args, kwargs))), "cpu")
    with torch.autocast(device_type="cpu" if device == "meta" else device, dtype=dtype):
        return forward(*args, **kwargs)


def _half_forward(forward: Callable[..., Any], dtype: torch.dtype, *args: Any, **kwargs: Any) -> Any:
    def cast(value: Any) -> Any:
        return value.to(dtype) if isinstance(value, torch.Tensor) and value.is_floating_point() else value

    return forward(*tree_map(cast, args), **tree_map(cast, kwargs))


def _tensors(value: Any) -> list[torch.Tensor]:
    from torch.utils._pytree import tree_flatten

    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def _wrap(model: nn.Module, kind: str, dtype: torch.dtype) -> None:
    wrapper = _autocast_forward if kind == "autocast" else _half_forward
    model.forward = functools.partial(wrapper, model.forward, dtype)  # type: ignore[method-assign]


@contextmanager
def lowered(model: nn.Module, kind: str, dtype: torch.dtype) -> Iterator[None]:
    """The model with ``kind`` ("autocast" or "half") at ``dtype`` inside the block, as it was after it. For
    "half" the floating-point parameters and buffers are meta tensors of ``dtype`` meanwhile."""
    if kind == "autocast":
        _check_recurrent(model, dtype)
    saved: list[tuple[dict[str, Any], str, Any]] = []
    if kind == "half":
        from nnmem.frontends.pytorch.step import swap_parameters

        saved = swap_parameters(model, lambda t: torch.empty_like(t, dtype=dtype, device="meta"),
                                lambda t: t.is_floating_point())
    had_forward = "forward" in vars(model)
    previous = vars(model).get("forward")
    _wrap(model, kind, dtype)
    try:
        yield
    finally:
        if had_forward:
            model.forward = previous  # type: ignore[method-assign,assignment]
        else:
            del model.forward
        for table, name, value in saved:
            table[name] = value


def _check_recurrent(model: nn.Module, dtype: torch.dtype) -> None:
    """Refuse autocast to ``dtype`` where the model's LSTMs run through oneDNN and oneDNN has no LSTM of that
    dtype on this CPU: autocast casts ``mkldnn_rnn_layer``'s inputs and the real step fails ("could not create
    a primitive descriptor"). The trace's inference LSTM is one op that autocast does not cast, so the rule that
    catches it in training (:mod:`.workspace.rnn`) would not see it."""
    from nnmem.cpu import describe
    from nnmem.frontends.pytorch.workspace.rnn import refuse_unsupported

    if torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled and any(
            isinstance(m, nn.LSTM) and not m.proj_size for m in model.modules()):
        refuse_unsupported(dtype, describe())


def apply_precision(model: nn.Module, kind: str, dtype: torch.dtype) -> nn.Module:
    """Apply "autocast" or "half" at ``dtype`` to ``model`` for real, in place; returns the model."""
    if kind == "half":
        model.to(dtype)
    _wrap(model, kind, dtype)
    return model
