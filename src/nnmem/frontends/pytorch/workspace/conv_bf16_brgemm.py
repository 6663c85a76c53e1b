"""The scratch of a bfloat16 channels-last forward on oneDNN's ``brg_conv_fwd:avx512_core_bf16`` (brgemm, no AMX).

ATen copies the activations and weights to channels-last, ideep reorders the weights (``OhwI16o2i``-like, output
channels padded to the chosen block) and runs the kernel into the output with its scratchpad: per-thread brgemm
batch elements and, where the reduction is split, a float32 accumulation buffer. Ported from oneDNN v3.12 (the
version torch 2.13 bundles), src/cpu/x64/jit_brgemm_conv_utils.cpp: ``init_jcp`` / ``init_conf`` (``exec_vpad``,
``exec_base``) / ``calc_blocks`` / ``iterate_ker_block`` / ``select_ic_block`` / ``estimate_brgemm_ur`` /
``get_brgemm_ur`` / ``est_eff`` / ``init_scratchpad``, and brgemm/brgemm_utils.cpp ``brgemm_blocking_vmm``. Unpadded
1x1s (``brgconv_1x1``): :mod:`.conv_bf16_brgemm_1x1`; one input channel a group (a relayout on ``exec_trans``):
:mod:`.conv_bf16_brgemm_relo`; the AMX kernels: :mod:`.conv_bf16_amx`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

import torch

from nnmem.cpu import CpuInfo
from nnmem.frontends.pytorch.workspace._common import div_up, per_core_cache, round_up
from nnmem.frontends.pytorch.workspace.conv_bf16_1x1 import l2_per_core
from nnmem.frontends.pytorch.workspace.conv_bf16_amx import Problem, _grid_coverage, _inp_size, trans_dim_koef
from nnmem.frontends.pytorch.workspace.conv_bwd_weights import as_float32 as _f32
from nnmem.frontends.pytorch.workspace.matmul import MODELLED_ISA, MODELLED_THREADS

if TYPE_CHECKING:  # conv_select imports this module for its note
    from nnmem.frontends.pytorch.workspace.conv_select import ConvCall

_P4K = 4096
_BATCH_ELEMENT = 40  # sizeof(brgemm_batch_element_t)
_SIMD, _ACC_SIMD, _VNNI, _REGS = 32, 16, 2, 32  # bf16 lanes of a zmm, f32 lanes, VNNI pair, zmm registers
_BF16, _F32 = 2, 4
_L1_K, _L2_K, _MEM_K = 1.0, 2.3, 17.0  # init_jcp's access costs (L3_k equals mem_k)


@cache
def _caches() -> tuple[int, int, int]:
    """``(L1 for brgemm_blocking, brg_blocking_t::L1, brg_blocking_t::L2)``: the whole L1, 7/8 of it, 3/4 of L2."""
    l1 = per_core_cache(1)
    return l1, l1 * 7 // 8, l2_per_core() * 3 // 4


def _saturate(lo: int, hi: int, value: int) -> int:
    return max(lo, min(hi, value))


def spatial_blocks(sp: int, start: int) -> list[int]:
    """``div_up(sp, ns)`` for ``ns = 1, 2, ...``, each value once and none above ``start``, largest first (the
    candidates ``iterate_ker_block`` / ``calc_blocks_1x1`` weigh), without walking every ``ns``."""
    blocks, ns = [], div_up(sp, max(1, start))
    while ns <= sp:
        value = div_up(sp, ns)
        blocks.append(value)
        if value == 1:
            break
        ns = div_up(sp, value - 1)  # the first ns past those giving this value
    return blocks


@cache
def vmm_blocking(m: int, n: int, k: int, max_vpad: int) -> tuple[int, int] | None:
    """``brgemm_blocking_vmm`` for bf16 on zmm without post-ops: ``(bd_block, adj_ld_block2)``, or None where no
    broadcast block is as large as the virtual padding."""
    ldb = n // _ACC_SIMD
    adj = max_bcast = min_bcast = 0
    for try_ld_block2 in range(4, 0, -1):
        ldb2, ldb2_tail = ldb // try_ld_block2, ldb % try_ld_block2
        adj = max(1, try_ld_block2 if ldb2 else ldb2_tail)
        max_bcast = min((_REGS - adj - 1) // adj, _REGS // adj)  # microkernel (one broadcast register), stores
        min_bcast = m % max_bcast or max_bcast
        if min_bcast >= max_vpad:
            break
    if min_bcast < max_vpad:
        return None
    l1 = _caches()[0]
    best_eff, bd_block = 0.0, max_bcast
    for bd in range(max_bcast, max(1, max_vpad) - 1, -1):
        disb = 0.0 if m <= 0 else _f32(m / round_up(m, bd))
        micro = _f32(adj * bd / ((adj + bd) * max_bcast))
        eff = _f32(disb * micro)
        if _BF16 * bd * k <= l1 and eff > best_eff:
            bd_block, best_eff = bd, eff
    return bd_block, adj


@dataclass(frozen=True, slots=True)
class Blocking:
    """One candidate ``iterate_ker_block`` weighs (one output row a block; ``exec_vpad`` takes the kernel's whole
    width)."""

    oc_block: int
    kd_block: int
    kh_block: int
    ow_block: int
    ic_block: int
    use_buffer: bool
    ur: int
    adj_ocblock: int
    batch: int  # gemm_batch_size
    kw_block: int
    eff: float = 0.0
    od_block: int = 1  # exec_trans (a relayout, :mod:`.conv_bf16_brgemm_relo`): output planes and rows a block,
    oh_block: int = 1
    os_blocking: bool = False  # the spatial block spanning ``oh_block`` rows,
    brg_m: int = 0  # and brgemm's M with the skipped columns, rounded to 16


def _estimate_ur(oc_block: int) -> int:
    return {64: 6, 48: 9, 32: 14}.get(oc_block, 28)


def _ic_block(p: Problem, oc_block: int, kdhw_block: tuple[int, int, int], sp_block: int, ur: int) -> int:
    """``select_ic_block`` off AMX, not ``exec_trans`` (``ur``: the last ``estimate_brgemm_ur``'s, 0 before)."""
    kd_block, kh_block, kw_block = kdhw_block
    _, l1, l2 = _caches()
    nb_simd = div_up(p.ic, _SIMD)
    max_blocks = min(5 * _SIMD, nb_simd)
    est_ur = min(sp_block, _estimate_ur(oc_block)) if sp_block > 0 else _estimate_ur(oc_block)
    inp_ur = _inp_size(p.iw, est_ur, kw_block, p.sw, p.dw)
    if kw_block > 1:  # fit the source into L1
        max_blocks = _saturate(1, max_blocks, l1 // (inp_ur * _BF16 * _SIMD))
    wei_per_ic = kd_block * kh_block * kw_block * oc_block * _BF16
    inp_per_ic = kd_block * kh_block * inp_ur * _BF16
    free = (l2 - ur * oc_block * _BF16) % 2 ** 32  # unsigned arithmetic
    max_blocks = _saturate(1, max_blocks, free // ((wei_per_ic + inp_per_ic) * _SIMD))
    blocks = 1
    for nb_icb in range(min(max_blocks, nb_simd), 0, -1):
        if _f32(nb_simd / round_up(nb_simd, nb_icb)) >= 0.5:
            blocks = nb_icb
            break
    return min(p.ic, blocks * _SIMD)


def _ur(p: Problem, oc_block: int, ic_block: int, ow_block: int, vpad: int) -> tuple[int, int, bool] | None:
    """``estimate_brgemm_ur``: ``(ur, adj_ocblock, whether the row tail's descriptor passes)``; None where the main
    descriptor fails (``ur`` unchanged). ``vpad``: the virtual padding (``exec_vpad``; 0 on ``exec_base``)."""
    m, m_tail = (ow_block if p.ow >= ow_block else 0), p.ow % ow_block
    n = oc_block if p.oc >= oc_block else p.oc % oc_block
    k = ic_block if p.ic >= ic_block else p.ic % ic_block
    main = vmm_blocking(m or m_tail, n, k, vpad)
    if main is None:
        return None
    tail_ok = not (vpad > 0 and m > 0 and m_tail > 0) or vmm_blocking(m_tail, n, k, vpad) is not None
    return main[0], main[1], tail_ok


def _io_k(sizes: tuple[int, int, int], n: float, pk: float, broadcast: bool, use_buffer: bool) -> float:
    """``brg_blocking_t::io_k``: the relative cost of one access to an array repeated ``n`` times."""
    if n < 1:
        return 0.0
    if n == 1:
        return pk
    _, l1, l2 = _caches()
    src, wei, dst = sizes
    amount = (src + wei + dst) * _BF16 + (dst * _F32 if use_buffer else 0)
    if broadcast:
        k = _L1_K if src * _BF16 < l1 else _L2_K if amount < l2 else _MEM_K
    else:
        k = _L2_K if amount < l2 else _MEM_K
    return (pk + k * (n - 1)) / n


def _squeeze(eff: float, koeff: float) -> float:
    k = 1.0 / koeff
    return (k - 1 + eff) / k if k > 1.0 else eff * koeff


def est_eff(p: Problem, b: Blocking, ndhwgc: bool) -> float:
    """``brg_blocking_t::est_eff`` off AMX (``loop_ndhwgc`` or ``loop_ngcdhw``; output-space blocking: the spatial
    amount is ``od * oh * ow`` in blocks of ``oh_block`` rows)."""
    nb_oc, nb_kd, nb_kh, nb_ic = div_up(p.oc, b.oc_block), div_up(p.kd, b.kd_block), div_up(p.kh, b.kh_block), \
        div_up(p.ic, b.ic_block)
    sp = p.od * p.oh * p.ow if b.os_blocking else p.ow
    spb = b.ow_block * b.oh_block if b.os_blocking else b.ow_block
    ur, ocb, icb, kw, kwb = b.ur, b.oc_block, b.ic_block, p.kw, b.kw_block
    nb_kw = div_up(kw, kwb)
    nb_sp, nb_od, nb_oh = div_up(sp, spb), div_up(p.od, b.od_block), div_up(p.oh, b.oh_block)
    micro = (b.adj_ocblock * ur) / ((b.adj_ocblock + ur) * _REGS)
    ur_eff = spb / round_up(spb, ur)
    brgemm_eff = _squeeze(ur * (2.0 - min(1.9, ur / spb)) / 64, 0.5)
    sp_amount = nb_od * nb_oh * nb_sp
    work = sp_amount * p.mb * p.g * nb_oc
    sp_eff, oc_block_eff = sp / round_up(sp, spb), p.oc / round_up(p.oc, ocb)
    job = div_up(work, p.nthr)  # balance211: thread 0 takes div_up
    max_job = _grid_coverage(job, p.oc, p.g, ocb, sp, spb) if ndhwgc else \
        _grid_coverage(job, sp, nb_od * nb_oh, spb, p.oc, ocb)
    job_eff = 1.0 if max_job == 0 else p.mb * p.od * p.oh * p.ow * p.g * p.oc / (max_job * p.nthr)

    def rnd_inp_simd(out_w: int, ker_w: int, vic: int) -> int:
        vsp = _inp_size(p.iw, out_w, ker_w, p.sw, p.dw)
        return round_up(vsp * vic, _SIMD) if p.sw == 1 and vic >= p.ic else vsp * round_up(vic, _SIMD)

    obs = ocb * icb
    kb = b.kd_block * b.kh_block
    src_is = rnd_inp_simd(ur, kwb, icb)
    wei_is = kb * kwb * obs
    loops: list[tuple[tuple[int, int, int], tuple[float, float, float], float]] = [
        ((_inp_size(p.iw, ur, kwb, p.sw, p.dw) * _SIMD, ocb, 0), (1, 1, 1), _ACC_SIMD),  # brgemm: by simd_w
        ((src_is, obs, 0), (1, 1, 1), kwb),  # by kw in kw_block
        ((src_is, kwb * obs, 0), (1, 1, 1), 1),  # by batch
        ((kb * src_is, wei_is, ur * ocb), (1, div_up(spb, ur), 1), 1),  # by ur in sp_block
        ((kb * rnd_inp_simd(spb, kwb, icb), wei_is, spb * ocb), (1, 1, nb_kd * nb_kh * nb_kw), 1),  # by k blocks
        ((p.kd * p.kh * rnd_inp_simd(spb, kw, icb), p.kd * p.kh * kw * obs, spb * ocb), (1, 1, nb_ic), 1),
    ]
    nb_oc_thr = min(nb_oc, div_up(job, 1 if ndhwgc else sp_amount))
    nsimd_oc_thr = div_up(min(p.oc, nb_oc_thr * ocb), _SIMD)
    dim_sp = p.g * nb_oc if ndhwgc else 1
    nb_sp_thr = min(nb_sp, div_up(job, dim_sp))
    sp_thr = min(sp, nb_sp_thr * spb)
    nb_oh_thr = oh_thr = nb_od_thr = od_thr = 1
    if not b.os_blocking:
        nb_oh_thr = min(nb_oh, div_up(job, nb_sp * dim_sp))
        oh_thr = min(p.oh, nb_oh_thr * b.oh_block)
        nb_od_thr = min(nb_od, div_up(job, nb_oh * nb_sp * dim_sp))
        od_thr = min(p.od, nb_od_thr * b.od_block)
    taps = p.kd * p.kh * kw
    src_is = p.kd * p.kh * rnd_inp_simd(spb, kw, p.ic)
    wei_op = taps * b.adj_ocblock * p.ic
    if ndhwgc:  # harness: by oc_block
        loops.append(((src_is, taps * ocb * p.ic, spb * ocb), (nb_oc_thr, 1, 1), 1))
        wei_op = taps * nsimd_oc_thr * p.ic
    rnd_oc_for_sp = _SIMD * (nsimd_oc_thr if ndhwgc else b.adj_ocblock)
    loops.append(((src_is, wei_op * _SIMD, spb * rnd_oc_for_sp), (1, nb_sp_thr, 1), 1))  # by sp blocks
    src_is = p.kd * p.kh * rnd_inp_simd(sp_thr, kw, p.ic)
    loops.append(((b.oh_block * src_is, wei_op * _SIMD, sp_thr * rnd_oc_for_sp), (1, nb_oh_thr, 1), 1))  # oh blocks
    loops.append(((b.od_block * oh_thr * src_is, wei_op * _SIMD, oh_thr * sp_thr * rnd_oc_for_sp), (1, nb_od_thr, 1),
                  1))  # by od blocks
    if not ndhwgc:  # harness: by oc_block
        loops.append(((od_thr * oh_thr * src_is, taps * ocb * p.ic, ocb * od_thr * oh_thr * sp_thr),
                      (nb_oc_thr, 1, 1), 1))
    mb_thr = min(p.mb, div_up(job, sp_amount * p.g * nb_oc))
    loops.append(((od_thr * oh_thr * src_is, taps * nsimd_oc_thr * _SIMD * p.ic,
                   od_thr * oh_thr * sp_thr * nsimd_oc_thr * _SIMD), (1, mb_thr, 1), 1))  # by mb
    src_op = mb_thr * od_thr * oh_thr * sp_thr * taps * p.ic
    dst_op = mb_thr * od_thr * oh_thr * sp_thr * nsimd_oc_thr
    wei_op = taps * nsimd_oc_thr * p.ic
    loops.append(((src_op, wei_op * _SIMD, dst_op * _SIMD), (1, 1, 1), 1))  # bench_iterations
    src_k = dst_k = wei_k = _MEM_K
    src_rp = dst_rp = wei_rp = 1.0
    for sizes, (src_n, wei_n, dst_n), overlap in reversed(loops):
        src_k = _io_k(sizes, float(src_n * overlap), src_k, True, b.use_buffer)
        dst_k = _io_k(sizes, float(dst_n), dst_k, False, b.use_buffer)
        wei_k = _io_k(sizes, float(wei_n), wei_k, False, b.use_buffer)
        src_rp, dst_rp, wei_rp = src_rp * src_n, dst_rp * dst_n, wei_rp * wei_n
    cost = (src_k * src_op * src_rp + dst_k * dst_op * dst_rp + wei_k * wei_op * wei_rp
            + 1000.0 * job * nb_ic * nb_kd * nb_kh * nb_kw)
    batch_eff = min(1.0, _caches()[2] / (_BATCH_ELEMENT * b.batch))
    cache_eff = p.mb * p.od * p.oh * sp * p.ic * p.oc / (p.nthr * cost)
    return oc_block_eff * micro * sp_eff * job_eff * ur_eff * cache_eff * brgemm_eff * batch_eff


def _iterate_ker_block(p: Problem, oc_block: int, kd_block: int, kh_block: int, best: Blocking | None,
                       ur: int, vpad: bool) -> tuple[Blocking | None, int]:
    """``iterate_ker_block`` on ``exec_vpad`` or ``exec_base``: each output-row block up to the threads' share, the
    best kept (the first on a tie); returns it and the last ``ur`` (``select_ic_block`` reads it next)."""
    l2 = _caches()[2]
    if vpad:
        kw_block, pads = p.kw, (kd_block, kh_block, p.kw)
    else:  # the padded kernel blocks as init_conf writes them
        kw_block = p.kw if p.ic * oc_block * _BF16 * p.kw < l2 else 1
        pads = (p.kd if kh_block >= p.kd else 1, p.kh if kw_block >= p.kh else 1, p.kw)
    batch = max(kd_block * kh_block * kw_block, math.prod(pads))
    split = (kd_block, kh_block, kw_block, *pads) != (p.kd, p.kh, p.kw) * 2 or (not vpad and p.iwp != p.iw)
    nb_oc = div_up(p.oc, oc_block)
    max_ow_block_thr = _saturate(1, p.ow, math.ceil(p.mb * p.g * nb_oc * p.od * p.oh * p.ow
                                                    / (_f32(0.9) * p.nthr)))
    for spb in spatial_blocks(p.ow, min(max_ow_block_thr, p.ow)):
        ic_block = _ic_block(p, oc_block, (kd_block, kh_block, kw_block), spb, ur)
        est = _ur(p, oc_block, ic_block, spb, max(p.l_pad, p.r_pad) if vpad else 0)
        if est is None:
            continue
        ur = est[0]
        if not est[2]:
            continue
        cand = Blocking(oc_block, kd_block, kh_block, spb, ic_block, split or ic_block < p.ic, est[0], est[1],
                        batch, kw_block)
        cand = dataclasses.replace(cand, eff=est_eff(p, cand, _ndhwgc(p)))
        if best is None or cand.eff > best.eff or best.eff == 0:
            best = cand
    return best, ur


def _ndhwgc(p: Problem) -> bool:
    """``init_conf``'s loop order (AVX-512): ``loop_ngcdhw`` where the source is smaller than the weights."""
    return not p.id * p.ih * p.iw * p.ic < p.oc * p.kd * p.kh * p.kw * p.ic


def _descriptors_ok(p: Problem, b: Blocking, vpad: bool) -> bool:
    """``get_brgemm_ur``: a brgemm descriptor for every M (block, tail) and N (block, tail) on ``exec_vpad`` (on
    ``exec_base`` no virtual padding, and every descriptor passes)."""
    m, m_tail = b.ow_block, p.ow % b.ow_block
    n, n_tail = (b.oc_block if p.oc >= b.oc_block else 0), p.oc % b.oc_block
    k = b.ic_block if p.ic >= b.ic_block else p.ic % b.ic_block
    pad = max(p.l_pad, p.r_pad) if vpad else 0
    return all(vmm_blocking(vm, vn, k, pad) is not None for vm in (m, m_tail) if vm for vn in (n, n_tail) if vn)


def select_blocking(p: Problem, vpad: bool) -> Blocking | None:
    """``try_exec_type`` on ``exec_vpad`` or ``exec_base``: the most efficient output-channel block (up to four
    16-lane blocks, less those ``fast_check_oc_block`` rejects) with its ``calc_blocks`` kernel blocking (whole or
    one-deep kernel depth and height); None where none passes."""
    best: Blocking | None = None
    rnd_oc = round_up(p.oc, _ACC_SIMD)
    for ocb in range(min(div_up(p.oc, _ACC_SIMD), 4), 0, -1):
        block = ocb * _ACC_SIMD
        if block == 64 and not (rnd_oc % 64 == 0 and rnd_oc * _BF16 < 192 * 4):
            continue
        if block == 48 and not (rnd_oc % 48 == 0 and rnd_oc * _BF16 <= 384 * 4
                                and p.id * p.ih * p.iw > 81 * p.sd * p.sh * p.sw):
            continue
        cand: Blocking | None = None
        ur = 0
        for kd_block in dict.fromkeys((p.kd, 1)):
            for kh_block in dict.fromkeys((p.kh, 1)):
                cand, ur = _iterate_ker_block(p, block, kd_block, kh_block, cand, ur, vpad)
        if cand is None or not _descriptors_ok(p, cand, vpad):
            continue
        if best is None or cand.eff > best.eff:
            best = cand
    return best


def scratchpad(p: Problem, b: Blocking) -> int:
    """``init_scratchpad`` on ``exec_vpad`` / ``exec_base``: the batch elements and, for a split reduction, the float32
    accumulation buffer (``LDC * M``: the output-channel block by the row block), per thread, booked page-aligned."""
    batch = div_up(round_up(b.batch * _BATCH_ELEMENT, _P4K), _BATCH_ELEMENT) * _BATCH_ELEMENT
    pad = p.nthr * batch + _P4K
    if b.use_buffer:
        pad += p.nthr * b.oc_block * b.ow_block * _F32 + _P4K
    return pad


def problem(x_shape: tuple[int, ...], w_shape: tuple[int, ...], stride: tuple[int, ...],
            padding: tuple[int, ...], nthr: int, dilation: tuple[int, ...], groups: int) -> Problem | None:
    """The problem (``trans_dim_koef`` folded) of a 2-D or 3-D channels-last bfloat16 forward that
    ``brg_conv_fwd:avx512_core_bf16`` runs (not an unpadded 1x1); None for any other."""
    (mb, _, *spatial), (oc, ic, *kernel) = x_shape, w_shape
    oc //= groups
    three_d = len(spatial) == 3
    (id_, ih, iw), (kd, kh, kw) = (spatial, kernel) if three_d else ((1, *spatial), (1, *kernel))
    (sd, sh, sw), (fp, tp, lp), (dd, dh, dw) = ((stride, padding, dilation) if three_d else
                                                ((1, *stride), (0, *padding), (1, *dilation)))
    od, oh, ow = ((i + 2 * pd - d * (k - 1) - 1) // s + 1
                  for i, pd, k, s, d in zip((id_, ih, iw), (fp, tp, lp), (kd, kh, kw), (sd, sh, sw), (dd, dh, dw)))
    if od < 1 or oh < 1 or ow < 1 or (kd * kh * kw == 1 and not any(padding)):
        return None  # an unpadded 1x1: init_1x1_conf (brgconv_1x1, :func:`scratch_1x1`)
    if groups > 1 and (ic == oc == 1 or (ic <= _ACC_SIMD and ic % 4 == 0 and oc % 4 == 0)):
        return None  # depthwise, grouped with few channels: init_jcp refuses (another kernel)
    if ic < _VNNI and three_d and id_ == 1 and kw > 1 and dw == 1:
        return None  # try_relo_wi on a 3-D one (not followed)
    if od == 1 and kw == 1 and ow == 1:
        return None  # exec_trans with output-space blocking
    return trans_dim_koef(Problem(mb, ic, oc, ih, iw, oh, ow, kh, kw, sh, sw, tp, lp, nthr, dh=dh, dw=dw, g=groups,
                                  id=id_, od=od, kd=kd, sd=sd, f_pad=fp, dd=dd, three_d=three_d))


@cache
def forward_scratch(x_shape: tuple[int, ...], w_shape: tuple[int, ...], stride: tuple[int, ...],
                    padding: tuple[int, ...], nthr: int, dilation: tuple[int, ...], groups: int,
                    nhwc_copies: int) -> int | None:
    """Scratch bytes of ideep's channels-last bfloat16 forward on ``brg_conv_fwd:avx512_core_bf16`` beyond its
    output, or None where not sized here: ``[copies, out, scratchpad, weights, -weights, -scratchpad, -copies]``
    (``nhwc_copies``: the bytes of ATen's ``contiguous(channels_last)`` copies of input and weight)."""
    ocg, icg = w_shape[0] // groups, w_shape[1]
    if math.prod(w_shape[2:]) == 1 and not any(padding):  # brgconv_1x1
        return _one_by_one(x_shape, w_shape, stride, nthr, groups, nhwc_copies)
    p = problem(x_shape, w_shape, stride, padding, nthr, dilation, groups)
    if p is None:
        return None
    if p.ic < _VNNI:
        from nnmem.frontends.pytorch.workspace.conv_bf16_brgemm_relo import relo_problem, relo_scratch  # imports this

        relo = relo_problem(p)
        if relo is not None:  # exec_trans with a relaid source and weights
            out = x_shape[0] * w_shape[0] * p.od * p.oh * p.ow * _BF16
            sized = relo_scratch(relo, math.prod(x_shape) * _BF16, out)
            return None if sized is None else nhwc_copies + sum(sized)
    b = None
    if div_up(max(0, p.l_pad), p.sw) < p.kw and div_up(max(0, p.r_pad), p.sw) < p.kw:
        b = select_blocking(p, True)
        if b is not None and (b.ow_block - 1) * p.sw + 1 > p.iw:
            b = None  # a row block wider than the source: exec_base
    b = b or select_blocking(p, False)
    if b is None:
        return None
    wei = groups * round_up(ocg, b.oc_block) * round_up(icg, _VNNI) * math.prod(w_shape[2:]) * _BF16
    return nhwc_copies + scratchpad(p, b) + wei


def brgemm_forward(call: ConvCall, info: CpuInfo) -> int | None:
    """Scratch bytes of a channels-last bfloat16 forward on ``brg_conv_fwd:avx512_core_bf16``
    or ``brgconv_1x1:avx512_core_bf16`` (:func:`forward_scratch`), or None where no rule here sizes it: 2-D or
    3-D, dense or grouped, on ``avx512_core_bf16`` at 1-4 threads, a shape the port follows (not depthwise, not a
    grouped one with few channels, not a 3-D relayout)."""
    from nnmem.frontends.pytorch.workspace.conv_select import _amx_nhwc_copies, onednn_nhwc  # imports this module

    if call.dtype != torch.bfloat16 or call.backward or call.transposed or call.one_d:
        return None
    if len(call.x_shape) not in (4, 5) or not onednn_nhwc(call) or "strided" in (call.x_layout, call.w_layout):
        return None
    if info.isa != MODELLED_ISA or torch.get_num_threads() not in MODELLED_THREADS:
        return None
    return forward_scratch(call.x_shape, call.w_shape, call.stride, call.padding, torch.get_num_threads(),
                           call.dilation, call.groups, _amx_nhwc_copies(call))


def _one_by_one(x_shape: tuple[int, ...], w_shape: tuple[int, ...], stride: tuple[int, ...], nthr: int,
                groups: int, nhwc_copies: int) -> int | None:
    """:func:`forward_scratch` of an unpadded 1x1 (``brgconv_1x1``, :mod:`.conv_bf16_brgemm_1x1`); None where
    ``init_jcp`` refuses it (depthwise, a grouped one with few channels)."""
    from nnmem.frontends.pytorch.workspace.conv_bf16_brgemm_1x1 import scratch_1x1  # imports this module

    (mb, _, *spatial), ocg, icg = x_shape, w_shape[0] // groups, w_shape[1]
    if groups > 1 and (icg == ocg == 1 or (icg <= _ACC_SIMD and icg % 4 == 0 and ocg % 4 == 0)):
        return None
    src = tuple(spatial) if len(spatial) == 3 else (1, *spatial)
    strides = tuple(stride) if len(stride) == 3 else (1, *stride)
    out = tuple((i - 1) // s + 1 for i, s in zip(src, strides))
    pad, oc_block = scratch_1x1(mb, icg, ocg, groups, out, src, strides, nthr)
    return nhwc_copies + pad + groups * round_up(ocg, oc_block) * round_up(icg, _VNNI) * _BF16
