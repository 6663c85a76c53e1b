"""A grouped (not depthwise) strided convolution's input gradient: on ``brgconv_strided`` (its scratchpad and the
grouped weights ideep reorders for it) or, for bfloat16 with few output channels a group, ``jit_bf16`` / ``gemm:jit``.

Ported from oneDNN 3.12 (torch 2.13's), src/cpu/x64/jit_brgemm_conv_bwd_utils.cpp: ``init_jcp`` reads ``ic`` / ``oc``
per group and refuses ``is_grouped_small_oc`` (a group's output channels at most ``acc_simd_w``, 16 on
``avx512_core`` and 8 on ``avx2``; bfloat16 only with both counts multiples of 4); ``init_conf`` books per thread
every group's output-gradient copy and mask bytes, the uneven width's buffer over all input channels; ``pick_tags``
gives the weights ``gIhwO{ic_block}i`` (float32) / ``gIhwO{ic_block}i2o`` (bfloat16). cpu_convolution_list.cpp tries
it before ``jit:avx512_core`` on ``avx512_core``, after it on ``avx2`` (not sized here).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import torch

from nnmem.frontends.pytorch.workspace._common import round_up
from nnmem.frontends.pytorch.workspace.conv_brgemm_bwd import _P4K, _book, _page, _regression, brgemm_batch_bytes

if TYPE_CHECKING:  # conv_select imports this module for its note
    from nnmem.cpu import CpuInfo
    from nnmem.frontends.pytorch.workspace.conv_select import ConvCall

_AVX512_F32_LANES = 16  # acc_simd_w of avx512_core for float32: is_grouped_small_oc's bound


def _grouped_strided(call: ConvCall) -> bool:
    """A grouped, not depthwise, strided, undilated 2-D (1-D viewed as 2-D) or 3-D input gradient."""
    c, o, g = call.x_shape[1], call.w_shape[0], call.groups
    return (g > 1 and not g == c == o and len(call.x_shape) in (4, 5) and any(s > 1 for s in call.stride)
            and all(d == 1 for d in call.dilation) and not call.transposed)


def _per_group(call: ConvCall) -> ConvCall:
    """The call as one group sees it (``init_jcp``'s ``ic`` / ``oc``), for the regression shapes' test."""
    g = call.groups
    return dataclasses.replace(call, x_shape=(call.x_shape[0], call.x_shape[1] // g, *call.x_shape[2:]),
                               w_shape=(call.w_shape[0] // g, *call.w_shape[1:]), groups=1)


def f32_avx512(call: ConvCall, block: int) -> bool:
    """Whether a float32 grouped strided input gradient runs ``brgconv_strided:avx512_core`` (AVX-512: ``block``
    16): more than 16 output channels a group, not a regression shape."""
    return (block == 16 and call.itemsize == 4 and _grouped_strided(call)
            and call.w_shape[0] // call.groups > _AVX512_F32_LANES and not _regression(_per_group(call)))


def _f32_scratchpad(call: ConvCall, nthreads: int) -> int | None:
    """:func:`.conv_brgemm_bwd.strided_bwd_data` with every group's copy and mask bytes; None where the blocking
    could change it (more blocks than a page of mask bytes, a batch of more than a page, an uneven width whose
    widest output buffer outgrows a page)."""
    planes, positions = 1, 1
    for i, k, o, s, pad in zip(call.x_shape[2:], call.w_shape[2:], call.out_sizes, call.stride, call.padding):
        end_pad = (o - 1) * s + k - (i + pad)  # calculate_end_padding
        planes *= o + max(0, k - 1 - pad) // s + max(0, k - 1 - end_pad) // s  # odp, ohp, owp
        positions *= i
    iw, sw, ic, g = call.x_shape[-1], call.stride[-1], call.x_shape[1], call.groups
    if math.prod(call.w_shape[2:]) * 40 > _P4K or positions // iw * -(-iw // sw) * g > _P4K:
        return None
    if iw % sw and -(-iw // sw) * sw * sw * ic > _P4K:
        return None
    uneven = _book(nthreads * _P4K * 4) if iw % sw else 0
    return (brgemm_batch_bytes(nthreads) + _book(nthreads * _page(planes * call.w_shape[0]) * 4)
            + _book(nthreads * _P4K) + uneven)


def _f32_weights(call: ConvCall) -> int:
    """``gIhwO{ic_block}i`` (``aCdeb16c`` / ``aCdeb32c``): the float32 blocking's input-channel block is 16 up to 16
    channels a group, 32 above (as the dense port, :func:`.conv_select.io_block`)."""
    c_pg = call.w_shape[1]
    return call.w_shape[0] * round_up(c_pg, 16 if c_pg <= 16 else 32) * math.prod(call.w_shape[2:]) * 4


def bf16_plan(call: ConvCall, nthreads: int, dst_dsz: int = 2) -> tuple[int, int] | None:
    """``(scratchpad bytes, ic_block)`` of ``brgconv_strided:avx512_core_bf16`` for a grouped strided input gradient
    (:func:`.conv_bf16_strided_bwd.scratchpad` on a group's channels), or None where another kernel runs
    (``is_grouped_small_oc``) or the blocking fails."""
    from nnmem.frontends.pytorch.workspace.conv_bf16_strided_bwd import problem, scratchpad

    if not _grouped_strided(call):
        return None
    p = problem(call.x_shape, call.w_shape, call.stride, call.padding, nthreads, dst_dsz, call.groups)
    return None if p is None else scratchpad(p)


def bf16_weights(call: ConvCall, ic_block: int) -> int:
    """``gIhwO{ic_block}i2o``: per group the output channels in VNNI pairs by the input channels padded to the
    blocking's ``ic_block``, bfloat16."""
    o_pg, c_pg = call.w_shape[0] // call.groups, call.w_shape[1]
    return call.groups * round_up(o_pg, 2) * round_up(c_pg, ic_block) * math.prod(call.w_shape[2:]) * 2


def grouped_strided_data(call: ConvCall, nthreads: int, block: int) -> tuple[int, int] | None:
    """``(scratchpad bytes, reordered weights' bytes)`` of a grouped strided input gradient on ``brgconv_strided``
    (float32 on ``avx512_core``, bfloat16 on ``avx512_core_bf16``), or None where not sized here."""
    if call.dtype == torch.float32:
        pad = _f32_scratchpad(call, nthreads) if f32_avx512(call, block) else None
        return None if pad is None else (pad, _f32_weights(call))
    if call.dtype != torch.bfloat16:
        return None
    plan = bf16_plan(call, nthreads)
    return None if plan is None else (plan[0], bf16_weights(call, plan[1]))


def grouped_strided_claims(call: ConvCall, info: CpuInfo) -> bool:
    """Whether a float32 grouped strided input gradient is sized (conv_note): on ``brgconv_strided:avx512_core``
    (:func:`grouped_strided_data`). At most 16 output channels a group run ``jit:avx512_core`` or, where its width
    unroll refuses the shape (``tail size unsupported``), ``brgconv_strided:avx2``: not sized here. A 3-D one's
    weights' gradient runs the grouped ``jit:avx512_core`` only where a group's dense problem would
    (:func:`.conv_bwd_weights.bwd_weights_kernel`; else ``gemm``, measured 1.8 MB above the jit sequence): not
    sized otherwise."""
    from nnmem.frontends.pytorch.workspace.conv_bwd_weights import bwd_weights_kernel

    if call.dtype != torch.float32 or grouped_strided_data(call, torch.get_num_threads(), info.onednn_block) is None:
        return False
    return len(call.x_shape) == 4 or bwd_weights_kernel(_per_group(call), 16) == "jit:avx512_core"


def bf16_small_oc_kernel(call: ConvCall) -> str | None:
    """Where a bfloat16 grouped strided input gradient that ``brgconv_strided`` refuses (``is_grouped_small_oc``: at
    most 16 output channels a group, both counts multiples of 4) runs: "jit" (``jit_bf16``, 1-D to 3-D) or, where
    that refuses it, "gemm" (``gemm:jit``; measured); None for other calls. Ported from
    jit_avx512_core_bf16_conv_kernel.cpp ``jit_avx512_core_bf16_bwd_data_kernel_t::init_conf``: its width unroll
    (``ur_w``, a multiple of the stride over at most 31 registers) and the refusals that follow from it."""
    from nnmem.frontends.pytorch.workspace.conv_select import grouped_block

    if not _grouped_strided(call):
        return None
    c_pg, o_pg = call.x_shape[1] // call.groups, call.w_shape[0] // call.groups
    if o_pg > 16 or o_pg % 4 or c_pg % 4:
        return None
    if call.kernel_outside():
        return "gemm"
    simd = grouped_block(c_pg, o_pg, 16) or 4
    nb_ic, max_regs = c_pg // simd, 31
    iw, kw, sw, l_pad, ow = call.x_shape[-1], call.w_shape[-1], call.stride[-1], call.padding[-1], call.out_sizes[-1]
    r_pad = (ow - 1) * sw + kw - (iw + l_pad)  # calculate_end_padding
    l_overflow = max(0, (kw - 1 - l_pad) // sw)
    ur_w, best = sw, 0
    for b in range(1, 5):
        if nb_ic % b:
            continue
        u = sw
        while u * b + u // sw <= max_regs and u < iw + sw:
            ur = min(u, iw)
            if not (l_overflow * sw > ur and ur != iw):
                length = -(-ur // sw) * b
                if length > best or (length == best and ur_w < ur):
                    ur_w, best = ur, length
            u += sw
    if sw + 1 > max_regs or best == 0 or l_overflow * sw > ur_w:
        return "gemm"
    tail = iw % ur_w
    r_overflow_no_tail = max(0, (kw - 1 - max(0, r_pad + tail)) // sw)
    refused = r_overflow_no_tail * sw > ur_w or (iw > ur_w and (ur_w % sw or r_pad + tail < 0))
    return "gemm" if refused else "jit"
