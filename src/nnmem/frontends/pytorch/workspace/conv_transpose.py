"""Scratch of float32 transposed convolutions: oneDNN's deconvolution (ideep) and ATen's ``slow_conv_transpose2d``.

ATen's ``mkldnn_convolution_transpose`` (aten/src/ATen/native/mkldnn/Conv.cpp) hands ideep's
``deconvolution_forward`` the nchw input; oneDNN runs a deconvolution as the backward data of the convolution
with the roles swapped (``conv:any+...`` / ``brg_deconv:...+...`` in ``ONEDNN_VERBOSE``), and the layouts follow
the kernel it picks (oneDNN 3.12 on AVX-512, measured with ``benchmarks/calibrate_workspace.py``):

- unit stride: ``jit`` / ``jit_1x1`` on blocked ``aBcd16b`` activations and ``BAcd16b16a`` weights (both channel
  counts padded to 16), a blocked destination copied dense into the output;
- a stride: ``brgconv_strided`` on nhwc (``acdb``) activations and ``Acdb16a/32a`` weights, whose scratchpad is the
  strided backward data's (:func:`.conv_brgemm_bwd.strided_bwd_data`) booked as a nested registry (+128 B); the
  nhwc destination is copied into a channels-last output that ATen then makes contiguous.

At unit stride a bias is added outside the kernel, through a float32 buffer of the blocked destination's size
(+128 B, booked first). The backward runs the transposed convolution's forward and backward weights
(:func:`transpose_backward`). ATen's own kernel (batch 1, small inputs) fills a ``columns`` buffer
(:func:`slow_transpose_forward`, :func:`slow_transpose_backward`). AVX2 (8-channel blocks) has its own kernels:
:mod:`.conv_transpose_avx2`. Shapes the rules do not follow (on AVX-512: grouped, channels-last, dilated, 3-D, an
output width that is not a multiple of the stride, the blockings ``strided_bwd_data`` or ``bwd_weights_scratch`` do
not size) keep :func:`transpose_note`'s note. Measured on seeded draws: tests/frontends/pytorch/test_conv_transpose.py.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from nnmem.cpu import CpuInfo
from nnmem.frontends.pytorch.workspace._common import NOT_MODELLED, alloc_peak, round_up
from nnmem.frontends.pytorch.workspace.conv_bf16_transpose import (
    bf16_transpose_backward,
    bf16_transpose_claims,
    bf16_transpose_forward,
)
from nnmem.frontends.pytorch.workspace.conv_brgemm_bwd import strided_bwd_data
from nnmem.frontends.pytorch.workspace.conv_transpose_avx2 import (
    avx2_modelled,
    avx2_transpose_backward,
    avx2_transpose_claims,
    avx2_transpose_forward,
    channels_last_copies,
)

if TYPE_CHECKING:  # conv_select imports this module for its note
    from nnmem.frontends.pytorch.workspace.conv_select import ConvCall

_NESTED = 128  # a nested primitive's registry booked in the deconvolution's: its size plus the alignment
_BLOCK = 16  # the AVX-512 channel block; AVX2 (8) runs other kernels, not measured


def transposed_out_sizes(call: ConvCall) -> tuple[int, ...]:
    """Spatial sizes of a transposed convolution's output: ``(x - 1)·s - 2p + d·(k - 1) + output_padding + 1``."""
    return tuple((x - 1) * s - 2 * p + d * (k - 1) + op + 1 for x, s, p, d, k, op in
                 zip(call.x_shape[2:], call.stride, call.padding, call.dilation, call.w_shape[2:],
                     call.output_padding))


def _as_convolution(call: ConvCall) -> ConvCall:
    """The convolution whose backward data oneDNN runs: its input is the deconvolution's output, its weight
    ``[c, o, k...]`` (the deconvolution's, read with the channel roles swapped)."""
    out = transposed_out_sizes(call)
    n, c = call.x_shape[:2]
    o = call.w_shape[1]
    return dataclasses.replace(call, x_shape=(n, o, *out), w_shape=(c, o, *call.w_shape[2:]), transposed=False,
                               output_padding=(0,) * len(out))


def _modelled(call: ConvCall, info: CpuInfo) -> bool:
    return (call.dtype == torch.float32 and call.groups == 1 and len(call.x_shape) == 4
            and call.x_layout == "contiguous" and info.onednn_block == _BLOCK
            and all(d == 1 for d in call.dilation))


def _strided_pad(call: ConvCall) -> int | None:
    """``brgconv_strided``'s scratchpad nested in the deconvolution's, where the output's width is a multiple of
    the stride (an uneven one books an output buffer after the blocking, measured otherwise: not sized)."""
    conv = _as_convolution(call)
    if conv.x_shape[-1] % conv.stride[-1]:
        return None
    pad = strided_bwd_data(conv, torch.get_num_threads(), _BLOCK)
    return None if pad is None else pad + _NESTED


def transpose_forward(call: ConvCall, bias: bool, info: CpuInfo) -> int | None:
    """Scratch bytes of ``mkldnn_convolution_transpose`` (the output excluded), or None where not modelled.

    Unit stride: ``[buf, src, wei, dst, -wei, -src, -buf, out, -dst]`` with blocked src / dst (channels padded to
    16) and ``BAcd16b16a`` weights, ``buf`` the bias's float32 destination (+128 B) or nothing without a bias.
    Strided: ``[pad, src, wei, dst, -wei, -src, -pad, out_cl, out, -dst, -out_cl]`` with nhwc src and dst (the
    src not reordered with one channel or one position), ``Acdb16a/32a`` weights over the output channels and
    ``out_cl`` the channels-last output ATen makes contiguous (none where nhwc is nchw: one output channel or
    one position)."""
    from nnmem.frontends.pytorch.workspace.conv_select import io_block

    if call.dtype == torch.bfloat16:  # conv_bf16_transpose's kernels
        return bf16_transpose_forward(call, bias, info)
    if avx2_modelled(call, info):  # AVX2: conv_transpose_avx2
        return avx2_transpose_forward(call, bias)
    if not _modelled(call, info):
        return None
    n, c = call.x_shape[:2]
    o, k, e = call.w_shape[1], math.prod(call.w_shape[2:]), call.itemsize
    s_in, s_out = math.prod(call.x_shape[2:]), math.prod(transposed_out_sizes(call))
    out = n * o * s_out * e
    if all(s == 1 for s in call.stride):
        src = n * round_up(c, _BLOCK) * s_in * e
        wei = round_up(o, _BLOCK) * round_up(c, _BLOCK) * k * e
        dst = n * round_up(o, _BLOCK) * s_out * e
        buf = dst + _NESTED if bias else 0
        return alloc_peak([buf, src, wei, dst, -wei, -src, -buf, out, -dst]) - out
    pad = _strided_pad(call)
    if pad is None:
        return None
    src = 0 if c == 1 or s_in == 1 else n * c * s_in * e
    wei = round_up(o, io_block(o, _BLOCK)) * c * k * e
    out_cl = 0 if o == 1 or s_out == 1 else out
    return alloc_peak([pad, src, wei, out, -wei, -src, -pad, out_cl, out, -out, -out_cl]) - out


def transpose_backward(call: ConvCall, grad_out: torch.Tensor, mask: Sequence[bool], outs: Sequence[Any],
                       info: CpuInfo) -> int | None:
    """Scratch bytes of ``mkldnn_convolution_transpose_backward`` (the fresh gradients excluded), or None where not
    modelled. oneDNN computes a deconvolution's input gradient as the forward of the convolution it transposes
    (:func:`.conv_onednn.conv_forward` on ``grad_output``, weights ``[c, o, k]`` read as that convolution's) and
    its weights' gradient as that convolution's backward weights with the roles swapped: ``grad_output`` is the
    source (kept nchw for 1-3 channels above a 1x1 kernel, blocks of 8 for 4-15: ``jit:avx2``), the input the
    destination's gradient; the bias gradient (``o`` channels) is summed outside the kernel. Measured sequence:
    ``[copy, data..., gy, x, gw, scratchpad, gb, -scratchpad, -x, -gy, gb, gw_dense, -gw, -gb]``, ``copy`` a
    non-contiguous ``grad_output`` made contiguous."""
    from nnmem.frontends.pytorch.workspace.conv_bwd_weights import bwd_weights_scratch
    from nnmem.frontends.pytorch.workspace.conv_onednn import conv_forward

    if call.dtype == torch.bfloat16:  # conv_bf16_transpose's kernels
        return bf16_transpose_backward(call, grad_out, mask, outs, info)
    if avx2_modelled(call, info):  # AVX2: conv_transpose_avx2
        return avx2_transpose_backward(call, grad_out, mask, outs, info)
    if not _modelled(call, info):
        return None
    n, c = call.x_shape[:2]
    o, k, e = call.w_shape[1], math.prod(call.w_shape[2:]), call.itemsize
    if k == 1 and max(call.stride) > 2:  # jit_1x1's "reduce to unit stride" is sized for stride 2 only
        return None
    s_x, s_gy = math.prod(call.x_shape[2:]), math.prod(transposed_out_sizes(call))
    seq = [0 if grad_out.is_contiguous() else n * o * s_gy * e]
    if mask[0]:
        gx = torch.empty(call.x_shape, dtype=call.dtype, device="meta")
        weight = torch.empty((c, o, *call.w_shape[2:]), dtype=call.dtype, device="meta")
        gy = torch.empty((n, o, *transposed_out_sizes(call)), dtype=call.dtype, device="meta")
        data = conv_forward(gy, weight, None, gx, 1, _BLOCK, call.stride)
        seq += [data + n * c * s_x * e, -data]
    if mask[1] or mask[2]:
        first = o <= 3 and k > 1
        bc = 8 if 4 <= o < 16 and k > 1 else _BLOCK
        pad = bwd_weights_scratch(_as_convolution(call), False, _BLOCK, torch.get_num_threads())
        if pad is None:
            return None
        pad += _NESTED if pad else 0  # the convolution's registry nested in the deconvolution's
        gy2 = 0 if first else n * round_up(o, bc) * s_gy * e
        xs = n * round_up(c, bc) * s_x * e
        gw = round_up(c, bc) * (o if first else round_up(o, bc)) * k * e
        gb = o * e if mask[2] else 0
        w = c * o * k * e
        seq += [gy2, xs, gw, pad, gb, -pad, -xs, -gy2, gb, w, -gw, -gb]
    fresh = sum(int(t.untyped_storage().nbytes()) for t in outs if isinstance(t, torch.Tensor))
    return max(alloc_peak(seq) - fresh, 0)


def slow_transpose_forward(call: ConvCall) -> int | None:
    """``slow_conv_transpose2d`` (NaiveConvolutionTranspose2d.cpp): ``columns`` of ``n × o·kh·kw × ih·iw``
    elements of the input's type, the whole batch's (measured in float32, float16 and bfloat16), after the input
    and the weight are made channels-last where either is (:func:`.conv_transpose_avx2.channels_last_copies`,
    measured in float32); None for other ranks (not measured)."""
    if len(call.x_shape) != 4 or call.groups != 1 or not call.dtype.is_floating_point:
        return None
    return _columns(call) + channels_last_copies(call)


def _columns(call: ConvCall) -> int:
    n, o = call.x_shape[0], call.w_shape[1]
    return n * o * math.prod(call.w_shape[2:]) * math.prod(call.x_shape[2:]) * call.itemsize


def _slow_columns(call: ConvCall) -> int:
    """The ``columns`` buffer: none for a 1x1 unit-stride unpadded kernel (``use_gemm`` false), else the
    forward's (:func:`_columns`)."""
    if math.prod(call.w_shape[2:]) == 1 and all(s == 1 for s in call.stride) and not any(call.padding):
        return 0
    return _columns(call)


def slow_transpose_backward(call: ConvCall, grad_out: torch.Tensor, mask: Sequence[bool],
                            outs: Sequence[Any]) -> int | None:
    """``slow_conv_transpose2d_backward``: each of the input's and the weights' gradients makes ``grad_output``
    contiguous (a copy where it is not; channels-last where the input or the weight is, after their own copies:
    :func:`.conv_transpose_avx2.channels_last_copies`) and fills ``columns`` (:func:`_slow_columns`); measured
    sequence ``[copies, copy, gx, cols, -cols, -copy, gb, gw, copy, cols, -cols, -copy]``."""
    if slow_transpose_forward(call) is None:
        return None
    layout = torch.channels_last if "channels_last" in (call.x_layout, call.w_layout) else torch.contiguous_format
    copy = 0 if grad_out.is_contiguous(memory_format=layout) else int(grad_out.numel()) * call.itemsize
    cols = _slow_columns(call)
    fresh = [int(t.untyped_storage().nbytes()) if isinstance(t, torch.Tensor) else 0 for t in outs]
    fresh += [0] * (3 - len(fresh))
    seq: list[int] = [channels_last_copies(call)]
    if mask[0]:
        seq += [copy, fresh[0], cols, -cols, -copy]
    if mask[1] or mask[2]:
        seq += [fresh[2], fresh[1], copy, cols, -cols, -copy]
    return max(alloc_peak(seq) - sum(fresh), 0)


def transpose_note(call: ConvCall, info: CpuInfo, backend: str) -> str | None:
    """Why a transposed convolution's scratch is not modelled here, or None."""
    what = f"transposed convolution through oneDNN (ISA {info.isa})"
    if backend.startswith("slow_transpose"):
        if slow_transpose_forward(call) is None:
            return f"{call.dtype} transposed convolution on ATen's {backend} kernel: {NOT_MODELLED}"
        return None
    if call.backward:
        if _backward_claimed(call, info):
            return None
        return f"{what}, backward: {NOT_MODELLED}"
    if transpose_forward(call, False, info) is None:
        return f"{what}, this shape: {NOT_MODELLED}"
    return None


def _backward_claimed(call: ConvCall, info: CpuInfo) -> bool:
    """Whether :func:`transpose_backward` sizes this call's backward whatever the mask: its weights' gradient
    scratchpad is one :func:`.conv_bwd_weights.bwd_weights_scratch` sizes."""
    from nnmem.frontends.pytorch.workspace.conv_bwd_weights import bwd_weights_scratch

    if call.dtype == torch.bfloat16:
        return bf16_transpose_claims(call, info)
    if avx2_modelled(call, info):
        return avx2_transpose_claims(call, info)
    if not _modelled(call, info):
        return False
    if math.prod(call.w_shape[2:]) == 1 and max(call.stride) > 2:
        return False
    return bwd_weights_scratch(_as_convolution(call), False, _BLOCK, torch.get_num_threads()) is not None
