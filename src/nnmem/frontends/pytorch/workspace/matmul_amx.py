"""The bfloat16 brgemm matmul scratchpad on ``brg_matmul:avx512_core_amx`` (AMX tiles), ported from oneDNN v3.12.

Follows src/cpu/x64/matmul/brgemm_matmul_utils.cpp (``compute_blocking_heuristic``'s AMX branch,
``init_brgemm_matmul_conf``, ``init_aux_values``, ``init_scratchpad``), amx_blocking_heuristics.cpp (the
``matmul_amx_blocking_params_macro_t`` grid heuristic for a plain src, ``..._micro_t`` otherwise),
src/cpu/x64/brgemm/brgemm_utils.cpp (``brgemm_blocking_tmm``: the C tiles behind ``get_wsp_buffer_size``) and
brgemm_matmul.cpp (``pd_t::init``: one brgemm kernel per M / N / K tail). The heuristics read the cache
geometry (``platform::get_per_core_cache_size``): the AMX Xeons (Sapphire, Emerald, Granite Rapids) have a
48 KiB L1d and a 2 MiB 16-way L2 of 2048 sets per core, the values used here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from nnmem.frontends.pytorch.workspace._common import div_up, round_up
from nnmem.frontends.pytorch.workspace.brgemm_tmm import blocking_tmm
from nnmem.frontends.pytorch.workspace.matmul_amx_macro import (
    _BF16,
    _F,
    _F32,
    _L2_THR,
    _TILE,
    _WEI_K_BLK,
    _is_pow2,
    _macro,
)


@dataclass(frozen=True, slots=True)
class Amx:
    """The brgemm matmul configuration the scratchpad depends on (a subset of ``brgemm_matmul_conf_t``)."""

    nthr: int
    m_blk: int
    m_chunk: int
    n_blk: int
    n_chunk: int
    k_blk: int
    k_chunk: int
    bs: int  # brgemm_batch_size
    nthr_k: int
    lda: int
    buf_a: bool
    buf_c: bool
    extendable_k: bool
    fused_copy_a: bool
    prefetch: bool  # need_prefetch_a || need_prefetch_b: the prefetching kernels exist


def _unordered_set_order(values: list[int]) -> list[int]:
    """Iteration order of a libstdc++ ``std::unordered_set<int>`` filled in this order (identity hash, 13
    buckets from the first insert on, no rehash below 14 elements): a new value goes first in its bucket's run,
    or first in the list when its bucket is empty."""
    order: list[int] = []
    for v in values:
        if v in order:
            continue
        same = [i for i, o in enumerate(order) if o % 13 == v % 13]
        order.insert(same[0] if same else 0, v)
    return order


class _Micro:
    """``matmul_amx_blocking_params_micro_t`` (bf16, ``nthr_k`` 1: ``max_nthr_k`` is 1 below 16 threads)."""

    def __init__(self, m: int, k: int, n: int, batch: int, nthr: int, buf_a: bool, plain_lda: int) -> None:
        self.M, self.K, self.N, self.batch, self.nthr = m, k, n, batch, nthr
        self.use_buffer_a, self.plain_lda = buf_a, plain_lda
        self.big_pow2 = not buf_a and _is_pow2(k) and k >= 8192 // _BF16  # lda_big_pow2 (transposed A copies)
        self.buf_a, self.buf_c, self.extendable_k = buf_a, False, False
        self.m_blk = self.m_chunk = self.n_blk = self.n_chunk = self.k_blk = self.bs = 0
        self.k_chunk, self.k_elems, self.lda, self.mem = 1, 0, 0, 0
        self.score = _F(0)

    def actual_lda(self) -> int:
        if not self.buf_a:
            return self.plain_lda
        lda = round_up(self.k_blk, 64 // _BF16)
        return lda + 64 // _BF16 if lda >= 512 and _is_pow2(lda) else lda

    def chunk_memory(self) -> int:
        self.k_elems = self.k_blk * self.k_chunk * self.bs
        self.lda = self.actual_lda()
        self.buf_c = self.k_elems < self.K or self.K % self.k_blk > 0  # bf16 dst != f32 accumulator
        m_el, n_el = self.m_blk * self.m_chunk, self.n_blk * self.n_chunk
        a_buf = _BF16 * self.lda * self.bs * m_el if self.buf_a else 0
        c_buf = _F32 * m_el * n_el if self.buf_c else 0
        return (_BF16 * self.k_elems * m_el + a_buf + _BF16 * self.k_elems * n_el + _BF16 * self.n_blk * self.k_elems
                + _BF16 * m_el * n_el + c_buf)

    def set_blocking(self, n_blk: int, n_chunk: int, m_blk: int, m_chunk: int) -> None:
        self.n_blk, self.n_chunk, self.m_blk, self.m_chunk = n_blk, n_chunk, m_blk, m_chunk
        K = self.K
        if K < _WEI_K_BLK:
            self.k_blk, self.bs = round_up(K, 2), 1
        else:
            self.k_blk = min(round_up(K, 2), _WEI_K_BLK)
            num_k_blk = div_up(K, self.k_blk)
            self.bs = num_k_blk
            chunk = self.chunk_memory()
            div_min, div_max = chunk // _L2_THR, div_up(chunk, _L2_THR)
            if div_min > (2 if self.big_pow2 else 0) and self.bs > 1:
                kc1, kc2 = max(self.bs // div_min, 1), div_up(self.bs, div_max)
                tail1, tail2 = num_k_blk % kc1, num_k_blk % kc2
                self.bs = kc2 if (not (tail1 == 0 or tail2 < tail1) or tail2 == 0) else kc1
            self.k_elems = self.k_blk * self.bs * self.k_chunk
            brg_k, tail = self.k_blk * self.bs, K % self.k_blk
            self.extendable_k = K % _WEI_K_BLK != 0 and brg_k > _WEI_K_BLK and not self.use_buffer_a and self.lda == K
            if self.extendable_k:
                self.k_blk, self.k_chunk, self.bs = min(brg_k, K), 1, 1
            elif tail == 0 and K % brg_k == 0:
                self.k_blk, self.bs = brg_k, 1
            elif brg_k + tail == K:
                self.k_blk, self.bs = brg_k, 2
        self.buf_a = self.use_buffer_a or (not self.extendable_k and K % 2 != 0)
        self.mem = self.chunk_memory()
        self.score = self.scores()

    def scores(self) -> np.float32:
        """``calculate_blocking_scores``: thread balance, L2 use and copied-data reuse, in float32."""
        f = _F
        if 0 in (self.n_blk, self.n_chunk, self.m_blk, self.m_chunk, self.k_blk, self.bs):
            return f(0)
        m_el, n_el = self.m_blk * self.m_chunk, self.n_blk * self.n_chunk
        coeff = f(min(self.nthr, 100))
        balance, cache = (coeff - f(1)) / coeff, f(1) / coeff
        l2 = f(1) - abs(f(_L2_THR) - f(self.mem)) / f(max(_L2_THR, self.mem))
        c_m = min(f(m_el) / f(min(self.M, 256)), f(1))
        c_n = min(f(n_el) / f(min(self.N, 64 * (4 if self.buf_a else 1))), f(1))
        reuse = f(0.5) * (c_m + c_n)
        s = cache * l2 + f(1) * reuse
        if balance > 0:
            chunks = self.batch * div_up(self.M, m_el) * div_up(self.N, n_el)
            mnb = (f(self.batch) * (f(self.M) / f(m_el)) * (f(self.N) / f(n_el)) / f(round_up(chunks, self.nthr))
                   * f(self.nthr))
            s = s + balance * (mnb * f(1) / f(self.nthr))
        return f(s / (f(1) + balance + cache))

    def copy(self) -> _Micro:
        other = _Micro.__new__(_Micro)
        other.__dict__.update(self.__dict__)
        return other


def _micro(m: int, k: int, n: int, batch: int, nthr: int, n_blk0: int, buf_a: bool, plain_lda: int) -> _Micro | None:
    """``matmul_amx_blocking_params_micro_t::find_best_blocking`` from ``compute_blocking_heuristic``'s M block
    candidate (13-16 tile rows times 2-4, else min(M, 64))."""
    m_blk0 = next((s * r for r in range(16, 12, -1) for s in range(4, 1, -1) if m % (s * r) == 0), min(m, 64))
    best, cur = _Micro(m, k, n, batch, nthr, buf_a, plain_lda), None
    cur = best.copy()
    num_m, num_n = div_up(m, m_blk0), div_up(n, n_blk0)
    work = batch * num_m * num_n
    low = float(np.float32(work)) < 1.5 * nthr
    min_m = div_up(m_blk0, 2) if low and m_blk0 > 32 else m_blk0
    want_m, want_n = min(4, num_m), min(6 if work > 16 * nthr else 4, num_n)
    cands, blk = [], m_blk0
    while blk >= min_m:
        cands.append(blk)
        blk = div_up(blk, 2) if blk > 1 else blk - 1
    if m > 16:
        cands += list(range(min(m // 16 * 16, 64), round_up(min_m, 16) - 1, -16))
    if len(set(cands)) >= 13:
        return None
    no_skip = m == 4 and (n, k) in ((4096, 4096), (11008, 4096), (4096, 11008))
    found = False
    for m_blk in _unordered_set_order(cands):
        for n_ch in range(want_n, 0, -1):
            for m_ch in range(want_m, 0, -1):
                cur.set_blocking(n_blk0, n_ch, m_blk, m_ch)
                chunks = batch * div_up(m, m_blk * m_ch) * div_up(n, n_blk0 * n_ch)
                if chunks < nthr * 3 and chunks % nthr != 0 and not no_skip:
                    continue
                if cur.score > best.score:
                    best, found = cur.copy(), True
    if not found:
        cur.set_blocking(n_blk0, 1, min_m, 1)
        if cur.score > best.score:
            best = cur.copy()
    return best if best.score != 0 else None


def _conf(m: int, k: int, n: int, batch: int, a_transposed: bool, b_transposed: bool, nthr: int
          ) -> tuple[Amx, int] | None:
    """The AMX configuration and ``wei_n_blk`` (``compute_blocking_heuristic``), None on a blocking failure."""
    plain_tag = not (a_transposed or m == 1)  # a [1, K] src takes the transposed tag (matmul_helper_t::transA)
    transposed_a = a_transposed and m != 1  # treat_A_as_plain
    wei_n_blk = 32 if plain_tag else 64  # get_default_n_block: 32 where the macro heuristic is supported
    if plain_tag:
        mac = _macro(m, k, n, batch, nthr, b_transposed)
        if mac is not None:
            conf = Amx(mac.nthr_, mac.m_blk, mac.m_chunk, mac.n_blk, mac.n_chunk, mac.k_blk, mac.k_chunk, 1,
                       mac.nthr_k, k, False, mac.buf_c, mac.extendable_k, mac.fused,
                       mac.need_prefetch_a or mac.need_prefetch_b)
            return conf, wei_n_blk
    prefer_copy_a = not transposed_a and _is_pow2(k) and k >= 8192 // _BF16 and m >= 1024
    mic = _micro(m, k, n, batch, nthr, min(wei_n_blk, n), transposed_a or prefer_copy_a, k)
    if mic is None:
        return None
    return Amx(nthr, mic.m_blk, mic.m_chunk, mic.n_blk, mic.n_chunk, mic.k_blk, mic.k_chunk, mic.bs, 1, mic.lda,
               mic.buf_a, mic.buf_c, mic.extendable_k, False, False), wei_n_blk


def _kernel_wsp(vm: int, vn: int, vk: int, bs: int, conf: Amx) -> int | None:
    """``get_wsp_buffer_size`` of one brgemm kernel, or None where ``brgemm_blocking_tmm`` refuses its K."""
    may_extend = conf.extendable_k and (vk % 2 != 0 or (vk > 32 and vk % 32 != 0))  # amx_may_extend_k
    if may_extend:
        rd_block = min(round_up(vk, 2), 32)
    elif conf.fused_copy_a:
        rd_block = 32
    else:
        rd_block = next((i for i in range(32, 0, -2) if vk % i == 0), 2)
    rdb, rdb_tail = vk // rd_block, vk % rd_block
    if not (may_extend or conf.fused_copy_a) and ((rdb > 0 and rdb_tail) or rdb_tail % 2):
        return None
    wsp = blocking_tmm(vm, vn, vk, None).c_tiles() * _TILE + (_TILE if may_extend else 0)
    return wsp + (bs * vm * round_up(vk, 32) * _BF16 if conf.fused_copy_a else 0)


def amx_scratchpad(m: int, k: int, n: int, batch: int, a_transposed: bool, b_transposed: bool, nthr: int,
                   book: Callable[[int], int]) -> int | None:
    """Bytes of the scratchpad a bf16 ``brg_matmul:avx512_core_amx`` primitive books (``init_scratchpad``): per
    thread the brgemm batch elements, the copy of A (transposed or odd-K src), the blocked copy of B, the f32 C
    (where a K block leaves partial sums) and the AMX tile workspace (``key_conv_amx_tile_buffer``). None where
    oneDNN takes another implementation (``VERBOSE_SMALL_SHAPES``, a K tail the tile kernel refuses, a blocking
    failure): the caller sizes ``avx512_core_bf16`` then.

    Args:
        m, k, n, batch: the primitive's shape.
        a_transposed, b_transposed: whether src / weights come with the transposed tag.
        nthr: ``dnnl_get_max_threads``; the macro heuristic may use fewer.
        book: ``registry_t::book`` rounding (:func:`.matmul._book`).
    """
    found = _conf(m, k, n, batch, a_transposed, b_transposed, nthr)
    if found is None:
        return None
    c, wei_n_blk = found
    if 2 * c.m_blk * c.lda <= 126:  # buffer_a_gb_stride: VERBOSE_SMALL_SHAPES, dispatched to VNNI
        return None
    k_elems = c.k_blk * c.k_chunk * c.bs
    k_tail = (k % c.k_blk if c.extendable_k or c.fused_copy_a else round_up(k % c.k_blk, 2)) if k > c.k_blk else 0
    k_chunks = div_up(k, k_elems)
    bs_tail = ((max(k, c.k_blk) - (k_chunks - 1) * k_elems) // c.k_blk) % c.bs
    wsp = 0
    for i_bs in ((0, 1) if bs_tail else (0,)):
        for vm in (c.m_blk, m % c.m_blk):
            for vn in (c.n_blk, n % c.n_blk):
                for is_tail, vk in enumerate((c.k_blk, k_tail) if k_tail else (c.k_blk,)):
                    bs = 1 if is_tail else (bs_tail if i_bs else c.bs)  # get_brg_batchsize
                    if 0 in (vm, vn, vk, bs) or c.lda < vk:
                        continue
                    size = _kernel_wsp(vm, vn, vk, bs, c)
                    if size is None:
                        return None
                    wsp = max(wsp, size)
    ldc = min(32, c.n_blk) if c.buf_c and c.nthr_k <= 1 else n
    chunk = round_up(c.n_blk, ldc) * c.m_blk * _F32 if c.nthr_k == 1 else _F32 * ldc * m
    buf_c = 0 if not c.buf_c else chunk if c.nthr_k > 1 or k_elems >= k else chunk * c.m_chunk * c.n_chunk
    buf_a = c.nthr * _BF16 * c.m_blk * c.lda * c.bs * c.k_chunk * c.m_chunk if c.buf_a else 0
    buf_b = c.nthr * _BF16 * round_up(c.n_blk, wei_n_blk) * round_up(c.k_blk, _WEI_K_BLK) * c.bs * c.k_chunk
    sizes = (c.nthr * 16 * c.bs * 40, buf_a, buf_b, c.nthr * buf_c, c.nthr * wsp)
    return sum(book(s) for s in sizes)

