"""Fake kernels for ops whose PyTorch meta kernel refuses what the CPU kernel runs.

``aten._grouped_mm``'s meta kernel checks the CUDA kernel's bf16-only rule (torch/_meta_registrations.py
``_meta_grouped_mm_common``), while the CPU kernel takes any float dtype; libraries pick the op by
availability (transformers ``integrations/moe.py`` ``_can_use_grouped_mm``), so a float32 MoE runs it for
real and fails under fake tensors. The output rule follows ATen ``create_grouped_gemm_output_tensor``
(aten/src/ATen/native/GroupedMMUtils.h): the last dimension's stride padded to 16 bytes.

The reflection and replication padding ops keep a channels-last input's layout on the CPU where their meta
kernels return contiguous outputs (:func:`_in_input_format`).

The packing ops of ``torch.nn.utils.rnn`` (aten/src/ATen/native/PackedSequence.cpp) read their lengths or
batch sizes, a CPU int64 tensor, through a data pointer. ``VALUE_ARGS`` names that argument: the dispatch mode
passes its real value, and the kernels below size the fake outputs from it and return ``batch_sizes`` and
``lengths`` as real tensors, as the CPU kernel makes them. With autograd on, ``_pad_packed_sequence`` runs its
composite kernel above the dispatch modes, which writes its ``lengths`` into a fake ``empty``:
:func:`packed_sequences` swaps in a replay of that kernel, op for op, that makes ``lengths`` real.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch._subclasses.fake_tensor import is_fake
from torch.utils._python_dispatch import _disable_current_modes

__all__ = ["FAKE_KERNELS", "VALUE_ARGS", "packed_sequences"]


def _grouped_mm(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: torch.Tensor | None = None,
                bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor | None:
    """The CPU kernel's output; None leaves a bf16 call (which the meta kernel accepts) to the meta kernel."""
    if mat_a.dtype == torch.bfloat16 or mat_a.device.type != "cpu":
        return None
    groups = 0 if offs is None else offs.shape[0]
    if mat_a.dim() == 2 and mat_b.dim() == 2:
        size = [groups, mat_a.shape[0], mat_b.shape[1]]
    elif mat_a.dim() == 2:
        size = [mat_a.shape[0], mat_b.shape[-1]]
    elif mat_b.dim() == 2:
        size = [mat_a.shape[1], mat_b.shape[1]]
    else:
        size = [mat_a.shape[0], mat_a.shape[1], mat_b.shape[-1]]
    dtype = out_dtype or mat_a.dtype
    align = max(16 // dtype.itemsize, 1)
    padded = -(-size[-1] // align) * align
    stride = [size[1] * padded, padded, 1] if len(size) == 3 else [padded, 1]
    return torch.empty_strided(size, stride, dtype=dtype, device=mat_a.device)


def _in_input_format(op: Any, index: int) -> Callable[..., Any]:
    """A fake kernel for a padding op whose CPU kernel makes its output in the memory format its input suggests
    (aten/src/ATen/native/ReflectionPad.cpp, ReplicationPadding.cpp: ``input.suggest_memory_format()``; the
    backward's grad_input follows ``self``) where the meta kernel returns a contiguous one: a channels-last (3-D)
    input keeps its layout, and the convolution after it runs on oneDNN's nhwc kernels, not on nchw reorders.
    ``index``: the argument whose format the output takes. None (the meta kernel) for any other input."""
    def kernel(*args: Any, **kwargs: Any) -> torch.Tensor | None:
        ref = args[index]
        if not isinstance(ref, torch.Tensor) or ref.is_contiguous() or ref.dim() not in (4, 5):
            return None
        fmt = torch.channels_last if ref.dim() == 4 else torch.channels_last_3d
        if not ref.is_contiguous(memory_format=fmt):
            return None
        out = op(*args, **kwargs)  # the meta kernel: checks and sizes
        return torch.empty(out.shape, dtype=out.dtype, device=out.device, memory_format=fmt)
    return kernel


def _pad(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """``aten.pad`` as it reaches the modes whole under inference mode: its reflection and replication modes run
    the padding kernels above (:func:`_in_input_format`); constant and circular padding keep the meta kernel's
    layout, as the CPU's does."""
    mode = args[2] if len(args) > 2 else kwargs.get("mode", "constant")
    if mode not in ("reflect", "replicate"):
        return None
    return _in_input_format(torch.ops.aten.pad.default, 0)(*args, **kwargs)


def _values(t: torch.Tensor) -> list[int]:
    """A plain tensor's values, read outside the fake mode."""
    with _disable_current_modes():
        return [int(v) for v in t.tolist()]


def _real_long(values: list[int]) -> torch.Tensor:
    """A plain CPU int64 tensor, made outside the fake mode."""
    with _disable_current_modes():
        return torch.tensor(values, dtype=torch.long)


def _pack_padded_sequence(data: torch.Tensor, lengths: torch.Tensor,
                          batch_first: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(data, batch_sizes)``: one packed row per valid entry; ``batch_sizes[t]`` counts lengths above t."""
    if not is_fake(data) or is_fake(lengths):
        return None
    values = _values(lengths)
    batch_sizes = [sum(1 for v in values if v > t) for t in range(values[0])]
    packed = torch.empty((sum(values), *data.shape[2:]), dtype=data.dtype, device=data.device)
    return packed, _real_long(batch_sizes)


def _pack_padded_sequence_backward(grad: torch.Tensor, input_size: list[int], batch_sizes: torch.Tensor,
                                   batch_first: bool) -> torch.Tensor | None:
    """The padded gradient: zeros in time-major order, transposed back for ``batch_first``."""
    if not is_fake(grad) or is_fake(batch_sizes):
        return None
    size = list(input_size)
    if batch_first:
        size[0], size[1] = size[1], size[0]
    out = torch.zeros(size, dtype=grad.dtype, device=grad.device)
    return out.transpose(0, 1) if batch_first else out


def _pad_packed_sequence(data: torch.Tensor, batch_sizes: torch.Tensor, batch_first: bool,
                         padding_value: float, total_length: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(padded, lengths)``: a ``full`` time-major output (transposed for ``batch_first``), real lengths."""
    if not is_fake(data) or is_fake(batch_sizes):
        return None
    sizes = _values(batch_sizes)
    steps = max(len(sizes), total_length)
    out = torch.full((steps, sizes[0], *data.shape[1:]), padding_value, dtype=data.dtype, device=data.device)
    lengths = _real_long([sum(1 for b in sizes if b > j) for j in range(sizes[0])])
    return (out.transpose(0, 1) if batch_first else out), lengths


def _pad_packed_replay(data: torch.Tensor, batch_sizes: torch.Tensor, batch_first: bool,
                       padding_value: float, total_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ATen's ``_pad_packed_sequence`` (PackedSequence.cpp) in the same ops, its ``lengths`` a real tensor
    (``torch.tensor`` lifts it through the dispatch modes, so the tracker counts it)."""
    sizes = _values(batch_sizes)
    steps = max(len(sizes), total_length)
    rest = list(data.shape[1:])
    out = torch.full((steps, sizes[0], *rest), padding_value, dtype=data.dtype, device=data.device)
    lengths = torch.tensor([sum(1 for b in sizes if b > j) for j in range(sizes[0])], dtype=torch.long)
    offset, prev_batch, prev_i = 0, sizes[0], 0
    for i in range(len(sizes) + 1):
        batch = sizes[i] if i != len(sizes) else 0
        if batch != prev_batch:
            n = prev_batch * (i - prev_i)
            block = data.narrow(0, offset, n).view(i - prev_i, prev_batch, *rest)
            out.narrow(0, prev_i, i - prev_i).narrow(1, 0, prev_batch).copy_(block)
            offset, prev_i = offset + n, i
        prev_batch = batch
    return (out.transpose(0, 1) if batch_first else out), lengths


@contextmanager
def packed_sequences() -> Iterator[None]:
    """Within: ``torch._VF._pad_packed_sequence`` on a fake ``data`` and real ``batch_sizes`` is replayed, except
    under inference mode, where the op reaches the dispatch modes whole (``FAKE_KERNELS``)."""
    vf = torch._VF
    native = vf._pad_packed_sequence

    def pad(data: torch.Tensor, batch_sizes: torch.Tensor, *args: Any) -> Any:
        if is_fake(data) and not is_fake(batch_sizes) and not torch.is_inference_mode_enabled():
            return _pad_packed_replay(data, batch_sizes, *args)
        return native(data, batch_sizes, *args)

    vf._pad_packed_sequence = pad  # type: ignore[assignment]  # shadows VFModule.__getattr__
    try:
        yield
    finally:
        del vf._pad_packed_sequence


# op overload → function(*args, **kwargs) returning the fake output, or None to use the meta kernel.
FAKE_KERNELS: dict[Any, Callable[..., Any]] = {
    torch.ops.aten._grouped_mm.default: _grouped_mm,
    torch.ops.aten._pack_padded_sequence.default: _pack_padded_sequence,
    torch.ops.aten._pack_padded_sequence_backward.default: _pack_padded_sequence_backward,
    torch.ops.aten._pad_packed_sequence.default: _pad_packed_sequence,
    torch.ops.aten.pad.default: _pad,
    **{op: _in_input_format(op, index) for op, index in (
        (torch.ops.aten.reflection_pad3d.default, 0), (torch.ops.aten.replication_pad3d.default, 0),
        (torch.ops.aten.reflection_pad2d_backward.default, 1), (torch.ops.aten.replication_pad2d_backward.default, 1),
        (torch.ops.aten.reflection_pad3d_backward.default, 1), (torch.ops.aten.replication_pad3d_backward.default, 1))},
}
# op overload → position of the CPU int64 argument the kernel reads, which the mode gives its real value.
VALUE_ARGS: dict[Any, int] = {
    torch.ops.aten._pack_padded_sequence.default: 1,
    torch.ops.aten._pack_padded_sequence_backward.default: 2,
    torch.ops.aten._pad_packed_sequence.default: 1,
}
