"""Scratch of float32 transposed convolutions through oneDNN on AVX2 (8-channel blocks), 1-D to 3-D.

oneDNN runs a deconvolution's forward as the backward data of the convolution it transposes (:func:`_conv`), its
input gradient as that convolution's forward and its weights' gradient as its backward weights with the roles
swapped. Which kernel runs each pass follows the ``init_conf`` checks the convolution rules port
(``jit_avx2_conv_bwd_data_kernel_f32``: :func:`.conv_bwd_weights.avx2_bwd_data_refuses`;
``jit_avx2_conv_fwd_kernel_f32``: :func:`.conv_select._avx2_forward_refuses`; the backward-weights kernels:
:func:`.conv_bwd_weights.bwd_weights_kernel`), else ``gemm`` (:mod:`.conv_gemm`); a strided undilated forward runs
``brgconv_strided`` (:func:`.conv_brgemm_bwd.strided_bwd_data`), a channels-last unit-stride one ``brg_deconv``'s
brgemm forward. The nested convolution's scratchpad is booked in the deconvolution's registry (+128 B); a bias the
kernel does not take adds a float32 buffer of the destination's size (+128 B). Measured on seeded draws:
tests/frontends/pytorch/test_conv_transpose_avx2.py.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from nnmem.cpu import CpuInfo
from nnmem.frontends.pytorch.workspace._common import alloc_peak, round_up
from nnmem.frontends.pytorch.workspace.conv_brgemm_bwd import (
    brgemm_batch_bytes,
    strided_bwd_data,
    strided_bwd_weights,
)
from nnmem.frontends.pytorch.workspace.conv_bwd_weights import (
    avx2_bwd_data_refuses,
    bwd_weights_kernel,
    bwd_weights_scratch,
)
from nnmem.frontends.pytorch.workspace.conv_gemm import (
    bwd_data_scratchpad,
    bwd_weights_scratchpad,
    forward_scratchpad,
    gemm_conv,
)

if TYPE_CHECKING:  # conv_select imports conv_transpose, which imports this module
    from nnmem.frontends.pytorch.workspace.conv_gemm import GemmConv
    from nnmem.frontends.pytorch.workspace.conv_select import ConvCall

_B = 8  # oneDNN's channel block on AVX2
_NESTED = 128  # a nested primitive's registry booked in the deconvolution's: its size plus the alignment


def avx2_modelled(call: ConvCall, info: CpuInfo) -> bool:
    """Whether the rules here read this call: float32 on AVX2; contiguous nc(d)hw, ungrouped or grouped (not
    depthwise) on gemm throughout (:func:`_grouped_gemm`); or an ungrouped 2-D one on nhwc (:func:`_nhwc`)."""
    if call.dtype != torch.float32 or info.onednn_block != _B or not info.isa_at_least("avx2"):
        return False  # below AVX2 (sse41) other kernels run: not measured
    if len(call.x_shape) not in (4, 5):
        return False
    if min(_conv(call).x_shape[2:]) < 1:  # an empty output: oneDNN's reference kernels run
        return False
    if _nhwc(call):
        return call.groups == 1 and len(call.x_shape) == 4 and not call.one_d and "strided" not in (
            call.x_layout, call.w_layout)
    if call.groups > 1 and (call.groups == call.x_shape[1] == call.w_shape[1] * call.groups
                            or not _grouped_gemm(call)):
        return False
    return call.x_layout == "contiguous" and call.w_layout == "contiguous"


def _nhwc(call: ConvCall) -> bool:
    """``mkldnn_conv_use_channels_last``: a channels-last input or weight runs the deconvolution on nhwc."""
    return "channels_last" in (call.x_layout, call.w_layout)


def _grouped_gemm(call: ConvCall) -> bool:
    """A grouped deconvolution whose channels a group oneDNN cannot block by 8 (``jit:avx2`` takes blocks of 8
    only, :func:`.conv_select.grouped_block`): every pass runs ``gemm`` (measured)."""
    from nnmem.frontends.pytorch.workspace.conv_select import grouped_block

    g = call.groups
    return g > 1 and grouped_block(call.x_shape[1] // g, call.w_shape[1], _B) != _B


def _conv(call: ConvCall) -> ConvCall:
    """The convolution the deconvolution transposes: its input the deconvolution's output (``o`` channels), its
    weight ``[c, o / groups, k...]`` (the deconvolution's, read with the channel roles swapped)."""
    out = tuple((x - 1) * s - 2 * p + d * (k - 1) + op + 1 for x, s, p, d, k, op in
                zip(call.x_shape[2:], call.stride, call.padding, call.dilation, call.w_shape[2:],
                    call.output_padding))
    return dataclasses.replace(call, x_shape=(call.x_shape[0], call.w_shape[1] * call.groups, *out),
                               transposed=False, output_padding=(0,) * len(out))


def _jcp(conv: ConvCall) -> GemmConv:
    return gemm_conv(conv.x_shape, conv.w_shape, conv.out_sizes, conv.stride, conv.groups, False)


def _nested(pad: int) -> int:
    """A nested convolution's scratchpad booked in the deconvolution's registry: nothing where it is empty."""
    return pad + _NESTED if pad else 0


def _one_by_one(conv: ConvCall) -> bool:
    return math.prod(conv.w_shape[2:]) == 1 and not any(conv.padding)


def _tiles(conv: ConvCall) -> bool:
    """Whether a convolution's output tiles its input at its stride (``rtus`` takes a strided 1x1 then)."""
    return all(i == o * st for i, o, st in zip(conv.x_shape[2:], conv.out_sizes, conv.stride))


def forward_kernel(call: ConvCall) -> str:
    """The kernel of the deconvolution's forward (the convolution's backward data): "gemm", "jit" (``jit:avx2``
    or ``jit_1x1:avx2`` on blocked activations) "brgconv_strided" (a strided undilated one) or "jit_1x1_strided"."""
    conv = _conv(call)
    if any(s > 1 for s in call.stride) and all(d == 1 for d in call.dilation) and (
            call.groups == 1 or call.x_shape[1] // call.groups > 8):  # conv_gemm.grouped_brgconv_strided: grouped too
        return "brgconv_strided"
    if _grouped_gemm(call):
        return "gemm"
    if any(s > 1 for s in call.stride):
        # a dilated 1x1 whose output tiles its input runs jit_1x1 with "reduce to unit stride" (not sized)
        return "jit_1x1_strided" if _one_by_one(conv) and _tiles(conv) else "gemm"
    if _one_by_one(conv):
        return "jit"
    return "gemm" if avx2_bwd_data_refuses(conv) else "jit"


def avx2_transpose_forward(call: ConvCall, bias: bool) -> int | None:
    """Scratch bytes of the forward (the output excluded), or None where not sized: :func:`_nchw_forward` or
    :func:`_nhwc_forward`."""
    return _nhwc_forward(call, bias) if _nhwc(call) else _nchw_forward(call, bias)


def _nchw_forward(call: ConvCall, bias: bool) -> int | None:
    """Scratch bytes of the forward (the output excluded), or None where not sized. ``jit``:
    ``[buf, src, wei, dst, -wei, -src, -buf, out, -dst]``, nChw8c src and dst, ``BAcd8b8a`` weights, ``buf`` the
    bias's destination-sized buffer (+128 B); ``gemm``: plain tensors, ``[pad, dst, -pad, out, -dst]``, ``pad``
    the columns (``bwd_data_scratchpad``) nested, plus the bias's buffer."""
    kernel = forward_kernel(call)
    n, c = call.x_shape[:2]
    o, k, e = call.w_shape[1] * call.groups, math.prod(call.w_shape[2:]), call.itemsize
    conv = _conv(call)
    s_in, s_out = math.prod(call.x_shape[2:]), math.prod(conv.x_shape[2:])
    out = n * o * s_out * e
    if kernel == "jit":
        src = n * round_up(c, _B) * s_in * e
        wei = round_up(o, _B) * round_up(c, _B) * k * e
        dst = n * round_up(o, _B) * s_out * e
        buf = dst + _NESTED if bias else 0
        return alloc_peak([buf, src, wei, dst, -wei, -src, -buf, out, -dst]) - out
    if kernel == "brgconv_strided" and call.groups == 1:
        return _strided_forward(call, bias)
    if kernel == "gemm":
        cols = bwd_data_scratchpad(_jcp(conv), torch.get_num_threads(), _B)
        if cols is None:
            return None
        pad = _nested(cols) + (out + _NESTED if bias else 0)
        return alloc_peak([pad, out, -pad, out, -out]) - out
    return None


def _brgconv_strided(call: ConvCall, bias: bool) -> tuple[int, int] | None:
    """``(scratchpad, weights)`` bytes of a strided undilated deconvolution on ``brgconv_strided:avx2``, the
    convolution's strided backward data on nhwc (:func:`.conv_brgemm_bwd.strided_bwd_data` for the blocking it
    picks, nested; the weights ``Ihwo{ic_block}i``: :func:`.conv_brgemm_bwd.strided_bwd_weights`), or None where not
    sized. ``brg_deconv`` passes the bias to the kernel, except where an output size is not a multiple of its stride
    (``init_conf``: "deconvolution with uneven spatial dimensions is not supported"): ``ref_deconvolution`` then
    adds it through a buffer of the destination's size (+128 B) in the same scratchpad."""
    conv, nthr = dataclasses.replace(_conv(call), x_layout="contiguous", w_layout="contiguous"), torch.get_num_threads()
    pad, wei = strided_bwd_data(conv, nthr, _B), strided_bwd_weights(conv, nthr, _B)
    if pad is None or wei is None:
        return None
    pad = _nested(pad)
    if bias and any(i % st for i, st in zip(conv.x_shape[2:], conv.stride)):
        pad += math.prod(conv.x_shape) * call.itemsize + _NESTED
    return pad, wei


def _strided_forward(call: ConvCall, bias: bool) -> int | None:
    """:func:`_brgconv_strided` from nchw, as on AVX-512 (:mod:`.conv_transpose`):
    ``[pad, src, wei, dst, -wei, -src, -pad, out_cl, out, -dst, -out_cl]``, the source copied to nhwc and the nhwc
    destination to a channels-last output ATen makes contiguous (none where nchw is nhwc: one channel or one
    position)."""
    sized = _brgconv_strided(call, bias)
    if sized is None:
        return None
    (pad, wei), conv = sized, _conv(call)
    n, c, e = call.x_shape[0], call.x_shape[1], call.itemsize
    o, s_in, s_out = conv.x_shape[1], math.prod(call.x_shape[2:]), math.prod(conv.x_shape[2:])
    out = n * o * s_out * e
    src = 0 if c == 1 or s_in == 1 else n * c * s_in * e
    out_cl = 0 if o == 1 or s_out == 1 else out
    return alloc_peak([pad, src, wei, out, -wei, -src, -pad, out_cl, out, -out, -out_cl]) - out


def _data_sequence(call: ConvCall) -> list[int] | None:
    """The input gradient (the convolution's forward on ``grad_output``): its peak, then the dense gradient
    left live."""
    from nnmem.frontends.pytorch.workspace.conv_onednn import conv_forward
    from nnmem.frontends.pytorch.workspace.conv_select import _avx2_forward_refuses

    conv = _conv(call)
    gx_bytes = math.prod(call.x_shape) * call.itemsize
    if _grouped_gemm(call) or not _one_by_one(conv) and _avx2_forward_refuses(conv):
        pad = forward_scratchpad(_jcp(conv), torch.get_num_threads(), _B)
        if pad is None:
            return None
        pad = _nested(pad)
        return [gx_bytes, pad, -pad, gx_bytes, -gx_bytes]
    if _one_by_one(conv) and _tiles(conv) and max(conv.stride) > 2:  # jit_1x1's rtus: sized for stride 2 only
        return None
    gx = torch.empty(call.x_shape, dtype=call.dtype, device="meta")
    weight = torch.empty(conv.w_shape, dtype=call.dtype, device="meta")
    gy = torch.empty(conv.x_shape, dtype=call.dtype, device="meta")
    data = conv_forward(gy, weight, None, gx, 1, _B, conv.stride)
    return [data + gx_bytes, -data]


def _weights_sequence(call: ConvCall, with_bias: bool) -> list[int] | None:
    """The weights' (and bias's) gradient: the convolution's backward weights with ``grad_output`` as its source,
    the bias summed outside the kernel (``o`` floats)."""
    conv = _conv(call)
    n, c = call.x_shape[:2]
    o, k, e = call.w_shape[1] * call.groups, math.prod(call.w_shape[2:]), call.itemsize
    s_x, s_gy = math.prod(call.x_shape[2:]), math.prod(conv.x_shape[2:])
    gb, w = o * e if with_bias else 0, c * call.w_shape[1] * k * e
    nthr = torch.get_num_threads()
    backward = dataclasses.replace(conv, backward=True)
    kernel = None if _grouped_gemm(call) else bwd_weights_kernel(backward, _B)
    if kernel is None:  # gemm
        pad = bwd_weights_scratchpad(_jcp(conv), nthr, _B)
        if pad is None:
            return None
        pad = _nested(pad)
        return [w, pad, gb, -pad, gb, w, -w, -gb]
    pad = bwd_weights_scratch(backward, False, _B, nthr)
    if pad is None:
        return None
    pad = _nested(pad)
    first = o == 3 and kernel == "jit:avx2"  # the direct kernel reads 3 channels flat (a strided 1x1 too)
    gy2 = 0 if first else n * round_up(o, _B) * s_gy * e
    xs = n * round_up(c, _B) * s_x * e
    gw = round_up(c, _B) * (o if first else round_up(o, _B)) * k * e
    return [gy2, xs, gw, pad, gb, -pad, -xs, -gy2, gb, w, -gw, -gb]


def avx2_transpose_backward(call: ConvCall, grad_out: torch.Tensor, mask: Sequence[bool], outs: Sequence[Any],
                            info: CpuInfo) -> int | None:
    """Scratch bytes of the backward (the fresh gradients excluded), or None where not sized: a non-contiguous
    ``grad_output`` made contiguous, the input's gradient (:func:`_data_sequence`), the weights' and bias's
    (:func:`_weights_sequence`); on nhwc :func:`_nhwc_backward`."""
    if _nhwc(call):
        return _nhwc_backward(call, grad_out, mask, outs, info)
    conv = _conv(call)
    seq = [0 if grad_out.is_contiguous() else math.prod(conv.x_shape) * call.itemsize]
    if mask[0]:
        data = _data_sequence(call)
        if data is None:
            return None
        seq += data
    if mask[1] or mask[2]:
        weights = _weights_sequence(call, bool(mask[2]))
        if weights is None:
            return None
        seq += weights
    fresh = sum(int(t.untyped_storage().nbytes()) for t in outs if isinstance(t, torch.Tensor))
    return max(alloc_peak(seq) - fresh, 0)


def avx2_transpose_claims(call: ConvCall, info: CpuInfo) -> bool:
    """Whether the rules here size this call (forward, or backward whatever the mask)."""
    if not avx2_modelled(call, info):
        return False
    if not call.backward:
        return avx2_transpose_forward(call, False) is not None
    if _nhwc(call):
        return _nhwc_weights(call, True, info) is not None
    return (not call.grad_input or _data_sequence(call) is not None) and _weights_sequence(call, True) is not None


def _cl_copies(call: ConvCall, with_grad_out: bool = False) -> int:
    """Bytes of ATen's ``contiguous(ChannelsLast)`` copies: the input and the weight ``[c, o, k...]`` where not laid
    out so (one channel, or one position, reads the same either way), and ``grad_output`` in the backward where
    it is not (an expanded one is copied whatever its shape)."""
    n, c, e = call.x_shape[0], call.x_shape[1], call.itemsize
    o, k = call.w_shape[1], math.prod(call.w_shape[2:])
    s_in, s_out = math.prod(call.x_shape[2:]), math.prod(_conv(call).x_shape[2:])
    x = n * c * s_in * e if call.x_layout != "channels_last" and c > 1 and s_in > 1 else 0
    w = c * o * k * e if call.w_layout != "channels_last" and o > 1 and k > 1 else 0
    gy = n * o * s_out * e if with_grad_out else 0
    return x + w + gy


def channels_last_copies(call: ConvCall) -> int:
    """Bytes of the input's and the weight's channels-last copies where either is channels-last (oneDNN's nhwc
    deconvolution; ``slow_conv_transpose2d``'s ``thnn_conv_use_channels_last`` alike), else 0."""
    return _cl_copies(call) if _nhwc(call) and len(call.x_shape) == 4 else 0


def _nhwc_forward(call: ConvCall, bias: bool) -> int | None:
    """An nhwc deconvolution, the output written in place: at unit stride ``brg_deconv:avx2`` runs the forward
    brgemm convolution with the weights flipped (``brg_conv_fwd:avx2`` / ``brgconv_1x1:avx2``), its scratchpad the
    brgemm batch (nested), the weights reordered to ``Acdb8a/16a/24a/32a`` over the output channels
    (:func:`.conv_select.io_block`); a strided undilated one runs ``brgconv_strided`` on the same nhwc tensors as
    from nchw (:func:`_brgconv_strided`); a strided dilated one ``gemm`` (not sized)."""
    from nnmem.frontends.pytorch.workspace.conv_select import io_block

    c, o, k, e = call.x_shape[1], call.w_shape[1], math.prod(call.w_shape[2:]), call.itemsize
    if any(s > 1 for s in call.stride):
        if any(d > 1 for d in call.dilation):
            return None
        sized = _brgconv_strided(call, bias)
        return None if sized is None else _cl_copies(call) + sized[0] + sized[1]
    wei = round_up(o, io_block(o, _B)) * c * k * e
    return _cl_copies(call) + _nested(brgemm_batch_bytes(torch.get_num_threads())) + wei


def _nhwc_weights(call: ConvCall, with_bias: bool, info: CpuInfo) -> list[int] | None:
    """The weights' gradient on nhwc: ``gemm`` where the direct kernel refuses
    (:func:`.conv_select._nhwc_gemm_bwd_weights`; its nhwc scratchpad, then the weight copied dense and to
    channels-last through one more copy), else ``jit:avx2`` / ``jit_1x1:avx2`` with ``BAcd8a8b`` weights (three
    output channels flat) and their reducers; the bias summed outside the kernel."""
    from nnmem.frontends.pytorch.workspace.conv_select import _nhwc_gemm_bwd_weights

    conv = _conv(call)
    c, o, k, e = call.x_shape[1], call.w_shape[1], math.prod(call.w_shape[2:]), call.itemsize
    gb, w, nthr = o * e if with_bias else 0, c * o * k * e, torch.get_num_threads()
    backward = dataclasses.replace(conv, backward=True)
    if not _one_by_one(conv) and _nhwc_gemm_bwd_weights(backward, info):  # 1x1: jit_1x1, dilation moot
        pad = bwd_weights_scratchpad(_jcp(conv), nthr, _B, nspc=True)
        if pad is None:
            return None
        pad = _nested(pad)
        return [w, pad, gb, -pad, gb, w, w, -w, w, -w, -w, -gb]
    kernel = bwd_weights_kernel(backward, _B, nxc=True)
    if kernel is None or _one_by_one(conv) and any(s > 1 for s in conv.stride):  # jit_1x1 on nhwc gathers
        return None  # a strided source otherwise than rtus (measured below the nchw port)
    pad = bwd_weights_scratch(backward, False, _B, nthr, nxc=True)
    if pad is None:
        return None
    pad = _nested(pad)
    first = o == 3 and kernel == "jit:avx2"
    gw = round_up(c, _B) * (o if first else round_up(o, _B)) * k * e
    return [gw, pad, gb, -pad, gb, w, w, -w, -gw, -gb]


def _nhwc_backward(call: ConvCall, grad_out: torch.Tensor, mask: Sequence[bool], outs: Sequence[Any],
                   info: CpuInfo) -> int | None:
    """``[copies, gx, wei, pad, -pad, -wei, weights...]``: the channels-last copies (:func:`_cl_copies`), the input
    gradient written in place by the forward brgemm convolution (``Bcda8b/16b/24b/32b`` weights over the input
    channels, the nested batch), the weights' gradient (:func:`_nhwc_weights`)."""
    from nnmem.frontends.pytorch.workspace.conv_select import io_block

    n, c, e = call.x_shape[0], call.x_shape[1], call.itemsize
    o, k = call.w_shape[1], math.prod(call.w_shape[2:])
    seq = [_cl_copies(call, with_grad_out=not grad_out.is_contiguous(memory_format=torch.channels_last))]
    if mask[0]:
        wei, pad = round_up(c, io_block(c, _B)) * o * k * e, _nested(brgemm_batch_bytes(torch.get_num_threads()))
        seq += [n * c * math.prod(call.x_shape[2:]) * e, wei, pad, -pad, -wei]
    if mask[1] or mask[2]:
        weights = _nhwc_weights(call, bool(mask[2]), info)
        if weights is None:
            return None
        seq += weights
    fresh = sum(int(t.untyped_storage().nbytes()) for t in outs if isinstance(t, torch.Tensor))
    return max(alloc_peak(seq) - fresh, 0)
