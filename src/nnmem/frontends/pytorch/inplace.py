"""In-place activations of a PyTorch model: the modules that can run in place, and switching them.

``nn.ReLU(inplace=True)`` and its kin overwrite their input instead of allocating an output: a step keeps one
tensor fewer per activation while it runs. In place is only right where nothing else reads the input and
backward does not need it: after an op that saves its output (a ReLU, a sigmoid) autograd refuses the step,
and where the input is read again (a skip connection) the model would compute something else. So a module is
switched only where that is known from the structure: inside an ``nn.Sequential`` (whose forward hands each
output to the next module alone), right after a linear, convolution or normalization layer (which save their
input, not their output). Other activation modules and functional calls in a ``forward`` (``F.relu(x)``) stay as
they are.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from nnmem.errors import UnsupportedError

__all__ = ["inplace_candidates", "in_place", "apply_inplace"]

_TYPES = (nn.ReLU, nn.LeakyReLU, nn.ELU, nn.CELU, nn.SELU, nn.SiLU, nn.Mish, nn.Hardtanh, nn.Hardswish,
          nn.Hardsigmoid, nn.RReLU, nn.Threshold, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d,
          nn.AlphaDropout, nn.FeatureAlphaDropout)


_PRODUCERS = (nn.Linear, nn.Bilinear, nn.modules.conv._ConvNd, nn.modules.batchnorm._NormBase, nn.LayerNorm,
              nn.GroupNorm, nn.RMSNorm, nn.LocalResponseNorm)


def inplace_candidates(model: nn.Module) -> list[str]:
    """Qualified names of the activation and dropout modules that run out of place now and can safely run in
    place (module docstring): in an ``nn.Sequential``, right after a linear, convolution or normalization layer.

    Raises:
        UnsupportedError: the model has none.
    """
    names = []
    for parent_name, parent in model.named_modules():
        if not isinstance(parent, nn.Sequential):
            continue
        children = list(parent.named_children())
        for (_, before), (name, module) in zip(children, children[1:]):
            if (isinstance(module, _TYPES) and getattr(module, "inplace", None) is False
                    and isinstance(before, _PRODUCERS)):
                names.append(f"{parent_name}.{name}" if parent_name else name)
    if not names:
        raise UnsupportedError(f"{type(model).__name__} has no activation or dropout module that runs out of place "
                               f"where in place is known to be safe (in an nn.Sequential, right after a linear, "
                               f"convolution or normalization layer)")
    return names


@contextmanager
def in_place(model: nn.Module, names: list[str]) -> Iterator[None]:
    """The modules ``names`` run in place inside the block, out of place again after it."""
    modules = dict(model.named_modules())
    for name in names:
        modules[name].inplace = True
    try:
        yield
    finally:
        for name in names:
            modules[name].inplace = False


def apply_inplace(model: nn.Module) -> nn.Module:
    """Switch every candidate module (:func:`inplace_candidates`) to in place, for real; returns the model."""
    modules = dict(model.named_modules())
    for name in inplace_candidates(model):
        modules[name].inplace = True
    return model
