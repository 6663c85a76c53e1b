"""The scratch of a bfloat16 forward convolution on oneDNN's ``brg_conv_fwd:avx512_core_amx`` (AMX tiles).

ideep copies the NCHW source to ``acdb``, reorders the weights (``OhwI32o2i``-like), runs the brgemm kernel into
an ``acdb`` destination with its scratchpad, then copies out (channels-last: in place). The scratchpad is ported
from oneDNN v3.12 (the version torch 2.13 bundles), src/cpu/x64/jit_brgemm_conv_utils.cpp: ``init_jcp`` /
``init_conf`` (``exec_trans`` with output-space blocking, source relayouts, groups, dilations, 3-D) /
``calc_blocks`` / ``iterate_ker_block`` / ``est_eff`` / ``init_scratchpad``; jit_brgemm_conv.cpp ``pd_t::init``
(the kernels behind the tile buffer) and brgemm_utils.cpp ``brgemm_blocking_tmm``. 1x1 kernels:
:mod:`.conv_bf16_amx_1x1`. ``exec_base`` (unpadded rows wider than 50) and channel counts split into blocks book
otherwise: :func:`forward_scratch` returns None for them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from nnmem.frontends.pytorch.workspace._common import div_up, round_up
from nnmem.frontends.pytorch.workspace.brgemm_tmm import blocking_tmm

_P4K = 4096
_BATCH_ELEMENT = 40  # sizeof(brgemm_batch_element_t)
_TILE = 1024  # one AMX tile: 16 rows of 64 bytes
_SIMD, _ACC_SIMD, _VNNI, _AMX_H = 32, 16, 2, 16  # bf16 lanes of a zmm, f32 lanes, VNNI pair, tile rows
_BF16, _F32 = 2, 4
# platform::get_per_core_cache_size on the AMX Xeons (Sapphire, Emerald, Granite Rapids): 48 KiB L1d, 2 MiB L2;
# init_jcp takes 7/8 of L1 and 3/4 of L2, brgemm_blocking_tmm the whole L1
_L1_CACHE = 48 * 1024
_L1 = _L1_CACHE * 7 // 8
_L2 = 2 * 1024 * 1024 * 3 // 4
_L1_K, _L2_K, _L3_K, _MEM_K = 1.0, 2.3, 17.0, 17.0




def _book(size: int) -> int:
    """``book(..., P4K)``: the size and a page of alignment (nothing for size 0)."""
    return size + _P4K if size else 0


@dataclass(frozen=True, slots=True)
class Problem:
    """A dense 2-D bfloat16 forward as ``init_jcp`` sees it (after ``trans_dim_koef`` folds a strided width)."""

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
    nthr: int
    relo: str = ""  # "wi" / "whi": the source relaid out per output column / per output position
    relo_weights: bool = False  # the weights rearranged at run time into a scratchpad buffer
    dh: int = 1  # dilations as PyTorch counts them (oneDNN's dilate_h + 1)
    dw: int = 1
    g: int = 1  # groups: ``ic`` and ``oc`` count one group's channels
    id: int = 1  # 3-D: input and output depth, kernel depth, its stride, front padding, dilation
    od: int = 1
    kd: int = 1
    sd: int = 1
    f_pad: int = 0
    dd: int = 1
    three_d: bool = False

    @property
    def ext_kd(self) -> int:
        return (self.kd - 1) * self.dd + 1

    @property
    def back_pad(self) -> int:
        return (self.od - 1) * self.sd + self.ext_kd - (self.id + self.f_pad)

    @property
    def idp(self) -> int:
        return self.id + self.f_pad + self.back_pad

    @property
    def ext_kh(self) -> int:
        return (self.kh - 1) * self.dh + 1

    @property
    def ext_kw(self) -> int:
        return (self.kw - 1) * self.dw + 1

    @property
    def kw_koef(self) -> int:
        return self.kw if self.relo else 1

    @property
    def kh_koef(self) -> int:
        return self.kh if self.relo == "whi" else 1

    @property
    def rd_padded(self) -> bool:
        """``is_rd_padded_to_block``: the reduction (channels, times the kernel taps a relayout folds) past a zmm."""
        return self.ic * self.kw_koef * self.kh_koef > _SIMD

    @property
    def b_pad(self) -> int:
        return (self.oh - 1) * self.sh + self.ext_kh - (self.ih + self.t_pad)

    @property
    def r_pad(self) -> int:
        return (self.ow - 1) * self.sw + self.ext_kw - (self.iw + self.l_pad)

    @property
    def ihp(self) -> int:
        return self.ih + self.t_pad + self.b_pad

    @property
    def iwp(self) -> int:
        return self.iw + self.l_pad + self.r_pad


@dataclass(frozen=True, slots=True)
class Blocking:
    """One blocking ``calc_blocks`` weighs: the output-channel block, kernel-height block, output rows."""

    oc_block: int
    kh_block: int
    oh_block: int
    ic_block: int
    use_buffer: bool
    lda: int
    m: int
    m_tail: int
    brg_m: int
    brg_m_tail: int
    oskip: int
    k: int
    k_tail: int
    ur: int
    adj_ocblock: int
    eff: float = 0.0
    kd_block: int = 1
    od_block: int = 1


def trans_dim_koef(p: Problem) -> Problem:
    """``init_jcp``: a strided unpadded width folds ``koef`` columns into the channels."""
    if not (p.kw > 1 and p.sw > 1 and p.dw == 1 and p.g == 1 and p.l_pad <= 0 and p.r_pad <= 0 and p.ic % _VNNI == 0
            and (p.ic <= _SIMD or p.ic % _SIMD == 0)):
        return p
    pure_1d = p.mb == 1 and p.id == 1 and p.ih == 1
    koef = 1
    for i in range(1, min(p.kw, p.sw, p.iw) + 1):
        if ((pure_1d or p.iw % i == 0) and (p.ic * i <= _SIMD or p.ic * i % _SIMD == 0)
                and p.iw % i == 0 and p.kw % i == 0 and p.sw % i == 0):
            koef = i
    if koef == 1:
        return p
    return dataclasses.replace(p, ic=p.ic * koef, iw=p.iw // koef, kw=p.kw // koef, sw=p.sw // koef)


def _relo(p: Problem, folded: bool) -> Problem:
    """``init_conf``'s ``try_relo_whi`` (preferred) and ``try_relo_wi`` (neither on a width ``trans_dim_koef``
    folded): the problem with its relayout and whether the weights are rearranged too (wi needs an undilated
    width, whi an undilated kernel)."""
    if folded or p.dw > 1:
        return p
    rd_wi, rd_whi = p.kw * p.ic, p.kh * p.kw * p.ic
    src_per_ic, wei_per_ic = _BF16 * p.mb * p.id * p.ih * p.iw, _BF16 * p.oc * p.kd * p.kh * p.kw
    conv_wi = not (p.ic % _VNNI == 0 and (rd_wi <= _SIMD or rd_wi % _SIMD == 0))
    rnd_wi = round_up(rd_wi, _SIMD)
    wi = p.kw > 1 and (p.ic < _SIMD // 2 or (rd_wi > _SIMD and rnd_wi / (p.kw * round_up(p.ic, _SIMD)) < 0.5
                                              and (not conv_wi or wei_per_ic / src_per_ic <= 4)))
    conv_whi = not (p.ic % _VNNI == 0 and (rd_whi <= _SIMD or rd_whi % _SIMD == 0) and 1 in (p.kh, p.kw))
    rnd_whi = round_up(rd_whi, _SIMD)
    whi = ((p.ic < _SIMD // 2 or (rd_whi > _SIMD and rnd_whi / (p.kh * p.kw * round_up(p.ic, _SIMD)) < 0.5
                                  and (not conv_whi or wei_per_ic / src_per_ic <= 4)))
           and rd_whi / rnd_whi > rd_wi / rnd_wi and (p.ow > 48 or p.ow % 16 == 0)
           and (not wi or rd_whi / rnd_whi > 0.7) and p.kh > 1 and p.dh == 1 and not p.three_d)
    if whi:
        return dataclasses.replace(p, relo="whi", relo_weights=conv_whi)
    if wi and (p.id == 1 or not conv_wi):  # 3-D: only weights already in the relaid layout
        return dataclasses.replace(p, relo="wi", relo_weights=conv_wi)
    return p



class _Unmodelled(Exception):
    """A branch of oneDNN's selection this port does not follow."""


def _inp_size(max_src: int, dst: int, k: int, stride: int, dilation: int = 1) -> int:
    """``brg_blocking_t::get_inp_size``: the source a block of ``dst`` outputs reads (``dilation`` as PyTorch
    counts it)."""
    return min(max_src, (dst - 1) * min(k, stride) + (k - 1) * dilation + 1)


def _od_oh_block(p: Problem, ic_block: int, oc_block: int, sp: int) -> tuple[int, int]:
    """``iterate_ker_block``'s output planes and rows per block on ``exec_trans``: fit L2, then L1 (AMX), then the
    threads (``sp``: the spatial amount the L1 fit reads)."""
    if p.relo == "whi":
        return 1, 1
    w_block = 2 * _BF16 * ic_block * p.iwp + _BF16 * p.ow * oc_block
    other = _BF16 * p.kd * p.kh * p.kw * ic_block * oc_block + _F32 * 2 * _AMX_H * oc_block
    l2_available = min(div_up(_L2, 2), 0 if other > _L2 else _L2 - other)
    od_block, oh_block = 1, p.oh
    if p.idp * p.ihp * w_block > l2_available:
        od_block = max(1, min(p.od, l2_available // (p.ihp * w_block)))
        if od_block == 1:
            oh_block = max(1, min(p.oh, l2_available // w_block))
    cur_od, cur_oh, fit = od_block, oh_block, False
    src_w_block = _BF16 * p.ic * p.iwp + _BF16 * p.ow * oc_block
    if src_w_block < _L1:
        cur_od = max(1, min(p.od, _L1 // (p.ihp * src_w_block)))
        if cur_od == 1:
            cur_oh = max(1, min(p.oh, _L1 // src_w_block))
    while cur_od > 1:
        if p.od / round_up(p.od, cur_od) > 0.9 and cur_od * cur_oh * p.iwp / round_up(sp, _AMX_H) > 0.8:
            fit = True
            break
        cur_od -= 1
    if cur_od == 1:
        for tmp in range(cur_oh, 0, -1):
            if p.oh / round_up(p.oh, tmp) > 0.9 and tmp * p.iwp > 128:
                fit, cur_oh = True, tmp
                break
    if fit:
        od_block, oh_block = cur_od, cur_oh
    thr_oc_block = div_up(p.nthr, p.mb * div_up((p.g if p.oc > 32 else 1) * p.oc, oc_block))
    thr_od_block = div_up(p.od, thr_oc_block)
    return min(od_block, thr_od_block), min(oh_block, div_up(p.oh, thr_oc_block * div_up(p.od, thr_od_block)))


def _ic_block(p: Problem) -> int:
    """``select_ic_block`` on AMX, ``exec_trans``: one block of all the channels (fewer than 5 zmm's worth)."""
    if p.kd * p.kh * p.ic * _BF16 > 8 * 1024:
        raise _Unmodelled("ic split into equal blocks")
    # past one zmm, nb_icb = nb_simd blocks (efficiency 1)
    block = round_up(p.ic, _VNNI) if p.ic * p.kw_koef * p.kh_koef <= _SIMD else div_up(p.ic, _SIMD) * _SIMD
    return max(block, p.ic) if p.relo else block


def _blocking(p: Problem, oc_block: int, kd_block: int, kh_block: int, sp: int) -> Blocking:
    """``iterate_ker_block`` + ``estimate_brgemm_ur`` for one candidate (output-space blocking: ``ow_block = ow``)."""
    ic_block = _ic_block(p)
    od_block, oh_block = _od_oh_block(p, ic_block, oc_block, sp)
    # bf16 destination, f32 accumulators: a buffer when the sum is split
    use_buffer = kh_block != p.kh or kd_block != p.kd
    inp_ic_block = p.ic if p.relo else ic_block
    lda = p.kh_koef * p.sw * inp_ic_block * (p.ext_kw if p.ow == 1 else 1)
    sp, sp_block = p.ow * p.oh, p.ow * oh_block
    m, m_tail = (sp_block if sp >= sp_block else 0), sp % sp_block
    adj_sh = 1 if p.relo == "whi" else p.sh
    oskip = (0 if p.ow == 1 else (p.ext_kw - 1) // p.sw * adj_sh) + (adj_sh - 1) * p.ow
    brg_m, brg_m_tail = m + oskip * (div_up(m, p.ow) - 1), m_tail + oskip * div_up(m_tail, p.ow)
    adj_ow = p.ow + oskip  # use_M_mask == 2: rows rounded so that bd blocks never start in the skipped columns
    i = 0
    while i < brg_m:
        i += _AMX_H if i % adj_ow < p.ow else 1
    brg_m = i
    start = (p.oh * p.ow // sp_block * sp_block) % p.ow
    i = 0
    while i < brg_m_tail:
        i += _AMX_H if (i + start) % adj_ow < p.ow else 1
    brg_m_tail = i
    n = oc_block if p.oc >= oc_block else 0
    if p.relo:
        k_full = round_up(p.kh_koef * p.kw * inp_ic_block, _VNNI)
        k_full = round_up(k_full, _SIMD) if k_full > _SIMD else k_full
        k, k_tail = (k_full if p.ic >= ic_block else 0), k_full
    else:
        k = ic_block if p.ic >= ic_block else 0
        k_tail = round_up(p.ic % ic_block, _SIMD if ic_block % _SIMD == 0 else _VNNI)
    t = blocking_tmm(m or m_tail, n or p.oc % oc_block, k or k_tail, None)
    ld_block2 = t.ld_block2 if div_up(t.ldb, t.ld_block2) else 0
    return Blocking(oc_block, kh_block, oh_block, ic_block, use_buffer, lda, m, m_tail, brg_m, brg_m_tail,
                    oskip, k, k_tail, t.bd_block * t.bd_block2, max(1, ld_block2), kd_block=kd_block,
                    od_block=od_block)


def _grid_coverage(nb: int, x: int, nx: int, xb: int, y: int, yb: int) -> int:
    """``brg_blocking_t::grid_coverage``: the area ``nb`` blocks cover."""
    nb_x, nb_y = div_up(x, xb), div_up(y, yb)
    yb_last, xb_last = nb // (nx * nb_x), nb % (nx * nb_x)
    y1_end = yb_last % nb_y * yb
    y2_end = min(y, y1_end + yb)
    x_tail = (x * (xb_last // nb_x) + xb_last % nb_x * xb) * (y2_end - y1_end)
    return nx * (yb_last // nb_y) * x * y + x * nx * y1_end + x_tail


def _io_k(sizes: tuple[int, int, int], n: float, pk: float, broadcast: bool, shared: bool,
          use_buffer: bool) -> float:
    """``brg_blocking_t::io_k``: the relative cost of one access to an array repeated ``n`` times."""
    if n < 1:
        return 0.0
    if n == 1:
        return pk
    src, wei, dst = sizes
    amount = (src + wei + dst) * _BF16 + (dst * _F32 if use_buffer else 0)
    far = _L3_K if shared else _MEM_K
    if broadcast:
        k = _L1_K if src * _BF16 < _L1 else _L2_K if amount < _L2 else far
    else:
        k = _L2_K if amount < _L2 else far
    return (pk + k * (n - 1)) / n


def _squeeze(eff: float, koeff: float) -> float:
    k = 1.0 / koeff
    return (k - 1 + eff) / k if k > 1.0 else eff * koeff


def est_eff(p: Problem, b: Blocking) -> float:
    """``brg_blocking_t::est_eff`` for a candidate (``loop_ndhwgc``, output-space blocking: the spatial amount
    is ``od * oh * ow`` in blocks of ``oh_block`` rows)."""
    nb_oc, nb_kh, nb_oh = div_up(p.oc, b.oc_block), div_up(p.kh, b.kh_block), div_up(p.oh, b.oh_block)
    nb_kd, nb_od = div_up(p.kd, b.kd_block), div_up(p.od, b.od_block)
    sp, sp_block = p.od * p.oh * p.ow, p.ow * b.oh_block
    nb_sp = div_up(sp, sp_block)
    ur, kw, kh, ic, ocb = b.ur, p.kw, p.kd * p.kh, p.ic, b.oc_block  # kh: the kernel's depth times height
    m_regs = div_up(ur, _AMX_H)
    micro = (b.adj_ocblock * m_regs) / ((b.adj_ocblock + m_regs) * 8)
    ur_eff = sp_block / round_up(sp_block, ur)
    brgemm_eff = _squeeze(ur * (2.0 - min(1.9, ur / sp_block)) / 64, 0.5)
    sp_amount = nb_od * nb_oh * nb_sp
    work = sp_amount * p.mb * p.g * nb_oc
    sp_eff, oc_block_eff = sp / round_up(sp, sp_block), p.oc / round_up(p.oc, ocb)
    job = div_up(work, p.nthr)
    max_job = _grid_coverage(job, p.oc, p.g, ocb, sp, sp_block)  # balance211: thread 0 takes div_up
    job_eff = 1.0 if max_job == 0 else p.mb * p.od * p.oh * p.ow * p.g * p.oc / (max_job * p.nthr)

    def rnd_inp_simd(out_w: int, ker_w: int, vic: int) -> int:
        vsp = _inp_size(p.iw, out_w, ker_w, p.sw, p.dw)
        return round_up(vsp * vic, _SIMD) if p.sw == 1 and vic >= ic else vsp * round_up(vic, _SIMD)

    ocb_ic = ocb * b.ic_block
    nb_oc_thr = min(nb_oc, job)
    nsimd_oc_thr = div_up(min(p.oc, nb_oc_thr * ocb), _SIMD)
    nb_sp_thr = min(nb_sp, div_up(job, p.g * nb_oc))
    sp_thr = min(sp, nb_sp_thr * sp_block)
    mb_thr = min(p.mb, div_up(job, sp_amount * p.g * nb_oc))
    wei_op = kh * kw * nsimd_oc_thr * ic
    src_sp = kh * rnd_inp_simd(sp_block, kw, ic)
    src_thr = kh * rnd_inp_simd(sp_thr, kw, ic)
    src_op, dst_op = mb_thr * sp_thr * kh * kw * ic, mb_thr * sp_thr * nsimd_oc_thr
    src_ur = rnd_inp_simd(ur, kw, b.ic_block)
    kb = b.kd_block * b.kh_block
    wei_is = kb * kw * ocb_ic
    # per loop, innermost first: (src, wei, dst) iteration sizes, (src, wei, dst) repeats, src's overlap
    loops = (
        ((_inp_size(p.iw, ur, kw, p.sw, p.dw) * _SIMD, ocb, 0), (1, 1, 1), _ACC_SIMD),  # brgemm: by simd_w
        ((src_ur, ocb_ic, 0), (1, 1, 1), kw),  # by kw in kw_block
        ((src_ur, kw * ocb_ic, 0), (1, 1, 1), 1),  # by batch
        ((kb * src_ur, wei_is, ur * ocb), (1, div_up(sp_block, ur), 1), 1),  # by ur in sp_block
        ((kb * rnd_inp_simd(sp_block, kw, b.ic_block), wei_is, sp_block * ocb), (1, 1, nb_kd * nb_kh), 1),
        ((kh * rnd_inp_simd(sp_block, kw, b.ic_block), kh * kw * ocb_ic, sp_block * ocb), (1, 1, 1), 1),
        ((src_sp, kh * kw * ocb * ic, sp_block * ocb), (nb_oc_thr, 1, 1), 1),  # harness: by oc_block
        ((src_sp, wei_op * _SIMD, sp_block * _SIMD * nsimd_oc_thr), (1, nb_sp_thr, 1), 1),  # by sp_blocks
        ((b.oh_block * src_thr, wei_op * _SIMD, sp_thr * _SIMD * nsimd_oc_thr), (1, 1, 1), 1),  # by oh_blocks
        ((b.od_block * src_thr, wei_op * _SIMD, sp_thr * _SIMD * nsimd_oc_thr), (1, 1, 1), 1),  # by od_blocks
        ((src_thr, kh * kw * nsimd_oc_thr * _SIMD * ic, sp_thr * nsimd_oc_thr * _SIMD), (1, mb_thr, 1), 1),
        ((src_op, wei_op * _SIMD, dst_op * _SIMD), (1, 1, 1), 1),  # bench_iterations
    )
    src_k = dst_k = wei_k = _MEM_K
    src_rp = dst_rp = wei_rp = 1.0
    for sizes, (src_n, wei_n, dst_n), overlap in reversed(loops):
        src_k = _io_k(sizes, float(src_n * overlap), src_k, True, False, b.use_buffer)
        dst_k = _io_k(sizes, float(dst_n), dst_k, False, False, b.use_buffer)
        wei_k = _io_k(sizes, float(wei_n), wei_k, False, True, b.use_buffer)
        src_rp, dst_rp, wei_rp = src_rp * src_n, dst_rp * dst_n, wei_rp * wei_n
    cost = (src_k * src_op * src_rp + dst_k * dst_op * dst_rp + wei_k * wei_op * wei_rp
            + 1000.0 * job * nb_kd * nb_kh)
    cache_eff = p.mb * p.od * p.oh * sp * ic * p.oc / (p.nthr * cost)
    return oc_block_eff * micro * sp_eff * job_eff * ur_eff * cache_eff * brgemm_eff


def _calc_blocks(p: Problem, oc_block: int) -> Blocking:
    """``calc_blocks``: the best of the whole kernel depth / height and one plane / row per batch (the first on a
    tie)."""
    best: Blocking | None = None
    sp = p.oh * p.ow  # iterate_ker_block's L1 fit reads ``sp``; update_blocks makes it od * oh * ow after a call
    for kd_block in dict.fromkeys((p.kd, 1)):
        for kh_block in dict.fromkeys((p.kh, 1)):
            cand = _blocking(p, oc_block, kd_block, kh_block, sp)
            cand = dataclasses.replace(cand, eff=est_eff(p, cand))
            sp = p.od * p.oh * p.ow
            if best is None or cand.eff > best.eff or best.eff == 0:
                best = cand
    assert best is not None
    return best


def _oc_blocks(p: Problem) -> list[int]:
    """``try_exec_type``'s output-channel blocks, largest first: up to four 16-lane blocks, two for a small AMX
    job with output-space blocking, less those ``fast_check_oc_block`` rejects."""
    job = div_up(p.mb * div_up(p.od * p.oh * p.ow, 64) * p.g * div_up(p.oc, 64), p.nthr)
    start = min(div_up(p.oc, _ACC_SIMD), 2 if job < 64 or p.oc < 256 else 4)
    rnd_oc, blocks = round_up(p.oc, _ACC_SIMD), []
    for ocb in range(start, 0, -1):
        block = ocb * _ACC_SIMD
        if block == 64 and not (rnd_oc % 64 == 0 and rnd_oc * _BF16 < 192 * 4):
            continue
        if block == 48 and not (rnd_oc % 48 == 0 and rnd_oc * _BF16 <= 384 * 4
                                and p.id * p.ih * p.iw > 81 * p.sd * p.sh * p.sw):
            continue
        blocks.append(block)
    return blocks


def select_blocking(p: Problem) -> Blocking:
    """``try_exec_type`` on ``exec_trans``: the most efficient of :func:`_oc_blocks` (the first on a tie)."""
    best: Blocking | None = None
    for oc_block in _oc_blocks(p):
        cand = _calc_blocks(p, oc_block)
        if best is None or cand.eff > best.eff:
            best = cand
    assert best is not None
    return best


def _bd_mask(p: Problem, b: Blocking, vm: int, size: int) -> list[int]:
    """``add_brg_descriptor``'s row mask: ``ow`` rows per output row, then ``oskip`` skipped ones."""
    mask: list[int] = []
    i_m = 0
    for _ in range(b.oh_block):
        on = 0 if i_m >= vm else 1
        for _ in range(p.ow):
            if len(mask) < size:
                mask.append(on)
                i_m += on
        mask.extend([0] * min(b.oskip, size - len(mask)))
    return mask + [0] * (size - len(mask))


def tile_buffer(p: Problem, b: Blocking) -> int:
    """``amx_buf_size_per_thread``: the largest kernel's C tiles, rounded past the next page."""
    ms = [b.m] + ([b.m_tail] if b.m_tail and b.m_tail != b.m else [])
    n_tail = p.oc % b.oc_block
    ns = ([b.oc_block] if p.oc >= b.oc_block else []) + ([n_tail] if n_tail and n_tail != b.oc_block else [])
    wsp = 0
    for vm in ms:
        brg_m = b.brg_m if vm == b.m else b.brg_m_tail
        for vn in ns:
            wsp = max(wsp, blocking_tmm(brg_m, vn, b.k or b.k_tail, _bd_mask(p, b, vm, brg_m)).c_tiles() * _TILE)
    return round_up(wsp + 1, _P4K)


def scratchpad(p: Problem, b: Blocking) -> int:
    """``init_scratchpad``: batch elements, the transposed-input buffer and its mask, the accumulation buffer
    (a split kernel height), the AMX tile buffer, each per thread and booked page-aligned."""
    batch = b.kd_block * b.kh_block * p.kw * _BATCH_ELEMENT
    batch = div_up(round_up(batch, _P4K), _BATCH_ELEMENT) * _BATCH_ELEMENT
    ds = _inp_size(p.idp, b.od_block, p.kd, p.sd, p.dd) + max(0, p.f_pad) + max(0, p.back_pad)
    hs = _inp_size(p.ihp, b.oh_block, p.kh, p.sh, p.dh) + max(0, p.t_pad) + max(0, p.b_pad)
    hs = div_up(round_up(hs * p.iwp, b.brg_m), p.iwp) + p.kh * p.dh
    inp = p.kh_koef * ds * hs * p.iwp * p.g * b.lda
    if p.relo == "whi":  # the buffer pointer shifts each output row, and a full zmm is written past the end
        inp += (p.oh - 1) * b.oh_block * p.sh * b.lda + b.lda
    inp = round_up(inp, _P4K)
    relo_wei = 0
    if p.relo:  # the rearranged weights (booked for any relayout)
        rd, rd_koef = (p.kw * p.kh * p.ic, 1) if p.relo == "whi" else (p.kw * p.ic, p.kh)
        non_oc = rd_koef * round_up(rd, _VNNI * (16 if p.rd_padded else 1))
        relo_wei = round_up(p.g * div_up(p.oc, b.oc_block) * b.oc_block * non_oc, 1024) * _BF16
    mask = round_up(div_up(p.od, b.od_block) * div_up(p.oh, b.oh_block) * p.g, _P4K)
    buffer = b.oc_block * b.m * _F32 if b.use_buffer else 0
    return sum(_book(p.nthr * size) for size in (batch, inp * _BF16, mask, buffer, tile_buffer(p, b))) \
        + _book(relo_wei)


def problem(x_shape: tuple[int, ...], w_shape: tuple[int, ...], stride: tuple[int, ...],
            padding: tuple[int, ...], nthr: int, dilation: tuple[int, ...] = (1, 1), groups: int = 1) -> Problem | None:
    """The problem (``trans_dim_koef`` folded) of a 2-D or 3-D bfloat16 forward, dense or grouped, whose
    scratchpad :func:`scratchpad` sizes (``exec_trans`` with output-space blocking and the uker); None for any
    other."""
    (mb, _, *spatial), (oc, ic, *kernel) = x_shape, w_shape
    oc //= groups
    if groups > 1 and ic == oc == 1:
        return None  # depthwise: jit_dw
    three_d = len(spatial) == 3
    (id_, ih, iw), (kd, kh, kw) = (spatial, kernel) if three_d else ((1, *spatial), (1, *kernel))
    (sd, sh, sw), (fp, tp, lp), (dd, dh, dw) = ((stride, padding, dilation) if three_d else
                                                ((1, *stride), (0, *padding), (1, *dilation)))
    od, oh, ow = ((i + 2 * pd - d * (k - 1) - 1) // s + 1
                  for i, pd, k, s, d in zip((id_, ih, iw), (fp, tp, lp), (kd, kh, kw), (sd, sh, sw), (dd, dh, dw)))
    if kd * kh * kw == 1 or od < 1 or oh < 1 or ow < 1 or (ic == oc and ic in (128, 256) and oh == ow == 150):
        return None  # 1x1: init_1x1_conf; the last: two ssd_resnet34 shapes oneDNN sends elsewhere
    p0 = Problem(mb, ic, oc, ih, iw, oh, ow, kh, kw, sh, sw, tp, lp, nthr, dh=dh, dw=dw, g=groups, id=id_, od=od,
                 kd=kd, sd=sd, f_pad=fp, dd=dd, three_d=three_d)
    p = trans_dim_koef(p0)
    if p.od * p.oh * p.ow <= 4 and p.ic <= 512 and p.mb * p.g * p.ic * p.oc <= _L1:
        return None  # "small shape": another kernel
    if three_d and p.ic * p.oc <= 32 and min(p.od, p.oh, p.ow) >= 128:
        return None  # "3d small ic": another kernel
    if p.f_pad >= p.ext_kd or p.t_pad >= p.ext_kh or p.r_pad >= p.ext_kw:
        return None  # init_conf refuses a padding as large as the dilated kernel
    p = _relo(p, p != p0)  # a relayout runs exec_trans
    if (not p.relo and p.l_pad <= 0 and p.r_pad <= 0 and p.ow > 50
            and (p.ic % _VNNI == 0 if p.ic <= _SIMD else p.ic % _SIMD == 0)):
        return None  # exec_base
    if (p.ow >= 256 and not p.relo) or p.iwp >= 10800:
        return None  # no uker
    if not (p.f_pad < p.kd and p.back_pad < p.kd and p.t_pad < p.kh and p.b_pad < p.kh and p.r_pad < p.kw
            and p.l_pad < p.kw):
        return None  # no output-space blocking
    return p


def forward_scratch(x_shape: tuple[int, ...], w_shape: tuple[int, ...], stride: tuple[int, ...],
                    padding: tuple[int, ...], nthr: int, dilation: tuple[int, ...] = (1, 1),
                    nhwc_copies: int | None = None, groups: int = 1) -> int | None:
    """Scratch bytes of ideep's bfloat16 forward on AMX beyond its output, or None where not sized here.

    NCHW sequence: ``[scratchpad, src acdb, weights, dst acdb, -weights, -src, -scratchpad, out, copy, -copy,
    -dst]``: the peak is the kernel's inputs with its destination, or the destination with two output-sized
    copies (one channel in or out: that side's reorder is skipped). On channels-last activations
    (``nhwc_copies``: the bytes of ATen's ``contiguous(channels_last)`` copies of input and weight) the kernel
    writes the output in place: ``[copies, out, scratchpad, weights, -weights, -scratchpad, -copies]``.
    """
    (mb, ic, *spatial), (oc, icg, *kernel) = x_shape, w_shape
    if math.prod(kernel) == 1:
        from nnmem.frontends.pytorch.workspace.conv_bf16_amx_1x1 import forward_scratch_1x1  # imports this module

        sized = forward_scratch_1x1(x_shape, w_shape, stride, padding, nthr, groups)
        if sized is None:
            return None
        pad, wei = sized
    else:
        p = problem(x_shape, w_shape, stride, padding, nthr, dilation, groups)
        if p is None:
            return None
        try:
            b = select_blocking(p)
            pad = scratchpad(p, b)
        except _Unmodelled:
            return None
        ocg = oc // groups
        if p.relo_weights:  # Ohwi16o / Owhi16o, per group
            wei = groups * round_up(ocg, 16) * icg * math.prod(kernel) * _BF16
        else:
            wei = groups * round_up(ocg, b.oc_block) * round_up(icg, _SIMD if p.rd_padded else _VNNI) * _BF16
            wei *= math.prod(kernel)
    out = mb * oc * _BF16
    for i, pd, k, st, d in zip(spatial, padding, kernel, stride, dilation):
        out *= (i + 2 * pd - d * (k - 1) - 1) // st + 1
    if math.prod(kernel) > 1 and pad > 64 * nthr * (mb * ic * math.prod(spatial) * _BF16 + wei + out):
        return None  # init_scratchpad refuses a scratchpad past 64 times the tensors per thread (exec_trans)
    if nhwc_copies is not None:
        return nhwc_copies + pad + wei
    src = 0 if ic == 1 else mb * ic * math.prod(spatial) * _BF16  # one channel: nchw is already acdb, no reorder
    copy = 0 if oc == 1 else out  # likewise the destination: ideep hands it out without a copy
    return max(pad + src + wei, out + copy)
