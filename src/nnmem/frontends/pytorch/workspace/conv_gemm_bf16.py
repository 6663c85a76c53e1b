"""Scratch of bfloat16 NCHW convolutions on oneDNN's ``gemm:jit`` kernel on ``avx512_core_bf16``.

A port of ``jit_gemm_convolution_utils::init_conf`` (oneDNN v3.12 src/cpu/gemm_convolution_utils.cpp) for
``gemm_bf16_convolution_fwd_t`` / ``_bwd_data_t`` / ``_bwd_weights_t`` (src/cpu/x64/gemm_bf16_convolution.hpp):
bfloat16 im2col columns (float32 for backward data), float32 accumulators (``key_conv_int_dat_in_acc_dt``), the
weights' float32 partial sums (``key_conv_wei_reduction``, ``nthr * weights_d.size()`` floats: four times the
bfloat16 weights' bytes per thread) and the bias converted to float32. Which calls fall to gemm follows the
``init_conf`` refusals of ``jit_bf16`` (jit_avx512_core_bf16_conv_kernel.cpp) and ``jit_dw``; ideep's plain
layouts around gemm are :mod:`.conv_gemm`'s measured sequences with 2-byte elements.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from nnmem.cpu import CpuInfo
from nnmem.frontends.pytorch.workspace._common import alloc_peak, book, div_up, per_core_cache, round_up
from nnmem.frontends.pytorch.workspace.conv_bf16 import _dw_forward_takes
from nnmem.frontends.pytorch.workspace.conv_bwd_weights import dw_jit_bwd_weights
from nnmem.frontends.pytorch.workspace.conv_gemm import (
    GEMM_THRLD,
    GemmConv,
    _f32,
    blocking_search,
    gemm_conv,
)
from nnmem.frontends.pytorch.workspace.matmul import MODELLED_ISA, MODELLED_THREADS

if TYPE_CHECKING:  # conv_select imports this module for its note
    from nnmem.frontends.pytorch.workspace.conv_select import ConvCall

_BF16, _F32 = 2, 4
_SIMD_W = 32  # init_conf's simd_w: vlen / data_size, bfloat16 lanes of a zmm
_CACHELINE_FLOATS = 16  # sizeof_cacheline_float
_BLOCK = 16  # jit_bf16's channel block


def _limit(j: GemmConv, nthr: int) -> int:
    """``scratchpad_limit``: 1 GiB or 15 times the threads times the bfloat16 tensors' bytes, the smaller."""
    return min(1 << 30, 15 * nthr * (j.src_bytes + j.wei_bytes + j.dst_bytes) // 2)


def _wei(j: GemmConv) -> int:
    """``weights_d.size()``: the bfloat16 weights' bytes, all groups."""
    return j.wei_bytes // 2


def _blocking(j: GemmConv, nthr: int, l2: int) -> tuple[int, int, int] | None:
    """``(icb, ocb, osb)`` the nchw forward's blocking search settles on (:func:`.conv_gemm.blocking_search`
    with bfloat16's ``simd_w``), ``l2`` in elements; None where another choice of other buffers (columns, float32
    accumulators) scores within float rounding."""
    return blocking_search(j, nthr, _SIMD_W, l2,
                           lambda icb, ocb, osb: (icb * osb, round_up(ocb * osb, _CACHELINE_FLOATS)))


def forward_scratchpad(j: GemmConv, nthr: int) -> int | None:
    """Bytes of ``gemm_bf16_convolution_fwd_t``'s nchw scratchpad: per thread of outer threading, float32
    accumulators of ``oc_block * os_block`` (rounded to a cache line) and bfloat16 columns of
    ``ic_block * ks * os_block``, and the bias in float32; None where the blocking hangs on the L2 size or on
    float rounding, or where the columns are skipped (an unpadded 1x1 unit-stride kernel) and the blocking search
    still runs (2-D, ``ic / oc < 42`` and ``ic * oc * is < 1024``)."""
    spatial, k = j.mb * j.ngroups * j.od * j.os, j.ic * j.ks
    if j.trivial:  # no columns: the blocking search only under its "heuristic condition" (not followed here)
        if not j.is_3d and j.ic // j.oc < 42 and j.ic * j.oc * j.is_ < 1024:
            return None
        blocking = False
    else:
        blocking = not j.is_3d and (spatial >= nthr * _SIMD_W or j.os < j.mb * j.ngroups * j.od
                                    or (j.strides[2] == 1 and k <= 0.05 * j.oc))
    if blocking:
        got = _blocking(j, nthr, per_core_cache(2) // _BF16)
        if got is None:
            return None
        icb, ocb, osb = got
        threads = nthr
    else:
        outer_work, inner_work = j.ngroups * j.mb * j.od, div_up(j.os, _SIMD_W) * div_up(j.oc, _SIMD_W)
        outer_eff = _f32(outer_work / round_up(outer_work, nthr))
        inner_eff = _f32(inner_work / round_up(inner_work, nthr))
        outer = (j.os // nthr < 512 and (j.od != 1 or j.mb != 1 or j.ngroups > 2)
                 and (_f32(outer_eff / inner_eff) >= 1.0 or j.os * j.ic * j.oc // nthr < GEMM_THRLD))
        icb, ocb, osb, threads = j.ic, j.oc, j.os, nthr if outer else 1
    pad = book(threads * round_up(ocb * osb, _CACHELINE_FLOATS) * _F32)
    pad += book(j.ngroups * j.oc * _F32) if j.with_bias else 0
    pad += 0 if j.trivial else book(threads * icb * j.ks * osb * _BF16)
    return pad if pad <= _limit(j, nthr) else None


def bwd_data_scratchpad(j: GemmConv, nthr: int) -> int | None:
    """Bytes of ``gemm_bf16_convolution_bwd_data_t``'s nchw scratchpad: per thread of outer threading, a float32
    accumulator of the input's gradient (a group's, rounded to a cache line) and float32 columns; None where the
    columns pass ``scratchpad_limit`` (oneDNN then cuts them into blocks)."""
    outer_work = j.ngroups * j.mb
    inner_work = div_up(j.is_, _SIMD_W) * div_up(j.ic, _SIMD_W)
    outer_eff = _f32(outer_work / round_up(outer_work, nthr))
    inner_eff = _f32(inner_work / round_up(inner_work, nthr))
    outer = ((j.os // nthr < 512 or j.ks < 64) and (j.mb != 1 or j.ngroups > 2)
             and (_f32(outer_eff / inner_eff) >= 1.0 or j.is_ * j.ic * j.oc // nthr < GEMM_THRLD))
    threads = nthr if outer else 1
    pad = book(threads * round_up(j.ic * j.id * j.is_, _CACHELINE_FLOATS) * _F32)
    cols = threads * j.im2col_sz * _F32
    limit = _limit(j, nthr)
    if pad > limit or limit - pad < cols:
        return None
    return pad + book(cols)


def bwd_weights_scratchpad(j: GemmConv, nthr: int) -> int | None:
    """Bytes of ``gemm_bf16_convolution_bwd_weights_t``'s nchw scratchpad: float32 partial sums of the weights per
    thread of outer threading, one float32 accumulator of them, the bias' gradient in float32 and bfloat16
    columns; None where the columns pass ``scratchpad_limit``."""
    wei, limit = _wei(j), _limit(j, nthr)
    bias = j.ngroups * j.oc * _F32 if j.with_bias else 0
    estimate = _F32 * nthr * wei + _F32 * wei + bias + _BF16 * nthr * j.ic * j.ks * _SIMD_W
    outer = estimate < limit and j.os // nthr < 256 and (j.mb != 1 or j.ngroups > 2)
    threads = nthr if outer else 1
    pad = book(threads * wei * _F32) + book(wei * _F32) + book(bias)
    cols = threads * j.im2col_sz * _BF16
    if pad > limit or limit - pad < cols:
        return None
    return pad + book(cols)


def _jit_fwd_takes(call: ConvCall) -> bool:
    """Whether ``jit_avx512_core_bf16_fwd_kernel_t::init_conf`` takes an nchw forward: a channel block (dense: 16,
    channels padded; grouped: 16, 8 or 4 dividing both per-group counts, ``ok_to_try_lower_zmm``), the dilated
    kernel overlapping the source on every side, and neither the left padding nor the right one before the
    width's tail past the width unroll ``31 // (nb_oc_blocking + 1)``."""
    from nnmem.frontends.pytorch.workspace.conv_select import grouped_block

    g = call.groups
    o = call.w_shape[0] // g
    block = _BLOCK if g == 1 else grouped_block(call.x_shape[1] // g, o, _BLOCK)
    if block is None or call.kernel_outside():
        return False
    nb_oc = div_up(o, block)
    blocking = min(4, nb_oc)
    ow, l_pad = call.out_sizes[-1], call.padding[-1]
    while blocking > 1:
        ur = 31 // (blocking + 1)
        if nb_oc % blocking == 0 and l_pad <= ur and (ow == 1 or ow % ur != 1):
            break
        blocking -= 1
    ur_w = min(31 // (blocking + 1), ow)
    iw, kw, sw, dw = call.x_shape[-1], call.w_shape[-1], call.stride[-1], call.dilation[-1]
    r_pad_no_tail = max(0, (ow - ow % ur_w - 1) * sw + (kw - 1) * dw + 1 - (iw + l_pad))
    return l_pad <= ur_w and r_pad_no_tail <= ur_w


def _jit_bwd_weights_takes(call: ConvCall) -> bool:
    """``jit_avx512_core_bf16_conv_bwd_weights_kernel_f32_t::init_conf``'s refusals on nchw (any rank): dilation
    only at unit stride (and a dilated kernel no higher than the input, no depth padding under a depth dilation),
    the paddings within ``boundaries_ok`` (a first convolution, fewer than 16 input channels, within the
    28-column unroll), ``kw`` at most 14 (24 first), channels in blocks of 16 (``block_ok``: a first
    convolution's and a grouped one's are not padded) and a first convolution's ``padding_ok``."""
    g = call.groups
    c, o = call.x_shape[1] // g, call.w_shape[0] // g
    first = c < _BLOCK and g == 1
    if (g > 1 and c % _BLOCK) or ((first or g > 1) and o % _BLOCK):
        return False
    dims = list(zip(call.x_shape[2:], call.w_shape[2:], call.out_sizes, call.stride, call.padding, call.dilation))
    ext, start, end = [], [], []
    for i, k, out, s, p, d in dims:
        if d > 1 and s != 1:
            return False
        ext.append((k - 1) * d + 1)
        start.append(p)
        end.append(max(0, (out - 1) * s + ext[-1] - (i + p)))
    if len(dims) == 3 and call.dilation[0] > 1 and (start[0] or end[0]):
        return False
    if call.dilation[-2] > 1 and ext[-2] > call.x_shape[-2]:
        return False
    if len(dims) == 3 and not (start[0] < ext[0] and end[0] < ext[0]):
        return False
    if not (start[-1] < ext[-1] and end[-1] < ext[-1] and start[-2] <= ext[-2] // 2 and end[-2] <= ext[-2] // 2):
        return False
    ow, iw, kw = call.out_sizes[-1], call.x_shape[-1], call.w_shape[-1]
    if first and ow > 28 and not (start[-1] < 28 and ext[-1] <= ow):
        return False
    if kw > (24 if first else 14):
        return False
    return not first or (start[-1] < 28 and end[-1] < 28 and ext[-1] <= iw + 1)


def _depthwise(call: ConvCall) -> bool:
    """One input and one output channel a group, more than one group."""
    return call.groups == call.x_shape[1] == call.w_shape[0] > 1


def jit_1x1_takes(call: ConvCall) -> bool:
    """Whether ``jit_bf16_1x1`` (jit_avx512_core_bf16_1x1_conv_kernel.cpp ``init_conf``, after ``rtus_prepare`` in
    jit_uni_1x1_conv_utils.hpp) takes a call: one group, a 1x1 kernel, no padding, and unit stride, or in 1-D and
    2-D a stride whose output tiles the input (``rtus`` gathers the source at unit stride)."""
    if call.groups != 1 or math.prod(call.w_shape[2:]) != 1 or any(call.padding):
        return False
    if len(call.x_shape) == 5:
        return all(s == 1 for s in call.stride)
    return all(o * s == i for o, s, i in zip(call.out_sizes, call.stride, call.x_shape[2:]))


def inner_product_takes(call: ConvCall) -> bool:
    """Whether ``ip_convolution`` (src/cpu/x64/ip_convolution.cpp ``check_conv_ip``, listed before the
    convolution kernels in every direction) runs a call as an inner product: one group, no dilation or padding,
    unit stride and one output position (a kernel as large as the input), a batch above 1 and more than 27 taps
    (its "performant" heuristic on AVX-512)."""
    return (call.groups == 1 and not any(call.padding) and all(d == 1 for d in call.dilation)
            and all(s == 1 for s in call.stride) and math.prod(call.out_sizes) == 1 and call.x_shape[0] > 1
            and math.prod(call.w_shape[2:]) > 27)


def _shape_ok(call: ConvCall, info: CpuInfo) -> bool:
    """A bfloat16 nchw (1-D, 2-D or 3-D) direct convolution ``jit_bf16_1x1`` refuses (:func:`jit_1x1_takes`), on
    ``avx512_core_bf16`` at 1-4 threads, not one :func:`inner_product_takes`."""
    if call.dtype != torch.bfloat16 or call.transposed or info.isa != MODELLED_ISA:
        return False
    if torch.get_num_threads() not in MODELLED_THREADS or (call.x_layout, call.w_layout) != ("contiguous",) * 2:
        return False
    return not jit_1x1_takes(call) and not inner_product_takes(call)


def _jcp(call: ConvCall, bias: bool) -> GemmConv:
    return gemm_conv(call.x_shape, call.w_shape, call.out_sizes, call.stride, call.groups, bias)


def _jit_fwd_or_dw_takes(call: ConvCall) -> bool:
    """Whether another kernel takes the forward: ``jit_dw`` a 2-D depthwise one
    (:func:`.conv_bf16._dw_forward_takes`), ``brdgmm_dw`` an undilated 3-D one (on ndhwc, jit_brdgmm_dw_conv.cpp
    ``init_conf`` refuses dilations), else ``jit_bf16`` (:func:`_jit_fwd_takes`)."""
    if _depthwise(call):
        if len(call.x_shape) != 4:
            return all(d == 1 for d in call.dilation)
        return _dw_forward_takes(call)
    return _jit_fwd_takes(call)


def _jit_weights_takes(call: ConvCall) -> bool:
    """Whether a ``jit`` kernel takes the weights' gradient: the depthwise one
    (:func:`.conv_bwd_weights.dw_jit_bwd_weights`), else ``jit_bf16`` (:func:`_jit_bwd_weights_takes`)."""
    if _depthwise(call):
        return dw_jit_bwd_weights(call.x_shape, call.w_shape, call.stride, call.padding, call.dilation)
    return _jit_bwd_weights_takes(call)


def forward_claims(call: ConvCall, info: CpuInfo) -> bool:
    """Whether a bfloat16 forward runs on ``gemm:jit`` (``jit_dw`` and ``jit_bf16`` refuse it) and is sized
    here, with or without bias."""
    if call.backward or not _shape_ok(call, info) or _jit_fwd_or_dw_takes(call):
        return False
    nthr = torch.get_num_threads()
    return all(forward_scratchpad(_jcp(call, bias), nthr) is not None for bias in (False, True))


def forward_scratch(call: ConvCall, with_bias: bool) -> int:
    """Scratch bytes of a forward :func:`forward_claims` takes: the scratchpad, ideep's plain destination, then
    ``mkldnn_to_dense``'s copy (``[pad, dst, -pad, out, -dst]``, :func:`.conv_gemm.forward`)."""
    j = _jcp(call, with_bias)
    pad = forward_scratchpad(j, torch.get_num_threads())
    assert pad is not None
    dst = j.dst_bytes // 2
    return alloc_peak([pad, dst, -pad, dst, -dst]) - dst


def _data_kernel(call: ConvCall) -> str | None:
    """Where the input's gradient runs: "gemm", "jit" (``jit_bf16``, or ``jit_dw`` for an undilated 2-D depthwise
    one; sized by :func:`.conv_onednn.conv_backward`), "strided" (``brgconv_strided``, a dense or grouped strided
    one :func:`.conv_bf16_transpose.bf16_strided_data_scratch` sizes) or None where not sized here."""
    from nnmem.frontends.pytorch.workspace.conv_bf16_transpose import bf16_strided_data_scratch
    from nnmem.frontends.pytorch.workspace.conv_grouped_strided_bwd import bf16_small_oc_kernel
    from nnmem.frontends.pytorch.workspace.conv_select import grouped_block

    if any(s != 1 for s in call.stride):
        if call.groups == 1 and any(d > 1 and s > 1 for d, s in zip(call.dilation, call.stride)):
            return "gemm"  # brgconv_strided takes no dilation, jit_bf16's dilate_ok none beside a stride
        small_oc = bf16_small_oc_kernel(call)  # grouped, few output channels a group: conv_grouped_strided_bwd
        if small_oc is not None:
            return small_oc
        if bf16_strided_data_scratch(call, torch.get_num_threads()) is None:  # grouped: conv_grouped_strided_bwd
            return None
        return "strided"
    if _depthwise(call):  # jit_dw takes no dilation; jit_bf16 no depthwise (no channel block)
        return "jit" if len(call.x_shape) == 4 and all(d == 1 for d in call.dilation) else "gemm"
    if call.kernel_outside():
        return "gemm"
    g = call.groups
    if g > 1 and grouped_block(call.x_shape[1] // g, call.w_shape[0] // g, _BLOCK) is None:
        return "gemm"
    return "jit"


def backward_claims(call: ConvCall, info: CpuInfo) -> bool:
    """Whether a bfloat16 ``convolution_backward`` has its weights' gradient on ``gemm:jit`` (``jit_bf16`` or the
    depthwise kernel refuses it) and is sized here: the input's gradient, where asked for, where
    :func:`_data_kernel` places and sizes it; the scratchpads with and without bias."""
    if not call.backward or not _shape_ok(call, info) or _jit_weights_takes(call):
        return False
    nthr = torch.get_num_threads()
    if any(bwd_weights_scratchpad(_jcp(call, bias), nthr) is None for bias in (False, True)):
        return False
    if not call.grad_input:
        return True
    data = _data_kernel(call)
    return data in ("jit", "strided") or data == "gemm" and bwd_data_scratchpad(_jcp(call, False), nthr) is not None


def backward_scratch(call: ConvCall, grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                     mask: Sequence[bool], fresh: int) -> int:
    """Scratch bytes of a ``convolution_backward`` :func:`backward_claims` takes, beyond its outputs ``fresh``.

    ATen runs the input's gradient and the weights' as two primitives: a non-contiguous grad_output made
    contiguous first; on gemm ``[gx, pad, -pad, gx, -gx]`` (plain layouts), on ``jit_bf16`` / ``jit_dw`` /
    ``brgconv_strided`` the sequence of :func:`.conv_onednn.conv_backward`; then, the dense input gradient live,
    ``[gw, pad, gb, -pad, gb, gw, -gw, -gb]`` (measured).
    """
    from nnmem.frontends.pytorch.workspace.conv_bf16_transpose import (
        bf16_strided_data_scratch,
        bf16_strided_data_weights,
    )
    from nnmem.frontends.pytorch.workspace.conv_onednn import conv_backward  # conv_onednn imports conv_select

    nthr = torch.get_num_threads()
    j = _jcp(call, bool(mask[2]))
    contiguous = 0 if grad_out.is_contiguous() else grad_out.numel() * grad_out.element_size()
    gx = j.src_bytes // 2
    seq, jit_peak = [contiguous], 0
    data = _data_kernel(call) if mask[0] else None
    if data == "gemm":
        pad = bwd_data_scratchpad(j, nthr)
        assert pad is not None
        seq += [gx, pad, -pad, gx, -gx]
    elif data is not None:
        strided = bf16_strided_data_scratch(call, nthr) if data == "strided" else None
        weights = bf16_strided_data_weights(call, nthr) if strided is not None else None  # its ic_block
        jit_peak = conv_backward(grad_out, x, weight, False, call.groups, (True, False, False), (), _BLOCK,
                                 strided is not None, data_scratchpad=strided or 0, data_weights=weights)
    peak, live = max(alloc_peak(seq), jit_peak), sum(seq) + (gx if jit_peak else 0)
    if mask[1] or mask[2]:
        pad = bwd_weights_scratchpad(j, nthr)
        assert pad is not None
        gw, gb = _wei(j), j.ngroups * j.oc * _BF16 if mask[2] else 0
        peak = max(peak, live + alloc_peak([gw, pad, gb, -pad, gb, gw, -gw, -gb]))
    return max(peak - fresh, 0)


def gemm_bf16_claims(call: ConvCall, info: CpuInfo) -> bool:
    """Whether :func:`forward_scratch` or :func:`backward_scratch` sizes this call (conv_note's bf16 clause)."""
    return backward_claims(call, info) if call.backward else forward_claims(call, info)
