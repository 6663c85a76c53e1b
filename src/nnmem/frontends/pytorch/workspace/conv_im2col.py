"""Scratch of convolutions on ATen's im2col kernel (``thnn_conv2d``, the ``Slow2d`` backend), any dtype.

Follows aten/src/ATen/native/Convolution.cpp (``_convolution``, ``subtensor`` per group) and
ConvolutionMM2d.cpp (``compute_columns2d``, ``slow_conv2d_forward_out_cpu``, ``slow_conv2d_backward_out_cpu``):
whole-batch columns, inputs made contiguous in the kernel's layout, per-group copies.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from nnmem.frontends.pytorch.workspace._common import alloc_peak
from nnmem.frontends.pytorch.workspace.conv_select import ConvCall, tensor_layout


def _columns(call: ConvCall, channels: int) -> int:
    """Bytes of ``compute_columns2d`` (ConvolutionMM2d.cpp): the batch unfolded, ``N x (C kh kw) x (oh ow)``;
    a view of the input (nothing) for a 1x1 kernel with stride 1 and no padding."""
    n, _, h, w = call.x_shape
    kh, kw = call.w_shape[2], call.w_shape[3]
    if (kh, kw) == (1, 1) and call.stride == (1, 1) and call.padding == (0, 0):
        return 0
    oh = (h + 2 * call.padding[0] - kh) // call.stride[0] + 1
    ow = (w + 2 * call.padding[1] - kw) // call.stride[1] + 1
    return n * channels * kh * kw * oh * ow * call.itemsize


def _slow2d_format(call: ConvCall) -> str:
    """The layout the Slow2d kernels work in: channels-last when the input or the weight is
    (ConvUtils.h ``thnn_conv_use_channels_last``), contiguous otherwise."""
    return "channels_last" if "channels_last" in (call.x_layout, call.w_layout) else "contiguous"


def _made_contiguous(call: ConvCall) -> int:
    """Bytes of ``input.contiguous(fmt)`` and ``weight.contiguous(fmt)`` before the Slow2d kernel (a strided
    1-D input is made contiguous by ``_convolution`` first)."""
    fmt = _slow2d_format(call)
    return _copy(call.x_shape, call.x_bytes, call.x_layout, fmt) + _copy(call.w_shape, call.w_bytes, call.w_layout, fmt)


def _copy(shape: tuple[int, ...], size: int, layout: str, fmt: str) -> int:
    """Bytes ``contiguous(fmt)`` copies: none when the tensor already is, as a contiguous tensor with one
    channel or one spatial element is also channels-last (size-1 dimensions' strides do not count)."""
    if layout == fmt or layout == "contiguous" and (shape[1] == 1 or math.prod(shape[2:]) == 1):
        return 0
    return size


def _slice_copy(shape: tuple[int, ...], itemsize: int, groups: int, layout: str = "contiguous") -> int:
    """Bytes of ``subtensor(t, 1, groups, g)`` (Convolution.cpp): one group's channels made contiguous in ``t``'s
    suggested format, a copy unless the batch is 1 and ``t`` contiguous (an expanded grad_output, as a ``sum()``'s
    backward hands it, is copied at batch 1 too)."""
    return 0 if shape[0] == 1 and layout == "contiguous" else math.prod(shape) * itemsize // groups


def grouped_forward(call: ConvCall, out_bytes: int, made: int, columns: int, fmt: str) -> int:
    """Scratch of a native kernel's forward under ``_convolution`` (Convolution.cpp): the operands made contiguous
    (``made`` bytes), then with one group the kernel's ``columns``; with several, per group a ``subtensor`` copy of
    the input's channels (in ``fmt``), its columns and its output, and ``at::cat`` of the group outputs."""
    g = call.groups
    if g == 1:
        return made + columns
    slice_in, slice_out = _slice_copy(call.x_shape, call.itemsize, g, fmt), out_bytes // g
    seq = [made]
    for _ in range(g):
        seq += [slice_in, columns, slice_out, -columns, -slice_in]
    return alloc_peak([*seq, out_bytes]) - out_bytes


GroupSeq = Callable[[ConvCall, tuple[int, ...], str, int, Sequence[bool], tuple[int, int, int]], list[int]]
"""One group's backward kernel as a sequence of allocations: ``(call, grad_output's shape and layout, channels,
mask, (grad_input, grad_weight, grad_bias) bytes) -> [+alloc, -free, ...]``."""


def grouped_backward(call: ConvCall, grad_out: torch.Tensor, mask: Sequence[bool], fresh: int, made: int,
                     kernel: GroupSeq, fmt: str) -> int:
    """Scratch of ``convolution_backward``'s branches for native kernels without groups (Convolution.cpp): the
    operands made contiguous (``made`` bytes); per group ``subtensor`` copies of grad_output's and the input's
    channels, the ``kernel``'s sequence, and ``at::cat`` of the group gradients at the end."""
    g, e = call.groups, call.itemsize
    gy_shape = tuple(int(d) for d in grad_out.shape)
    if call.one_d:
        gy_shape = (*gy_shape[:2], 1, gy_shape[2])
    channels = call.x_shape[1] // g
    sizes = (call.x_bytes // g if mask[0] else 0, call.w_bytes // g if mask[1] else 0,
             call.w_shape[0] // g * e if mask[2] else 0)
    gy_layout = tensor_layout(grad_out)
    if g == 1:
        return max(alloc_peak([made, *kernel(call, gy_shape, gy_layout, channels, mask, sizes)]) - fresh, 0)
    gy_g, x_g = _slice_copy(gy_shape, e, g, gy_layout), _slice_copy(call.x_shape, e, g, fmt)
    group_shape = (gy_shape[0], gy_shape[1] // g, *gy_shape[2:])
    slice_layout = "channels_last" if gy_layout == "channels_last" else "contiguous"  # suggest_memory_format
    seq = [made]
    for _ in range(g):
        seq += [gy_g, x_g, *kernel(call, group_shape, slice_layout, channels, mask, sizes), -gy_g, -x_g]
    seq += [g * s for s in sizes]
    return max(alloc_peak(seq) - fresh, 0)


def slow2d_forward(call: ConvCall, out_bytes: int) -> int:
    """Scratch of the ``Slow2d`` branch of ``_convolution`` (Convolution.cpp) and ``slow_conv2d_forward_out_cpu``
    (ConvolutionMM2d.cpp): the batch's columns (``compute_columns2d``), per group as :func:`grouped_forward` has it."""
    return grouped_forward(call, out_bytes, _made_contiguous(call), _columns(call, call.x_shape[1] // call.groups),
                           _slow2d_format(call))


def _bias_sum_buffer(shape: tuple[int, ...], dtype: torch.dtype, layout: str) -> int:
    """Float32 buffers of ``sum_out`` of a bfloat16/float16 NC(H)W tensor over N and the spatial dimensions, in
    bytes (ReduceOps.cpp ``should_use_acc_buffer``): when two reduced dimensions stay apart after coalescing
    (a contiguous NCHW tensor with N > 1, C > 1, H*W > 1; in channels-last N, H and W coalesce into one) it
    sums ``self.to(kFloat)`` into a float32 result, then copies it back."""
    n, c, spatial = shape[0], shape[1], math.prod(shape[2:])
    if dtype not in (torch.bfloat16, torch.float16) or layout != "contiguous" or min(n, c, spatial) <= 1:
        return 0
    return 4 * (math.prod(shape) + c)


def _slow2d_backward_seq(call: ConvCall, gy_shape: tuple[int, ...], gy_layout: str, channels: int,
                         mask: Sequence[bool], sizes: tuple[int, int, int]) -> list[int]:
    """``slow_conv2d_backward_out_cpu`` (ConvolutionMM2d.cpp) on one group: grad_input (its per-thread column
    buffer is a ``std::make_unique``, outside the allocator), grad_bias by ``sum_out`` of grad_output as it
    came, then grad_weight over the input unfolded again; grad_output is made contiguous in the kernel's
    layout in the grad_input and grad_weight phases."""
    gx, gw, gb = sizes
    gy_copy = 0 if gy_layout == _slow2d_format(call) else math.prod(gy_shape) * call.itemsize
    seq: list[int] = []
    if mask[0]:
        seq += [gx, gy_copy, -gy_copy]
    if mask[2]:
        acc = _bias_sum_buffer(gy_shape, call.dtype, gy_layout)
        seq += [gb, acc, -acc]
    if mask[1]:
        columns = _columns(call, channels)
        seq += [gw, gy_copy, columns, -columns, -gy_copy]
    return seq


def slow2d_backward(call: ConvCall, grad_out: torch.Tensor, mask: Sequence[bool], fresh: int) -> int:
    """Scratch of ``convolution_backward``'s ``Slow2d`` branch (Convolution.cpp), per group as
    :func:`grouped_backward` has it."""
    return grouped_backward(call, grad_out, mask, fresh, _made_contiguous(call), _slow2d_backward_seq,
                            _slow2d_format(call))
