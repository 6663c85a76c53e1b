"""Unstructured pruning with ``torch.nn.utils.prune``, as it really sits in memory.

``prune.l1_unstructured(module, "weight", amount)`` zeroes the smallest weights through a mask, but keeps every
one of them: the parameter becomes ``weight_orig`` (same size), the mask a buffer ``weight_mask`` (same size and
dtype), and a forward pre-hook recomputes ``weight = weight_orig * weight_mask`` as a plain attribute in each
forward, kept until the next one (and saved for backward in training). So pruning this way adds two weight-sized
tensors per pruned layer, whatever the amount; ``prune.remove`` folds the mask in and takes the step back to the
dense model's memory, zeros included. Memory falls only when the zeros are dropped (structured pruning that
removes channels, or sparse storage).

What-if traces use :func:`pruned`: the same parameters, buffer, attribute and hook as ``prune`` makes, with the
mask and the weight on the meta device (their values do not change memory, and a real mask would be a
model-sized allocation). :func:`apply_pruning` prunes for real.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.nn.utils import prune

from nnmem.errors import ConfigError, UnsupportedError

__all__ = ["apply_pruning", "prune_amount", "prune_targets", "pruned"]

_TYPES = (nn.Linear, nn.modules.conv._ConvNd)


def prune_amount(argument: str, kind: str = "prune") -> float:
    """The fraction of "prune:AMOUNT" / "prune-channels:AMOUNT" (0 < AMOUNT < 1).

    Raises:
        ConfigError: not a number strictly between 0 and 1.
    """
    try:
        amount = float(argument)
    except ValueError:
        amount = -1.0
    if not 0.0 < amount < 1.0:
        what = "weights to zero" if kind == "prune" else "output channels to remove"
        raise ConfigError(f"expected {kind}:AMOUNT with AMOUNT the fraction of {what}, between 0 and 1 "
                          f"(e.g. {kind}:0.5). Received: {kind + ':' + argument!r}")
    return amount


def prune_targets(model: nn.Module) -> list[str]:
    """Qualified names of the linear and convolution modules whose ``weight`` is a parameter not yet pruned.

    ``nn.MultiheadAttention``'s ``out_proj`` is left out: the attention reads its weight directly, never calling
    it, so the pruning hook would not run and training would reuse the weight the first step computed (its graph
    freed: "Trying to backward through the graph a second time").

    Raises:
        UnsupportedError: the model has none.
    """
    skipped = {f"{name}.{child}" if name else child for name, module in model.named_modules()
               if isinstance(module, nn.MultiheadAttention) for child, _ in module.named_children()}
    names = [name for name, module in model.named_modules()
             if isinstance(module, _TYPES) and isinstance(module._parameters.get("weight"), nn.Parameter)
             and name not in skipped]
    if not names:
        raise UnsupportedError(f"{type(model).__name__} has no linear or convolution weight to prune")
    return names


@contextmanager
def pruned(model: nn.Module, amount: float) -> Iterator[list[str]]:
    """The model as ``prune.l1_unstructured(module, "weight", amount)`` leaves each of :func:`prune_targets`,
    with the mask and the recomputed weight on the meta device; the model is as it was after the block."""
    names = prune_targets(model)
    modules = dict(model.named_modules())
    done: list[tuple[nn.Module, dict[str, nn.Parameter | None], int]] = []
    try:
        for name in names:
            module = modules[name]
            before = dict(module._parameters)
            weight = module._parameters["weight"]
            method = prune.L1Unstructured(amount)
            method._tensor_name = "weight"
            del module._parameters["weight"]
            module.register_parameter("weight_orig", weight)
            module.register_buffer("weight_mask", torch.empty_like(weight, device="meta"))
            object.__setattr__(module, "weight", torch.empty_like(weight, device="meta"))
            handle = module.register_forward_pre_hook(method)
            done.append((module, before, handle.id))
        yield names
    finally:
        for module, before, hook in reversed(done):
            module._forward_pre_hooks.pop(hook, None)
            module.__dict__.pop("weight", None)
            del module._buffers["weight_mask"]
            module._parameters.clear()
            module._parameters.update(before)


def apply_pruning(model: nn.Module, amount: float) -> nn.Module:
    """Prune ``amount`` of each :func:`prune_targets` weight for real (``prune.l1_unstructured``); returns the
    model."""
    modules = dict(model.named_modules())
    for name in prune_targets(model):
        prune.l1_unstructured(modules[name], "weight", amount=amount)
    return model
