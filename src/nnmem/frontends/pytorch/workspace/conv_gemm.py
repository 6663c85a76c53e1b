"""Scratch of float32 convolutions on oneDNN's ``gemm`` kernel (``gemm:jit`` / ``gemm:ref`` in ``ONEDNN_VERBOSE``).

A port of ``jit_gemm_convolution_utils::init_conf`` (oneDNN v3.12 src/cpu/gemm_convolution_utils.cpp): per-thread
im2col columns (``key_conv_gemm_col``), the weights' per-thread partial sums (``key_conv_wei_reduction``, booked
as ``nthr * weights_d.size()`` floats: four times the weights' bytes) and, on nhwc, per-thread transposed sources
(``key_conv_gemm_imtr``); each booking takes 128 bytes more (``memory_tracking::registrar_t::default_alignment``).
ideep gives gemm plain layouts (no reorders): the sequences around the scratchpad are the measured ones.
The nchw forward's blocking search reads the per-core L2 size (:func:`._common.per_core_cache`, as oneDNN reads it);
a shape is sized only where float rounding cannot change the columns it picks.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nnmem.frontends.pytorch.workspace._common import alloc_peak, div_up, per_core_cache, round_up
from nnmem.frontends.pytorch.workspace.conv_brgemm_bwd import strided_bwd_data
from nnmem.frontends.pytorch.workspace.conv_grouped_strided_bwd import grouped_strided_data

if TYPE_CHECKING:
    from nnmem.frontends.pytorch.workspace.conv_select import ConvCall

ALIGN = 128  # memory_tracking.hpp default_alignment: each booking's capacity is its size plus this
GEMM_THRLD = 64 * 1024  # init_conf's gemm size per thread threshold
_TIE = 1e-5  # relative distance under which two blocking choices count as tied (float vs double rounding)


def _f32(value: float) -> float:
    """``value`` rounded to a C ``float``."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


def _tdiv(a: int, b: int) -> int:
    """C's integer division (towards zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _rnd_dn(a: int, b: int) -> int:
    return _tdiv(a, b) * b


def _sat(low: int, upper: int, a: int) -> int:
    return max(low, min(upper, a))


@dataclass(frozen=True, slots=True)
class GemmConv:
    """The ``jcp`` fields ``init_conf`` reads, for a float32 convolution (channels per group; 2-D as depth 1).

    Sizes are elements; ``src_bytes``, ``wei_bytes``, ``dst_bytes`` are the tensors' bytes.
    """

    mb: int
    ngroups: int
    ic: int
    oc: int
    id: int
    ih: int
    iw: int
    od: int
    oh: int
    ow: int
    ks: int
    strides: tuple[int, int, int]
    with_bias: bool
    is_3d: bool = False

    @property
    def is_(self) -> int:
        return self.ih * self.iw

    @property
    def os(self) -> int:
        return self.oh * self.ow

    @property
    def wei_bytes(self) -> int:
        return self.ngroups * self.oc * self.ic * self.ks * 4

    @property
    def src_bytes(self) -> int:
        return self.mb * self.ngroups * self.ic * self.id * self.is_ * 4

    @property
    def dst_bytes(self) -> int:
        return self.mb * self.ngroups * self.oc * self.od * self.os * 4

    @property
    def trivial(self) -> bool:
        """A 1x1 unit-stride kernel on an unpadded source: gemm reads the source as is (``im2col_sz`` 0)."""
        return (self.ow == self.iw and self.oh == self.ih and self.od == self.id and self.strides == (1, 1, 1)
                and self.ks == 1)

    @property
    def im2col_sz(self) -> int:
        """``ic * ks * os`` elements, or 0 where no im2col runs."""
        return 0 if self.trivial else self.ic * self.ks * self.os

    def limit(self, nthr: int) -> int:
        """``scratchpad_limit``: 1 GiB or 15 times the threads times the tensors' bytes, the smaller."""
        return min(1 << 30, 15 * nthr * (self.src_bytes + self.wei_bytes + self.dst_bytes))


def gemm_conv(x_shape: tuple[int, ...], w_shape: tuple[int, ...], out_sizes: tuple[int, ...],
              stride: tuple[int, ...], groups: int, with_bias: bool) -> GemmConv:
    """The ``jcp`` of a convolution of 4-D (1-D viewed as 2-D) or 5-D shapes."""
    g = groups
    spatial_in, spatial_out, kernel = x_shape[2:], out_sizes, w_shape[2:]
    if len(spatial_in) == 2:
        spatial_in, spatial_out, stride = (1, *spatial_in), (1, *spatial_out), (1, *stride)
    (i_d, i_h, i_w), (o_d, o_h, o_w) = spatial_in, spatial_out
    return GemmConv(x_shape[0], g, x_shape[1] // g, w_shape[0] // g, i_d, i_h, i_w, o_d, o_h, o_w,
                    math.prod(kernel), (stride[0], stride[1], stride[2]), with_bias, len(x_shape) == 5)


def _book(*sizes: int) -> int:
    """Bytes of a scratchpad holding these bookings (zero-sized ones are skipped)."""
    return sum(s + ALIGN for s in sizes if s)


def forward_scratchpad(j: GemmConv, nthr: int, simd_w: int) -> int | None:
    """Bytes of the nchw forward's scratchpad: ``nthr * im2col_sz`` floats of columns; None where the blocking
    search depends on the L2 size or on float rounding."""
    if not j.im2col_sz:
        return 0
    spatial = j.mb * j.ngroups * j.od * j.os
    k, sw = j.ic * j.ks, j.strides[2]
    blocking = (not j.is_3d and (spatial >= nthr * simd_w or j.os < j.mb * j.ngroups * j.od
                                 or (sw == 1 and k <= 0.05 * j.oc)))
    if not blocking:  # is_3d or none of the conditions: one block of everything, threading by heuristic
        outer_work, inner_work = j.ngroups * j.mb * j.od, div_up(j.os, simd_w) * div_up(j.oc, simd_w)
        outer_eff = _f32(outer_work / round_up(outer_work, nthr))
        inner_eff = _f32(inner_work / round_up(inner_work, nthr))
        outer = (j.os // nthr < 512 and (j.od != 1 or j.mb != 1 or j.ngroups > 2)
                 and (_f32(outer_eff / inner_eff) >= 1.0 or j.os * j.ic * j.oc // nthr < GEMM_THRLD))
        pad = _book((nthr if outer else 1) * j.im2col_sz * 4)
        return pad if pad <= j.limit(nthr) else None  # init_conf's last check: else not gemm
    size = _blocked_im2col(j, nthr, simd_w, per_core_cache(2) // 4)
    if size is None:
        return None
    pad = _book(nthr * size * 4)
    return pad if pad <= j.limit(nthr) else None


def _blocked_im2col(j: GemmConv, nthr: int, simd_w: int, l2: int) -> int | None:
    """``icb * ks * osb`` the nchw forward's blocking search settles on, or None where two choices of other
    columns score within float rounding of the best (:func:`blocking_search`)."""
    found = blocking_search(j, nthr, simd_w, l2, lambda icb, ocb, osb: icb * osb)
    return None if found is None else found[0] * found[2] * j.ks


def blocking_search(j: GemmConv, nthr: int, simd_w: int, l2: int,
                    key: Callable[[int, int, int], object]) -> tuple[int, int, int] | None:
    """``(icb, ocb, osb)`` the nchw forward's blocking search settles on (``try_cfg`` / ``explore_cfg`` in
    ``init_conf``), ``l2`` in elements; None where another choice scores within float rounding of the best and
    gives the caller's buffers (``key`` of the blocks) other sizes. float32 (:func:`_blocked_im2col`) and
    bfloat16 (:mod:`.conv_gemm_bf16`) share it with their own ``simd_w`` and element size."""
    sh, sw = j.strides[1], j.strides[2]
    spatial = j.mb * j.ngroups * j.od * j.os
    tried: list[tuple[float, object]] = []
    best_eff, best = 0.0, (j.ic, 1, 1)

    def try_cfg(nthr_oc: int, ocb: int, osb: int) -> None:
        nonlocal best_eff, best
        eff, ocb, osb, icb = _score(j, nthr, simd_w, l2, nthr_oc, ocb, osb)
        tried.append((eff, key(icb, ocb, osb)))
        if eff > best_eff:
            best_eff, best = eff, (icb, ocb, osb)

    def explore(nthr_oc: int, ocb: int, osb: int) -> None:
        try_cfg(nthr_oc, ocb, osb)
        try_cfg(nthr_oc, _rnd_dn(ocb, 8), _rnd_dn(osb, 48))
        try_cfg(nthr_oc, round_up(ocb, 8), _rnd_dn(osb, 48))
        try_cfg(nthr_oc, round_up(ocb, 8), round_up(osb, simd_w))
        try_cfg(nthr_oc, round_up(ocb, 8), round_up(osb, 48))

    for nthr_oc in range(1, nthr + 1):
        max_oc, max_os = div_up(j.oc, nthr_oc), div_up(spatial, nthr // nthr_oc)
        try_cfg(nthr_oc, max_oc, max_os)
        if best == (j.ic, max_oc, max_os):
            continue
        a_k, b_k = sh * sw + j.ks, j.ks * max_oc
        icb = j.ic  # note 1
        ocb = _sat(8, max_oc, _tdiv(l2 - a_k * icb * simd_w - b_k * icb, simd_w))
        osb = _sat(simd_w, max_os, _tdiv(l2 - b_k * icb, a_k * icb + ocb))
        explore(nthr_oc, ocb, osb)
        icb_max = max(1, l2 // (2 * 8 * a_k + 2 * b_k))  # note 2
        if icb_max < j.ic:
            icb = j.ic // max(1, j.ic // icb_max)
            osb = max(1, _tdiv(l2 - 2 * b_k * icb, 2 * icb * a_k))
            ocb = l2 // 2 // osb
            if ocb > max_oc:
                ocb = max_oc
                osb = _sat(simd_w, max_os, _tdiv(l2 - b_k * icb, a_k * icb + ocb))
            elif osb > max_os:
                osb = max_os
                ocb = _sat(8, max_oc, _tdiv(l2 - a_k * icb * osb - b_k * icb, osb))
            explore(nthr_oc, ocb, osb)
        ocb, icb = max_oc, j.ic  # note 3
        osb = max(simd_w, _rnd_dn(_tdiv(l2 - b_k * icb, a_k * icb + ocb), simd_w))
        explore(nthr_oc, ocb, osb)
    chosen = key(*best)
    if any(abs(eff - best_eff) <= _TIE * best_eff and got != chosen for eff, got in tried):
        return None
    return best


def _score(j: GemmConv, nthr: int, simd_w: int, l2: int, nthr_oc: int, ocb: int,
           osb: int) -> tuple[float, int, int, int]:
    """``try_cfg``'s efficiency of one blocking, in C ``float``; returns it with the blocks it settled on."""
    sh, sw = j.strides[1], j.strides[2]
    spatial, k = j.mb * j.ngroups * j.od * j.os, j.ic * j.ks
    max_oc, min_oc = div_up(j.oc, nthr_oc), max(1, j.oc // nthr_oc)
    max_os = div_up(spatial, nthr // nthr_oc)
    ocb, osb = _sat(8, max_oc, ocb), _sat(simd_w, max_os, osb)
    min_os = div_up(spatial, div_up(nthr, nthr_oc))
    # balance2D's largest and smallest share of the threads' work
    max_thr = max_oc * max_os if j.oc % nthr_oc > nthr % nthr_oc else max(max_oc * min_os, min_oc * max_os)
    min_os = max(1, spatial // div_up(nthr, nthr_oc))
    if nthr % nthr_oc > j.oc % nthr_oc:
        min_thr = min_oc * min_os
    else:
        min_thr = min(max_oc * min_os, min_oc * (spatial // (nthr // nthr_oc)))
    thr_disb = _f32(min_thr / max_thr)
    oc_per_thr, os_per_thr = max_oc, max_os
    ocb = min(oc_per_thr, ocb)
    os_max = min(j.os, os_per_thr)
    osb = min(os_max, osb)
    max_icb = _max_icb(j, l2, ocb, osb, oc_per_thr, os_per_thr)
    cost = 20 if max_icb < 1 else 1
    max_icb = max(1, max_icb)
    icb = max(1, j.ic // div_up(j.ic, max_icb))
    nb_ic = div_up(j.ic, icb)
    kb = icb * j.ks
    kb_caligned = round_up(kb, simd_w)
    out_ops = cost * oc_per_thr * round_up(os_per_thr, simd_w) * (1 if icb == j.ic else 2 * nb_ic - 1)
    osb_caligned = round_up(osb, simd_w)
    inp_size = j.ic * round_up(os_per_thr * sh * sw, simd_w)
    inp_ops = cost * j.ks * inp_size
    koeff = _f32(osb_caligned / osb)
    half = _f32(_f32(j.ks * inp_size) * koeff)
    col_ops = int(_f32(cost * _f32(half + half)))
    if sw != 1:
        col_ops = int(_f32(col_ops * 8.0))
    wei_ops = cost * oc_per_thr * round_up(k, simd_w)
    fma = _f32(_f32(_f32(os_per_thr / simd_w) * oc_per_thr) * k)
    thr_mem_eff = _f32(fma / _f32(inp_ops + col_ops + wei_ops + out_ops))
    oc_disb = _f32(oc_per_thr / round_up(oc_per_thr, ocb))
    os_disb = _f32(os_max / round_up(os_max, osb))
    ic_disb = _f32(j.ic / round_up(j.ic, icb))
    reg_osb_disb = _f32(osb / round_up(osb, 3 * simd_w))
    gemm_eff = _f32(_f32(_f32(float(osb) * ocb) * kb) / _f32(_f32(float(oc_per_thr) * os_per_thr) * k))
    calc = _f32(_f32(_f32(osb / simd_w) * ocb) * kb)
    gemm_calc_eff = _f32(calc / _f32(osb_caligned * kb + ocb * kb_caligned + ocb * osb_caligned))
    product = _f32(thr_disb ** 8)
    for factor in (oc_disb, os_disb, ic_disb, reg_osb_disb, thr_mem_eff, _f32(math.sqrt(gemm_eff)), gemm_calc_eff):
        product = _f32(product * factor)
    return _f32(product ** _f32(1.0 / 14.5)), ocb, osb, icb


def _max_icb(j: GemmConv, l2: int, ocb: int, osb: int, oc_per_thr: int, os_per_thr: int) -> int:
    """``calc_max_icb``: the input-channel block whose columns, source rows and weights fit the L2."""
    block_out = ocb * osb
    inp_row = j.strides[1] * j.strides[2] * osb
    col_row = j.ks * osb
    if osb >= os_per_thr:
        max_icb = _tdiv(l2, inp_row + col_row)
        if ocb < oc_per_thr:
            max_icb = min(max_icb, _tdiv(l2 - block_out, col_row + j.ks * ocb))
    else:
        max_icb = _tdiv(l2 - block_out, inp_row + col_row + j.ks * oc_per_thr)
    if max_icb < j.ic:
        max_icb = _tdiv(l2 - block_out, inp_row + col_row + j.ks * oc_per_thr)
    return max_icb


def bwd_data_scratchpad(j: GemmConv, nthr: int, simd_w: int) -> int | None:
    """Bytes of the nchw backward-data scratchpad: ``nthr * im2col_sz`` floats of columns (``col2im``); None
    where it passes ``scratchpad_limit`` (oneDNN then shrinks the columns or declines)."""
    outer_work = j.ngroups * j.mb
    inner_work = div_up(j.is_, simd_w) * div_up(j.ic, simd_w)
    outer_eff = _f32(outer_work / round_up(outer_work, nthr))
    inner_eff = _f32(inner_work / round_up(inner_work, nthr))
    outer = ((j.os // nthr < 512 or j.ks < 64) and (j.mb != 1 or j.ngroups > 2)
             and (_f32(outer_eff / inner_eff) >= 1.0 or j.is_ * j.ic * j.oc // nthr < GEMM_THRLD))
    cols = (nthr if outer else 1) * j.im2col_sz * 4
    return None if cols > j.limit(nthr) else _book(cols)


def bwd_weights_scratchpad(j: GemmConv, nthr: int, simd_w: int, nspc: bool = False) -> int | None:
    """Bytes of the backward-weights scratchpad: the partial sums (``nthr * weights_d.size()`` floats), the
    columns and, on nhwc, the transposed sources; None where the columns pass ``scratchpad_limit``."""
    limit = j.limit(nthr)
    if nspc:
        estimate = nthr * (4 * j.im2col_sz + 4 * j.id * j.is_ * j.ic + 4 * j.wei_bytes)
        outer = estimate < limit and j.os // nthr < 256 and (j.mb != 1 or j.ngroups > 2)
        t = nthr if outer else 1
        total = _book(t * j.im2col_sz * 4, t * j.wei_bytes * 4, t * j.id * j.is_ * j.ic * 4)
        return total if total <= limit else None
    estimate = 4 * nthr * j.wei_bytes + 4 * nthr * j.ic * j.ks * simd_w
    outer = estimate < limit and j.os // nthr < 256 and (j.mb != 1 or j.ngroups > 2)
    t = nthr if outer else 1
    reduction = _book(t * j.wei_bytes * 4)
    cols = t * j.im2col_sz * 4
    if reduction > limit or cols > limit - reduction:
        return None
    return reduction + _book(cols)


def forward(j: GemmConv, nthr: int, simd_w: int) -> int | None:
    """Scratch of ``mkldnn_convolution`` on gemm (nchw): the scratchpad, the plain destination ideep allocates,
    then ``mkldnn_to_dense``'s copy: ``[pad, dst, -pad, out, -dst]`` (measured; no reorders)."""
    pad = forward_scratchpad(j, nthr, simd_w)
    if pad is None:
        return None
    return alloc_peak([pad, j.dst_bytes, -pad, j.dst_bytes, -j.dst_bytes]) - j.dst_bytes


def bwd_data_sequence(j: GemmConv, nthr: int, simd_w: int) -> list[int] | None:
    """ideep's backward data on gemm: a plain grad_input, the scratchpad, the dense copy (measured)."""
    pad = bwd_data_scratchpad(j, nthr, simd_w)
    if pad is None:
        return None
    return [j.src_bytes, pad, -pad, j.src_bytes, -j.src_bytes]


def bwd_weights_sequence(j: GemmConv, nthr: int, simd_w: int, nspc: bool = False) -> list[int] | None:
    """ideep's backward weights on gemm: a plain grad_weight, the scratchpad, grad_bias, then both copied out:
    ``[gw, pad, gb, -pad, gb, gw, -gw, -gb]`` (measured)."""
    pad = bwd_weights_scratchpad(j, nthr, simd_w, nspc)
    if pad is None:
        return None
    gw, gb = j.wei_bytes, j.ngroups * j.oc * 4 if j.with_bias else 0
    return [gw, pad, gb, -pad, gb, gw, -gw, -gb]


def _jcp(call: ConvCall, bias: bool = False) -> GemmConv:
    return gemm_conv(call.x_shape, call.w_shape, call.out_sizes, call.stride, call.groups, bias)


def gemm_sized(call: ConvCall, on_gemm: tuple[bool, bool], nthr: int, simd_w: int) -> bool:
    """Whether the rules here size the parts of this nchw call that run on gemm (``on_gemm``: forward and
    backward data, backward weights; :func:`.conv_select.onednn_gemm`)."""
    if call.transposed:
        return False
    j = _jcp(call)
    if "channels_last" in (call.x_layout, call.w_layout):  # nhwc: a dense one's weights' gradient only
        if not call.backward or on_gemm[0]:
            return not on_gemm[0]
        if call.grad_input and any(s > 1 for s in call.stride):  # brgconv_strided's input gradient: not sized
            return False
        return call.groups == 1 and bwd_weights_scratchpad(j, nthr, simd_w, nspc=True) is not None
    if not call.backward:
        return not on_gemm[0] or forward_scratchpad(j, nthr, simd_w) is not None
    if on_gemm[0] and not on_gemm[1]:  # the input's gradient on gemm, the weights' on a jit kernel: not sized
        return False
    if on_gemm[0] and call.grad_input and bwd_data_scratchpad(j, nthr, simd_w) is None:
        return False
    depthwise = call.groups == call.x_shape[1] == call.w_shape[0]
    if call.grad_input and call.groups == 1 and any(s > 1 for s in call.stride) and \
            strided_bwd_data(call, nthr, simd_w) is None:  # a dense one's runs brgconv_strided: sized there
        return False
    if call.grad_input and not depthwise and any(s > 1 for s in call.stride) and grouped_brgconv_strided(call) \
            and grouped_strided_data(call, nthr, simd_w) is None:
        return False  # its input's gradient runs on brgconv_strided, sized by conv_grouped_strided_bwd or not
    return not on_gemm[1] or bwd_weights_scratchpad(j, nthr, simd_w) is not None


def gemm_forward(call: ConvCall, nthr: int, simd_w: int) -> int | None:
    """Scratch of an nchw forward on gemm (:func:`forward`), or None where not sized."""
    return forward(_jcp(call), nthr, simd_w)


def gemm_backward(call: ConvCall, on_gemm: tuple[bool, bool], mask: Sequence[bool], grad_out_copy: int,
                  jit_data_peak: int | None, fresh: int, nthr: int, simd_w: int) -> int | None:
    """Scratch of ``mkldnn_convolution_backward`` with its weights' gradient (and, where ``jit_data_peak`` is
    None, its input's) on gemm, or None where not sized.

    Args:
        on_gemm: :func:`.conv_select.onednn_gemm`'s answer.
        mask: ATen's output mask (grad_input, grad_weight, grad_bias).
        grad_out_copy: bytes of grad_output made contiguous first (0 when it is).
        jit_data_peak: the peak of the copy and the input's gradient on a jit kernel
            (:func:`.conv_onednn.conv_backward` with no outputs), in bytes; None where it runs on gemm too.
        fresh: bytes of the op's outputs.
    """
    if on_gemm[0] and not on_gemm[1] and (mask[1] or mask[2]):
        return None
    j = _jcp(call, bool(mask[2]))
    seq = [grad_out_copy]
    if jit_data_peak is None and mask[0]:
        data = bwd_data_sequence(j, nthr, simd_w)
        if data is None:
            return None
        seq += data
    peak, live = max(alloc_peak(seq), jit_data_peak or 0), sum(seq)
    if jit_data_peak is not None and mask[0]:
        live += j.src_bytes  # the input's gradient, dense
    if mask[1] or mask[2]:
        weights = bwd_weights_sequence(j, nthr, simd_w)
        if weights is None:
            return None
        peak = max(peak, live + alloc_peak(weights))
    return max(peak - fresh, 0)


def _pads(call: ConvCall) -> list[tuple[int, int, int]]:
    """Per spatial dimension: the dilated kernel's extent and the start and end paddings (``init_conf``'s
    ``calculate_extended_filter_size`` / ``calculate_end_padding``; an end padding may be negative)."""
    return [((k - 1) * d + 1, p, (o - 1) * s + (k - 1) * d + 1 - (i + p)) for i, k, o, s, p, d in
            zip(call.x_shape[2:], call.w_shape[2:], call.out_sizes, call.stride, call.padding, call.dilation)]


def dw_forward_refuses(call: ConvCall, ur_w: int) -> bool:
    """Whether ``jit_uni_dw_conv_fwd_kernel::init_conf`` (jit_uni_dw_conv_kernel_utils.cpp) refuses a 2-D nchw
    depthwise forward, which then runs on gemm: a kernel outside the source, or a left padding or the right one
    before the width's tail past the width unroll ``ur_w`` (6 on AVX-512, 4 on AVX2, at most the output's width)."""
    if call.kernel_outside():
        return True
    ext, l_pad, _ = _pads(call)[-1]
    ow, iw, sw = call.out_sizes[-1], call.x_shape[-1], call.stride[-1]
    ur_w = min(ur_w, ow)
    r_pad_no_tail = max(0, (ow - ow % ur_w - 1) * sw + ext - (iw + l_pad))
    return l_pad > ur_w or r_pad_no_tail > ur_w


def gemm_nhwc_backward(call: ConvCall, mask: Sequence[bool], copies: int, data_peak: int, fresh: int, nthr: int,
                       simd_w: int) -> int | None:
    """Scratch of a channels-last ``mkldnn_convolution_backward`` whose weights' gradient runs on gemm (nhwc
    ``init_conf``: columns, partial sums, transposed sources), or None where not sized.

    Args:
        mask: ATen's output mask.
        copies: bytes of the channels-last copies made first (:func:`.conv_nhwc.nhwc_backward` with nothing to
            compute); the input's gradient follows them where ``mask[0]``.
        data_peak: the peak of those copies and the input's gradient (``nhwc_backward`` with no outputs).
        fresh: bytes of the op's outputs.

    Measured after backward data: ``[gw, pad, gb, -pad, gb, w, w, -w, w, -w, -w, -gb]``, a plain (hwio)
    grad_weight ``gw`` and the weight's dense and channels-last copies ``w``.
    """
    pad = bwd_weights_scratchpad(_jcp(call), nthr, simd_w, nspc=True)
    if pad is None:
        return None
    live = copies + (call.x_bytes if mask[0] else 0)
    w, gb = call.w_bytes, call.w_shape[0] * 4 if mask[2] else 0
    weights = [w, pad, gb, -pad, gb, w, w, -w, w, -w, -w, -gb]
    return max(max(data_peak, live + alloc_peak(weights)) - fresh, 0)


def grouped_brgconv_strided(call: ConvCall) -> bool:
    """Whether oneDNN's ``brgconv_strided`` (``jit_brgemm_conv_bwd_utils.cpp`` ``init_conf``, tried before gemm at
    ``avx512_core`` and then ``avx2``) takes a strided grouped input gradient: no dilation, and more output
    channels per group than the ``avx2`` variant's 8 (``is_grouped_small_oc``; measured)."""
    return all(d == 1 for d in call.dilation) and call.w_shape[0] // call.groups > 8
