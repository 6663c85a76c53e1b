"""bfloat16 convolution backward through oneDNN on ``avx512_core_bf16``: which calls are modelled, and the
backward-weights scratchpad of ``jit_bf16`` (``jit_avx512_core_bf16_convolution_bwd_weights_t``).

The allocations around the kernels are the float32 backward's (:func:`.conv_onednn.conv_backward`, 2-byte
elements; ``ONEDNN_VERBOSE`` and the profiler's sequence agree); what differs is the weights' gradient: its
kernel transposes the source and the output gradient into per-thread buffers (VNNI pairs), a first
convolution (fewer than 16 input channels) keeps the source as it is and its weights unpadded (``Acdb16a``),
and the partial sums of bfloat16 weights are reduced through float32 buffers, one per batch thread. Ported
from oneDNN 3.12 (the version torch 2.13 bundles), src/cpu/x64/jit_avx512_core_bf16_conv_kernel.cpp:
``jit_avx512_core_bf16_conv_bwd_weights_kernel_f32_t::init_conf`` / ``balance`` / ``init_scratchpad``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from nnmem.cpu import CpuInfo
from nnmem.frontends.pytorch.workspace._common import barriers, book, round_up
from nnmem.frontends.pytorch.workspace.conv_bf16_1x1 import OneByOne
from nnmem.frontends.pytorch.workspace.conv_bwd_weights import _div_up, dw_jit_bwd_weights
from nnmem.frontends.pytorch.workspace.matmul import AMX_ISA, MODELLED_ISA, MODELLED_THREADS

if TYPE_CHECKING:  # conv_select imports this module for its note
    from nnmem.frontends.pytorch.workspace.conv_select import ConvCall

_BLOCK = 16  # simd_w: 16 floats in a zmm register
_MAX_UR_W = 28  # jit_avx512_core_bf16_conv_bwd_weights_kernel_f32_t::max_ur_w
_FULL_SPAT_OPT = 48 * 1024  # full_spat_opt_working_set_size
_BF16, _F32 = 2, 4


def _geometry(call: ConvCall) -> tuple[int, ...]:
    """``(ih, iw, oh, ow, kh, kw, sh, sw, t_pad, l_pad, b_pad, r_pad, ext_kh, ext_kw)`` of a 2-D call, the end
    paddings at least 0 (``init_conf`` of the backward-weights kernel clamps them)."""
    ext_kh, ext_kw, b_pad, r_pad = call.extents
    return (*call.x_shape[2:], *call.out_sizes, *call.w_shape[2:], *call.stride, *call.padding,
            max(0, b_pad), max(0, r_pad), ext_kh, ext_kw)


def jit_bf16_bwd_weights(call: ConvCall) -> bool:
    """Whether ``jit_bf16`` takes this dense NCHW bfloat16 call's weights' gradient (``init_conf``'s checks),
    and whether its scratchpad is sized here: not a first convolution whose output is 124 or more wide
    (``use_spatial_blocking`` then hangs on the L2 cache's size per core)."""
    if call.groups != 1 or len(call.x_shape) != 4 or call.x_layout != "contiguous" or \
            call.w_layout == "channels_last":
        return False
    c, o = call.x_shape[1], call.w_shape[0]
    ih, iw, oh, ow, kh, kw, sh, sw, t_pad, l_pad, b_pad, r_pad, ext_kh, ext_kw = _geometry(call)
    dh, dw = call.dilation
    if (dh > 1 and sh != 1) or (dw > 1 and sw != 1) or (dh > 1 and ext_kh > ih):
        return False
    first = c < _BLOCK
    if not (l_pad < ext_kw and r_pad < ext_kw and t_pad <= ext_kh // 2 and b_pad <= ext_kh // 2):
        return False
    if first and ow > _MAX_UR_W and not (l_pad < _MAX_UR_W and ext_kw <= ow):
        return False
    if kw > (24 if first else 14) or (first and o % _BLOCK):  # block_ok: unpadded channels in blocks
        return False
    if first and not (l_pad < _MAX_UR_W and r_pad < _MAX_UR_W and ext_kw <= iw + 1):  # padding_ok
        return False
    return not (first and ow >= 124 and oh > 1)


def _balance(nthreads: int, mb: int, work: int, ic: int, oc: int, nb_ic: int, nb_oc: int, ic_block: int,
             geometry: tuple[int, ...]) -> tuple[int, int, int]:
    """``balance``: ``(nthr_mb, nthr_oc_b, nthr_ic_b)`` of the lowest memory cost, one group."""
    ih, tr_iw, oh, tr_ow, kh, kw, sh, sw = geometry
    src_size = mb * ic * ih * tr_iw * 2
    dst_size = mb * oc * oh * tr_ow * 2
    wei_size = oc * ic * kh * kw * 4
    wei_scale = 0.5 * (dst_size + src_size) / wei_size
    ratio = nb_oc / nb_ic
    src_coef = max(1.0 / ratio, 1.0) * (4.0 if wei_scale < 1.0 else 1.0)
    dst_coef, wei_coef = max(ratio, 1.0), max(wei_scale, 1.0)

    def cost(n_mb: int, n_oc: int, n_ic: int) -> float:
        # float arithmetic in the C++'s order (float32 there; the comparisons are not near ties here)
        src = (src_coef * _div_up(work, n_mb) * _div_up(nb_ic, n_ic) * mb * ic_block * ih * tr_iw
               / work / sh / sw)
        wei = wei_coef * _div_up(nb_oc, n_oc) * _div_up(nb_ic, n_ic) * kh * kw * ic_block * _BLOCK
        dst = dst_coef * _div_up(work, n_mb) * _div_up(nb_oc, n_oc) * mb * _BLOCK * oh * tr_ow / work
        return src + dst + wei

    best, pick = cost(1, 1, 1), (1, 1, 1)
    for n_mb in range(1, min(nthreads, work) + 1):
        par = nthreads // n_mb
        for n_oc in range(1, min(par, nb_oc) + 1):
            n_ic = min(par // n_oc, nb_ic)
            c = cost(n_mb, n_oc, n_ic)
            if c <= best:
                best, pick = c, (n_mb, n_oc, n_ic)
    n_mb = pick[0]
    if nthreads // 2 < n_mb < nthreads:
        n_mb = min(work, nthreads)
    return n_mb, pick[1], pick[2]


def bf16_bwd_weights_scratch(call: ConvCall, with_bias: bool, nthreads: int) -> int:
    """Bytes of ``jit_bf16``'s backward-weights scratchpad for a call :func:`jit_bf16_bwd_weights` takes
    (bfloat16 weights' and bias' gradients, nchw, OpenMP threads, so ``global_transpose``)."""
    c, o, mb = call.x_shape[1], call.w_shape[0], call.x_shape[0]
    ih, iw, oh, ow, kh, kw, sh, sw, t_pad, l_pad, b_pad, r_pad, _, _ = _geometry(call)
    first = c < _BLOCK
    ic, oc = (c, o) if first else (round_up(c, _BLOCK), round_up(o, _BLOCK))
    ic_block = ic if first else _BLOCK
    nb_ic, nb_oc = ic // ic_block, _div_up(oc, _BLOCK)
    transpose_src = not first  # transpose_dst always (no permw transposition on 2-D nchw)
    tr_pad = round_up(max(l_pad, r_pad + 1), 2)
    tr_iw = round_up(_div_up(iw, sw) + tr_pad, 2) * sw if transpose_src else iw
    tr_ow = round_up(ow, 2)
    full_spatial = (not first and ih == oh and iw == ow and kh != 1 and kw != 1 and sh == sw == 1
                    and call.dilation == (1, 1) and l_pad == kw // 2 and t_pad == kh // 2 and ic >= 128
                    and (ic_block * tr_iw + _BLOCK * tr_ow) * _BF16 * max(1, b_pad, t_pad) <= _FULL_SPAT_OPT)
    work = mb if full_spatial else mb * oh  # harness_compute_full_spatial / harness_2d_reduction
    nthr_mb, nthr_oc, nthr_ic = _balance(nthreads, mb, work, ic, oc, nb_ic, nb_oc, ic_block,
                                         (ih, tr_iw, oh, tr_ow, kh, kw, sh, sw))
    nthr = nthr_mb * nthr_oc * nthr_ic
    tr_src = (nthr_mb * nb_ic * tr_iw * ic_block * ih if transpose_src else 0) + tr_pad  # + guard elements
    total = book(tr_src * _BF16)
    if nthr_oc > 1:
        total += barriers(nthr // nthr_oc)
    total += book(nthr_mb * nb_oc * tr_ow * _BLOCK * oh * _BF16)
    if nthr_ic > 1:
        total += barriers(nthr // nthr_ic)
    # bfloat16 weights (and bias): every batch thread's partial sums in float32, the reduction's barrier
    reduction = nb_oc * _BLOCK * nb_ic * ic_block * kh * kw * nthr_mb + (nb_oc * _BLOCK * nthr_mb if with_bias else 0)
    return total + book(reduction * _F32) + barriers(1)


def bf16_backward_modelled(call: ConvCall, info: CpuInfo) -> bool:
    """Whether a bfloat16 ``convolution_backward`` is one the rules size, as measured on oneDNN's
    ``avx512_core_bf16`` kernels at 1-4 threads: dense, NCHW, 1-D or 2-D, not a 1x1 ``jit_bf16_1x1`` takes
    (:func:`bf16_1x1_modelled`: it books other buffers), not one ``ip_convolution`` takes
    (:func:`.conv_gemm_bf16.inner_product_takes`), the weights' gradient on ``jit_bf16``
    (:func:`jit_bf16_bwd_weights`) and, when the input's gradient is asked for, stride 1 (strided ones run
    ``brgconv_strided``)."""
    if call.dtype != torch.bfloat16 or not call.backward or call.transposed or info.isa != MODELLED_ISA:
        return False
    from nnmem.frontends.pytorch.workspace.conv_gemm_bf16 import inner_product_takes  # it imports this module

    if torch.get_num_threads() not in MODELLED_THREADS or bf16_1x1_modelled(call, info) or inner_product_takes(call):
        return False
    if call.grad_input and any(s != 1 for s in call.stride):
        return False
    return jit_bf16_bwd_weights(call)


def bf16_1x1_modelled(call: ConvCall, info: CpuInfo) -> bool:
    """Whether a bfloat16 1x1 convolution (forward or backward) runs on ``jit_bf16_1x1`` and is sized by
    :mod:`.conv_bf16_1x1`: dense, NCHW, 1-D or 2-D, unpadded, a stride whose output tiles the input (``rtus``
    gathers the source at unit stride), on ``avx512_core_bf16`` at 1-4 threads."""
    if call.dtype != torch.bfloat16 or call.transposed or call.groups != 1 or info.isa != MODELLED_ISA:
        return False
    if len(call.x_shape) != 4 or call.x_layout != "contiguous" or call.w_layout == "channels_last":
        return False
    if torch.get_num_threads() not in MODELLED_THREADS or math.prod(call.w_shape[2:]) != 1 or any(call.padding):
        return False
    return all(o * s == i for o, s, i in zip(call.out_sizes, call.stride, call.x_shape[2:]))


def one_by_one(call: ConvCall, with_bias: bool) -> OneByOne:
    """The 1x1 problem ``init_conf`` sees for a call :func:`bf16_1x1_modelled` takes."""
    oh, ow = call.out_sizes
    return OneByOne(call.x_shape[0], round_up(call.x_shape[1], _BLOCK), round_up(call.w_shape[0], _BLOCK),
                    call.w_shape[0], oh, ow, with_bias, any(s != 1 for s in call.stride))


def bf16_depthwise_modelled(call: ConvCall, info: CpuInfo) -> bool:
    """Whether a bfloat16 depthwise convolution (one channel per group) runs on ``jit_dw:avx512_core_bf16`` in
    the directions asked and is sized here: NCHW, 1-D or 2-D, on ``avx512_core_bf16`` at 1-4 threads, a forward
    :func:`_dw_forward_takes`, and for a backward a shape the depthwise backward-weights kernel takes
    (:func:`.conv_bwd_weights.dw_jit_bwd_weights`; oneDNN runs others on ``gemm``) without a strided input
    gradient."""
    c = call.x_shape[1]
    if call.dtype != torch.bfloat16 or call.transposed or not call.groups == c == call.w_shape[0] or c == 1:
        return False
    if len(call.x_shape) != 4 or call.x_layout != "contiguous" or call.w_layout == "channels_last":
        return False
    if info.isa not in (MODELLED_ISA, AMX_ISA) or torch.get_num_threads() not in MODELLED_THREADS:
        return False
    if call.backward:  # a strided one's input gradient runs on brgconv_strided (grouped), not sized here
        return not (call.grad_input and any(st != 1 for st in call.stride)) and dw_jit_bwd_weights(
            call.x_shape, call.w_shape, call.stride, call.padding, call.dilation)
    return _dw_forward_takes(call)


def _dw_forward_takes(call: ConvCall) -> bool:
    """``jit_uni_dw_conv_fwd_kernel_t::init_conf``'s checks for bfloat16 on nChw16c: the dilated kernel overlaps
    the source on every side, and neither the left padding nor the right one outside the width's tail passes
    the width unroll (``ur_w``: 6, at most the output width)."""
    if call.kernel_outside():
        return False
    ur_w = min(6, call.out_sizes[-1])
    return call.padding[-1] <= ur_w and call.r_pad_no_tail(ur_w) <= ur_w


def bf16_depthwise_bias(call: ConvCall, with_bias: bool) -> int:
    """The forward's scratchpad: a bfloat16 bias converted to float32 (``key_conv_bias_bf16_convert_wsp``)."""
    return book(round_up(call.x_shape[1], _BLOCK) * _F32) if with_bias else 0


def bf16_depthwise_bwd_weights(call: ConvCall, with_bias: bool, nthreads: int) -> int:
    """``jit_uni_dw_conv_bwd_weights_kernel_t::init_scratchpad`` for bfloat16 weights (``harness_mb_reduction``):
    float32 partial sums of the weights, one per batch thread (one even on a single batch thread), the bias'
    partial sums of the other batch threads, and the bias gradient converted from float32."""
    groups = round_up(call.x_shape[1], _BLOCK)
    nthr_g = min(groups // _BLOCK, nthreads)
    nthr_mb = min(max(1, nthreads // nthr_g), call.x_shape[0])
    taps = math.prod(call.w_shape[2:])
    total = book(groups * taps * nthr_mb * _F32)
    if with_bias:
        total += (book(groups * (nthr_mb - 1) * _F32) if nthr_mb > 1 else 0) + book(groups * _F32)
    return total
