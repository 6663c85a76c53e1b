"""Saved tensors offloaded to host memory (``torch.autograd.graph.save_on_cpu``): a GPU what-if.

``save_on_cpu`` (torch/autograd/graph.py) installs a pair of saved-tensor hooks around the forward: every tensor
autograd saves for backward is copied to host memory when it is saved (``pack_to_cpu``: ``tensor.cpu()``, or with
``pin_memory=True`` a pinned ``torch.empty`` of its size and a copy), and autograd keeps only that host copy;
in backward each one is copied back to the device when its gradient formula needs it (``unpack_from_cpu``:
``tensor.to(device)``: a new contiguous device tensor, freed when that formula is done). Device memory then holds
a saved tensor only while something else (the next layer, a parameter) still refers to it, plus the copies
backward brings back one node at a time — parameters included: a layer's saved weight comes back as a copy.

On a CPU device "host" and "device" are one memory (``tensor.cpu()`` returns the tensor itself), so the technique
saves nothing there; on a GPU it trades device memory for two PCIe copies of every saved tensor.

The estimate traces the step with hooks that do to device memory what ``save_on_cpu`` does and keep nothing on it
(:func:`traced_offload`); the caching-allocator model then gives the GPU peaks. That trace is checked on the CPU
against :func:`host_offload`, the same hooks run for real with the "host" copies in NumPy buffers, which PyTorch's
allocator (the measured level) does not see.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
from torch import nn

from nnmem.errors import UnsupportedError

__all__ = ["MODELLED_NOTE", "apply_offload", "host_offload", "is_traced_offload", "offloaded", "offload_check",
           "traced_offload", "wrap_forward"]

MODELLED_NOTE = ("modelled, not measured: save_on_cpu's device-side effect (saved tensors kept in host memory, "
                 "copied back to the device in backward) traced with hooks that keep nothing on the device; the "
                 "hooks are checked on the CPU with NumPy as the host memory")


def offload_check(mode: str, device: str) -> None:
    """Refuse the technique where it cannot save device memory.

    Raises:
        UnsupportedError: inference (nothing is saved for backward), or a CPU device (host and device are one).
    """
    if mode != "train":
        raise UnsupportedError("save-on-cpu changes training only: it offloads what autograd saves for backward, and "
                               "inference saves nothing")
    if device.lower() == "cpu":
        raise UnsupportedError("save-on-cpu moves saved tensors from a GPU to host memory; on a CPU device they are "
                               "one memory and it saves nothing (estimate it for a GPU: device cuda or a name "
                               "from `nnmem devices`)")


def traced_offload(moved: list[int] | None = None) -> AbstractContextManager[None]:
    """Saved-tensor hooks for a trace: packing keeps only the tensor's size and dtype (its device memory is then
    held by its other references alone), unpacking allocates a new contiguous tensor of that size on its device,
    as ``save_on_cpu``'s ``tensor.to(device)`` does. ``moved`` (when given) collects the bytes of each packed
    tensor: what crosses to the host and back."""

    def pack(t: torch.Tensor) -> tuple[torch.device, torch.Size, torch.dtype]:
        if moved is not None:
            moved.append(t.numel() * t.element_size())
        return t.device, t.size(), t.dtype

    def unpack(packed: tuple[torch.device, torch.Size, torch.dtype]) -> torch.Tensor:
        device, size, dtype = packed
        return torch.empty(size, dtype=dtype, device=device)

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


def is_traced_offload(model: nn.Module) -> bool:
    """Whether ``model``'s forward runs inside :func:`traced_offload` (the estimate's stand-in for save_on_cpu)."""
    return getattr(model.__dict__.get("forward"), "hooks", None) is traced_offload


def host_offload() -> AbstractContextManager[None]:
    """``save_on_cpu``'s hooks run for real on the CPU with NumPy as the host memory: each saved tensor copied into
    a NumPy buffer (outside PyTorch's allocator) when saved, copied back into a new tensor in backward."""

    def pack(t: torch.Tensor) -> tuple[torch.device, torch.dtype, Any]:
        data = t.detach()
        if data.dtype in (torch.bfloat16, torch.float16):
            data = data.view(torch.int16)
        return t.device, t.dtype, data.numpy().copy()

    def unpack(packed: tuple[torch.device, torch.dtype, Any]) -> torch.Tensor:
        device, dtype, array = packed
        out = torch.from_numpy(array).to(device, copy=True)
        return out.view(dtype) if out.dtype != dtype else out

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


@contextmanager
def offloaded(model: nn.Module, hooks: Callable[[], AbstractContextManager[None]]) -> Iterator[None]:
    """For the duration, ``model``'s forward runs inside ``hooks()`` (the saved tensors of its forward packed by
    them; backward unpacks them whatever context it runs in)."""
    own = model.__dict__.get("forward")  # a forward set on the instance (another wrap) comes back after
    wrap_forward(model, hooks)
    try:
        yield
    finally:
        if own is None:
            del model.forward
        else:
            model.forward = own  # type: ignore[method-assign]


def apply_offload(model: nn.Module, pin_memory: bool = True) -> nn.Module:
    """Wrap ``model``'s forward in ``torch.autograd.graph.save_on_cpu(pin_memory=...)`` for real, in place;
    returns the model (on a GPU its saved tensors then live in pinned host memory)."""
    return wrap_forward(model, lambda: torch.autograd.graph.save_on_cpu(pin_memory=pin_memory))


def wrap_forward(model: nn.Module, hooks: Callable[[], AbstractContextManager[None]]) -> nn.Module:
    """Run ``model``'s forward inside ``hooks()`` from now on (an instance attribute over its forward); returns
    the model."""
    forward = model.forward

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with hooks():
            return forward(*args, **kwargs)

    wrapped.hooks = hooks  # type: ignore[attr-defined]
    model.forward = wrapped  # type: ignore[method-assign]  # an instance attribute: nn.Module.__call__ calls it
    return model
