"""The blocking of oneDNN's ``brgconv_strided:avx2``: a dense strided float32 input gradient on an AVX2 CPU
(8-float vectors, 16 ymm registers), 1-D to 3-D, undilated.

For float32 the scratchpad hardly depends on the blocking (:mod:`.conv_brgemm_bwd`), but the weights' layout does
(``pick_tags``: ``Ihwo{ic_block}i``, the input channels padded to the chosen block of 8 to 32), and so do an uneven
width's output buffer (``iw_block``), a large kernel's batch (``kd_block`` / ``kh_block``) and the block mask.
Ported from oneDNN 3.12 (the version torch 2.13 bundles), src/cpu/x64/jit_brgemm_conv_bwd_utils.cpp ``init_jcp`` /
``init_conf``'s ``try_exec_type`` / ``brg_blocking_t`` (``calc_blocks``, ``iterate_ker_block``, ``est_eff``,
``est_eff_1x1``, ``estimate_brgemm_ur``) and brgemm/brgemm_utils.cpp ``brgemm_blocking_vmm`` at ``avx2``, in the
single precision the C++ computes its efficiencies in (ties and near-ties pick the same block).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np

from nnmem.frontends.pytorch.workspace._common import div_up, per_core_cache, round_up

F = np.float32
_SIMD, _REGS, _DSZ = 8, 16, 4  # float32 lanes of a ymm, isa_num_vregs(avx2), sizeof(float)
_L1_K, _L2_K, _L3_K, _MEM_K = F(1), F(3), F(15), F(15)  # brg_blocking_t's access costs
_MIN_EFF = F(0.00001)  # iterate_ker_block's floor for float32
_Loop = tuple[tuple[int, float, float], tuple[int, float, float], tuple[int, float, float]]  # src, dst, wei


@dataclass
class Avx2Blocking:
    """The ``brg_blocking_t`` fields the blocking reads and writes (a 2-D problem has depth 1, a 1-D one height 1
    too); ``ic_block``, ``iw_block``, ``kd_block`` / ``kh_block`` and ``nb_*`` are the chosen blocking's."""

    mb: int
    ic: int
    oc: int
    id: int
    ih: int
    iw: int
    kd: int
    kh: int
    kw: int
    sd: int
    sh: int
    sw: int
    nthr: int
    is_1x1: bool = False
    uneven: bool = False
    ngcdhw: bool = False
    odp: int = 0
    ohp: int = 0
    owp: int = 0
    ow: int = 0
    ic_block: int = 0
    nb_ic: int = 0
    kd_block: int = 0
    kh_block: int = 0
    id_block: int = 0
    ih_block: int = 0
    iw_block: int = -1
    sp: int = 0
    sp_block: int = -1
    nb_id: int = 0
    nb_ih: int = 0
    nb_sp: int = 0
    nb_kd: int = 0
    nb_kh: int = 0
    ur: int = 0
    eff: F = F(0)


def _bd_block(m: int, n: int, k: int) -> int:
    """``brgemm_blocking_vmm`` at ``avx2`` for float32 without post-ops or virtual padding: the broadcast block
    (``bd_block``, the convolution's ``ur``) of an ``m`` x ``n`` x ``k`` brgemm."""
    ldb = n // _SIMD
    adj = max(1, 4 if ldb // 4 else ldb % 4)  # calculate_ldb_params(4): the first try fits (no vpad)
    one_load = adj == 4  # few_regs: n_bcast_1_load
    micro = (_REGS - (1 if one_load else adj) - (0 if one_load else 1)) // (adj + one_load)
    max_bcast = min(micro, _REGS // adj)
    l1, best, bd_block = F(per_core_cache(1)), F(0), max_bcast
    for bd in range(max_bcast, 0, -1):
        disb = F(0) if m <= 0 else F(m) / F(round_up(m, bd))
        eff = disb * ((F(adj) * F(bd)) / F((adj + bd) * max_bcast))
        if F(_DSZ) * F(bd) * F(k) <= l1 and eff > best:
            bd_block, best = bd, eff
    return bd_block


def _estimate_ur(s: Avx2Blocking) -> None:
    """``estimate_brgemm_ur``: ``ur`` of the brgemm over ``ceil(iw_block / stride_w)`` rows (``M`` or ``M_tail``),
    ``ic_block`` columns (the channels where fewer) and the output channels (``oc_block = oc`` for float32)."""
    adj_sp = div_up(s.iw_block, s.sw)
    m = s.sp_block if adj_sp >= s.sp_block else adj_sp % s.sp_block
    s.ur = _bd_block(m, s.ic_block if s.ic >= s.ic_block else s.ic % s.ic_block, s.oc)


def _update_blocks(s: Avx2Blocking) -> None:
    s.nb_id, s.nb_ih, s.nb_ic = div_up(s.id, s.id_block), div_up(s.ih, s.ih_block), div_up(s.ic, s.ic_block)
    s.nb_kd, s.nb_kh = div_up(s.kd, s.kd_block), div_up(s.kh, s.kh_block)
    s.sp = round_up(s.iw, s.sw) if s.uneven else s.iw
    s.sp_block = s.iw_block
    s.nb_sp = div_up(s.iw, s.iw_block)


def _inp_w(s: Avx2Blocking, out_w: int, ker_w: int) -> int:
    """``get_inp_size(ow, out_w, ker_w, stride_w, dilate_w)``."""
    return min(s.ow, (out_w - 1) * min(ker_w, s.sw) + ker_w)


def _rnd_inp_simd(s: Avx2Blocking, out_w: int, ker_w: int, voc: int) -> int:
    vsp = _inp_w(s, out_w, ker_w)
    return round_up(vsp * voc, _SIMD) if s.sw == 1 and voc >= s.oc else vsp * round_up(voc, _SIMD)


def _io_k(sizes: tuple[int, int, int], n: F, pk: F, broadcast: bool, shared: bool) -> F:
    """``brg_blocking_t::io_k`` (``L1`` / ``L2``: ``get_per_core_cache_size``, as the backward's ``init_jcp`` sets
    them)."""
    if n < 1:
        return F(0)
    if n == 1:
        return pk
    src, wei, dst = sizes
    amount = (src + wei + dst) * _DSZ
    far = _L2_K if amount < per_core_cache(2) else _L3_K if shared else _MEM_K
    k = _L1_K if broadcast and src * _DSZ < per_core_cache(1) else far
    return (pk + k * (n - F(1))) / n


def _balance211(n: int, team: int, tid: int) -> tuple[int, int]:
    if team <= 1 or n == 0:
        return 0, n
    n1 = div_up(n, team)
    t1 = n - (n1 - 1) * team
    start = tid * n1 if tid <= t1 else t1 * n1 + (tid - t1) * (n1 - 1)
    return start, start + (n1 if tid < t1 else n1 - 1)


def _job_eff(s: Avx2Blocking, work: int) -> F:
    """``est_eff``'s per-thread balance where a thread has fewer jobs than there are threads (its iterator steps
    twice a job, as the C++ does)."""
    dims = [s.mb, s.id, s.ih, s.nb_sp, 1, s.nb_ic]  # n, idp, ihp, spb, g, icb (ndhwgc)
    order = [0, 4, 5, 1, 2, 3] if s.ngcdhw else [0, 1, 2, 3, 4, 5]
    jobs = []
    for ithr in range(s.nthr):
        if ithr >= work:
            jobs.append(0)
            continue
        start, end = _balance211(work, s.nthr, ithr)
        idx, rem = [0] * 6, start
        for d in reversed(order):
            idx[d], rem = rem % dims[d], rem // dims[d]
        job = 0
        for _ in range(start, end):
            job += min(s.sp - idx[3] * s.sp_block, s.sp_block) * min(s.ic - idx[5] * s.ic_block, s.ic_block)
            for steps in ([0, 1, 2, 3, 4, 5], order):  # nd_iterator_step twice
                for d in reversed(steps):
                    idx[d] += 1
                    if idx[d] < dims[d]:
                        break
                    idx[d] = 0
        jobs.append(job)
    top = max(jobs)
    return F(1) if top == 0 else F(sum(jobs)) / F(top * s.nthr)


def _traffic(loops: list[_Loop], ops: tuple[int, int, int], wei_shared: bool, src_shared: bool) -> F:
    """``est_eff``'s memory cost: each array's access cost through the loops (innermost first in ``loops``),
    times its operations and repeats."""
    src_k = dst_k = wei_k = _MEM_K
    src_rp = dst_rp = wei_rp = F(1)
    for src, dst, wei in reversed(loops):
        sizes = (src[0], wei[0], dst[0])
        src_k = _io_k(sizes, F(src[1]) * F(src[2]), src_k, True, src_shared)
        dst_k = _io_k(sizes, F(dst[1]) * F(dst[2]), dst_k, False, False)
        wei_k = _io_k(sizes, F(wei[1]) * F(wei[2]), wei_k, False, wei_shared)
        src_rp, dst_rp, wei_rp = src_rp * F(src[1]), dst_rp * F(dst[1]), wei_rp * F(wei[1])
    src_op, dst_op, wei_op = ops
    return src_k * (F(src_op) * src_rp) + dst_k * (F(dst_op) * dst_rp) + wei_k * (F(wei_op) * wei_rp)


def _common_effs(s: Avx2Blocking) -> tuple[F, F, int, int, int, int, int, int, int, int, int]:
    """The efficiencies and per-thread extents ``est_eff`` and ``est_eff_1x1`` share: (the product of the channel,
    microkernel, width and job efficiencies, ``brgemm_eff``, ``job``, ``nb_ic_thr``, ``nsimd_ic_thr``, ``nb_sp_thr``,
    ``sp_thr``, ``nb_ih_thr``, ``ih_thr``, ``nb_id_thr``, ``id_thr``)."""
    icblock, ur, spb = s.ic_block // _SIMD, s.ur, s.sp_block
    micro = (F(icblock) * F(ur)) / F((ur + icblock) * _REGS)
    brgemm_eff = (F(1) + F(ur) * (F(2) - min(F(1.9), F(ur) / F(spb))) / F(64)) / F(2)  # squeeze_val(eff, 0.5)
    sp_amount = s.nb_id * s.nb_ih * s.nb_sp
    work = s.mb * s.nb_ic * sp_amount
    job = div_up(work, s.nthr)
    job_eff = _job_eff(s, work) if job < s.nthr else F(work) / F(round_up(work, s.nthr))
    effs = F(s.ic) / F(round_up(s.ic, s.ic_block)) * micro * (F(s.sp) / F(round_up(s.sp, spb))) * job_eff \
        * (F(spb) / F(round_up(spb, ur)))
    nb_ic_thr = min(s.nb_ic, div_up(job, sp_amount if s.ngcdhw else 1))
    nsimd_ic_thr = div_up(min(s.ic, nb_ic_thr * s.ic_block), _SIMD)
    dim_sp = 1 if s.ngcdhw else s.nb_ic
    nb_sp_thr = min(s.nb_sp, div_up(job, dim_sp))
    nb_ih_thr = min(s.nb_ih, div_up(job, s.nb_sp * dim_sp))
    nb_id_thr = min(s.nb_id, div_up(job, s.nb_ih * s.nb_sp * dim_sp))
    return (effs, brgemm_eff, job, nb_ic_thr, nsimd_ic_thr, nb_sp_thr, min(s.sp, nb_sp_thr * spb), nb_ih_thr,
            min(s.ih, nb_ih_thr * s.ih_block), nb_id_thr, min(s.id, nb_id_thr * s.id_block))


def _est_eff(s: Avx2Blocking) -> F:
    """``brg_blocking_t::est_eff``: the blocking's efficiency, from its loops' memory traffic."""
    if s.is_1x1:
        return _est_eff_1x1(s)
    effs, brgemm_eff, job, nb_ic_thr, nsimd, nb_sp_thr, sp_thr, nb_ih_thr, ih_thr, nb_id_thr, id_thr = _common_effs(s)
    ur, spb, icb, kw, taps = s.ur, s.sp_block, s.ic_block, s.kw, s.kd * s.kh * s.kw
    icb_size, kdb, khb = icb * s.oc, s.kd_block, s.kh_block
    loops: list[_Loop] = [
        ((_inp_w(s, ur, kw) * _SIMD, 1, _SIMD), (0, 1, 1), (icb, 1, 1)),
        ((_rnd_inp_simd(s, ur, kw, s.oc), 1, kw), (0, 1, 1), (icb_size, 1, 1)),
        ((_rnd_inp_simd(s, ur, kw, s.oc), 1, 1), (0, 1, 1), (kw * icb_size, 1, 1)),
        ((kdb * khb * _rnd_inp_simd(s, ur, kw, s.oc), 1, 1), (ur * icb, 1, 1),
         (kdb * khb * kw * icb_size, div_up(spb, ur), 1)),
        ((kdb * khb * _rnd_inp_simd(s, spb, kw, s.oc), 1, 1), (spb * icb, s.nb_kd * s.nb_kh, 1),
         (kdb * khb * kw * icb_size, 1, 1)),
        ((s.kd * s.kh * _rnd_inp_simd(s, spb, kw, s.oc), 1, 1), (spb * icb, 1, 1), (taps * icb_size, 1, 1)),
    ]
    src_is = s.kd * s.kh * _rnd_inp_simd(s, spb, kw, s.oc)
    wei_op = taps * (icb // _SIMD) * s.oc
    if not s.ngcdhw:
        loops.append(((src_is, nb_ic_thr, 1), (spb * icb, 1, 1), (taps * icb * s.oc, 1, 1)))
        wei_op = taps * nsimd * s.oc
    rnd_ic_for_sp = _SIMD * ((icb // _SIMD) if s.ngcdhw else nsimd)
    loops.append(((src_is, 1, 1), (spb * rnd_ic_for_sp, 1, 1), (wei_op * _SIMD, nb_sp_thr, 1)))
    src_is = s.kd * s.kh * _rnd_inp_simd(s, sp_thr, kw, s.oc)
    loops.append(((s.ih_block * src_is, 1, 1), (sp_thr * rnd_ic_for_sp, 1, 1), (wei_op * _SIMD, nb_ih_thr, 1)))
    loops.append(((s.id_block * ih_thr * src_is, 1, 1), (ih_thr * sp_thr * rnd_ic_for_sp, 1, 1),
                  (wei_op * _SIMD, nb_id_thr, 1)))
    if s.ngcdhw:
        loops.append(((id_thr * ih_thr * src_is, nb_ic_thr, 1), (icb * id_thr * ih_thr * sp_thr, 1, 1),
                      (taps * icb * s.oc, 1, 1)))
    mb_thr = min(s.mb, div_up(job, s.nb_id * s.nb_ih * s.nb_sp * s.nb_ic))
    loops.append(((id_thr * ih_thr * src_is, 1, 1), (id_thr * ih_thr * sp_thr * nsimd * _SIMD, 1, 1),
                  (taps * nsimd * _SIMD * s.oc, mb_thr, 1)))
    src_op = mb_thr * id_thr * ih_thr * sp_thr * taps * s.oc
    dst_op = mb_thr * id_thr * ih_thr * sp_thr * nsimd
    wei_op = taps * nsimd * s.oc
    loops.append(((src_op, 1, 1), (dst_op * _SIMD, 1, 1), (wei_op * _SIMD, 1, 1)))
    cost = _traffic(loops, (src_op, dst_op, wei_op), not s.ngcdhw, s.ngcdhw) + F(job * s.nb_kd * s.nb_kh)
    cache_eff = F(s.mb * s.id * s.ih * s.sp * s.oc * s.ic) / (F(s.nthr) * cost)
    return effs * cache_eff * brgemm_eff


def _est_eff_1x1(s: Avx2Blocking) -> F:
    """``brg_blocking_t::est_eff_1x1`` off AMX."""
    effs, brgemm_eff, job, nb_ic_thr, nsimd, nb_sp_thr, sp_thr, nb_ih_thr, ih_thr, nb_id_thr, id_thr = _common_effs(s)
    ur, spb, icb = s.ur, s.sp_block, s.ic_block
    icb_size, r_oc = icb * s.oc, round_up(s.oc, _SIMD)
    loops: list[_Loop] = [
        ((ur * _SIMD, 1, _SIMD), (0, 1, 1), (icb, 1, 1)),
        ((ur * r_oc, 1, 1), (ur * icb, 1, 1), (icb_size, div_up(spb, ur), 1)),
        ((spb * s.oc, 1, 1), (spb * icb, 1, 1), (icb_size, 1, 1)),
    ]
    wei_op = (icb // _SIMD) * s.oc
    if not s.ngcdhw:
        loops.append(((spb * round_up(s.ic, _SIMD), nb_ic_thr, 1), (spb * icb, 1, 1), (icb * s.ic, 1, 1)))
        wei_op = nsimd * s.ic
    rnd_ic_for_sp = _SIMD * ((icb // _SIMD) if s.ngcdhw else nsimd)
    loops.append(((spb * s.oc, 1, 1), (spb * rnd_ic_for_sp, 1, 1), (wei_op * _SIMD, nb_sp_thr, 1)))
    loops.append(((s.ih_block * sp_thr * r_oc, 1, 1), (s.ih_block * sp_thr * rnd_ic_for_sp, 1, 1),
                  (wei_op * _SIMD, nb_ih_thr, 1)))
    loops.append(((s.id_block * ih_thr * sp_thr * r_oc, 1, 1), (s.id_block * ih_thr * sp_thr * rnd_ic_for_sp, 1, 1),
                  (wei_op * _SIMD, nb_id_thr, 1)))
    if s.ngcdhw:
        loops.append(((id_thr * ih_thr * round_up(sp_thr * s.oc, _SIMD), nb_ic_thr, 1),
                      (icb * id_thr * ih_thr * sp_thr, 1, 1), (icb * s.oc, 1, 1)))
    mb_thr = min(s.mb, div_up(job, s.nb_id * s.nb_ih * s.nb_sp * s.nb_ic))
    loops.append(((id_thr * ih_thr * sp_thr * r_oc, 1, 1), (nsimd * _SIMD * id_thr * ih_thr * sp_thr, 1, 1),
                  (nsimd * s.oc * _SIMD, mb_thr, 1)))
    src_op = mb_thr * id_thr * ih_thr * sp_thr * s.oc
    dst_op = mb_thr * nsimd * id_thr * ih_thr * sp_thr
    wei_op = nsimd * s.oc
    loops.append(((src_op, 1, 1), (dst_op * _SIMD, 1, 1), (wei_op * _SIMD, 1, 1)))
    cost = _traffic(loops, (src_op, dst_op, wei_op), True, False) + F(job)
    cache_eff = F(s.mb * s.id * s.ih * s.sp * s.oc * s.ic) / (F(s.nthr) * cost)
    return effs * cache_eff * brgemm_eff


def _iterate_ker_block(s: Avx2Blocking, best: Avx2Blocking, kd_block: int, kh_block: int,
                       max_iw_block_thr: int) -> Avx2Blocking:
    """``iterate_ker_block``: the planes and rows a block (L2, then the threads), then every input-width block."""
    s.kd_block, s.kh_block = kd_block, kh_block
    l2 = per_core_cache(2)
    w_block_size = 2 * _DSZ * s.oc * s.owp + _DSZ * s.iw * s.ic_block
    other_size = _DSZ * s.kd * s.kh * s.kw * s.oc * s.ic_block + _DSZ * 2 * 16 * s.ic_block  # amx_h 16
    l2_available = min(div_up(l2, 2), 0 if other_size > l2 else l2 - other_size)
    s.id_block, s.ih_block = 1, s.ih
    if s.odp * s.ohp * w_block_size > l2_available:
        s.id_block = max(1, min(s.id, l2_available // (s.ohp * w_block_size)))
        if s.id_block == 1:
            s.ih_block = max(1, min(s.ih, l2_available // w_block_size))
    thr_ic_block = div_up(s.nthr, s.mb * div_up(s.ic, s.ic_block))
    thr_id_block = div_up(s.id, thr_ic_block)
    s.id_block = min(s.id_block, thr_id_block)
    s.ih_block = min(s.ih_block, div_up(s.ih, thr_ic_block * div_up(s.id, thr_id_block)))
    while (s.id_block % s.sd != 0 or (s.id % s.sd == 0 and s.id % s.id_block != 0)) and s.id_block < s.id:
        s.id_block += 1
    while (s.ih_block % s.sh != 0 or (s.ih % s.sh == 0 and s.ih % s.ih_block != 0)) and s.ih_block < s.ih:
        s.ih_block += 1
    start_iw_block = min(max_iw_block_thr, s.iw)
    s.sp = round_up(s.iw, s.sw) if s.uneven else s.iw
    start_sp_block = round_up(start_iw_block, s.sw) if s.uneven else start_iw_block
    prev = 0
    for ns in range(1, s.sp + 1):
        spb = div_up(s.sp, ns)
        if spb == prev or spb > start_sp_block or spb % s.sw or (not s.uneven and s.iw % spb):
            continue
        prev = spb
        s.iw_block = s.sp_block = spb
        _estimate_ur(s)
        _update_blocks(s)
        s.eff = _est_eff(s)
        if (s.eff > best.eff or best.eff == 0) and s.eff >= _MIN_EFF:
            best = copy.copy(s)
    return best


def _calc_blocks(s: Avx2Blocking) -> bool:
    """``calc_blocks``: the best kernel-depth, -height and width blocking for ``s.ic_block``; False where none beats
    the efficiency ``s`` carries in (the previous channel block's, as the C++ object keeps it)."""
    s.sp = round_up(s.iw, s.sw) if s.uneven else s.iw
    kd_blocks = [s.kd] if s.kd == 1 else [s.kd, s.sd]
    kh_blocks = [s.kh] if s.kh == 1 else [s.kh, s.sh]
    jobs = F(s.mb * s.nb_ic * s.id * s.ih * s.iw) / (F(0.9) * F(s.nthr))  # thr_eff_threshold
    max_iw_block_thr = max(1, min(s.sp, int(math.ceil(jobs))))
    s.iw_block = s.sp_block = -1
    best = copy.copy(s)
    for kd_block in kd_blocks:
        for kh_block in kh_blocks:
            best = _iterate_ker_block(s, best, kd_block, kh_block, max_iw_block_thr)
    s.__dict__.update(copy.copy(best).__dict__)
    if s.sp_block <= 0:
        return False
    s.iw_block = s.sp_block
    _update_blocks(s)
    return True


def _blocking(s: Avx2Blocking) -> Avx2Blocking | None:
    """``try_exec_type``: the input-channel block (32, 24, 16 or 8; ``fast_check_ic_block`` passes them all) of the
    best efficiency, and its blocking."""
    best: Avx2Blocking | None = None
    cur = copy.copy(s)
    for icb in range(min(div_up(s.ic, _SIMD), 4), 0, -1):
        cur.ic_block = icb * _SIMD
        cur.nb_ic = div_up(s.ic, cur.ic_block)
        if not _calc_blocks(cur):
            continue
        _estimate_ur(cur)  # get_brgemm_ur
        cur.eff = _est_eff(cur)
        if cur.eff > (best.eff if best else F(0)):
            best = copy.copy(cur)
    return best


def avx2_blocking(x_shape: tuple[int, ...], w_shape: tuple[int, ...], stride: tuple[int, ...],
                  padding: tuple[int, ...], nthreads: int) -> Avx2Blocking | None:
    """The blocking ``init_conf`` picks for a dense, undilated, strided float32 input gradient of an nc(d)hw input
    ``x_shape`` (a 1-D one viewed as 2-D), or None where it finds none."""
    lead = (1,) * (5 - len(x_shape))
    mb, ic, idd, ih, iw = (*x_shape[:2], *lead, *x_shape[2:])
    oc, _, kd, kh, kw = (*w_shape[:2], *lead, *w_shape[2:])
    (sd, sh, sw), pads = (*lead, *stride), (*((0,) * len(lead)), *padding)
    outs = [(i + 2 * p - k) // st + 1 for i, p, k, st in zip((idd, ih, iw), pads, (kd, kh, kw), (sd, sh, sw))]
    ends = [(o - 1) * st + k - (i + p) for o, st, k, i, p in zip(outs, (sd, sh, sw), (kd, kh, kw), (idd, ih, iw), pads)]
    s = Avx2Blocking(mb, ic, oc, idd, ih, iw, kd, kh, kw, sd, sh, sw, nthreads)
    s.is_1x1 = kd == kh == kw == 1 and max(*pads, *ends) <= 0
    s.uneven, s.ow = iw % sw != 0, outs[2]
    # l/r, t/b, f/back overflow (back_ovf reads the undilated kd, as init_conf does: undilated here)
    s.odp, s.ohp, s.owp = (o + max(0, k - 1 - p) // st + max(0, k - 1 - e) // st
                           for o, k, p, e, st in zip(outs, (kd, kh, kw), pads, ends, (sd, sh, sw)))
    s.ngcdhw = math.prod(outs) < ic * kd * kh * kw and not s.uneven  # bcast_amount < wei_amount, not exec_trans
    return _blocking(s)
