"""The scratchpad of a bfloat16 1x1 forward convolution on oneDNN's ``brgconv_1x1:avx512_core_amx`` (AMX tiles).

Ported from oneDNN v3.12 (the version torch 2.13 bundles), src/cpu/x64/jit_brgemm_conv_utils.cpp:
``init_1x1_conf`` (the zero-padded input channels, the loop order, the output-channel blocks),
``brg_blocking_t::calc_blocks_1x1`` / ``estimate_brgemm_ur`` / ``est_eff_1x1`` and ``init_scratchpad``;
jit_brgemm_1x1_conv.cpp ``pd_t::init`` (the kernels behind the tile buffer). A strided source or a padded
channel count runs ``exec_trans`` (the "rtus" relayout buffer); any other ``exec_base``.
"""

from __future__ import annotations

from dataclasses import dataclass

from nnmem.frontends.pytorch.workspace._common import div_up, round_up
from nnmem.frontends.pytorch.workspace.brgemm_tmm import blocking_tmm
from nnmem.frontends.pytorch.workspace.conv_bf16_amx import _grid_coverage, _io_k, _squeeze

_P4K = 4096
_TILE = 1024  # one AMX tile
_BATCH = div_up(round_up(40, _P4K), 40) * 40  # adjusted_batch_size (one element) * sizeof(brgemm_batch_element_t)
_SIMD, _ACC_SIMD, _VNNI, _AMX_H = 32, 16, 2, 16
_BF16 = 2
_L1 = 48 * 1024 * 7 // 8  # init_jcp: 7/8 of L1, 3/4 of L2 (see conv_bf16_amx)
_L2 = 2 * 1024 * 1024 * 3 // 4
_CACHE_LINE = 64


def _book(size: int) -> int:
    """``book(..., P4K)``: the size and a page of alignment (nothing for size 0)."""
    return size + _P4K if size else 0


@dataclass(frozen=True, slots=True)
class Problem1x1:
    """An unpadded 1x1 bfloat16 forward as ``init_1x1_conf`` sees it: ``ic`` / ``oc`` count one group's channels
    (``ic`` zero-padded where it pads)."""

    mb: int
    ic_raw: int
    ic: int
    oc: int
    ih: int
    iw: int
    oh: int
    ow: int
    sh: int
    sw: int
    nthr: int
    g: int = 1
    od: int = 1  # 3-D: output depth, input depth, stride
    id: int = 1
    sd: int = 1

    @property
    def os(self) -> int:
        return self.od * self.oh * self.ow

    @property
    def extendable_k(self) -> bool:
        return self.ic_raw > _SIMD and self.ic_raw % _SIMD != 0

    @property
    def rtus(self) -> bool:
        """``is_rtus``: zero-padded channels, or a stride output-space blocking cannot read in place."""
        return self.ic != self.ic_raw or not (self.sd == self.sh == 1 and self.iw % self.sw == 0)

    @property
    def ngcdhw(self) -> bool:
        """``init_1x1_conf``'s loop order on AMX: ``loop_ngcdhw`` for large weights or one small image."""
        return self.oc * self.ic * _BF16 > 0.75 * _L2 or (self.mb == 1 and self.os < 400)


@dataclass(frozen=True, slots=True)
class Blocking1x1:
    """The blocking ``calc_blocks_1x1`` settles on for one output-channel block."""

    oc_block: int
    sp_block: int
    m: int
    m_tail: int
    eff: float


def _ur(p: Problem1x1, vm: int, vn: int) -> tuple[int, int, int]:
    """``estimate_brgemm_ur``'s non-uker brgemm blocking: ``(ur, ur_block, adj_ocblock)``."""
    t = blocking_tmm(vm, vn, p.ic, None, uker=False)
    return t.bd_block * t.bd_block2, t.bd_block, max(1, t.ld_block2 if t.ldb2 else t.ldb2_tail)


def est_eff_1x1(p: Problem1x1, oc_block: int, sp_block: int) -> float:
    """``brg_blocking_t::est_eff_1x1`` (output-space blocking, one input-channel block, one group)."""
    sp, ic, oc, mb, nthr = p.os, p.ic, p.oc, p.mb, p.nthr
    m, m_tail = (sp_block if sp >= sp_block else 0), sp % sp_block
    ur, ur_block, adj_ocblock = _ur(p, m or m_tail, oc_block if oc >= oc_block else oc % oc_block)
    ur_block_tail = _ur(p, m_tail, oc_block if oc >= oc_block else oc % oc_block)[1] if m and m_tail else 0
    nb = oc_block // _ACC_SIMD
    block2 = min(2, nb)
    ocb_ave = (nb // block2 * block2 + nb % block2) / div_up(nb, block2)
    spb_ave = float(min(2, sp_block // ur_block))
    m_blks = max(m, m_tail) // ur_block
    m_tail_blks = m_tail // ur_block_tail if ur_block_tail > 0 else 0
    if (ic, oc) in ((1024, 2048), (1024, 512), (256, 1024), (512, 1024), (512, 2048)):  # maskrcnn_cond
        amx_fac = float(div_up(m + m_tail, 16) // (m_blks + m_tail_blks))
    else:
        amx_fac = div_up(m + m_tail, 16) / (m_blks + m_tail_blks)
    micro = amx_fac * (ocb_ave * spb_ave) / (ocb_ave + spb_ave)
    ur_eff = sp_block / round_up(sp_block, ur)
    brgemm_eff = _squeeze(ur * (2.0 - min(1.9, ur / sp_block)) / 64, 0.5)
    nb_oc, nb_sp = div_up(oc, oc_block), div_up(sp, sp_block)
    work = mb * p.g * nb_oc * nb_sp
    sp_eff, oc_block_eff = sp / round_up(sp, sp_block), oc / round_up(oc, oc_block)
    job = div_up(work, nthr)
    nb_oc_thr = min(nb_oc, div_up(job, nb_sp if p.ngcdhw else 1))
    nsimd_oc_thr = div_up(min(oc, nb_oc_thr * oc_block), _SIMD)
    nb_sp_thr = min(nb_sp, div_up(job, 1 if p.ngcdhw else p.g * nb_oc))
    sp_thr = min(sp, nb_sp_thr * sp_block)
    # balance211: thread 0 takes div_up(work, nthr)
    max_job = (_grid_coverage(job, sp, 1, sp_block, oc, oc_block) if p.ngcdhw
               else _grid_coverage(job, oc, p.g, oc_block, sp, sp_block))
    job_eff = 1.0 if max_job == 0 else mb * sp * p.g * oc / (max_job * nthr)
    ocb_ic = oc_block * ic
    nb_ur = div_up(sp_block, ur)
    nb_ur_average = (sp // sp_block * nb_ur + div_up(sp % sp_block, ur)) // nb_sp
    rnd_ic = round_up(ic, _SIMD)
    # per loop, innermost first: (src, wei, dst) iteration sizes, (src, wei, dst) repeats, src's overlap
    loops = [
        ((ur * _SIMD, oc_block, 0), (1, 1, 1), _ACC_SIMD),  # brgemm: by simd_w
        ((ur * rnd_ic, ocb_ic, ur * oc_block), (1, nb_ur_average, 1), 1),  # by ur in sp_block
        ((sp_block * ic, ocb_ic, sp_block * oc_block), (1, 1, 1), 1),  # by ic_chunks
    ]
    wei_op = adj_ocblock * ic
    if not p.ngcdhw:  # harness: by oc_block
        loops.append(((sp_block * rnd_ic, oc_block * ic, sp_block * oc_block), (nb_oc_thr, 1, 1), 1))
        wei_op = nsimd_oc_thr * ic
    rnd_oc_for_sp = _SIMD * (adj_ocblock if p.ngcdhw else nsimd_oc_thr)
    loops.append(((sp_block * ic, wei_op * _SIMD, sp_block * rnd_oc_for_sp), (1, nb_sp_thr, 1), 1))  # os_blocks
    if p.ngcdhw:  # harness: by oc_block
        loops.append(((round_up(sp_thr * ic, _SIMD), oc_block * ic, oc_block * sp_thr), (nb_oc_thr, 1, 1), 1))
    mb_thr = min(mb, div_up(job, nb_sp * p.g * nb_oc))
    loops.append(((sp_thr * rnd_ic, nsimd_oc_thr * ic * _SIMD, nsimd_oc_thr * _SIMD * sp_thr), (1, mb_thr, 1), 1))
    src_op, dst_op, wei_op = mb_thr * sp_thr * ic, mb_thr * nsimd_oc_thr * sp_thr, nsimd_oc_thr * ic
    loops.append(((src_op, wei_op * _SIMD, dst_op * _SIMD), (1, 1, 1), 1))  # bench_iterations
    src_k = dst_k = wei_k = 17.0  # mem_k
    src_rp = dst_rp = wei_rp = 1.0
    for sizes, (src_n, wei_n, dst_n), overlap in reversed(loops):
        src_k = _io_k(sizes, float(src_n * overlap), src_k, True, False, False)
        dst_k = _io_k(sizes, float(dst_n), dst_k, False, False, False)
        wei_k = _io_k(sizes, float(wei_n), wei_k, False, True, False)
        src_rp, dst_rp, wei_rp = src_rp * src_n, dst_rp * dst_n, wei_rp * wei_n
    cost = src_k * src_op * src_rp + dst_k * dst_op * dst_rp + wei_k * wei_op * wei_rp + 1000.0 * job
    cache_eff = mb * sp * ic * oc / (nthr * cost)
    return oc_block_eff * micro * sp_eff * job_eff * ur_eff * cache_eff * brgemm_eff


def _start_sp_block(p: Problem1x1, oc_block: int) -> int:
    """``calc_blocks_1x1``'s largest spatial block: by the threads, and against 4 KiB aliasing of the output."""
    os = p.os
    if 1024 <= _BF16 * p.ic < 4096:
        thr = max(min(16, os), div_up(os, div_up(p.nthr, p.mb * div_up(p.oc, oc_block))))
    else:
        thr = max(div_up(2048, oc_block), div_up(p.mb * p.g * os, p.nthr))
    aliasing = 1000000 // p.nthr
    if p.g * p.oc * os * _BF16 % _P4K == 0:  # oc_without_padding: all groups' channels
        cur = p.g * p.oc
        while aliasing * _BF16 > 400 and cur % 2 == 0 and cur * os * _BF16 >= _P4K:
            aliasing //= 2
            cur //= 2
        aliasing += 0 if aliasing % 2 else 1
    aliasing = min(div_up(1001, _BF16), aliasing)
    return max(1, min(os, min(thr, os, aliasing)))


def calc_blocks_1x1(p: Problem1x1, oc_block: int) -> Blocking1x1 | None:
    """``calc_blocks_1x1``: the most efficient spatial block of those fitting whole AMX tiles (the first on a
    tie); None where none fits (oneDNN keeps a zero-efficiency blocking)."""
    sp, start = p.os, _start_sp_block(p, oc_block)
    best: Blocking1x1 | None = None
    prev = 0
    for ns in range(1, sp + 1):
        spb = div_up(sp, ns)
        min_dis, best_w = 16, 16
        min_w = max(1, min(11, sp // 2))
        if spb < min_w:
            break
        for w in range(min(16, sp), min_w - 1, -1):
            dis = (w - spb % w) % w
            if dis < min_dis:
                min_dis, best_w = dis, w
        spb = min(sp, spb // best_w * best_w)
        if spb == prev or spb > start:
            continue
        prev = spb
        eff = est_eff_1x1(p, oc_block, spb)
        if best is None or eff > best.eff or best.eff == 0:
            best = Blocking1x1(oc_block, spb, spb if sp >= spb else 0, sp % spb, eff)
    return best


def select_blocking_1x1(p: Problem1x1) -> Blocking1x1:
    """``init_1x1_conf``: the most efficient of up to four 16-lane output-channel blocks (the first on a tie)."""
    best: Blocking1x1 | None = None
    for ocb in range(min(div_up(p.oc, _ACC_SIMD), 4), 0, -1):
        cand = calc_blocks_1x1(p, ocb * _ACC_SIMD)
        if cand is not None and cand.eff > (0.0 if best is None else best.eff):
            best = cand
    if best is None:
        raise ValueError("no output-channel block")
    return best


def tile_buffer_1x1(p: Problem1x1, b: Blocking1x1) -> int:
    """``amx_buf_size_per_thread``: the largest kernel's C tiles (and a tile for a wary K tail), past a page."""
    small_mb = p.nthr > 1 and p.mb == 1 and p.ic * p.oh <= 28 * 1024 and p.oc * p.oh <= 14 * 1024
    n_tail = p.oc % b.oc_block
    wsp = 0
    for vm in (b.m, b.m_tail):
        for vn in (b.oc_block if p.oc >= b.oc_block else 0, n_tail):
            if vm and vn:
                wsp = max(wsp, blocking_tmm(vm, vn, p.ic, None, uker=not small_mb).c_tiles() * _TILE)
    return round_up(wsp + (_TILE if p.extendable_k else 0) + 1, _P4K)


def problem_1x1(x_shape: tuple[int, ...], w_shape: tuple[int, ...], stride: tuple[int, ...],
                padding: tuple[int, ...], nthr: int, groups: int = 1) -> Problem1x1 | None:
    """The problem of an unpadded 2-D 1x1 bfloat16 forward ``init_1x1_conf`` takes; None for any other."""
    (mb, _, *spatial), (oc, ic, *kernel) = x_shape, w_shape
    oc //= groups
    (id_, ih, iw), (sd, sh, sw) = (spatial, stride) if len(spatial) == 3 else ((1, *spatial), (1, *stride))
    if any(k != 1 for k in kernel) or any(padding):
        return None  # a padded 1x1 is not is_1x1: init_conf
    od, oh, ow = (id_ - 1) // sd + 1, (ih - 1) // sh + 1, (iw - 1) // sw + 1
    if groups > 1 and ic == oc == 1:
        return None  # depthwise: jit_dw
    if od * oh * ow <= 4 and ic <= 512 and mb * groups * ic * oc <= _L1 // 2:
        return None  # "small shape": another kernel
    if ic > _SIMD and ic % 2:
        return None  # an odd extendable K: the estimate's brgemm refuses it
    vnni_block = min(_ACC_SIMD, div_up(ic, _VNNI)) * _VNNI
    padded = ic if ic > _SIMD and ic % _SIMD else round_up(ic, vnni_block) if ic % _VNNI or ic > vnni_block else ic
    return Problem1x1(mb, ic, padded, oc, ih, iw, oh, ow, sh, sw, nthr, groups, od, id_, sd)


def scratchpad_1x1(p: Problem1x1, b: Blocking1x1) -> int:
    """``init_scratchpad``: batch elements, the rtus buffer and its mask (``exec_trans``), the AMX tile buffer,
    each per thread and booked page-aligned."""
    inp = mask = 0
    if p.rtus:
        inp = round_up(p.ic * p.os, _CACHE_LINE) * _BF16
        mask = round_up(div_up(p.os, b.sp_block), _CACHE_LINE)
    return sum(_book(p.nthr * size) for size in (_BATCH, inp, mask, tile_buffer_1x1(p, b)))


def weights_bytes_1x1(p: Problem1x1, b: Blocking1x1) -> int:
    """The reordered weights: output channels padded to the block, input channels to the VNNI pair or to a
    zmm (``is_rd_padded_to_block``)."""
    return p.g * round_up(p.oc, b.oc_block) * round_up(p.ic, _SIMD if p.ic > _SIMD else _VNNI) * _BF16


def forward_scratch_1x1(x_shape: tuple[int, ...], w_shape: tuple[int, ...], stride: tuple[int, ...],
                        padding: tuple[int, ...], nthr: int, groups: int = 1) -> tuple[int, int] | None:
    """``(scratchpad, weights)`` bytes of ideep's 1x1 bfloat16 forward on AMX, or None where not sized here."""
    p = problem_1x1(x_shape, w_shape, stride, padding, nthr, groups)
    if p is None:
        return None
    try:
        b = select_blocking_1x1(p)
    except ValueError:
        return None
    pad, wei = scratchpad_1x1(p, b), weights_bytes_1x1(p, b)
    if p.rtus:  # init_scratchpad refuses a scratchpad past 64 times the tensors per thread
        tensors = p.mb * p.g * (p.ic_raw * p.id * p.ih * p.iw + p.oc * p.os) * _BF16 + wei
        if pad > 64 * p.nthr * tensors:
            return None
    return pad, wei
