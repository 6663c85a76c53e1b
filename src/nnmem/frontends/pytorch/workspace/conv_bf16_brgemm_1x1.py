"""The scratchpad of an unpadded 1x1 bfloat16 channels-last forward on ``brgconv_1x1:avx512_core_bf16``.

Off AMX the kernel reads the source in place (no "reduce to unit stride" buffer): its scratchpad is the per-thread
brgemm batch elements and, where the input channels are split, a float32 accumulation buffer; the reordered weights
pad the output channels to the block ``est_eff_1x1`` picks. Ported from oneDNN v3.12 (the version torch 2.13
bundles), src/cpu/x64/jit_brgemm_conv_utils.cpp: ``init_1x1_conf`` / ``calc_blocks_1x1`` /
``fast_check_oc_block_1x1`` / ``est_eff_1x1`` / ``init_scratchpad``; the rest is :mod:`.conv_bf16_brgemm`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nnmem.frontends.pytorch.workspace._common import div_up, round_up
from nnmem.frontends.pytorch.workspace.conv_bf16_amx import _grid_coverage
from nnmem.frontends.pytorch.workspace.conv_bf16_brgemm import (
    _ACC_SIMD,
    _BATCH_ELEMENT,
    _BF16,
    _F32,
    _MEM_K,
    _P4K,
    _REGS,
    _SIMD,
    _caches,
    _estimate_ur,
    _io_k,
    _saturate,
    _squeeze,
    spatial_blocks,
    vmm_blocking,
)
from nnmem.frontends.pytorch.workspace.conv_bwd_weights import as_float32 as _f32


@dataclass(frozen=True, slots=True)
class OneByOne:
    """A 1x1 forward as ``init_jcp`` sees it: per-group channels, output sizes, whether the spatial block spans rows
    (``is_os_blocking``: unit depth and height strides, a width the stride divides)."""

    mb: int
    ic: int
    oc: int
    g: int
    od: int
    oh: int
    ow: int
    iw: int
    nthr: int
    os_blocking: bool
    ndhwgc: bool  # loop order: the source's plane at least the output channels


def _ic_block(q: OneByOne, oc_block: int, sp_block: int, ur: int) -> int:
    """``select_ic_block`` off AMX for a 1x1 (one kernel tap; ``ur``: the last ``estimate_brgemm_ur``'s)."""
    l2 = _caches()[2]
    nb_simd = div_up(q.ic, _SIMD)
    est_ur = min(sp_block, _estimate_ur(oc_block))
    inp_ur = est_ur if q.os_blocking else min(q.iw, est_ur)  # inp_w(est_ur, 1) with a unit-width kernel
    free = (l2 - ur * oc_block * _BF16) % 2 ** 32  # unsigned arithmetic
    max_blocks = _saturate(1, min(5 * _SIMD, nb_simd), free // ((oc_block + inp_ur) * _BF16 * _SIMD))
    blocks = 1
    for nb_icb in range(min(max_blocks, nb_simd), 0, -1):
        if _f32(nb_simd / round_up(nb_simd, nb_icb)) >= 0.5:
            blocks = nb_icb
            break
    return min(q.ic, blocks * _SIMD)


def _eff(q: OneByOne, ocb: int, spb: int, icb: int, ur: int, adj: int, use_buffer: bool) -> float:
    """``est_eff_1x1`` off AMX."""
    sp = q.od * q.oh * q.ow if q.os_blocking else q.ow
    nb_oc, nb_ic, nb_sp = div_up(q.oc, ocb), div_up(q.ic, icb), div_up(sp, spb)
    micro = adj * ur / ((ur + adj) * _REGS)
    ur_eff = spb / round_up(spb, ur)
    brgemm_eff = _squeeze(ur * (2.0 - min(1.9, ur / spb)) / 64, 0.5)
    sp_amount = nb_sp if q.os_blocking else q.od * q.oh * nb_sp
    job = div_up(q.mb * q.g * nb_oc * sp_amount, q.nthr)
    sp_eff, oc_block_eff = sp / round_up(sp, spb), q.oc / round_up(q.oc, ocb)
    nb_oc_thr = min(nb_oc, div_up(job, 1 if q.ndhwgc else sp_amount))
    nsimd = div_up(min(q.oc, nb_oc_thr * ocb), _SIMD)
    dim_sp = q.g * nb_oc if q.ndhwgc else 1
    nb_sp_thr = min(nb_sp, div_up(job, dim_sp))
    sp_thr = min(sp, nb_sp_thr * spb)
    nb_oh_thr = oh_thr = nb_od_thr = od_thr = 1
    if not q.os_blocking:
        nb_oh_thr = min(q.oh, div_up(job, nb_sp * dim_sp))
        oh_thr = min(q.oh, nb_oh_thr)
        nb_od_thr = min(q.od, div_up(job, q.oh * nb_sp * dim_sp))
        od_thr = min(q.od, nb_od_thr)
    if q.os_blocking:
        max_job = _grid_coverage(job, q.oc, q.g, ocb, sp, spb) if q.ndhwgc else \
            _grid_coverage(job, sp, 1, spb, q.oc, ocb)
    else:
        max_job = _grid_coverage(job, q.oc, q.g, ocb, sp, spb) if q.ndhwgc else \
            _grid_coverage(job, sp, q.od * q.oh, spb, q.oc, ocb)
    job_eff = 1.0 if max_job == 0 else q.mb * q.od * q.oh * q.ow * q.g * q.oc / (max_job * q.nthr)
    obs = ocb * icb
    loops: list[tuple[tuple[int, int, int], tuple[float, float, float], float]] = [
        ((ur * _SIMD, ocb, 0), (1, 1, 1), _ACC_SIMD),  # brgemm: by simd_w
        ((ur * round_up(icb, _SIMD), obs, ur * ocb), (1, div_up(spb, ur), 1), 1),  # by ur in sp_block
        ((spb * icb, obs, spb * ocb), (1, 1, nb_ic), 1),  # by ic chunks
    ]
    wei_op = adj * q.ic
    if q.ndhwgc:  # harness: by oc_block
        loops.append(((spb * round_up(q.ic, _SIMD), ocb * q.ic, spb * ocb), (nb_oc_thr, 1, 1), 1))
        wei_op = nsimd * q.ic
    rnd_oc = _SIMD * (nsimd if q.ndhwgc else adj)
    loops.append(((spb * icb, wei_op * _SIMD, spb * rnd_oc), (1, nb_sp_thr, 1), 1))  # by sp (os) blocks
    if not q.os_blocking:
        loops.append(((sp_thr * round_up(icb, _SIMD), wei_op * _SIMD, sp_thr * rnd_oc), (1, nb_oh_thr, 1), 1))
        loops.append(((oh_thr * sp_thr * round_up(icb, _SIMD), wei_op * _SIMD, oh_thr * sp_thr * rnd_oc),
                      (1, nb_od_thr, 1), 1))
    if not q.ndhwgc:  # harness: by oc_block
        loops.append(((od_thr * oh_thr * round_up(sp_thr * icb, _SIMD), ocb * q.ic, ocb * od_thr * oh_thr * sp_thr),
                      (nb_oc_thr, 1, 1), 1))
    mb_thr = min(q.mb, div_up(job, sp_amount * q.g * nb_oc))
    loops.append(((od_thr * oh_thr * sp_thr * round_up(icb, _SIMD), nsimd * q.ic * _SIMD,
                   nsimd * _SIMD * od_thr * oh_thr * sp_thr), (1, mb_thr, 1), 1))  # by mb
    src_op = mb_thr * od_thr * oh_thr * sp_thr * icb
    dst_op = mb_thr * nsimd * od_thr * oh_thr * sp_thr
    wei_op = nsimd * q.ic
    loops.append(((src_op, wei_op * _SIMD, dst_op * _SIMD), (1, 1, 1), 1))  # bench_iterations
    src_k = dst_k = wei_k = _MEM_K
    src_rp = dst_rp = wei_rp = 1.0
    for sizes, (src_n, wei_n, dst_n), overlap in reversed(loops):
        src_k = _io_k(sizes, float(src_n * overlap), src_k, True, use_buffer)
        dst_k = _io_k(sizes, float(dst_n), dst_k, False, use_buffer)
        wei_k = _io_k(sizes, float(wei_n), wei_k, False, use_buffer)
        src_rp, dst_rp, wei_rp = src_rp * src_n, dst_rp * dst_n, wei_rp * wei_n
    cost = src_k * src_op * src_rp + dst_k * dst_op * dst_rp + wei_k * wei_op * wei_rp + 1000.0 * job * nb_ic
    up_sp = 1 if q.os_blocking else q.od * q.oh
    cache_eff = q.mb * up_sp * sp * q.ic * q.oc / (q.nthr * cost)
    return oc_block_eff * micro * sp_eff * job_eff * ur_eff * cache_eff * brgemm_eff


def _start_block(q: OneByOne, ocb: int) -> int:
    """``calc_blocks_1x1``'s largest spatial block: the threads' share, the output's aliasing on pages."""
    os_ = q.od * q.oh * q.ow
    if not q.os_blocking:
        thr = _saturate(1, q.ow, math.ceil(q.mb * q.g * div_up(q.oc, ocb) * os_ / (_f32(0.9) * q.nthr)))
        return _saturate(1, q.ow, min(thr, os_))
    if 1024 <= _BF16 * q.ic < 4096:
        thr = max(min(16, os_), div_up(os_, div_up(q.nthr, q.mb * div_up(q.oc, ocb))))
    else:
        thr = max(div_up(2048, ocb), div_up(q.mb * q.g * os_, q.nthr))
    aliasing = 1000000 // q.nthr
    oc_all = q.g * q.oc
    if oc_all * os_ * _BF16 % _P4K == 0:
        cur = oc_all
        while aliasing * _BF16 > 400 and cur % 2 == 0 and cur * os_ * _BF16 >= _P4K:
            aliasing //= 2
            cur //= 2
        aliasing += 0 if aliasing % 2 else 1
    aliasing = min(div_up(1001, _BF16), aliasing)
    return _saturate(1, os_, min(thr, os_, aliasing))


def _calc_blocks(q: OneByOne, ocb: int) -> tuple[float, int, bool]:
    """``calc_blocks_1x1``: ``(eff, spatial block, use_buffer)`` of the best spatial block (the first on a tie)."""
    sp = q.od * q.oh * q.ow if q.os_blocking else q.ow
    start = _start_block(q, ocb)
    best: tuple[float, int, bool] | None = None
    ur = 0
    n = ocb if q.oc >= ocb else q.oc % ocb
    for spb in spatial_blocks(sp, start):
        icb = _ic_block(q, ocb, spb, ur)
        blocking = vmm_blocking(spb, n, icb if q.ic >= icb else q.ic % icb, 0)
        assert blocking is not None  # no virtual padding: every broadcast block passes
        ur, adj = blocking
        use_buffer = icb < q.ic
        eff = _eff(q, ocb, spb, icb, ur, adj, use_buffer)
        if best is None or eff > best[0] or best[0] == 0:
            best = (eff, spb, use_buffer)
    assert best is not None
    return best


def scratch_1x1(mb: int, ic: int, oc: int, g: int, out: tuple[int, ...], src: tuple[int, ...],
                stride: tuple[int, ...], nthr: int) -> tuple[int, int]:
    """``(scratchpad in bytes, oc_block)`` of ``brgconv_1x1:avx512_core_bf16`` for per-group channels ``ic`` /
    ``oc``, the output's and the source's spatial sizes ``out`` / ``src`` and the ``stride`` (depth, height,
    width each)."""
    (od, oh, ow), (sd, sh, sw) = out, stride
    q = OneByOne(mb, ic, oc, g, od, oh, ow, src[2], nthr, sd == sh == 1 and src[2] % sw == 0,
                 not math.prod(src) < oc)  # init_1x1_conf: loop_ngcdhw where a source plane is below the weights
    best: tuple[float, int, bool, int] | None = None
    rnd_oc = round_up(oc, _ACC_SIMD)
    for blocks in range(min(div_up(oc, _ACC_SIMD), 4), 0, -1):
        ocb = blocks * _ACC_SIMD
        if ocb == 64 and not (rnd_oc % 64 == 0 and od * oh * ow >= 64 * sd * sh * sw):
            continue
        if ocb == 48 and not _f32(oc / round_up(oc, 48)) >= _f32(0.95):
            continue
        eff, spb, use_buffer = _calc_blocks(q, ocb)
        if best is None or eff > best[0]:
            best = (eff, spb, use_buffer, ocb)
    assert best is not None
    _, spb, use_buffer, ocb = best
    batch = div_up(round_up(_BATCH_ELEMENT, _P4K), _BATCH_ELEMENT) * _BATCH_ELEMENT  # one batch element
    pad = nthr * batch + _P4K
    if use_buffer:
        pad += nthr * ocb * spb * _F32 + _P4K
    return pad, ocb
