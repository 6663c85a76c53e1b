"""The scratchpad of oneDNN's ``brgconv_strided:avx512_core_bf16``: a strided bfloat16 input gradient (and the
forward of a strided transposed convolution, which runs it), 1-D to 3-D, undilated.

Unlike float32 (:func:`.conv_brgemm_bwd.strided_bwd_data`) a bfloat16 input gradient accumulates in a float32
buffer per thread (``use_buffer``: ``ic_block * ceil(iw_block / stride_w)`` floats), so the blocking matters:
``calc_blocks`` / ``iterate_ker_block`` weigh each input-channel block (16-64) and input-width block with
``est_eff`` / ``est_eff_1x1`` and keep the best. Ported from oneDNN 3.12 (the version torch 2.13 bundles),
src/cpu/x64/jit_brgemm_conv_bwd_utils.cpp ``init_jcp`` / ``init_conf`` / ``brg_blocking_t`` / ``pick_tags`` /
``init_scratchpad``, and brgemm/brgemm_utils.cpp ``brgemm_blocking_vmm`` (:func:`.conv_bf16_brgemm.vmm_blocking`).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

from nnmem.frontends.pytorch.workspace._common import div_up, per_core_cache, round_up
from nnmem.frontends.pytorch.workspace.conv_bf16_1x1 import l2_per_core
from nnmem.frontends.pytorch.workspace.conv_bf16_brgemm import vmm_blocking

_P4K = 4096
_BATCH_ELEMENT = 40  # sizeof(brgemm_batch_element_t)
_SIMD, _ACC_SIMD, _REGS, _AMX_H = 32, 16, 32, 16  # bf16 lanes of a zmm, f32 lanes, zmm registers, jcp.amx_h
_L1_K, _L2_K, _L3_K, _MEM_K = 1.0, 3.0, 15.0, 15.0  # brg_blocking_t's access costs
_Loops = list[tuple[tuple[int, float, float], ...]]  # est_eff's loops: (src, dst, wei) (itersize, repeatn, overlap)


def _book(size: int) -> int:
    """``book(..., P4K)``: the size and a page of alignment (nothing for size 0)."""
    return size + _P4K if size else 0


@dataclass
class _State:
    """The ``brg_blocking_t`` fields the blocking reads and writes; a 2-D problem has depth 1 (``id = kd = 1``)."""

    mb: int
    ic: int
    oc: int
    id: int
    ih: int
    iw: int
    od: int
    oh: int
    ow: int
    kd: int
    kh: int
    kw: int
    sd: int
    sh: int
    sw: int
    nthr: int
    dst_dsz: int  # the input gradient's element size: 2, or 4 where the deconvolution asks float32
    ngroups: int = 1  # ic and oc are a group's
    is_1x1: bool = False
    uneven: bool = False
    ngcdhw: bool = False
    odp: int = 0
    ohp: int = 0
    owp: int = 0
    ic_block: int = 0
    oc_block: int = 0
    nb_oc: int = 0
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
    m: int = 0
    m_tail: int = 0
    use_buffer: bool = False
    eff: float = 0.0


def _inp_w(s: _State, out_w: int, ker_w: int) -> int:
    """``get_inp_size(ow, out_w, ker_w, stride_w, dilate_w)``."""
    adj = min(ker_w, s.sw)
    return min(s.ow, (out_w - 1) * adj + ker_w)


def _rnd_inp_simd(s: _State, out_w: int, ker_w: int, voc: int) -> int:
    vsp = _inp_w(s, out_w, ker_w)
    return round_up(vsp * voc, _SIMD) if s.sw == 1 and voc >= s.oc else vsp * round_up(voc, _SIMD)


def _estimate_ur(s: _State) -> bool:
    """``estimate_brgemm_ur``: the brgemm's rows (``M`` / ``M_tail``) and ``ur`` (its ``bd_block``)."""
    adj_sp = div_up(s.iw_block, s.sw)
    s.m = s.sp_block if adj_sp >= s.sp_block else 0
    s.m_tail = adj_sp % s.sp_block
    n = s.ic_block if s.ic >= s.ic_block else s.ic % s.ic_block
    k = s.oc_block if s.oc >= s.oc_block else s.oc % s.oc_block
    blocking = vmm_blocking(s.m or s.m_tail, n, k, 0)
    if blocking is None:
        return False
    s.ur = blocking[0]
    return s.ur > 0


def _update_blocks(s: _State) -> None:
    s.nb_id, s.nb_ih = div_up(s.id, s.id_block), div_up(s.ih, s.ih_block)
    s.nb_oc, s.nb_ic = div_up(s.oc, s.oc_block), div_up(s.ic, s.ic_block)
    s.nb_kd, s.nb_kh = div_up(s.kd, s.kd_block), div_up(s.kh, s.kh_block)
    s.sp = round_up(s.iw, s.sw) if s.uneven else s.iw
    s.sp_block = s.iw_block
    s.nb_sp = div_up(s.iw, s.iw_block)


def _io_k(s: _State, sizes: tuple[int, int, int], n: float, pk: float, broadcast: bool, shared: bool) -> float:
    """``brg_blocking_t::io_k``."""
    if n < 1:
        return 0.0
    if n == 1:
        return pk
    src, wei, dst = sizes
    amount = src * 2 + wei * 2 + dst * s.dst_dsz + (dst * 4 if s.use_buffer else 0)
    l1, l2 = per_core_cache(1), l2_per_core()
    k = _L2_K if amount < l2 else _L3_K if shared else _MEM_K
    if broadcast and src * 2 < l1:  # a broadcast array fitting L1
        k = _L1_K
    return (pk + k * (n - 1)) / n


def _balance211(n: int, team: int, tid: int) -> tuple[int, int]:
    if team <= 1 or n == 0:
        return 0, n
    n1 = div_up(n, team)
    n2 = n1 - 1
    t1 = n - n2 * team
    end_len = n1 if tid < t1 else n2
    start = tid * n1 if tid <= t1 else t1 * n1 + (tid - t1) * n2
    return start, start + end_len


def _job_eff(s: _State, work: int) -> float:
    """``est_eff``'s per-thread job balance where there are fewer jobs per thread than threads (its iterator
    steps twice a position, as the C++ does)."""
    dims_ndhwgc = [s.mb, s.id, s.ih, s.nb_sp, s.ngroups, s.nb_ic]  # n, idp, ihp, spb, g, icb
    jobs = []
    for ithr in range(s.nthr):
        if ithr >= work:
            jobs.append(0)
            continue
        start, end = _balance211(work, s.nthr, ithr)
        order = [0, 4, 5, 1, 2, 3] if s.ngcdhw else [0, 1, 2, 3, 4, 5]
        idx = [0] * 6
        rem = start
        for d in reversed(order):
            idx[d] = rem % dims_ndhwgc[d]
            rem //= dims_ndhwgc[d]
        job = 0
        for _ in range(start, end):
            icb, spb = idx[5], idx[3]
            job += min(s.sp - spb * s.sp_block, s.sp_block) * min(s.ic - icb * s.ic_block, s.ic_block)
            for o in ([0, 1, 2, 3, 4, 5], order):  # nd_iterator_step twice
                for d in reversed(o):
                    idx[d] += 1
                    if idx[d] < dims_ndhwgc[d]:
                        break
                    idx[d] = 0
        jobs.append(job)
    top = max(jobs)
    return 1.0 if top == 0 else sum(jobs) / (top * s.nthr)


def _est_eff(s: _State) -> float:
    """``brg_blocking_t::est_eff`` (``est_eff_1x1``): the blocking's efficiency, from its loops' memory traffic."""
    if s.is_1x1:
        return _est_eff_1x1(s)
    icblock = s.ic_block // _ACC_SIMD
    ur, spb = s.ur, s.sp_block
    micro = icblock * ur / ((ur + icblock) * _REGS)
    ur_eff = spb / round_up(spb, ur)
    brgemm_eff = (1 + ur * (2.0 - min(1.9, ur / spb)) / 64) / 2  # squeeze_val(eff, 0.5)
    sp_amount = s.nb_id * s.nb_ih * s.nb_sp
    work = s.mb * s.ngroups * s.nb_ic * sp_amount
    job = div_up(work, s.nthr)
    job_eff = _job_eff(s, work) if job < s.nthr else work / round_up(work, s.nthr)
    effs = (s.ic / round_up(s.ic, s.ic_block)) * micro * (s.sp / round_up(s.sp, spb)) * job_eff * ur_eff
    ocb, icb_size, kdb, khb, kw = s.oc_block, s.ic_block * s.oc_block, s.kd_block, s.kh_block, s.kw
    taps = s.kd * s.kh * kw
    # (src, dst, wei): (itersize, repeatn, overlap), innermost loop first
    loops: _Loops = [
        ((_inp_w(s, ur, kw) * _SIMD, 1, _ACC_SIMD), (0, 1, 1), (s.ic_block, 1, 1)),
        ((_rnd_inp_simd(s, ur, kw, ocb), 1, kw), (0, 1, 1), (icb_size, 1, 1)),
        ((_rnd_inp_simd(s, ur, kw, ocb), 1, 1), (0, 1, 1), (kw * icb_size, 1, 1)),
        ((kdb * khb * _rnd_inp_simd(s, ur, kw, ocb), 1, 1), (ur * s.ic_block, 1, 1),
         (kdb * khb * kw * icb_size, div_up(spb, ur), 1)),
        ((kdb * khb * _rnd_inp_simd(s, spb, kw, ocb), 1, 1), (spb * s.ic_block, s.nb_kd * s.nb_kh, 1),
         (kdb * khb * kw * icb_size, 1, 1)),
        ((s.kd * s.kh * _rnd_inp_simd(s, spb, kw, ocb), 1, 1), (spb * s.ic_block, s.nb_oc, 1),
         (taps * icb_size, 1, 1)),
    ]
    nb_ic_thr = min(s.nb_ic, div_up(job, sp_amount if s.ngcdhw else 1))
    nsimd_ic_thr = div_up(min(s.ic, nb_ic_thr * s.ic_block), _SIMD)
    dim_sp = 1 if s.ngcdhw else s.ngroups * s.nb_ic
    nb_sp_thr = min(s.nb_sp, div_up(job, dim_sp))
    sp_thr = min(s.sp, nb_sp_thr * spb)
    nb_ih_thr = min(s.nb_ih, div_up(job, s.nb_sp * dim_sp))
    ih_thr = min(s.ih, nb_ih_thr * s.ih_block)
    nb_id_thr = min(s.nb_id, div_up(job, s.nb_ih * s.nb_sp * dim_sp))
    id_thr = min(s.id, nb_id_thr * s.id_block)
    src_is = s.kd * s.kh * _rnd_inp_simd(s, spb, kw, s.oc)
    wei_op = taps * icblock * s.oc
    if not s.ngcdhw:
        loops.append(((src_is, nb_ic_thr, 1), (spb * s.ic_block, 1, 1), (taps * s.ic_block * s.oc, 1, 1)))
        wei_op = taps * nsimd_ic_thr * s.oc
    rnd_ic_for_sp = _SIMD * (icblock if s.ngcdhw else nsimd_ic_thr)
    loops.append(((src_is, 1, 1), (spb * rnd_ic_for_sp, 1, 1), (wei_op * _SIMD, nb_sp_thr, 1)))
    src_is = s.kd * s.kh * _rnd_inp_simd(s, sp_thr, kw, s.oc)
    loops.append(((s.ih_block * src_is, 1, 1), (sp_thr * rnd_ic_for_sp, 1, 1), (wei_op * _SIMD, nb_ih_thr, 1)))
    loops.append(((s.id_block * ih_thr * src_is, 1, 1), (ih_thr * sp_thr * rnd_ic_for_sp, 1, 1),
                  (wei_op * _SIMD, nb_id_thr, 1)))
    if s.ngcdhw:
        loops.append(((id_thr * ih_thr * src_is, nb_ic_thr, 1), (s.ic_block * id_thr * ih_thr * sp_thr, 1, 1),
                      (taps * s.ic_block * s.oc, 1, 1)))
    mb_thr = min(s.mb, div_up(job, sp_amount * s.ngroups * s.nb_ic))
    loops.append(((id_thr * ih_thr * src_is, 1, 1), (id_thr * ih_thr * sp_thr * nsimd_ic_thr * _SIMD, 1, 1),
                  (taps * nsimd_ic_thr * _SIMD * s.oc, mb_thr, 1)))
    src_op = mb_thr * id_thr * ih_thr * sp_thr * taps * s.oc
    dst_op = mb_thr * id_thr * ih_thr * sp_thr * nsimd_ic_thr
    wei_op = taps * nsimd_ic_thr * s.oc
    loops.append(((src_op, 1, 1), (dst_op * _SIMD, 1, 1), (wei_op * _SIMD, 1, 1)))
    cost = _traffic(s, loops, (src_op, dst_op, wei_op), not s.ngcdhw) + job * s.nb_oc * s.nb_kd * s.nb_kh
    cache_eff = (s.mb * s.id * s.ih * s.sp * s.oc * s.ic) / (s.nthr * cost)
    return effs * cache_eff * brgemm_eff


def _traffic(s: _State, loops: _Loops, ops: tuple[int, int, int], wei_shared: bool) -> float:
    """``est_eff``'s memory cost: each array's access cost through the loops (innermost last), times its
    operations and repeats."""
    src_k = dst_k = wei_k = _MEM_K
    src_rp = dst_rp = wei_rp = 1.0
    for src, dst, wei in reversed(loops):
        sizes = (src[0], wei[0], dst[0])
        src_k = _io_k(s, sizes, src[1] * src[2], src_k, True, not wei_shared)
        dst_k = _io_k(s, sizes, dst[1] * dst[2], dst_k, False, False)
        wei_k = _io_k(s, sizes, wei[1] * wei[2], wei_k, False, wei_shared)
        src_rp, dst_rp, wei_rp = src_rp * src[1], dst_rp * dst[1], wei_rp * wei[1]
    src_op, dst_op, wei_op = ops
    return src_k * src_op * src_rp + dst_k * dst_op * dst_rp + wei_k * wei_op * wei_rp


def _est_eff_1x1(s: _State) -> float:
    """``brg_blocking_t::est_eff_1x1`` off AMX."""
    icblock, ur, spb, ocb = s.ic_block // _ACC_SIMD, s.ur, s.sp_block, s.oc_block
    micro = icblock * ur / ((ur + icblock) * _REGS)
    brgemm_eff = (1 + ur * (2.0 - min(1.9, ur / spb)) / 64) / 2  # squeeze_val(eff, 0.5)
    sp_amount = s.nb_id * s.nb_ih * s.nb_sp
    work = s.mb * s.ngroups * s.nb_ic * sp_amount
    job = div_up(work, s.nthr)
    nb_ic_thr = min(s.nb_ic, div_up(job, sp_amount if s.ngcdhw else 1))
    nsimd_ic_thr = div_up(min(s.ic, nb_ic_thr * s.ic_block), _SIMD)
    dim_sp = 1 if s.ngcdhw else s.ngroups * s.nb_ic
    nb_sp_thr = min(s.nb_sp, div_up(job, dim_sp))
    sp_thr = min(s.sp, nb_sp_thr * spb)
    nb_ih_thr = min(s.nb_ih, div_up(job, s.nb_sp * dim_sp))
    ih_thr = min(s.ih, nb_ih_thr * s.ih_block)
    nb_id_thr = min(s.nb_id, div_up(job, s.nb_ih * s.nb_sp * dim_sp))
    id_thr = min(s.id, nb_id_thr * s.id_block)
    job_eff = _job_eff(s, work) if job < s.nthr else work / round_up(work, s.nthr)
    effs = (s.ic / round_up(s.ic, s.ic_block)) * micro * (s.sp / round_up(s.sp, spb)) * job_eff \
        * (spb / round_up(spb, ur))
    icb_size, r_ocb = s.ic_block * ocb, round_up(ocb, _SIMD)
    loops: _Loops = [
        ((ur * _SIMD, 1, _ACC_SIMD), (0, 1, 1), (s.ic_block, 1, 1)),
        ((ur * r_ocb, 1, 1), (ur * s.ic_block, 1, 1), (icb_size, div_up(spb, ur), 1)),
        ((spb * ocb, 1, 1), (spb * s.ic_block, s.nb_oc, 1), (icb_size, 1, 1)),
    ]
    wei_op = icblock * s.oc
    if not s.ngcdhw:
        loops.append(((spb * round_up(s.ic, _SIMD), nb_ic_thr, 1), (spb * s.ic_block, 1, 1), (s.ic_block * s.ic, 1, 1)))
        wei_op = nsimd_ic_thr * s.ic
    rnd_ic_for_sp = _SIMD * (icblock if s.ngcdhw else nsimd_ic_thr)
    loops.append(((spb * ocb, 1, 1), (spb * rnd_ic_for_sp, 1, 1), (wei_op * _SIMD, nb_sp_thr, 1)))
    loops.append(((s.ih_block * sp_thr * r_ocb, 1, 1), (s.ih_block * sp_thr * rnd_ic_for_sp, 1, 1),
                  (wei_op * _SIMD, nb_ih_thr, 1)))
    loops.append(((s.id_block * ih_thr * sp_thr * r_ocb, 1, 1), (s.id_block * ih_thr * sp_thr * rnd_ic_for_sp, 1, 1),
                  (wei_op * _SIMD, nb_id_thr, 1)))
    if s.ngcdhw:
        loops.append(((id_thr * ih_thr * round_up(sp_thr * ocb, _SIMD), nb_ic_thr, 1),
                      (s.ic_block * id_thr * ih_thr * sp_thr, 1, 1), (s.ic_block * s.oc, 1, 1)))
    mb_thr = min(s.mb, div_up(job, sp_amount * s.ngroups * s.nb_ic))
    loops.append(((id_thr * ih_thr * sp_thr * r_ocb, 1, 1), (nsimd_ic_thr * _SIMD * id_thr * ih_thr * sp_thr, 1, 1),
                  (nsimd_ic_thr * s.oc * _SIMD, mb_thr, 1)))
    src_op = mb_thr * id_thr * ih_thr * sp_thr * ocb
    dst_op = mb_thr * nsimd_ic_thr * id_thr * ih_thr * sp_thr
    wei_op = nsimd_ic_thr * s.oc
    loops.append(((src_op, 1, 1), (dst_op * _SIMD, 1, 1), (wei_op * _SIMD, 1, 1)))
    cost = _traffic(s, loops, (src_op, dst_op, wei_op), True) + job * s.nb_oc
    cache_eff = (s.mb * s.id * s.ih * s.sp * s.oc * s.ic) / (s.nthr * cost)
    return effs * cache_eff * brgemm_eff


def _iterate_ker_block(s: _State, best: _State, kd_block: int, kh_block: int, max_iw_block_thr: int) -> _State:
    """``iterate_ker_block``: the planes and rows a block (L2 and the threads), then every input-width block."""
    s.kd_block, s.kh_block = kd_block, kh_block
    l2 = l2_per_core()
    w_block_size = 2 * 2 * s.oc * s.owp + s.dst_dsz * s.iw * s.ic_block
    other_size = 2 * s.kd * s.kh * s.kw * s.oc * s.ic_block + 4 * 2 * _AMX_H * s.ic_block
    l2_available = min(div_up(l2, 2), 0 if other_size > l2 else l2 - other_size)
    s.id_block, s.ih_block = 1, s.ih
    if s.odp * s.ohp * w_block_size > l2_available:
        s.id_block = max(1, min(s.id, l2_available // (s.ohp * w_block_size)))
        if s.id_block == 1:
            s.ih_block = max(1, min(s.ih, l2_available // w_block_size))
    thr_ic_block = div_up(s.nthr, s.mb * div_up((s.ngroups if s.ic > 32 else 1) * s.ic, s.ic_block))
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
        s.oc_block = round_up(s.oc, 2) if s.uneven else s.oc  # select_oc_block: exec_trans pads to VNNI pairs
        s.nb_oc = div_up(s.oc, s.oc_block)
        s.use_buffer = s.dst_dsz != 4
        if not _estimate_ur(s):
            continue
        _update_blocks(s)
        s.eff = _est_eff(s)
        if s.eff > best.eff or best.eff == 0:
            best = copy.copy(s)
    return best


def _calc_blocks(s: _State) -> bool:
    """``calc_blocks``: the best kernel-height and width blocking for ``s.ic_block`` (``s`` keeps its state
    where none beats the efficiency it carries in, as the C++ object does)."""
    s.sp = round_up(s.iw, s.sw) if s.uneven else s.iw
    kd_blocks = [s.kd] if s.kd == 1 else [s.kd, s.sd]
    kh_blocks = [s.kh] if s.kh == 1 else [s.kh, s.sh]
    max_iw_block_thr = max(1, min(s.sp, math.ceil(s.mb * s.ngroups * s.nb_ic * s.id * s.ih * s.iw / (0.9 * s.nthr))))
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


def _fast_check(s: _State) -> bool:
    """``fast_check_ic_block`` (``fast_check_ic_block_1x1``): which input-channel blocks are weighed."""
    rnd_ic = round_up(s.ic, _ACC_SIMD)
    if s.is_1x1 and s.ic_block == 64:
        return rnd_ic % 64 == 0 and s.id * s.ih * s.iw >= 64 * s.sd * s.sh * s.sw
    if s.is_1x1 and s.ic_block == 48:
        return s.ic / round_up(s.ic, 48) >= 0.95
    if s.ic_block == 64:
        return rnd_ic % 64 == 0 and rnd_ic * 2 < 192 * 4
    if s.ic_block == 48:
        return rnd_ic % 48 == 0 and rnd_ic * 2 <= 384 * 4 and s.od * s.oh * s.ow > 81 * s.sd * s.sh * s.sw
    return True


def blocking(s: _State) -> _State | None:
    """``init_conf``'s ``try_exec_type``: the input-channel block of the best efficiency and its blocking."""
    best: _State | None = None
    best_eff = 0.0
    cur = copy.copy(s)
    for icb in range(min(div_up(s.ic, _ACC_SIMD), 4), 0, -1):
        cur.ic_block = icb * _ACC_SIMD
        cur.nb_ic = div_up(s.ic, cur.ic_block)
        if not _fast_check(cur) or not _calc_blocks(cur) or not _estimate_ur(cur):
            continue
        cur.eff = _est_eff(cur)
        if cur.eff > best_eff:
            best, best_eff = copy.copy(cur), cur.eff
    return best


def problem(x_shape: tuple[int, ...], w_shape: tuple[int, ...], stride: tuple[int, ...],
            padding: tuple[int, ...], nthreads: int, dst_dsz: int = 2, groups: int = 1) -> _State | None:
    """The problem ``init_jcp`` / ``init_conf`` see (a 2-D one with depth 1, a 1-D one with height 1 too), or None
    where another kernel runs (unit stride; ``is_grouped_small_oc``: 16 or fewer output channels a group, both
    counts a multiple of 4)."""
    if len(x_shape) not in (4, 5) or all(st == 1 for st in stride):
        return None
    lead = (1,) * (5 - len(x_shape))
    mb, ic, idd, ih, iw = (*x_shape[:2], *lead, *x_shape[2:])
    oc, _, kd, kh, kw = (*w_shape[:2], *lead, *w_shape[2:])
    ic, oc = ic // groups, oc // groups
    if groups > 1 and oc <= _ACC_SIMD and oc % 4 == 0 and ic % 4 == 0:
        return None
    (sd, sh, sw), pads = (*lead, *stride), (*((0,) * len(lead)), *padding)
    outs = [(i + 2 * p - k) // st + 1 for i, p, k, st in zip((idd, ih, iw), pads, (kd, kh, kw), (sd, sh, sw))]
    ends = [(o - 1) * st + k - (i + p) for o, st, k, i, p in zip(outs, (sd, sh, sw), (kd, kh, kw), (idd, ih, iw), pads)]
    od, oh, ow = outs
    s = _State(mb, ic, oc, idd, ih, iw, od, oh, ow, kd, kh, kw, sd, sh, sw, nthreads, dst_dsz, groups)
    s.is_1x1 = kd == kh == kw == 1 and max(*pads, *ends) <= 0
    s.uneven = iw % sw != 0
    # l/r, t/b, f/back overflow (back_ovf reads the undilated kd, as init_conf does: undilated here)
    s.odp, s.ohp, s.owp = (o + max(0, k - 1 - p) // st + max(0, k - 1 - e) // st
                           for o, k, p, e, st in zip(outs, (kd, kh, kw), pads, ends, (sd, sh, sw)))
    s.ngcdhw = s.od * s.oh * s.ow * 2 < ic * kd * kh * kw * 2 and not s.uneven
    return s


def scratchpad(s: _State) -> tuple[int, int] | None:
    """``(bytes, ic_block)``: ``init_scratchpad`` for the chosen blocking (batch elements, the output gradient's copy
    with its overflow, the block mask, the uneven width's output buffer, the float32 accumulation buffer) and the
    input-channel block the weights' layout pads to (``pick_tags``: ``IhwO{ic_block}i2o``), or None where the
    blocking fails or a batch outgrows a page."""
    b = blocking(s)
    if b is None or b.kd_block * b.kh_block * b.kw * _BATCH_ELEMENT > _P4K:
        return None
    nthr = s.nthr
    batch = nthr * div_up(_P4K, _BATCH_ELEMENT) * _BATCH_ELEMENT
    inp = round_up(s.odp * s.ohp * s.owp * s.ngroups * b.nb_oc * b.oc_block, _P4K) * 2
    mask = round_up(b.nb_id * b.nb_ih * div_up(s.iw, b.iw_block) * s.ngroups * b.nb_oc, _P4K)
    total = _book(batch) + _book(nthr * inp) + _book(nthr * mask)
    if s.uneven:
        total += _book(nthr * round_up(b.iw_block * s.sw * s.ic * s.ngroups, _P4K) * s.dst_dsz)
    if b.use_buffer:
        total += _book(nthr * b.ic_block * (b.m or b.m_tail) * 4)
    return total, b.ic_block
