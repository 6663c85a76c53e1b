"""Scratch of convolutions on ATen's native dilated and 3-D kernels (``SlowDilated2d``, ``SlowDilated3d``,
``Slow3d``), any dtype: where oneDNN declines a convolution (a float32 one of batch 1 with a small input and
kernel, a bfloat16 one on a CPU without bf16 instructions).

NaiveDilatedConvolution.cpp (``slow_conv_dilated_all_cpu_template``): inputs made contiguous in the kernel's
layout (channels-last 2-D where ``thnn_conv_use_channels_last``), one sample's columns
``(C kvol) x out_vol`` reused across the batch, and a gradient of the bias summed per sample
(``grad_output_n.sum(dims)``: ``C_out`` elements). Groups go through Convolution.cpp's per-group ``subtensor``
copies, as for ``Slow2d`` (:mod:`.conv_im2col`). ConvolutionMM3d.cpp: ``compute_columns3d`` unfolds the whole
batch (a view of the input for a 1x1x1 kernel with unit stride, no padding and one group), the input gradient
takes a whole-batch ``fgrad_input`` of the same shape, grad_output is made contiguous in each phase, and the
bias gradient is a ``sum_out`` over the batch and the volume; groups are native (batched gemms).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from nnmem.frontends.pytorch.workspace._common import alloc_peak
from nnmem.frontends.pytorch.workspace.conv_im2col import (
    _bias_sum_buffer,
    _copy,
    _made_contiguous,
    _slow2d_format,
    grouped_backward,
    grouped_forward,
)
from nnmem.frontends.pytorch.workspace.conv_select import ConvCall, tensor_layout

__all__ = ["slow_dilated_forward", "slow_dilated_backward", "slow3d_forward", "slow3d_backward"]


def _format(call: ConvCall) -> str:
    """The layout the dilated kernels work in: channels-last for a 2-D call where either operand is, else
    contiguous (the 3-D kernel is contiguous only)."""
    return _slow2d_format(call) if len(call.x_shape) == 4 else "contiguous"


def _made(call: ConvCall) -> int:
    """Bytes of the input and weight made contiguous in the kernel's layout."""
    return _made_contiguous(call) if len(call.x_shape) == 4 else (
        _copy(call.x_shape, call.x_bytes, call.x_layout, "contiguous")
        + _copy(call.w_shape, call.w_bytes, call.w_layout, "contiguous"))


def _sample_columns(call: ConvCall, channels: int) -> int:
    """One sample's columns of the dilated kernel: ``channels x kvol x out_vol`` elements, always allocated."""
    return channels * math.prod(call.w_shape[2:]) * math.prod(call.out_sizes) * call.itemsize


def slow_dilated_forward(call: ConvCall, out_bytes: int) -> int:
    """``SlowDilated2d`` / ``SlowDilated3d`` forward: the operands made contiguous, one sample's columns, per group
    as :func:`~.conv_im2col.grouped_forward` has it."""
    columns = _sample_columns(call, call.x_shape[1] // call.groups)
    return grouped_forward(call, out_bytes, _made(call), columns, _format(call))


def _dilated_backward_seq(call: ConvCall, gy_shape: tuple[int, ...], gy_layout: str, channels: int,
                          mask: Sequence[bool], sizes: tuple[int, int, int]) -> list[int]:
    """``slow_conv_dilated{2,3}d_backward_cpu`` on one group: grad_output made contiguous in the kernel's layout,
    the gradients, one sample's columns and, per sample, the bias gradient's sum (``C_out`` elements)."""
    gy_copy = 0 if gy_layout == _format(call) else math.prod(gy_shape) * call.itemsize
    columns = _sample_columns(call, channels) if mask[0] or mask[1] else 0
    bias_sum = gy_shape[1] * call.itemsize if mask[2] else 0
    return [gy_copy, *sizes, columns, bias_sum, -bias_sum, -columns, -gy_copy]


def slow_dilated_backward(call: ConvCall, grad_out: torch.Tensor, mask: Sequence[bool], fresh: int) -> int:
    """``convolution_backward``'s ``SlowDilated`` branches (Convolution.cpp), per group as
    :func:`~.conv_im2col.grouped_backward` has it."""
    return grouped_backward(call, grad_out, mask, fresh, _made(call), _dilated_backward_seq, _format(call))


def _batch_columns(call: ConvCall, *, view_allowed: bool) -> int:
    """``compute_columns3d``: ``N x (C kvol) x out_vol`` elements for the whole batch; a view of the input (nothing)
    for a 1x1x1 kernel with unit stride, no padding and one group when ``view_allowed``."""
    if (view_allowed and math.prod(call.w_shape[2:]) == 1 and all(s == 1 for s in call.stride)
            and all(p == 0 for p in call.padding) and call.groups == 1):
        return 0
    n, c = call.x_shape[:2]
    return n * c * math.prod(call.w_shape[2:]) * math.prod(call.out_sizes) * call.itemsize


def slow3d_forward(call: ConvCall, out_bytes: int) -> int:
    """``slow_conv3d_forward_out_cpu``: the input and the weight made contiguous, the batch's columns."""
    return _made(call) + _batch_columns(call, view_allowed=True)


def slow3d_backward(call: ConvCall, grad_out: torch.Tensor, mask: Sequence[bool], fresh: int) -> int:
    """``slow_conv3d_backward_out_cpu``: the input gradient (weight and grad_output made contiguous, grad_input
    resized, a whole-batch ``fgrad_input``), the bias gradient (``sum_out`` over batch and volume), then the weight
    gradient (resized, grad_output made contiguous again, the input's columns); each gradient is allocated (resized
    from empty) in its own phase."""
    gy_shape = tuple(int(d) for d in grad_out.shape)
    e = call.itemsize
    gy_copy = 0 if grad_out.is_contiguous() else math.prod(gy_shape) * e
    w_copy = _copy(call.w_shape, call.w_bytes, call.w_layout, "contiguous")
    x_copy = _copy(call.x_shape, call.x_bytes, call.x_layout, "contiguous")
    seq: list[int] = []
    if mask[0]:
        fgrad = _batch_columns(call, view_allowed=False)
        seq += [w_copy, gy_copy, call.x_bytes, fgrad, -fgrad, -gy_copy, -w_copy]
    if mask[2]:
        acc = _bias_sum_buffer(gy_shape, call.dtype, tensor_layout(grad_out))
        seq += [call.w_shape[0] * e, acc, -acc]
    if mask[1]:
        columns = _batch_columns(call, view_allowed=True)
        seq += [call.w_bytes, gy_copy, x_copy, columns, -columns, -x_copy, -gy_copy]
    return max(alloc_peak(seq) - fresh, 0)
