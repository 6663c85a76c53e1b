"""Structured pruning that really frees memory: output channels (neurons) removed from a layer and the inputs the
next layer reads from them, so the parameters, their gradients and optimizer state, and the activations between
the two shrink.

A pair is a linear or convolution layer (``groups=1``) whose output goes, inside one ``nn.Sequential``, through
element-wise modules only (activations, dropout, and batch norms, which shrink with it) into the next linear or
convolution layer. The last layer of a chain keeps its outputs (the model's output shape does not change), and
nothing is pruned across a ``Flatten``, a skip connection or a functional call in a ``forward``: there the
channel mapping is not known from the structure (the ``torch-pruning`` package traces a dependency graph for
that). The channels kept are those whose weights have the largest L1 norm (:func:`apply_channel_pruning`); the
trace (:func:`channels_pruned`) uses layers of the smaller shapes on the meta device, their values unknown.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from nnmem.errors import UnsupportedError

__all__ = ["apply_channel_pruning", "channel_pairs", "channels_pruned"]

_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_ELEMENTWISE = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.GELU, nn.SiLU, nn.ELU, nn.Tanh, nn.Sigmoid, nn.Hardswish,
                nn.Mish, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.Identity)


def _prunable(module: Any) -> bool:
    return isinstance(module, _LAYERS) and getattr(module, "groups", 1) == 1 and module.weight.shape[0] > 1


def channel_pairs(model: nn.Module) -> list[tuple[nn.Sequential, int, list[int], int]]:
    """(the ``nn.Sequential``, the producer's index, the indices of the batch norms between, the consumer's
    index) of each prunable pair (module docstring).

    Raises:
        UnsupportedError: the model has none.
    """
    pairs = []
    for parent in model.modules():
        if not isinstance(parent, nn.Sequential):
            continue
        children: list[Any] = list(parent)
        for i, producer in enumerate(children):
            if not _prunable(producer):
                continue
            norms, j = [], i + 1
            while j < len(children) and isinstance(children[j], (*_ELEMENTWISE, *_NORMS)):
                if isinstance(children[j], _NORMS):
                    if children[j].num_features != producer.weight.shape[0]:
                        break
                    norms.append(j)
                j += 1
            if (j < len(children) and isinstance(children[j], _LAYERS) and getattr(children[j], "groups", 1) == 1
                    and children[j].weight.shape[1] == producer.weight.shape[0]
                    and isinstance(children[j], nn.Linear) == isinstance(producer, nn.Linear)):
                pairs.append((parent, i, norms, j))
    if not pairs:
        raise UnsupportedError(f"{type(model).__name__} has no linear or convolution layer whose outputs go, inside "
                               f"an nn.Sequential, through element-wise modules only into another: channel pruning "
                               f"needs that structure (torch-pruning traces other graphs)")
    return pairs


def _resized(module: Any, n_in: int | None, n_out: int | None, device: Any) -> nn.Module:
    """A module like ``module`` with ``n_in`` inputs / ``n_out`` outputs (None: unchanged), on ``device``."""
    kw = {"device": device, "dtype": module.weight.dtype}
    outputs = int(n_out or module.weight.shape[0])
    if isinstance(module, _NORMS):
        return type(module)(outputs, module.eps, module.momentum, module.affine, module.track_running_stats, **kw)
    inputs = int(n_in or module.weight.shape[1])
    if isinstance(module, nn.Linear):
        return nn.Linear(inputs, outputs, bias=module.bias is not None, **kw)
    return type(module)(inputs, outputs, module.kernel_size, module.stride, module.padding, module.dilation, 1,
                        module.bias is not None, module.padding_mode, **kw)


def _kept(producer: Any, amount: float) -> torch.Tensor:
    """Indices of the output channels kept: the largest L1 norms (the first ones for a meta weight)."""
    n = producer.weight.shape[0]
    keep = max(1, n - math.floor(amount * n))
    if producer.weight.is_meta:
        return torch.arange(keep)
    norms = producer.weight.detach().flatten(1).abs().sum(1)
    return torch.sort(torch.topk(norms, keep).indices).values


def _plan(model: nn.Module, amount: float) -> list[tuple[Any, int, Any, Any, Any]]:
    """(sequential, index, kept output channels, kept input channels, kept norm channels; None where that side
    stays) for every module a pruning changes; a module that is both a consumer and a producer gets both."""
    changes: dict[tuple[int, int], dict[str, Any]] = {}
    for parent, i, norms, j in channel_pairs(model):
        kept = _kept(parent[i], amount)
        changes.setdefault((id(parent), i), {"parent": parent, "index": i})["out"] = kept
        for k in norms:
            changes.setdefault((id(parent), k), {"parent": parent, "index": k})["norm"] = kept
        changes.setdefault((id(parent), j), {"parent": parent, "index": j})["in"] = kept
    return [(c["parent"], c["index"], c.get("out"), c.get("in"), c.get("norm")) for c in changes.values()]


def _new_module(module: Any, out: Any, inp: Any, norm: Any, device: Any) -> nn.Module:
    if norm is not None:
        return _resized(module, None, len(norm), device)
    return _resized(module, None if inp is None else len(inp), None if out is None else len(out), device)


@contextmanager
def channels_pruned(model: nn.Module, amount: float) -> Iterator[int]:
    """The model with ``amount`` of each pair's channels removed, as layers of the smaller shapes on the meta
    device, inside the block (yields the number of pairs); the original layers after it."""
    plan = _plan(model, amount)
    saved = [(parent, index, parent[index]) for parent, index, *_ in plan]
    try:
        for parent, index, out, inp, norm in plan:
            parent[index] = _new_module(parent[index], out, inp, norm, "meta")
        yield sum(out is not None for _, _, out, _, _ in plan)
    finally:
        for parent, index, module in saved:
            parent[index] = module


def apply_channel_pruning(model: nn.Module, amount: float) -> nn.Module:
    """Remove ``amount`` of each pair's output channels for real (the largest L1 norms kept, their weights
    copied); returns the model."""
    with torch.no_grad():
        for parent, index, out, inp, norm in _plan(model, amount):
            old: Any = parent[index]
            new: Any = _new_module(old, out, inp, norm, old.weight.device)
            for name in ("weight", "bias", "running_mean", "running_var"):
                source, target = getattr(old, name, None), getattr(new, name, None)
                if source is None or target is None:
                    continue
                value = source
                if norm is not None:
                    value = value[norm]
                else:
                    if out is not None:
                        value = value[out]
                    if inp is not None and name == "weight":
                        value = value[:, inp]
                target.copy_(value)
            if norm is not None and getattr(old, "num_batches_tracked", None) is not None:
                new.num_batches_tracked.copy_(old.num_batches_tracked)
            new.train(old.training)
            parent[index] = new
    return model
