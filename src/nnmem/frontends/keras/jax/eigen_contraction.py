"""The scratch of XLA:CPU's own dots and convolutions: Eigen's thread-pool contraction and the oneDNN sgemm under it.

XLA:CPU runs a ``dot`` it does not hand to YNNPACK (``xla/backends/cpu/runtime/dot_lib.h``) and a convolution
outside a YNNPACK fusion (``conv_impl.h``, ``EigenConv2DImpl``: ``extract_image_patches`` then a contraction) as
an Eigen tensor contraction on its intra-op thread pool. jaxlib builds Eigen with ``-mavx`` (8-float packets, no
FMA: ``gebp_traits`` mr 16, nr 4) and with TSL's custom contraction kernel
(``xla/tsl/framework/contraction/eigen_contraction_kernel.h``): its blocking is Eigen's
(``evaluateProductBlockingSizesHeuristic``, from the caches CPUID reports) refined for oneDNN, and each kernel call
is a single-threaded ``dnnl_sgemm`` on a packed block. What a contraction allocates, ported from
``unsupported/Eigen/CXX11/src/Tensor/TensorContractionThreadPool.h`` (``evalProductImpl``):

- on one thread (the cost model's choice, or ``n == 1``): one lhs and one rhs block (``evalGemmPartial``);
- sharded by the inner dimension: a partial result per k block beyond the first, and a block pair per task;
- otherwise (``EvalParallelContext``): every lhs and rhs block of up to two k slices in one buffer
  (``packed_mem_``), thread-local blocks when it parallelizes by the sharding dimension only, and the context;
- per kernel call, oneDNN's sgemm workspace (oneDNN 3.7 ``gemm_driver.cpp``: the AVX2 no-copy kernel's
  ``jit_avx_gemm_f32`` heap workspace, or the copy-based driver's packing buffer).

Eigen takes its blocks with ``aligned_malloc`` (64 B more than asked), oneDNN with ``posix_memalign``. Checked
byte for byte against a malloc log of single jitted ``a.T @ b`` dots and convolutions on an AVX2 CPU (AMD EPYC
Zen 3; docs/backends/keras-jax.md, "Eigen contractions on AVX2"). The sgemm workspace is ported for oneDNN's AVX2
kernels only (:func:`ported`); with AVX-512 the calibrated constant of :mod:`.scratch` stands.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from nnmem.cpu import describe

__all__ = ["Caches", "ContractionScratch", "contraction_scratch", "host_caches", "ported"]

_PACKET = 8
"""Floats per packet: jaxlib's Eigen is compiled for AVX (``Packet8f``)."""
_NR, _MR = 4, 16
"""``gebp_traits<float, float>`` register blocks without FMA: nr 4, mr (16 registers / 2 / nr) x 8."""
_ALIGN = 64
"""``EIGEN_MAX_ALIGN_BYTES``: each packed block is rounded up to it, and ``aligned_malloc`` asks for it more."""
_P = 3
"""``EvalParallelContext::P``: k slices in flight, of which P - 1 hold packed blocks."""
_DOT_CONTEXT = 1_056
"""Bytes of the heap-allocated ``EvalParallelContext`` of a dot (malloc log)."""
_CONV_CONTEXT = 1_360
"""The same for a convolution's image-patch contraction (malloc log)."""
_SYS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")
_EIGEN_DEFAULT_CACHES = (16 * 1024, 512 * 1024, 512 * 1024)
"""Eigen's ``defaultL1CacheSize``, ``defaultL2CacheSize``, ``defaultL3CacheSize`` where CPUID says nothing."""

# TensorCostModel<ThreadPoolDevice> (TensorCostModel.h): cycles.
_LOAD = _STORE = 11 / 64
_STARTUP = _PER_THREAD = 100_000
_TASK = 40_000
# scalar_div_cost<long> and MulCost<long>: the image-patch evaluator's index arithmetic per coefficient.
_PATCH_COMPUTE = 3 * 24 + 6 * 1 + 8 * 1

# oneDNN 3.7, AVX2: the no-copy kernel's workspace, (BK * unroll_m + 64 + unroll_m) floats with BK 256 > its stack
# capacity of (4 * 4096 - 256) / (4 * 16) = 252 (jit_avx_gemm_f32.cpp, sgemm_nocopy_driver).
_NOCOPY_WORKSPACE = 4 * (256 * 16 + 64 + 16)
# gemm_info.cpp, f32 with AVX2: um, un, bm, bn, bk, bk_traditional, blocking_small_k, bn_small_k.
_UM, _UN, _BM, _BN, _BK, _BK_TRADITIONAL, _SMALL_K, _BN_SMALL_K = 24, 4, 10_000, 384, 192, 256, 48, 24
_PAGE = 4096


@dataclass(frozen=True, slots=True)
class Caches:
    """Cache sizes in bytes as Eigen reads them (``queryCacheSizes``: each level's whole size)."""

    l1: int
    l2: int
    l3: int


@dataclass(frozen=True, slots=True)
class ContractionScratch:
    """Bytes a contraction holds beside its operands and result, at both ends of its threads' overlap."""

    high: int
    """Every thread, and the calling one, in a kernel call at once (each with oneDNN's workspace)."""
    low: int
    """One kernel call at a time."""


def ported() -> bool:
    """Whether this process's oneDNN runs the sgemm kernels whose workspace is ported (AVX2, below AVX-512)."""
    info = describe()
    return info.isa_at_least("avx2") and not info.isa_at_least("avx512_core")


@lru_cache(maxsize=1)
def host_caches() -> Caches:
    """L1 data, L2 and L3 sizes of cpu0 from sysfs (what CPUID reports), Eigen's defaults where it says nothing."""
    sizes = dict(enumerate(_EIGEN_DEFAULT_CACHES, start=1))
    try:
        for index in sorted(_SYS_CACHE.glob("index*")):
            level = int((index / "level").read_text())
            if (index / "type").read_text().strip() == "Instruction" or level not in sizes:
                continue
            text = (index / "size").read_text().strip().upper()
            sizes[level] = int(text.rstrip("KMG")) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
    except (OSError, ValueError):
        pass
    return Caches(sizes[1], sizes[2], sizes[3])


def _divup(a: int, b: int) -> int:
    return -(-a // b)


def _usable(request: int) -> int:
    """``malloc_usable_size`` of a glibc block of ``request`` bytes (16 B granules, 8 B header)."""
    return max(24, ((request + 8 + 15) & ~15) - 8)


@dataclass(frozen=True, slots=True)
class _Cost:
    """``TensorOpCost``: bytes loaded, bytes stored, compute cycles."""

    load: float = 0.0
    store: float = 0.0
    compute: float = 0.0

    def __add__(self, other: _Cost) -> _Cost:
        return _Cost(self.load + other.load, self.store + other.store, self.compute + other.compute)

    def scaled(self, factor: float) -> _Cost:
        return _Cost(self.load * factor, self.store * factor, self.compute * factor)

    def compute_only(self) -> _Cost:
        return _Cost(0.0, 0.0, self.compute)

    def total(self, size: float) -> float:
        return size * (_LOAD * self.load + _STORE * self.store + self.compute)


def _vector(load: float, store: float, compute: float) -> _Cost:
    return _Cost(load, store, compute / _PACKET)


@dataclass(frozen=True, slots=True)
class _Problem:
    m: int
    n: int
    k: int
    threads: int
    caches: Caches
    rhs: _Cost  # the right operand's cost per coefficient: a tensor map's load, or an image patch's arithmetic

    def bandwidth(self, by_col: bool, bm: int, bn: int, bk: int) -> float:
        """``computeBandwidth`` without FMA."""
        if bk == 1:
            return 4.0
        return 2.0 if (bn if by_col else bm) < _NR or (bm if by_col else bn) < _MR else 1.0

    def cost(self, m: int, n: int, bm: int, bn: int, bk: int, by_col: bool, prepacked: bool) -> _Cost:
        """``contractionCost`` of an ``m`` x ``n`` output in ``bm`` x ``bn`` x ``bk`` blocks."""
        cost = _vector(0, 0, bk * self.bandwidth(False, bm, bn, bk)) + _vector(0, 4, 0)
        if prepacked:
            return cost
        lhs, rhs = _vector(4, 0, 0).scaled(bk / n), self.rhs.scaled(bk / m)
        return cost + (lhs.compute_only() if by_col else lhs) + (rhs if by_col else rhs.compute_only())

    def blocking(self, threads: int, by_col: bool, k: int | None = None) -> tuple[int, int, int]:
        """(bk, bm, bn): ``TensorContractionBlocking`` of TSL's kernel for ``k`` (default: all of it)."""
        k = self.k if k is None else k
        if by_col:
            kc, mc, nc = _heuristic(k, self.m, self.n, threads, self.caches)
        else:
            kc, nc, mc = _heuristic(k, self.n, self.m, threads, self.caches)
        if kc <= 0 or mc <= 0 or nc <= 0:
            return kc, mc, nc
        mc = min(self.m, _divup(int(mc * 1.5), 48) * 48)
        nc = min(self.n, _divup(nc, 24) * 24)
        return min(k, _divup(k // max(1, _divup(k, kc)), 8) * 8), mc, nc

    def inner_threads(self) -> int:
        """``numThreadsInnerDim``."""
        m, n = self.m, self.n
        cost = _vector(0, 0, self.bandwidth(True, m, n, self.k) * m * n) + _vector(0, 4, 0) + \
            _vector(4, 0, 0).scaled(m).compute_only() + self.rhs.scaled(n)
        parallel = cost.total(self.k)
        reduction = _vector(2, 1, 1).total(m * n)
        best, least = 1, parallel
        for nt in range(2, self.threads + 1, 2):
            total = parallel / nt + 100_000 + nt * (reduction + 3_000)
            if total < least:
                best, least = nt, total
        return best

    def by_inner(self, threads: int, by_k: int) -> bool:
        """``shardByInnerDim``."""
        m, n, k = self.m, self.n, self.k
        if n == 1 or by_k < 2 or by_k < threads or m * n * 4 > self.caches.l3 / by_k or k // by_k < 2 * _NR:
            return False
        return max(m, n) // threads < _NR or (k // by_k > 8 * _NR and (min(m, n) < 2 * _NR or by_k > threads))

    def grain(self, bm: int, bn: int, bk: int, grains: tuple[int, int], old: tuple[int, int], threads: int,
              by_col: bool) -> int:
        """``checkGrain``: 1 take it, 0 skip it, -1 stop."""
        gm, gn = grains
        size = self.cost(bm * gm, bn * gn, bm, bn, bk, by_col, True).total(float(bm) * gm * bn * gn) / _TASK
        if size < 1:
            return 1
        if size > 2:
            return -1
        nm0, nn0 = _divup(self.m, bm), _divup(self.n, bn)

        def parallelism(g: tuple[int, int]) -> float:
            tasks = _divup(nm0, g[0]) * _divup(nn0, g[1])
            return tasks / (_divup(tasks, threads) * threads)
        new = parallelism(grains)
        return 1 if new > parallelism(old) or new == 1 else 0

    def coarsen(self, bm: int, bn: int, bk: int, other: int, threads: int, by_col: bool, rows: bool) -> int:
        """``coarsenM`` (``rows``) or ``coarsenN``: the task grain along one dimension."""
        blocks = _divup(self.m if rows else self.n, bm if rows else bn)
        grain = trial = 1
        count = blocks
        while True:
            while trial <= blocks and count == _divup(blocks, trial):
                trial += 1
            if trial > blocks:
                return grain
            pair, old = ((trial, other), (grain, other)) if rows else ((other, trial), (other, grain))
            verdict = self.grain(bm, bn, bk, pair, old, threads, by_col)
            if verdict < 0:
                return grain
            count = _divup(blocks, trial)
            if verdict > 0:
                grain = trial


def _heuristic(k: int, m: int, n: int, threads: int, caches: Caches) -> tuple[int, int, int]:
    """``evaluateProductBlockingSizesHeuristic<float, float, 1>`` (GeneralBlockPanelKernel.h): (k, m, n) blocks."""
    l1, l2, l3 = caches.l1, caches.l2, caches.l3
    k_div, k_sub = _MR * 4 + _NR * 4, _MR * _NR * 4
    if threads > 1:
        k_cache = max(8, min((l1 - k_sub) // k_div, 320))
        if k_cache < k:
            k = k_cache - k_cache % 8
        n_cache, n_per = (l2 - l1) // (_NR * 4 * k), _divup(n, threads)
        n = n_cache - n_cache % _NR if n_cache <= n_per else min(n, n_per + _NR - 1 - (n_per + _NR - 1) % _NR)
        if l3 > l2:
            m_cache, m_per = (l3 - l2) // (4 * k * threads), _divup(m, threads)
            m = m_cache - m_cache % _MR if _MR <= m_cache < m_per else \
                min(m, m_per + _MR - 1 - (m_per + _MR - 1) % _MR)
        return k, m, n
    if max(k, m, n) < 48:
        return k, m, n
    max_kc = max(((l1 - k_sub) // k_div) & ~7, 1)
    old_k = k
    if k > max_kc:
        k = max_kc if k % max_kc == 0 else max_kc - 8 * ((max_kc - 1 - k % max_kc) // (8 * (k // max_kc + 1)))
    actual_l2 = 1_572_864
    remaining_l1 = l1 - k_sub - m * k * 4
    max_nc = remaining_l1 // (k * 4) if remaining_l1 >= _NR * 4 * k else (3 * actual_l2) // (4 * max_kc * 4)
    nc = min(actual_l2 // (2 * k * 4), max_nc) & ~(_NR - 1)
    if n > nc:
        n = nc if n % nc == 0 else nc - _NR * ((nc - n % nc) // (_NR * (n // nc + 1)))
    elif old_k == k:
        problem, actual_lm, max_mc = k * n * 4, actual_l2, m
        if problem <= 1024:
            actual_lm = l1
        elif l3 != 0 and problem <= 32768:
            actual_lm, max_mc = l2, min(576, max_mc)
        mc = min(actual_lm // (3 * k * 4), max_mc)
        if mc > _MR:
            mc -= mc % _MR
        elif mc == 0:
            return k, m, n
        m = mc if m % mc == 0 else mc - _MR * ((mc - m % mc) // (_MR * (m // mc + 1)))
    return k, m, n


def _shard_by_col(m: int, n: int, threads: int) -> bool:
    """``shardByCol``."""
    if m // threads >= _NR and (n // threads < _NR or (n // threads < 4 * _NR and n % (threads * _NR) != 0 and
                                                       (m % (threads * _NR) == 0 or m // n >= 6))):
        return False
    return not (n // threads < 16 * _NR and m > n * 32)


def _blocks(bm: int, bk: int, bn: int) -> tuple[int, int]:
    """``ComputeLhsRhsBlockSizes``: bytes of one lhs and one rhs block, each rounded up to the alignment."""
    return _divup(bm * bk * 4, _ALIGN) * _ALIGN, _divup(bn * bk * 4, _ALIGN) * _ALIGN


def _sgemm_workspace(rows: int, cols: int, depth: int) -> int:
    """Bytes oneDNN's AVX2 ``dnnl_sgemm('N', 'N')`` allocates for one Eigen kernel call of ``rows`` x ``depth`` by
    ``depth`` x ``cols`` (column-major, as ``gemm_driver`` sees it; one thread: ``nocopy_checker_avx2`` picks the
    no-copy kernel or the copy-based ``gemm_kernel_driver``); 0 for a matrix-vector product (``jump_to_gemv``)."""
    m, n, k = rows, cols, depth
    if min(m, n, k) <= 0 or m == 1 or n == 1:
        return 0
    nocopy = 1.0 / m + 1.0 / n >= 0.0038
    if not nocopy and not (m <= 378 and n <= 378 and k >= 378) and not (m >= 378 and k >= 378):
        nocopy = (m <= 128 and n <= 128) or n <= 16 or k <= 2 or (m <= 64 and n >= 16)
    if nocopy:
        return _NOCOPY_WORKSPACE
    k_padd = max(128, k) if k <= _BK_TRADITIONAL else (k + 1) // 2 if k < 2 * _BK else _BK
    m_padd = _divup(min(max(m, _UM), _BM), _UM) * _UM
    n_padd = _divup(min(max(n, _UN), _BN_SMALL_K if k < _SMALL_K else _BN), _UN) * _UN
    return 4 * (m_padd * k_padd + k_padd * n_padd + _UM + n_padd) + 4 * _PAGE


def _calls(m: int, n: int, bm: int, bn: int, bk: int) -> list[int]:
    """The sgemm workspace of each kernel call of one k slice, largest first."""
    return sorted((_sgemm_workspace(min(bm, m - i), min(bn, n - j), bk)
                   for i in range(0, m, bm) for j in range(0, n, bn)), reverse=True)


def _held(base: int, workspaces: list[int], threads: int) -> ContractionScratch:
    high = base + sum(_usable(w) for w in workspaces[:threads + 1] if w)
    low = base + (_usable(workspaces[0]) if workspaces and workspaces[0] else 0)
    return ContractionScratch(high, low)


def contraction_scratch(m: int, n: int, k: int, *, threads: int, caches: Caches,
                        patches: bool = False) -> ContractionScratch:
    """Scratch of one Eigen contraction of an ``m`` x ``k`` by ``k`` x ``n`` product in Eigen's column-major terms
    (a row-major dot's output columns are ``m``), on a pool of ``threads``; ``patches``: the right operand is a
    convolution's image patches (their index arithmetic enters the cost model)."""
    rhs = _Cost(4, 0, _PATCH_COMPUTE / _PACKET) if patches else _vector(4, 0, 0)
    problem = _Problem(m, n, k, threads, caches, rhs)
    by_col = _shard_by_col(m, n, 2)
    bk, bm, bn = problem.blocking(2, by_col)
    chosen = max(1, min(threads, int((problem.cost(m, n, bm, bn, bk, by_col, False).total(float(n) * m) - _STARTUP)
                                     / _PER_THREAD + 0.9)))
    by_k = problem.inner_threads()
    if problem.by_inner(chosen, by_k):
        size = min(k, max(12 * _PACKET, _divup(_divup(k, by_k), 8) * 8))
        count = _divup(k, size)
        partials = (count - 1) * _usable(m * n * 4 + _ALIGN)
        tasks = []
        for start in range(0, k, size):
            kc, mc, nc = problem.blocking(count, True, min(size, k - start))
            lhs, rhs_bytes = _blocks(min(m, mc), kc, min(n, nc))
            work = _calls(m, n, min(m, mc), min(n, nc), kc)
            tasks.append(_usable(lhs + rhs_bytes + _ALIGN) + (_usable(work[0]) if work[0] else 0))
        tasks.sort(reverse=True)
        return ContractionScratch(partials + sum(tasks[:threads + 1]), partials + tasks[0])
    if n == 1 or chosen == 1:
        kc, mc, nc = problem.blocking(1, True)
        lhs, rhs_bytes = _blocks(min(m, mc), kc, min(n, nc))
        work = _calls(m, n, min(m, mc), min(n, nc), kc)
        return _held(_usable(lhs + rhs_bytes + _ALIGN), work[:1], 0)
    by_col = _shard_by_col(m, n, chosen)
    bk, bm, bn = problem.blocking(chosen, by_col)
    nm0, nn0, nk = _divup(m, bm), _divup(n, bn), _divup(k, bk)
    if by_col:
        gm = problem.coarsen(bm, bn, bk, 1, chosen, by_col, rows=True)
        gn = problem.coarsen(bm, bn, bk, gm, chosen, by_col, rows=False)
    else:
        gn = problem.coarsen(bm, bn, bk, 1, chosen, by_col, rows=False)
        gm = problem.coarsen(bm, bn, bk, gn, chosen, by_col, rows=True)
    pool = threads
    oversharding = 8.0 if pool <= 4 else 4.0 if pool <= 8 else 2.0 if pool <= 16 else 1.0 if pool <= 32 else \
        0.8 if pool <= 64 else 0.6
    lhs, rhs_bytes = _blocks(bm, bk, bn)
    base = _usable((nm0 * lhs + nn0 * rhs_bytes) * min(nk, _P - 1) + _ALIGN) + \
        _usable(_CONV_CONTEXT if patches else _DOT_CONTEXT)
    if (_divup(nn0, gn) if by_col else _divup(nm0, gm)) >= oversharding * pool:  # thread-local blocks too
        base += _usable(pool * (gn * rhs_bytes if by_col else gm * lhs) + _ALIGN)
    return _held(base, _calls(m, n, bm, bn, bk), threads)
