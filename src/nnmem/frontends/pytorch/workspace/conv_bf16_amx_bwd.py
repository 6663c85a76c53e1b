"""The scratch of a bfloat16 ``convolution_backward`` on oneDNN's AMX kernels (``avx512_core_amx``).

The input's gradient runs ``brg_conv_bwd``: at unit stride oneDNN converts it into the forward convolution of
the output's gradient with the transposed weights (``fwd_conv_desc_create``, jit_brgemm_conv_bwd.cpp: the
paddings become ``kernel - 1 - padding``, no input relayout under ``use_inversion``), whose scratchpad is nested
in the backward's; it is sized by :mod:`.conv_bf16_amx` and :mod:`.conv_bf16_amx_1x1`. The weights' gradient
runs ``brgconv_bwd_w``, ported from jit_brgemm_conv_utils.cpp ``init_conf_bwd_w`` / ``balance_bwd_w`` /
``init_scratchpad_bwd_w``, or, on paddings it refuses, ``gemm:jit`` (gemm_convolution_utils.cpp ``init_conf``);
oneDNN v3.12, bundled with torch 2.13. ATen/ideep's reorders around them follow ONEDNN_VERBOSE and the profiler.
The strided input gradient (``brgconv_strided``) is not sized here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from nnmem.cpu import CpuInfo
from nnmem.frontends.pytorch.workspace import conv_bf16_amx as fwd
from nnmem.frontends.pytorch.workspace._common import alloc_peak, barriers, book, div_up, round_up
from nnmem.frontends.pytorch.workspace.conv_bf16 import jit_bf16_bwd_weights
from nnmem.frontends.pytorch.workspace.conv_bf16_amx_1x1 import forward_scratch_1x1
from nnmem.frontends.pytorch.workspace.matmul import AMX_ISA, MODELLED_THREADS

if TYPE_CHECKING:  # conv_select imports this module for its note
    from nnmem.frontends.pytorch.workspace.conv_select import ConvCall

_BF16, _F32 = 2, 4
_BLOCK = 16  # ic_block, oc_block of brgconv_bwd_w
_TR_ROUND = 32  # init_conf_bwd_w's tr_round: a full tile row of bfloat16
_P4K = 4096  # a page
_BATCH_ELEMENT = 40  # sizeof(brgemm_batch_element_t)
_L2 = fwd._L2  # brg_blocking_t::L2 (3/4 of the per-core L2)
f32 = np.float32


@dataclass(frozen=True, slots=True)
class BwdW:
    """``jcp`` of ``brgconv_bwd_w`` on a dense 2-D problem, as far as its scratchpad reads it."""

    mb: int
    ic: int
    oc: int
    ih: int
    iw: int
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    t_pad: int
    l_pad: int
    b_pad: int
    r_pad: int
    max_batch: int

    @property
    def nb_ic(self) -> int:
        return div_up(self.ic, _BLOCK)

    @property
    def nb_oc(self) -> int:
        return div_up(self.oc, _BLOCK)

    @property
    def tr_iw(self) -> int:
        return round_up(div_up(self.iw + self.l_pad + self.r_pad, self.sw), _TR_ROUND) * self.sw

    @property
    def tr_ow(self) -> int:
        """``tr_ow``: the width rounded to VNNI pairs, then widened up to a tile row for fewer row blocks."""
        tr_ow = round_up(self.ow, 2)
        if tr_ow <= _TR_ROUND:
            return tr_ow
        best_bdb, best = tr_ow // 2, tr_ow
        for cand in range(tr_ow, round_up(tr_ow, _TR_ROUND) + 1, 2):
            for i in range(_TR_ROUND, 0, -2):
                if cand % i == 0:
                    if cand // i < best_bdb:
                        best_bdb, best = cand // i, cand
                    break
        return best


def bwd_w_problem(x_shape: Sequence[int], w_shape: Sequence[int], stride: Sequence[int],
                  padding: Sequence[int]) -> BwdW | None:
    """The problem of a dense undilated 2-D call that ``init_conf_bwd_w`` takes, else None. An unpadded 1x1 at
    unit stride at most 28 wide runs as one row (``make_1d``)."""
    mb, ic, ih, iw = x_shape
    oc, _, kh, kw = w_shape
    (sh, sw), (tp, lp) = stride, padding
    oh, ow = (ih + 2 * tp - kh) // sh + 1, (iw + 2 * lp - kw) // sw + 1
    if oh < 1 or ow < 1:
        return None
    b_pad, r_pad = (oh - 1) * sh + kh - (ih + tp), (ow - 1) * sw + kw - (iw + lp)  # calculate_end_padding
    if not (lp < kw and r_pad < kw and tp <= kh // 2 and b_pad <= kh // 2):
        return None  # boundaries_ok: another implementation
    if kh == kw == sh == sw == 1 and tp == lp == b_pad == r_pad == 0 and iw <= 28:
        return BwdW(mb, ic, oc, 1, iw * ih, 1, ow * oh, kh, kw, sh, sw, tp, lp, b_pad, r_pad, 1)
    return BwdW(mb, ic, oc, ih, iw, oh, ow, kh, kw, sh, sw, tp, lp, b_pad, r_pad, oh)


def _balance(p: BwdW, nthreads: int) -> tuple[int, int, int, int]:
    """``balance_bwd_w`` (one group): ``(nthr, nthr_mb, nthr_oc_b, nthr_ic_b)`` of the lowest memory cost, in
    float32 as the C++ computes it."""
    nb_oc_blocking, nb_ic_blocking = (2 if p.nb_oc > 1 else 1), (2 if p.nb_ic > 1 else 1)
    os_chunks = p.mb * p.oh  # harness_2d_reduction
    oc_chunks, ic_chunks = div_up(p.nb_oc, nb_oc_blocking), div_up(p.nb_ic, nb_ic_blocking)
    wei_ks = p.kh * p.kw
    src_spatial, dst_spatial = p.mb * p.ih * p.tr_iw, p.mb * p.oh * p.tr_ow
    src_size, dst_size = src_spatial * p.ic * 2, dst_spatial * p.oc * 2
    wei_size = p.oc * p.ic * wei_ks * 4
    wei_scale = f32(f32(0.5) * f32(dst_size + src_size)) / f32(wei_size)
    ratio = f32(oc_chunks) / f32(ic_chunks)
    src_coef = max(f32(1.0) / ratio, f32(1.0)) * (f32(4.0) if wei_scale < 1.0 else f32(1.0))
    dst_coef, wei_coef = max(ratio, f32(1.0)), max(wei_scale, f32(1.0))
    nb_oc_job, nb_ic_job = _BLOCK * nb_oc_blocking, _BLOCK * nb_ic_blocking
    src_chunk, dst_chunk = src_spatial // os_chunks, dst_spatial // os_chunks

    def cost(n_mb: int, n_oc: int, n_ic: int) -> np.float32:
        thr_mb = div_up(os_chunks, n_mb)
        thr_ic_amount = div_up(ic_chunks, n_ic) * nb_ic_job
        thr_src_sp = thr_mb * src_chunk // p.sh // p.sw
        thr_oc_amount = div_up(oc_chunks, nb_oc_job * n_oc) * nb_oc_job
        src_v = f32(f32(f32(f32(2) * src_coef) * f32(1)) * f32(thr_ic_amount)) * f32(thr_src_sp)
        dst_v = f32(f32(f32(f32(2) * dst_coef) * f32(1)) * f32(thr_oc_amount)) * f32(thr_mb * dst_chunk)
        wei_v = f32(f32(f32(f32(f32(4) * wei_coef) * f32(1)) * f32(thr_oc_amount)) * f32(thr_ic_amount)) \
            * f32(wei_ks)
        return f32(f32(src_v + dst_v) + wei_v)

    best, pick = cost(1, 1, 1), (1, 1, 1)
    for n_mb in range(1, min(nthreads, os_chunks) + 1):
        par = nthreads // n_mb
        for n_oc in range(1, min(par, oc_chunks) + 1):
            n_ic = min(par // n_oc, p.nb_ic // nb_ic_blocking)
            c = cost(n_mb, n_oc, n_ic)
            if c <= best:
                best, pick = c, (n_mb, n_oc, n_ic)
    n_mb, n_oc, n_ic = pick
    if nthreads // 2 < n_mb < nthreads:
        n_mb = min(os_chunks, nthreads)
    return n_mb * n_oc * n_ic, n_mb, n_oc, n_ic


def bwd_w_scratch(p: BwdW, nthreads: int, with_bias: bool) -> int | None:
    """Bytes of ``brgconv_bwd_w``'s scratchpad (bfloat16 weights' and bias' gradients, OpenMP threads, so
    ``global_transpose``), or None where ``balance_bwd_w``'s AMX heuristic for small batches would take over."""
    if p.mb <= nthreads // 2 and p.oc >= 64 and p.ic >= 64:
        return None  # the "cubic pieces" thread split: not ported
    nthr, nthr_mb, nthr_oc_b, nthr_ic_b = _balance(p, nthreads)
    irow = _BF16 * p.tr_iw * _BLOCK * div_up(p.nb_ic, nthr_ic_b) * 2
    orow = _BF16 * p.tr_ow * _BLOCK * div_up(p.nb_oc, nthr_oc_b) * 2
    limit = int(f32(max(f32(1.0), f32(max(f32(0.0), f32(f32(0.8) * f32(_L2)) - f32(p.kh * irow))
                                      / f32(irow + orow)))))
    limit = div_up(p.oh, div_up(p.oh, limit))
    oh_block = min(max(1, limit), p.oh)
    ih_block = min(p.ih, p.sh * fwd._inp_size(p.ih, oh_block, p.kh, p.sh))
    tr_pad = round_up(max(p.l_pad, p.r_pad + 1), _TR_ROUND)
    tr_src = nthr_mb * p.nb_ic * p.tr_iw * _BLOCK * ih_block + tr_pad
    total = book(tr_src * _BF16)
    if nthr_oc_b > 1:
        total += barriers(nthr // nthr_oc_b)
    tr_dst = nthr_mb * p.nb_oc * p.tr_ow * _BLOCK * oh_block + p.tr_iw * _BLOCK
    total += book(tr_dst * _BF16, 64)
    if nthr_ic_b > 1:
        total += barriers(nthr // nthr_ic_b)
    wei = p.nb_oc * _BLOCK * p.nb_ic * _BLOCK * p.kh * p.kw
    bia = p.nb_oc * _BLOCK if with_bias else 0
    total += book((wei + bia) * nthr_mb * _F32) + barriers(1)
    total += book(64, 64)  # key_conv_amx_tilecfg
    batch = div_up(round_up(p.max_batch * _BATCH_ELEMENT, _P4K), _BATCH_ELEMENT)
    total += book(nthr * batch * _BATCH_ELEMENT, _P4K)
    total += book(nthr * 2 * _P4K, _P4K)  # key_conv_amx_tile_buffer
    return total


def gemm_bwd_w_scratch(x_shape: Sequence[int], w_shape: Sequence[int], out_sizes: Sequence[int],
                       stride: Sequence[int], nthreads: int, with_bias: bool) -> int | None:
    """Bytes of ``gemm:jit``'s bfloat16 backward-weights scratchpad (nchw), where ``brgconv_bwd_w`` refuses the
    padding (``jit_gemm_convolution_utils::init_conf``, gemm_convolution_utils.cpp): float32 partial sums per
    thread of outer threading and one accumulator of the weights, the bias converted to float32, and bfloat16
    im2col columns; None where the columns would be cut into blocks to fit ``scratchpad_limit``."""
    (mb, ic, ih, iw), (oc, _, kh, kw), (oh, ow) = x_shape, w_shape, out_sizes
    ks, wei = kh * kw, oc * ic * kh * kw * _BF16  # weights_d.size(), in bytes
    limit = min(1 << 30, 15 * nthreads * (mb * ic * ih * iw * _BF16 + wei + mb * oc * oh * ow * _BF16))
    trivial = ks == 1 and (oh, ow) == (ih, iw) and tuple(stride) == (1, 1)
    cols = 0 if trivial else ic * ks * oh * ow
    simd_w = 32  # vlen / data_size: bfloat16 lanes of a zmm
    estimate = _F32 * nthreads * wei + _F32 * wei + (_F32 * oc if with_bias else 0)
    estimate += _BF16 * nthreads * ic * ks * simd_w  # the least columns: os_block >= simd_w
    outer = estimate < limit and oh * ow // nthreads < 256 and mb != 1
    nthr = nthreads if outer else 1
    total = book(nthr * wei * _F32) + book(wei * _F32) + (book(oc * _F32) if with_bias else 0)
    if total > limit or limit - total < nthr * cols * _BF16:
        return None
    return total + book(nthr * cols * _BF16)


def bwd_data_scratch(x_shape: Sequence[int], w_shape: Sequence[int], padding: Sequence[int],
                     nthreads: int) -> tuple[int, int] | None:
    """``(scratchpad, weights)`` bytes of a unit-stride input gradient on ``brg_conv_bwd`` (the forward of the
    output's gradient, :mod:`.conv_bf16_amx`): its nested scratchpad and the weights ideep reorders for it, or
    None where the forward's port does not follow it."""
    mb, ic, ih, iw = x_shape
    oc, _, kh, kw = w_shape
    th, tw = kh - 1 - padding[0], kw - 1 - padding[1]  # overflow_l of fwd_conv_desc_create
    if th < 0 or tw < 0:
        return None
    oh, ow = ih + 2 * padding[0] - kh + 1, iw + 2 * padding[1] - kw + 1
    if kh * kw == 1:  # brgconv_1x1 on the output's gradient
        sized = forward_scratch_1x1((mb, oc, oh, ow), (ic, oc, 1, 1), (1, 1), (0, 0), nthreads)
        return None if sized is None else (book(sized[0]), sized[1])
    p = fwd.problem((mb, oc, oh, ow), (ic, oc, kh, kw), (1, 1), (th, tw), nthreads)
    if p is None:
        return None
    if p.relo:  # use_inversion: no relayout, so exec_base and the uker's width apply
        p = dataclasses.replace(p, relo="", relo_weights=False)
        if p.l_pad <= 0 and p.r_pad <= 0 and p.ow > 50 and (p.ic % 2 == 0 if p.ic <= 32 else p.ic % 32 == 0):
            return None  # exec_base
        if p.ow >= 256:
            return None
    try:
        b = fwd.select_blocking(p)
        pad = fwd.scratchpad(p, b)
    except fwd._Unmodelled:
        return None
    wei = round_up(ic, b.oc_block) * round_up(oc, 32 if p.rd_padded else 2) * kh * kw * _BF16
    src, dst = mb * oc * oh * ow * _BF16, mb * ic * ih * iw * _BF16
    if pad > 64 * nthreads * (src + wei + dst):
        return None  # init_scratchpad's limit: another implementation
    return book(pad), wei  # nested in the backward's registry


def _weights_scratch(call: ConvCall, nthreads: int, with_bias: bool) -> tuple[int, bool] | None:
    """The weights' gradient's scratchpad bytes and whether ``brgconv_bwd_w`` runs (else ``gemm:jit``: a padding
    ``brgconv_bwd_w`` and ``jit_bf16`` both refuse), or None where not sized."""
    p = bwd_w_problem(call.x_shape, call.w_shape, call.stride, call.padding)
    if p is not None:
        pad = bwd_w_scratch(p, nthreads, with_bias)
        return None if pad is None else (pad, True)
    if jit_bf16_bwd_weights(call):
        return None
    pad = gemm_bwd_w_scratch(call.x_shape, call.w_shape, call.out_sizes, call.stride, nthreads, with_bias)
    return None if pad is None else (pad, False)


def amx_backward_claims(call: ConvCall, info: CpuInfo) -> bool:
    """Whether :func:`amx_backward_scratch` sizes this bfloat16 ``convolution_backward``: dense, NCHW, 1-D or
    2-D, undilated, more than one input channel and one output position, on ``avx512_core_amx`` at 1-4
    threads, the weights' gradient on a ``brgconv_bwd_w`` or ``gemm:jit`` this port follows (with or without
    bias) and, where the input's gradient is asked for, unit stride and a ``brg_conv_bwd`` the forward's port
    follows."""
    if call.dtype != torch.bfloat16 or not call.backward or call.transposed or call.groups != 1:
        return False
    if info.isa != AMX_ISA or torch.get_num_threads() not in MODELLED_THREADS or len(call.x_shape) != 4:
        return False
    if call.x_layout != "contiguous" or call.w_layout != "contiguous" or call.dilation != (1, 1):
        return False
    if math.prod(call.out_sizes) == 1 or call.x_shape[1] == 1:
        return False  # an inner product; one input channel: read as channels-last
    if any(_weights_scratch(call, torch.get_num_threads(), bias) is None for bias in (False, True)):
        return False
    if call.grad_input:
        return call.stride == (1, 1) and \
            bwd_data_scratch(call.x_shape, call.w_shape, call.padding, torch.get_num_threads()) is not None
    return True


def amx_backward_scratch(call: ConvCall, mask: Sequence[bool], contiguous: int, fresh: int) -> int:
    """Scratch bytes of a call :func:`amx_backward_claims` takes beyond its fresh outputs (``fresh``).

    ``contiguous``: ATen's copy of a non-contiguous grad_output, live throughout. Input gradient: grad_output
    reordered to ``acdb``, the weights to ``BcdA16b2a``-like, an ``acdb`` result, the scratchpad; then the dense
    output and one more copy of it. Weights' gradient: grad_output and the source reordered to ``acdb``, the
    gradient in ``ABcd16b16a2b`` (channels padded to 16 and 32), the scratchpad and the bias' gradient; then
    the dense weights' gradient (on ``gemm:jit``: plain gradients, no reorders). One output channel: grad_output
    is ``acdb`` already.
    """
    nthreads = torch.get_num_threads()
    n, c, ih, iw = call.x_shape
    o = call.w_shape[0]
    taps = call.w_shape[2] * call.w_shape[3]
    gy = n * o * math.prod(call.out_sizes) * _BF16 if o > 1 else 0  # one channel: nchw is acdb, no reorder
    x = n * c * ih * iw * _BF16
    seq = [contiguous]
    if mask[0]:
        sized = bwd_data_scratch(call.x_shape, call.w_shape, call.padding, nthreads)
        assert sized is not None
        pad, wei = sized
        seq += [gy, wei, x, pad, -pad, -wei, -gy, x, x, -x, -x]
    weights = _weights_scratch(call, nthreads, bool(mask[2]))
    assert weights is not None
    pad, brg = weights
    if (mask[1] or mask[2]) and not brg:  # gemm: plain layouts, no reorders
        gw, gb = o * c * taps * _BF16, (o * _BF16 if mask[2] else 0)
        seq += [gw, pad, gb, -pad, gb, gw, -gw, -gb]
    elif mask[1] or mask[2]:
        gw_blocked = round_up(o, _BLOCK) * round_up(c, 2 * _BLOCK) * taps * _BF16
        gb = o * _BF16 if mask[2] else 0
        seq += [gy, x, gw_blocked, pad, gb, -pad, -x, -gy, gb, o * c * taps * _BF16, -gw_blocked, -gb]
    return max(alloc_peak(seq) - fresh, 0)
