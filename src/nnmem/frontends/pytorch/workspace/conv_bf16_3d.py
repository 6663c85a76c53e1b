"""bfloat16 3-D (NCDHW) convolutions through oneDNN on ``avx512_core_bf16``: which calls are sized, and the scratchpads.

The allocations around the kernels are the 2-D ones' (:func:`.conv_onednn.conv_forward` / ``conv_backward``, 2-byte
elements, ``nCdhw16c`` reorders). Forward runs ``jit_bf16`` (its scratchpad: a padded bias) or, for an unpadded
unit-stride 1x1, ``jit_bf16_1x1`` (:mod:`.conv_bf16_1x1`, spatial ``od * oh`` and ``is = id * ih * iw``; 3-D has no
"reduce to unit stride", so a strided 1x1 runs ``jit_bf16``). The weights' gradient runs ``jit_bf16``'s
``harness_3d_reduction`` (batch threads over ``mb * od``, transposes of the whole ``id * ih`` planes, none where the
``permw`` kernel takes a kernel one wide) or ``jit_bf16_1x1``. Ported from oneDNN 3.12, src/cpu/x64/
jit_avx512_core_bf16_conv_kernel.cpp (``init_conf`` / ``balance`` / ``init_scratchpad`` of the forward and
backward-weights kernels) and jit_avx512_core_bf16_1x1_conv_kernel.cpp (``init_conf``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from nnmem.cpu import CpuInfo
from nnmem.frontends.pytorch.workspace._common import barriers, book, div_up, round_up
from nnmem.frontends.pytorch.workspace.conv_bf16 import _balance
from nnmem.frontends.pytorch.workspace.conv_bf16_1x1 import OneByOne, bwd_weights, fwd_or_bwd_data
from nnmem.frontends.pytorch.workspace.conv_gemm_bf16 import inner_product_takes
from nnmem.frontends.pytorch.workspace.matmul import MODELLED_ISA, MODELLED_THREADS

if TYPE_CHECKING:  # conv_select imports this module for its note
    from nnmem.frontends.pytorch.workspace.conv_select import ConvCall

_BLOCK = 16  # simd_w: 16 floats in a zmm register
_MAX_UR_W = 28  # jit_avx512_core_bf16_conv_bwd_weights_kernel_f32_t::max_ur_w
_BF16, _F32 = 2, 4


def _end_pads(call: ConvCall) -> tuple[int, ...]:
    """``calculate_end_padding`` per spatial dimension (negative where the kernel stops short of the input's end)."""
    return tuple((o - 1) * s + (k - 1) * d + 1 - (i + p) for i, k, o, s, p, d in
                 zip(call.x_shape[2:], call.w_shape[2:], call.out_sizes, call.stride, call.padding, call.dilation))


def _candidate(call: ConvCall, info: CpuInfo) -> bool:
    """A dense bfloat16 NCDHW convolution on ``avx512_core_bf16`` at 1-4 threads, not one ``ip_convolution`` takes
    (:func:`.conv_gemm_bf16.inner_product_takes`), the kernel overlapping the padded input (else ``gemm``)."""
    return (call.dtype == torch.bfloat16 and not call.transposed and call.groups == 1 and len(call.x_shape) == 5
            and call.x_layout == "contiguous" and call.w_layout != "channels_last" and info.isa == MODELLED_ISA
            and torch.get_num_threads() in MODELLED_THREADS and not call.kernel_outside()
            and not inner_product_takes(call))


def _unit_1x1(call: ConvCall) -> bool:
    """Whether ``jit_bf16_1x1`` takes the call: a 1x1x1 kernel, unit stride, no padding (3-D has no ``rtus``)."""
    return call.w_shape[2:] == (1, 1, 1) and all(s == 1 for s in call.stride) and not any(call.padding)


def _one_by_one(call: ConvCall, with_bias: bool) -> OneByOne:
    """The 1x1 problem ``init_conf`` sees: depth and height folded into one (its ``spatial`` is ``od * oh``)."""
    od, oh, ow = call.out_sizes
    return OneByOne(call.x_shape[0], round_up(call.x_shape[1], _BLOCK), round_up(call.w_shape[0], _BLOCK),
                    call.w_shape[0], od * oh, ow, with_bias, False)


def _forward_pads(call: ConvCall) -> bool:
    """``jit_avx512_core_bf16_fwd_kernel_t::init_conf``'s width checks: neither the left padding nor the right one
    outside the width's tail passes the width unroll ``31 // (nb_oc_blocking + 1)`` (the 2-D rule's, on the last
    dimension)."""
    ow, l_pad, iw, sw = call.out_sizes[-1], call.padding[-1], call.x_shape[-1], call.stride[-1]
    ext_kw = (call.w_shape[-1] - 1) * call.dilation[-1] + 1
    nb_oc = div_up(call.w_shape[0], _BLOCK)
    blocking = min(4, nb_oc)
    while blocking > 1:
        ur = 31 // (blocking + 1)
        if nb_oc % blocking == 0 and l_pad <= ur and (ow == 1 or ow % ur != 1):
            break
        blocking -= 1
    ur_w = min(31 // (blocking + 1), ow)
    r_pad_no_tail = max(0, (ow - ow % ur_w - 1) * sw + ext_kw - (iw + l_pad))
    return l_pad <= ur_w and r_pad_no_tail <= ur_w


def bf16_3d_forward_scratchpad(call: ConvCall, info: CpuInfo, with_bias: bool) -> int | None:
    """Bytes of oneDNN's scratchpad for a bfloat16 3-D forward the rules size, or None: ``jit_bf16_1x1``'s store
    buffer (:func:`.conv_bf16_1x1.fwd_or_bwd_data`) for an unpadded unit-stride 1x1, else ``jit_bf16``'s padded
    bias (``init_scratchpad``: a bias whose channels are not a multiple of 16)."""
    if call.backward or not _candidate(call, info):
        return None
    if _unit_1x1(call):
        return fwd_or_bwd_data(_one_by_one(call, with_bias), torch.get_num_threads(), False)
    if not _forward_pads(call):
        return None
    o = call.w_shape[0]
    return book(round_up(o, _BLOCK) * _BF16) if with_bias and o % _BLOCK else 0


def _jit_bf16_bwd_weights(call: ConvCall) -> bool:
    """``jit_avx512_core_bf16_conv_bwd_weights_kernel_f32_t::init_conf``'s checks on NCDHW: a dilation only at unit
    stride, none in depth with a depth padding, paddings inside the dilated kernel (top and bottom within half
    of it), ``kw`` at most 14 (24 on a first convolution, fewer than 16 input channels, whose output channels come
    in whole blocks); not a first convolution with ``oh * ow >= 64 * 124`` (``use_spatial_blocking``)."""
    kw, (sd, sh, sw), (dd, dh, dw) = call.w_shape[-1], call.stride, call.dilation
    ext_kd, ext_kh, ext_kw = ((k - 1) * d + 1 for k, d in zip(call.w_shape[2:], call.dilation))
    (_, ih, iw), (_, oh, ow) = call.x_shape[2:], call.out_sizes
    f_pad, t_pad, l_pad = call.padding
    back_pad, b_pad, r_pad = (max(0, p) for p in _end_pads(call))
    first = call.x_shape[1] < _BLOCK
    if (dd > 1 and sd != 1) or (dh > 1 and sh != 1) or (dw > 1 and sw != 1) or (dh > 1 and ext_kh > ih):
        return False
    if dd > 1 and (f_pad or back_pad):
        return False
    if not (l_pad < ext_kw and r_pad < ext_kw and t_pad <= ext_kh // 2 and b_pad <= ext_kh // 2
            and f_pad < ext_kd and back_pad < ext_kd):
        return False
    if first and ow > _MAX_UR_W and not (l_pad < _MAX_UR_W and ext_kw <= ow):
        return False
    if kw > (24 if first else 14) or (first and call.w_shape[0] % _BLOCK):
        return False
    if first and not (l_pad < _MAX_UR_W and r_pad < _MAX_UR_W and ext_kw <= iw + 1):  # padding_ok
        return False
    return not (first and oh * ow >= 64 * 124)


def bf16_3d_backward_claims(call: ConvCall, info: CpuInfo) -> bool:
    """Whether a bfloat16 3-D ``convolution_backward`` is one the rules size: the weights' gradient on ``jit_bf16``
    (:func:`_jit_bf16_bwd_weights`) or ``jit_bf16_1x1`` (an unpadded unit-stride 1x1), the input's gradient, when
    asked for, at unit stride (a strided one runs ``brgconv_strided``)."""
    if not call.backward or not _candidate(call, info):
        return False
    if call.grad_input and any(s != 1 for s in call.stride):
        return False
    return _unit_1x1(call) or _jit_bf16_bwd_weights(call)


def bf16_3d_backward_scratchpads(call: ConvCall, mask: Sequence[bool], nthreads: int) -> tuple[int, int, bool]:
    """``(backward data's, backward weights', first)`` for a call :func:`bf16_3d_backward_claims` takes: the
    scratchpads in bytes and whether the weights' gradient reads the source as it is (a first convolution)."""
    with_bias = bool(mask[2])
    if _unit_1x1(call):
        problem = _one_by_one(call, with_bias)
        data = fwd_or_bwd_data(problem, nthreads, True) if mask[0] else 0
        _, oh, ow = call.out_sizes  # uses_permw_transposition: 3-D adds oc <= 64 (channels padded to 16)
        permw = oh > 14 and ow > 14 and problem.oc <= 64
        return data, bwd_weights(problem, nthreads, permw) if mask[1] else 0, False
    weights = bwd_weights_scratch(call, with_bias, nthreads) if mask[1] else 0
    return 0, weights, call.x_shape[1] < _BLOCK


def bwd_weights_scratch(call: ConvCall, with_bias: bool, nthreads: int) -> int:
    """Bytes of ``jit_bf16``'s backward-weights scratchpad on NCDHW (``harness_3d_reduction``, OpenMP threads, so
    ``global_transpose``): the transposed source and output gradient per batch thread (none where ``permw``
    runs: a kernel one wide at unit width stride, not a first convolution), their barriers, the float32 partial
    sums of the bfloat16 weights (and bias) per batch thread."""
    c, o, mb = call.x_shape[1], call.w_shape[0], call.x_shape[0]
    (idd, ih, iw), (od, oh, ow), (kd, kh, kw) = call.x_shape[2:], call.out_sizes, call.w_shape[2:]
    (sd, sh, sw), l_pad = call.stride, call.padding[-1]
    r_pad = max(0, _end_pads(call)[-1])
    first = c < _BLOCK
    ic, oc = (c, o) if first else (round_up(c, _BLOCK), round_up(o, _BLOCK))
    ic_block = ic if first else _BLOCK
    nb_ic, nb_oc = ic // ic_block, div_up(oc, _BLOCK)
    permw = not first and sw == 1 and call.dilation[-1] == 1 and kw == 1  # ic_block_step 8 > 4 (kw <= 3)
    transpose_src = not first and not permw
    tr_pad = round_up(max(l_pad, r_pad + 1), 2)
    tr_iw = round_up(div_up(iw, sw) + tr_pad, 2) * sw if transpose_src else iw
    tr_ow = ow if permw else round_up(ow, 2)
    nthr_mb, nthr_oc, nthr_ic = _balance(nthreads, mb, mb * od, ic, oc, nb_ic, nb_oc, ic_block,
                                         (idd * ih, tr_iw, od * oh, tr_ow, kd * kh, kw, sd * sh, sw))
    nthr = nthr_mb * nthr_oc * nthr_ic
    total = 0
    if not permw:
        tr_src = (nthr_mb * nb_ic * tr_iw * ic_block * ih * idd if transpose_src else 0) + tr_pad
        total += book(tr_src * _BF16)
        if nthr_oc > 1:
            total += barriers(nthr // nthr_oc)
        total += book(nthr_mb * nb_oc * tr_ow * _BLOCK * oh * od * _BF16)
        if nthr_ic > 1:
            total += barriers(nthr // nthr_ic)
    reduction = nb_oc * _BLOCK * nb_ic * ic_block * kd * kh * kw * nthr_mb + (nb_oc * _BLOCK * nthr_mb if with_bias
                                                                             else 0)
    return total + book(reduction * _F32) + barriers(1)


def bf16_3d_claims(call: ConvCall, info: CpuInfo) -> bool:
    """Whether a rule here sizes the call (forward or backward): conv_note's test."""
    return bf16_3d_backward_claims(call, info) if call.backward else \
        bf16_3d_forward_scratchpad(call, info, False) is not None
