"""The scratchpad of a channels-last bfloat16 forward with one input channel a group on
``brg_conv_fwd:avx512_core_bf16``: the kernel relays the source out per thread (``exec_trans`` with ``relo_wi`` or
``relo_whi``) and rearranges the weights at run time.

Ported from oneDNN v3.12 (the version torch 2.13 bundles), src/cpu/x64/jit_brgemm_conv_utils.cpp: ``init_conf``'s
``try_relo_wi`` / ``try_relo_whi`` off AMX, ``iterate_ker_block`` / ``select_ic_block`` / ``estimate_brgemm_ur`` on
``exec_trans``, ``init_scratchpad`` (batch elements, the input buffer and its mask, the rearranged weights, the
accumulation buffer) and its limit of 64 times the tensors per thread; the rest is :mod:`.conv_bf16_brgemm`'s.
"""

from __future__ import annotations

import dataclasses
import math

from nnmem.frontends.pytorch.workspace._common import div_up, round_up
from nnmem.frontends.pytorch.workspace.conv_bf16_amx import Problem, _inp_size
from nnmem.frontends.pytorch.workspace.conv_bf16_brgemm import (
    _ACC_SIMD,
    _BATCH_ELEMENT,
    _BF16,
    _F32,
    _P4K,
    _SIMD,
    _VNNI,
    Blocking,
    _caches,
    _saturate,
    est_eff,
    spatial_blocks,
    vmm_blocking,
)
from nnmem.frontends.pytorch.workspace.conv_bwd_weights import as_float32 as _f32

_AMX_H = 16  # brgM rounds to it even off AMX


def relo_problem(p: Problem) -> Problem | None:
    """``try_relo_whi`` (preferred) or ``try_relo_wi`` off AMX for one input channel a group: ``relo_whi`` for a
    2-D kernel taller than 1, undilated, more than 4 outputs wide; ``relo_wi`` for one wider than 1, undilated in
    width, 2-D (the 3-D ones are left out); None where neither applies."""
    if p.ic != 1 or p.three_d:
        return None
    if p.kh > 1 and p.ow > 4 and p.dh == p.dw == 1:
        return dataclasses.replace(p, relo="whi", relo_weights=True)
    if p.kw > 1 and p.dw == 1:
        return dataclasses.replace(p, relo="wi", relo_weights=True)
    return None


def _os_blocking(p: Problem) -> bool:
    """``init_conf``'s output-space blocking on ``exec_trans`` without the uker: paddings inside the kernel, unit
    height stride, one output column or a kernel no wider than its stride."""
    return (p.f_pad < p.kd and p.back_pad < p.kd and p.t_pad < p.kh and p.b_pad < p.kh and p.r_pad < p.kw
            and p.l_pad < p.kw and p.iwp < 10800 and p.sh == 1 and (p.ow == 1 or p.ext_kw <= p.sw))


def _od_oh_block(p: Problem, ic_block: int, oc_block: int) -> tuple[int, int]:
    """``iterate_ker_block`` on ``exec_trans`` off AMX: planes and rows a block fitting half of L2, then the
    threads' share (``relo_whi``: one of each)."""
    if p.relo == "whi":
        return 1, 1
    l2 = _caches()[2]
    w_block = 2 * _BF16 * ic_block * p.iwp + _BF16 * p.ow * oc_block
    other = _BF16 * p.kd * p.kh * p.kw * ic_block * oc_block + _F32 * 2 * _AMX_H * oc_block
    available = min(div_up(l2, 2), 0 if other > l2 else l2 - other)
    od_block, oh_block = 1, p.oh
    if p.idp * p.ihp * w_block > available:
        od_block = _saturate(1, p.od, available // (p.ihp * w_block))
        oh_block = _saturate(1, p.oh, available // w_block) if od_block == 1 else p.oh
    thr_oc = div_up(p.nthr, p.mb * div_up((p.g if p.oc > 32 else 1) * p.oc, oc_block))
    thr_od = div_up(p.od, thr_oc)
    return min(od_block, thr_od), min(oh_block, div_up(p.oh, thr_oc * div_up(p.od, thr_od)))


def _ic_block(p: Problem) -> int:
    """``select_ic_block`` on ``exec_trans`` off AMX for one channel: the channel padded to a VNNI pair (to 16 pairs
    where the relaid reduction passes a zmm)."""
    return min(round_up(p.ic, _VNNI * (_ACC_SIMD if p.rd_padded else 1)), _SIMD)


def _candidate(p: Problem, oc_block: int, kd_block: int, kh_block: int, ow_block: int,
               os_blocking: bool) -> Blocking:
    """One ``iterate_ker_block`` step: ``estimate_brgemm_ur``'s M, N, K and ur for a relaid source."""
    ic_block = _ic_block(p)
    od_block, oh_block = _od_oh_block(p, ic_block, oc_block)
    sp = p.ow * (p.oh if os_blocking else 1)
    spb = ow_block * (oh_block if os_blocking else 1)
    m = spb if sp >= spb else 0
    m_tail = (p.oh * p.ow) % spb if os_blocking else sp % spb
    brg_m = 0
    if os_blocking:
        adj_sh = 1 if p.relo == "whi" else p.sh
        oskip = (0 if p.ow == 1 else (p.ext_kw - 1) // p.sw * adj_sh) + (adj_sh - 1) * p.ow
        brg_m = round_up(m + oskip * (div_up(m, p.ow) - 1), _AMX_H)
    n = oc_block if p.oc >= oc_block else p.oc % oc_block
    k = round_up(p.kh_koef * p.kw * p.ic, _VNNI)  # K is 0 (one channel below the block): its tail
    k = round_up(k, _SIMD) if k > _SIMD else k
    blocking = vmm_blocking(m or m_tail, n, k, 0)
    assert blocking is not None  # no virtual padding: every broadcast block passes
    split = (kd_block, kh_block) != (p.kd, p.kh)
    cand = Blocking(oc_block, kd_block, kh_block, ow_block, ic_block, split, blocking[0], blocking[1],
                    kd_block * kh_block * p.kw, p.kw, od_block=od_block, oh_block=oh_block, os_blocking=os_blocking,
                    brg_m=brg_m)
    return dataclasses.replace(cand, eff=est_eff(p, cand, True))


def select_blocking(p: Problem) -> Blocking:
    """``try_exec_type`` on ``exec_trans`` (``loop_ndhwgc``): the most efficient output-channel block and its
    ``calc_blocks`` kernel and row blocking (the first on a tie)."""
    os_blocking = _os_blocking(p)
    best: Blocking | None = None
    rnd_oc = round_up(p.oc, _ACC_SIMD)
    for ocb in range(min(div_up(p.oc, _ACC_SIMD), 4), 0, -1):
        block = ocb * _ACC_SIMD
        if block == 64 and not (rnd_oc % 64 == 0 and rnd_oc * _BF16 < 192 * 4):
            continue
        if block == 48 and not (rnd_oc % 48 == 0 and rnd_oc * _BF16 <= 384 * 4
                                and p.id * p.ih * p.iw > 81 * p.sd * p.sh * p.sw):
            continue
        thr = _saturate(1, p.ow, math.ceil(p.mb * p.g * div_up(p.oc, block) * p.od * p.oh * p.ow
                                           / (_f32(0.9) * p.nthr)))
        start = p.ow if os_blocking else min(thr, p.ow)
        cand: Blocking | None = None
        for kd_block in dict.fromkeys((p.kd, 1)):
            for kh_block in dict.fromkeys((p.kh, 1)):
                # row blocks: div_up(ow, ns) up to the threads' share; whole rows only on output-space blocking
                for spb in [p.ow] if os_blocking else spatial_blocks(p.ow, start):
                    c = _candidate(p, block, kd_block, kh_block, spb, os_blocking)
                    if cand is None or c.eff > cand.eff or cand.eff == 0:
                        cand = c
        if cand is not None and (best is None or cand.eff > best.eff):
            best = cand
    assert best is not None
    return best


def relo_scratch(p: Problem, x_bytes: int, out_bytes: int) -> tuple[int, int] | None:
    """``(scratchpad, rearranged weights)`` in bytes: ``init_scratchpad`` on ``exec_trans`` with a relayout; None
    where the scratchpad passes 64 times the tensors per thread (``init_scratchpad`` refuses it)."""
    b = select_blocking(p)
    batch = div_up(round_up(b.batch * _BATCH_ELEMENT, _P4K), _BATCH_ELEMENT) * _BATCH_ELEMENT
    lda = p.kh_koef * p.sw * p.ic * (p.ext_kw if p.ow == 1 else 1)
    ds = _inp_size(p.idp, b.od_block, p.kd, p.sd, p.dd) + max(0, p.f_pad) + max(0, p.back_pad)
    hs = _inp_size(p.ihp, b.oh_block, p.kh, p.sh, p.dh) + max(0, p.t_pad) + max(0, p.b_pad)
    if b.os_blocking:
        hs = div_up(round_up(hs * p.iwp, b.brg_m), p.iwp) + p.kh * p.dh
    inp = p.kh_koef * ds * hs * p.iwp * p.g * lda  # one input-channel block
    if p.relo == "whi":  # the buffer pointer shifts each output row, and a full zmm is written past the end
        inp += (p.oh - 1) * b.oh_block * p.sh * lda + lda
    inp = round_up(inp, _P4K)
    nb_ow = 1 if b.os_blocking else div_up(p.ow, b.ow_block)
    mask = round_up(div_up(p.od, b.od_block) * div_up(p.oh, b.oh_block) * nb_ow * p.g, _P4K)
    rd, rd_koef = (p.kw * p.kh * p.ic, 1) if p.relo == "whi" else (p.kw * p.ic, p.kh)
    non_oc = rd_koef * round_up(rd, _VNNI * (16 if p.rd_padded else 1))
    relo_wei = round_up(p.g * div_up(p.oc, b.oc_block) * b.oc_block * non_oc, 1024) * _BF16
    sizes = [p.nthr * batch, p.nthr * inp * _BF16, p.nthr * mask, relo_wei]
    if b.use_buffer:
        sizes.append(p.nthr * b.oc_block * (b.ow_block * (b.oh_block if b.os_blocking else 1)) * _F32)
    pad = sum(size + _P4K for size in sizes if size)
    wei = p.g * round_up(p.oc, 16) * p.kd * p.kh * p.kw * p.ic * _BF16  # Ohwi16o / Owhi16o, per group
    if pad > 64 * p.nthr * (x_bytes + wei + out_bytes):
        return None
    return pad, wei
