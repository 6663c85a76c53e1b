"""The scratchpad of oneDNN's bfloat16 1x1 convolutions (``jit_bf16_1x1:avx512_core_bf16``), in each direction.

Forward and backward data accumulate into a float32 store buffer per thread (``key_conv_store_wsp``: the
spatial size rounded to the register blocking times the output channels one load group takes); the weights'
gradient reduces float32 partial sums per batch thread and, on small images, transposes the source and the
output gradient per thread; a strided 1x1 gathers its source at unit stride per thread first ("reduce to unit
stride", ``rtus``). Ported from oneDNN 3.12 (the version torch 2.13 bundles): src/cpu/x64/
jit_avx512_core_bf16_1x1_conv_kernel.cpp ``init_conf`` / ``balance`` / ``init_scratchpad`` and
jit_uni_1x1_conv_utils.hpp ``rtus_prepare`` / ``rtus_prepare_space_info`` (``best_divider``: :mod:`.conv_bwd_weights`).
"""

from __future__ import annotations

from dataclasses import dataclass

from nnmem.frontends.pytorch.workspace._common import barriers, book, per_core_cache, round_up
from nnmem.frontends.pytorch.workspace.conv_bwd_weights import _div_up, best_divider
from nnmem.frontends.pytorch.workspace.conv_bwd_weights import as_float32 as _f32

_BLOCK = 16
_BF16, _F32 = 2, 4


def l2_per_core() -> int:
    """Bytes of L2 cache per core (``platform::get_per_core_cache_size(2)``, :func:`._common.per_core_cache`)."""
    return per_core_cache(2)


@dataclass(frozen=True, slots=True)
class OneByOne:
    """A 1x1 convolution as ``init_conf`` sees it after ``rtus_prepare``: channels padded to 16, the
    unit-stride spatial size ``os`` (the output's), whether its source is gathered at unit stride."""

    mb: int
    ic: int
    oc: int
    oc_unpadded: int
    oh: int
    ow: int
    with_bias: bool
    strided: bool


def _ur(spatial: int, os: int, expl_bcast: bool, load_dim: int) -> int:
    """The register blocking ``ur`` of forward and backward data."""
    if expl_bcast:
        max_regs, min_regs = (6, 5) if 128 < load_dim < 256 and 10 < spatial < 28 else (9, 6)
    else:
        max_regs, min_regs = 30, 9
    for ur in range(max_regs, min_regs - 1, -1):
        if (spatial >= 14 and spatial % ur == 0) or (spatial < 14 and os % ur == 0):
            return ur
    ur, tail = min(max_regs, os), os % max_regs
    for i in range(max_regs, min_regs - 1, -1):
        if os % i > tail or os % i == 0:
            ur, tail = i, os % i
            if tail == 0:
                break
    return ur


def _load_groups(c: OneByOne, nthr: int, load_dim: int, reduce_dim: int, bcast_dim: int, ur: int,
                 expl_bcast: bool, l2: int) -> tuple[int, int]:
    """``(load_grp_count, load_blocking)`` of forward and backward data."""
    nb_bcast, nb_load = _div_up(bcast_dim, ur), _div_up(load_dim, _BLOCK)
    load_blocking = load_dim
    load_size, bcast_size = load_dim * reduce_dim, c.mb * bcast_dim * reduce_dim
    if nthr <= 28 and c.mb < nthr and nb_load * nb_bcast > nthr:
        ratio = _f32(load_size / bcast_size)
        best_cost, groups = float("inf"), nthr if ratio > 1 else 1

        def job_cost(lb: int, tg: int, mem_k: float) -> float:
            bb = c.mb * _div_up(nb_bcast, tg)
            calc = _f32(_f32(_f32(bb * ur) * (lb * _BLOCK)) * reduce_dim)
            mem = _f32(_f32(bb * ur + lb * _BLOCK) * reduce_dim)
            return _f32(_f32(0.01 * calc) + _f32(mem_k * mem))

        for i in range(nthr):
            lgc = nthr - i if ratio > 1 else i + 1
            mem_k = 1.0 if _div_up(nthr, lgc) == 1 else _f32(1.3)
            if nthr % lgc < nb_load % lgc:
                cost = job_cost(_div_up(nb_load, lgc), nthr // lgc, mem_k)
            else:
                cost = max(job_cost(_div_up(nb_load, lgc), _div_up(nthr, lgc), mem_k),
                           job_cost(nb_load // lgc, nthr // lgc, mem_k))
            if cost < best_cost:
                groups, best_cost = lgc, cost
        load_blocking = _div_up(nb_load, groups) * _BLOCK
    else:
        groups = _div_up(nthr, c.mb * nb_bcast)
        groups = best_divider(nthr, groups, 2 * groups, False)
    if expl_bcast and bcast_dim <= 64 and load_size >= l2 // _BF16:
        groups = max(groups, 4)
    elif bcast_dim <= 49 and c.mb <= nthr and load_dim > 512 and load_dim // reduce_dim >= 4:
        groups, load_blocking = max(groups, 2), _BLOCK
    return groups, load_blocking


def fwd_or_bwd_data(c: OneByOne, nthreads: int, backward_data: bool, l2: int | None = None) -> int:
    """Bytes of the forward (or backward-data) scratchpad: the padded bias (forward), the float32 store
    buffer, the unit-stride source (or its gradient) per thread."""
    load_dim, reduce_dim = (c.ic, c.oc) if backward_data else (c.oc, c.ic)
    os = bcast_dim = c.oh * c.ow
    expl_bcast = (8 * c.mb) // nthreads >= 1  # reduce_dim is padded to 16: no odd tail
    ur = _ur(c.oh, os, expl_bcast, load_dim)
    groups, load_blocking = _load_groups(c, nthreads, load_dim, reduce_dim, bcast_dim, ur, expl_bcast,
                                         l2 or l2_per_core())
    nb_bcast, nb_load = _div_up(bcast_dim, ur), _div_up(load_dim, _BLOCK)
    nthr = nthreads
    if _BF16 * c.mb * bcast_dim * reduce_dim < 8192 and nthr > 1 and nb_bcast * nb_load < nthr:  # is_adjust_thread
        nthr = min(nthr, max(nb_bcast, nb_load))
    total = 0
    if not backward_data and c.with_bias and c.oc_unpadded % _BLOCK:
        total += book(c.oc * _BF16)
    grp_count = _div_up(nthr, _div_up(nthr, groups))
    per_thread = round_up(_div_up(load_dim, grp_count), _BLOCK)
    total += book(nthr * round_up(bcast_dim, ur) * per_thread * _F32)
    if c.strided:
        factor = _div_up(load_blocking, _BLOCK) if backward_data else _div_up(reduce_dim, _BLOCK)
        total += book(nthr * factor * os * _BLOCK * _BF16)
    return total


def bwd_weights(c: OneByOne, nthreads: int, permw: bool | None = None) -> int:
    """Bytes of the backward-weights scratchpad: the padded bias, one float32 partial sum of the bfloat16
    weights (and bias) per batch thread and its barrier, the transposed output gradient and source per
    thread (images of 14 or fewer rows or columns), the unit-stride source per thread."""
    reduce_dim = c.oh * c.ow
    permw = c.oh > 14 and c.ow > 14 if permw is None else permw  # 3-D: the caller's (uses_permw_transposition)
    if permw:
        block = best_divider(reduce_dim, 7, min(256, reduce_dim), True, 2)
    else:
        block = best_divider(reduce_dim, 8, 16, True, 2)
    if reduce_dim % block:
        block = best_divider(c.ow, 4, c.ow, permw, 2)
    if block > 256:
        block = 1
    if not permw:
        block = round_up(block, 2)
    nb_bcast, nb_load, nb_reduce = c.ic // _BLOCK, c.oc // _BLOCK, _div_up(reduce_dim, block)
    koeff = 4 * max(1, c.oc // c.ic)

    def cost(n_mb: int, n_oc: int, n_ic: int) -> int:
        rows = _div_up(c.mb * nb_reduce, n_mb)
        return (rows * _div_up(nb_bcast, n_ic) * _BLOCK * block + rows * _div_up(nb_load, n_oc) * _BLOCK * block
                + koeff * _div_up(nb_load, n_oc) * _div_up(nb_bcast, n_ic) * _BLOCK * _BLOCK)

    best, pick = cost(1, 1, 1), (1, 1, 1)
    for n_mb in range(1, min(nthreads, c.mb * nb_reduce) + 1):
        par = nthreads // n_mb
        for n_oc in range(1, min(par, nb_load) + 1):
            n_ic = min(par // n_oc, nb_bcast)
            if cost(n_mb, n_oc, n_ic) <= best:
                best, pick = cost(n_mb, n_oc, n_ic), (n_mb, n_oc, n_ic)
    nthr_mb = pick[0]
    if nthreads // 2 < nthr_mb < nthreads:
        nthr_mb = min(c.mb, nthreads)
    nthr = nthr_mb * pick[1] * pick[2]
    load_blocking = best_divider(nb_load, 16, nb_load, False)
    bcast_blocking = best_divider(nb_bcast, 5, nb_bcast, False)
    total = book(c.oc * _BF16) if c.with_bias and c.oc_unpadded % _BLOCK else 0
    total += book((c.oc * c.ic + (c.oc if c.with_bias else 0)) * nthr_mb * _F32)
    if nthr_mb > 1:
        total += barriers(1)
    if not permw:
        total += book(nthr * round_up(reduce_dim, 2) * _BLOCK * load_blocking * _BF16)
        total += book(nthr * round_up(reduce_dim, 2) * _BLOCK * bcast_blocking * _BF16)
    if c.strided:
        total += book(nthr * bcast_blocking * reduce_dim * _BLOCK * _BF16)
    return total
