"""Allocator models: from tensor bytes to what the framework's allocator hands out and holds.

The CUDA model replays an allocation/free sequence through a Python re-implementation of PyTorch's
``CUDACachingAllocator`` (``c10/cuda/CUDACachingAllocator.cpp``, ``DeviceCachingAllocator``) for one
device and one stream, to predict the ``allocator`` level (``torch.cuda.memory_allocated``) and the
``reserved`` level (``torch.cuda.memory_reserved``). Constants come from ``c10/core/AllocatorConfig.h``.
Not modelled: multiple streams and their events, CUDA graph pools, ``roundup_power2_divisions``,
``garbage_collection_threshold`` (all off by default).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from nnmem.errors import ConfigError
from nnmem.units import format_bytes

__all__ = [
    "MIN_BLOCK_SIZE",
    "SMALL_SIZE",
    "SMALL_BUFFER",
    "LARGE_BUFFER",
    "MIN_LARGE_ALLOC",
    "ROUND_LARGE",
    "AllocEvent",
    "AllocatorPeaks",
    "CudaCachingAllocator",
    "simulate_cuda_caching",
    "round_cuda_size",
    "cuda_segment_size",
    "cpu_allocated",
    "cublas_workspace_bytes",
    "cublaslt_workspace_bytes",
]

_MiB = 2**20
# c10/core/AllocatorConfig.h: "all sizes are rounded to at least 512 bytes" (kMinBlockSize).
MIN_BLOCK_SIZE = 512
# kSmallSize: "largest 'small' allocation is 1 MiB"; requests <= this go to the small pool (get_pool).
SMALL_SIZE = _MiB
# kSmallBuffer: "'small' allocations are packed in 2 MiB blocks".
SMALL_BUFFER = 2 * _MiB
# large_segment_size_ default 20 MiB (kLargeBuffer): segment for requests in (1 MiB, 10 MiB).
LARGE_BUFFER = 20 * _MiB
# kMinLargeAlloc: "allocations between 1 and 10 MiB may use kLargeBuffer".
MIN_LARGE_ALLOC = 10 * _MiB
# kRoundLarge: "round up large allocations to 2 MiB".
ROUND_LARGE = 2 * _MiB
# max_non_split_rounding_size_ default (AllocatorConfig.h: "The default is 20 MiB").
_MAX_NON_SPLIT_ROUNDING = 20 * _MiB
# Expandable segments reserve virtual address space for 9/8 of the GPU (ExpandableSegment ctor:
# "prop.totalGlobalMem + prop.totalGlobalMem / 8"); with no capacity given we assume a 1 TiB device.
_DEFAULT_VIRTUAL_BYTES = 2**40


def round_cuda_size(nbytes: int) -> int:
    """Bytes the caching allocator charges for a request (``round_size``), in bytes.

    ``round_size`` rounds up to a multiple of 512 with a 512-byte minimum; a 0-byte request never reaches
    it (``NativeCachingAllocator::allocate`` skips ``malloc`` when ``size == 0``), so it costs 0.

    Example:
        >>> round_cuda_size(1), round_cuda_size(513), round_cuda_size(0)
        (512, 1024, 0)
    """
    if nbytes <= 0:
        return 0
    return -(-nbytes // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE


def cuda_segment_size(nbytes: int) -> int:
    """Size of the ``cudaMalloc`` the allocator makes when no cached block fits (``get_allocation_size``).

    Args:
        nbytes: the request, in bytes (rounded with :func:`round_cuda_size` first).

    Returns:
        2 MiB for requests <= 1 MiB, 20 MiB below 10 MiB, else the size rounded up to 2 MiB; in bytes.
    """
    size = round_cuda_size(nbytes)
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


def cpu_allocated(nbytes: int) -> int:
    """Bytes c10's CPU allocator reports for a request, in bytes: the request itself, not rounded.

    ``c10/core/impl/alloc_cpu.cpp`` aligns the pointer (64 bytes) but the profiler and MemTracker record
    ``nbytes`` as requested.
    """
    return max(nbytes, 0)


def cublas_workspace_bytes(compute_capability: tuple[int, int]) -> int:
    """Default cuBLAS workspace per (handle, stream), taken from the caching allocator, in bytes.

    ``aten/src/ATen/cuda/CublasHandlePool.cpp`` ``parseChosenWorkspaceSize``: with no
    ``CUBLAS_WORKSPACE_CONFIG``, ``":4096:2:16:8 default, 32MiB for Hopper and Blackwell"`` —
    ``4096 * 8 * 1024`` (32 MiB) when the major version is 9, 10, 11 or 12, else
    ``4096 * 1024 * 2 + 16 * 1024 * 8`` (8 MiB + 128 KiB). Older releases (before 2.3) used 4 MiB.

    Args:
        compute_capability: ``(major, minor)``, e.g. ``(9, 0)`` for H100.
    """
    major = compute_capability[0]
    if major in (9, 10, 11, 12):
        return 4096 * 8 * 1024
    return 4096 * 1024 * 2 + 16 * 1024 * 8


def cublaslt_workspace_bytes() -> int:
    """Default cuBLASLt workspace, in bytes: ``CUBLASLT_WORKSPACE_SIZE`` default 1024 KiB.

    ``CublasHandlePool.cpp`` ``parseCUDABlasLtWorkspaceSize``: "default size in KiB according to #73328".
    """
    return 1024 * 1024


@dataclass(frozen=True, slots=True)
class AllocEvent:
    """One step of an allocation sequence.

    Attributes:
        kind: ``"alloc"`` or ``"free"``.
        block: the caller's id of the tensor storage; a ``free`` names an id allocated before.
        nbytes: requested size for ``alloc``, in bytes; ignored for ``free``.

    Example:
        >>> [AllocEvent("alloc", 0, 4096), AllocEvent("free", 0)][1].nbytes
        0
    """

    kind: Literal["alloc", "free"]
    block: int
    nbytes: int = 0


@dataclass(frozen=True, slots=True)
class AllocatorPeaks:
    """Outcome of replaying a sequence through the caching allocator. Bytes are ints.

    Attributes:
        allocated_peak: ``torch.cuda.max_memory_allocated()``, in bytes.
        reserved_peak: ``torch.cuda.max_memory_reserved()``, in bytes.
        allocated_end: ``torch.cuda.memory_allocated()`` after the last event, in bytes.
        reserved_end: ``torch.cuda.memory_reserved()`` after the last event, in bytes.
        segments: live segments at the end (``cudaMalloc`` blocks, or expandable segments).
        oom: whether a request failed even after cached segments were released.
        oom_event: index of the event that ran out of memory (replay stops there), else ``None``.
    """

    allocated_peak: int
    reserved_peak: int
    allocated_end: int
    reserved_end: int
    segments: int
    oom: bool
    oom_event: int | None = None


class _Segment:
    __slots__ = ("order", "small", "page", "size")

    def __init__(self, order: int, small: bool, page: int, size: int) -> None:
        self.order, self.small, self.page, self.size = order, small, page, size


class _Block:
    """Mutable simulator state (not a value): one block of a segment, as in the C++ ``Block``."""

    __slots__ = ("seg", "offset", "size", "allocated", "mapped", "prev", "next")

    def __init__(self, seg: _Segment, offset: int, size: int, mapped: bool = True) -> None:
        self.seg, self.offset, self.size, self.mapped = seg, offset, size, mapped
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None

    def key(self) -> tuple[int, int, int]:
        # BlockComparatorSizeCounterAddress: (size, registration_counter, ptr).
        return (self.size, self.seg.order, self.offset)

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


class _FreePool:
    """Cached free blocks of one pool ordered by (size, segment, address): ``BlockPool::blocks``."""

    __slots__ = ("keys", "blocks")

    def __init__(self) -> None:
        self.keys: list[tuple[int, int, int]] = []
        self.blocks: dict[tuple[int, int, int], _Block] = {}

    def add(self, b: _Block) -> None:
        k = b.key()
        bisect.insort(self.keys, k)
        self.blocks[k] = b

    def remove(self, b: _Block) -> None:
        k = b.key()
        del self.keys[bisect.bisect_left(self.keys, k)]
        del self.blocks[k]

    def lower_bound(self, size: int) -> int:
        return bisect.bisect_left(self.keys, (size, -1, -1))

    def at(self, i: int) -> _Block:
        return self.blocks[self.keys[i]]


class CudaCachingAllocator:
    """Incremental model of PyTorch's CUDA caching allocator (one device, one stream).

    Args:
        capacity: bytes the allocator may reserve from the device (device memory minus the CUDA context);
            ``None`` for unlimited. A ``cudaMalloc`` beyond it fails, as on a full GPU.
        expandable_segments: model ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``.
        max_split_size: ``max_split_size_mb`` in bytes (must exceed 20 MiB, as the config parser demands);
            ``None`` for the default, unlimited.

    Example:
        >>> a = CudaCachingAllocator()
        >>> a.malloc(0, 1), a.allocated, a.reserved
        (True, 512, 2097152)
    """

    def __init__(
        self,
        *,
        capacity: int | None = None,
        expandable_segments: bool = False,
        max_split_size: int | None = None,
    ) -> None:
        if capacity is not None and capacity <= 0:
            raise ConfigError(
                f"expected capacity as a positive number of bytes or None. Received: {capacity}"
            )
        if max_split_size is not None and max_split_size <= LARGE_BUFFER:
            raise ConfigError(
                f"expected max_split_size above {format_bytes(LARGE_BUFFER)} (PyTorch rejects smaller "
                f"max_split_size_mb). Received: {max_split_size} bytes. Fix: pass None or a larger size."
            )
        self._capacity = capacity
        self._expandable = expandable_segments
        self._max_split = max_split_size if max_split_size is not None else 2**63
        self._virtual = (capacity or _DEFAULT_VIRTUAL_BYTES) * 9 // 8
        self._pools = {True: _FreePool(), False: _FreePool()}  # keyed by "is small pool"
        self._unmapped: set[_Block] = set()
        self._live: dict[int, _Block | None] = {}  # caller id -> block (None for 0-byte requests)
        self._segments: list[_Segment] = []
        self._order = 0
        self.allocated = 0
        self.reserved = 0
        self.allocated_peak = 0
        self.reserved_peak = 0
        self.oom = False

    @property
    def segments(self) -> int:
        """Live segments: ``cudaMalloc`` blocks, or expandable segments."""
        return len(self._segments)

    def peaks(self, oom_event: int | None = None) -> AllocatorPeaks:
        """The current levels and peaks as an :class:`AllocatorPeaks`."""
        return AllocatorPeaks(
            self.allocated_peak,
            self.reserved_peak,
            self.allocated,
            self.reserved,
            self.segments,
            self.oom,
            oom_event,
        )

    def reset_peaks(self) -> None:
        """Set the peaks to the current levels, like ``torch.cuda.reset_peak_memory_stats()``."""
        self.allocated_peak, self.reserved_peak = self.allocated, self.reserved

    def empty_cache(self) -> None:
        """Return every unsplit cached segment to the device, like ``torch.cuda.empty_cache()``."""
        self._release_cached_blocks()

    def malloc(self, block: int, nbytes: int) -> bool:
        """Allocate ``nbytes`` for the caller's storage id ``block``.

        Returns:
            ``True`` if served; ``False`` on out-of-memory (``oom`` is then set; PyTorch would raise).

        Raises:
            ConfigError: ``nbytes`` is negative or ``block`` is already live.
        """
        if nbytes < 0:
            raise ConfigError(f"expected nbytes >= 0 for block {block}. Received: {nbytes}")
        if block in self._live:
            raise ConfigError(
                f"expected a new block id for an alloc. Received: {block}, which is still allocated. "
                "Fix: free it first or use a distinct id per storage."
            )
        if nbytes == 0:  # NativeCachingAllocator::allocate skips malloc for size 0
            self._live[block] = None
            return True
        size = round_cuda_size(nbytes)
        small = size <= SMALL_SIZE
        # Same order as DeviceCachingAllocator::malloc: cached block, new segment, free oversize
        # segments and retry, free all unsplit cached segments and retry.
        found = self._get_free_block(small, size) or self._alloc_block(small, size)
        if found is None and self._release_available_cached_blocks(small, size):
            found = self._alloc_block(small, size)
        if found is None and self._release_cached_blocks():
            found = self._alloc_block(small, size)
        if found is None:
            self.oom = True
            return False
        self._live[block] = self._alloc_found_block(found, size)
        return True

    def free(self, block: int) -> None:
        """Return the storage ``block`` to the cache (merging with free neighbours; nothing is cudaFree'd).

        Raises:
            ConfigError: ``block`` is not allocated.
        """
        if block not in self._live:
            raise ConfigError(
                f"expected the id of an allocated block to free. Received: {block}. "
                "Fix: every free must follow an alloc of the same id."
            )
        b = self._live.pop(block)
        if b is None:
            return
        b.allocated = False
        self.allocated -= b.size
        for neighbour in (b.prev, b.next):
            self._try_merge(b, neighbour)
        self._pools[b.seg.small].add(b)

    # -- internals mirroring DeviceCachingAllocator -------------------------------------------------

    def _bump(self) -> None:
        self.allocated_peak = max(self.allocated_peak, self.allocated)
        self.reserved_peak = max(self.reserved_peak, self.reserved)

    def _get_free_block(self, small: bool, size: int) -> _Block | None:
        """Best fit: the smallest cached block >= size (``get_free_block``)."""
        pool = self._pools[small]
        i = pool.lower_bound(size)
        if i == len(pool.keys):
            return None
        b = pool.at(i)
        if self._expandable:
            # "for the purposes of best fit we consider its size to be the size it can expand to".
            def grow(x: _Block) -> int:
                return x.size + (x.next.size if x.next is not None and not x.next.mapped else 0)

            while i + 1 < len(pool.keys) and grow(pool.at(i + 1)) < grow(b):
                i += 1
                b = pool.at(i)
        if size < self._max_split and b.size >= self._max_split:
            return None  # "Do not return an oversized block for a large request"
        if size >= self._max_split and b.size >= size + _MAX_NON_SPLIT_ROUNDING:
            return None  # "Allow oversized block size to be rounded up but within a limit"
        pool.remove(b)
        return b

    def _alloc_block(self, small: bool, size: int) -> _Block | None:
        """A new segment (``cudaMalloc``) or newly mapped pages (``alloc_block``)."""
        if self._expandable:
            return self._alloc_expandable(small, size)
        alloc_size = cuda_segment_size(size)
        if self._capacity is not None and self.reserved + alloc_size > self._capacity:
            return None
        self._order += 1
        seg = _Segment(self._order, small, alloc_size, alloc_size)
        self._segments.append(seg)
        self.reserved += alloc_size
        self._bump()
        return _Block(seg, 0, alloc_size)

    def _should_split(self, b: _Block, size: int) -> bool:
        remaining = b.size - size
        if b.seg.small or self._expandable:
            return remaining >= MIN_BLOCK_SIZE
        return size < self._max_split and remaining > SMALL_SIZE

    def _alloc_found_block(self, b: _Block, size: int) -> _Block:
        if self._should_split(b, size):
            remaining = b
            b = _Block(remaining.seg, remaining.offset, size)
            b.prev, b.next = remaining.prev, remaining
            if b.prev is not None:
                b.prev.next = b
            remaining.prev = b
            remaining.offset += size
            remaining.size -= size
            self._pools[remaining.seg.small].add(remaining)
        b.allocated = True
        self.allocated += b.size  # stats.allocated_bytes counts block->size, split or not
        self._bump()
        return b

    def _try_merge(self, dst: _Block, src: _Block | None) -> None:
        """Absorb a free neighbour with the same mapped state into ``dst`` (``try_merge_blocks``)."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return
        if src.mapped:
            self._pools[src.seg.small].remove(src)
        else:
            self._unmapped.discard(src)
        if dst.prev is src:
            dst.offset, dst.prev = src.offset, src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size

    def _release_segment(self, b: _Block) -> None:
        self._pools[b.seg.small].remove(b)
        self._segments.remove(b.seg)
        self.reserved -= b.size

    def _release_available_cached_blocks(self, small: bool, size: int) -> bool:
        """With max_split_size set, free oversize cached segments enough for ``size``."""
        if self._max_split == 2**63 or self._expandable:
            return False
        pool, target = self._pools[small], max(size, self._max_split)
        i = pool.lower_bound(target)
        if i < len(pool.keys):
            self._release_segment(pool.at(i))
            return True
        released = 0
        while pool.keys and released < target and pool.keys[-1][0] >= self._max_split:
            b = pool.at(len(pool.keys) - 1)
            released += b.size
            self._release_segment(b)
        return released >= target

    def _release_cached_blocks(self) -> bool:
        """Free all unsplit cached segments (and unmap free expandable pages): ``release_cached_blocks``."""
        for pool in self._pools.values():
            for b in [pool.blocks[k] for k in pool.keys]:
                if self._expandable:
                    self._unmap_block(b)
                elif not b.is_split():
                    self._release_segment(b)
        return True

    # -- expandable segments ("Note [Expandable Segments]") ------------------------------------------

    def _alloc_expandable(self, small: bool, size: int) -> _Block | None:
        """``try_allocate_expandable_block``: map pages at the lowest address that can fit ``size``."""
        cand = self._find_expandable_block(small, size)
        if cand is None:
            return None
        if not cand.mapped and not self._map_block(cand, min(cand.size, size)):
            return None
        while cand.size < size:
            nxt = cand.next
            assert nxt is not None and not nxt.mapped
            if not self._map_block(nxt, min(size - cand.size, nxt.size)):
                return None
            cand = nxt  # it absorbed the free block before it
        self._pools[small].remove(cand)
        return cand

    def _find_expandable_block(self, small: bool, size: int) -> _Block | None:
        def room(b: _Block | None) -> int:
            total = 0
            while b is not None and not b.allocated and total < size:
                total, b = total + b.size, b.next
            return total

        for c in sorted(
            (u for u in self._unmapped if u.seg.small == small), key=lambda u: (u.seg.order, u.offset)
        ):
            if c.prev is not None and not c.prev.allocated:
                c = c.prev
            if room(c) >= size:
                return c
        # 2 MiB pages for the small pool, 20 MiB (large_segment_size) for the large pool.
        page = SMALL_BUFFER if small else LARGE_BUFFER
        pages = -(-self._virtual // page)
        if pages * page < size:
            return None  # "A single allocation cannot span expandable segments"
        self._order += 1
        seg = _Segment(self._order, small, page, pages * page)
        self._segments.append(seg)
        cand = _Block(seg, 0, seg.size, mapped=False)
        self._unmapped.add(cand)
        return cand

    def _map_block(self, b: _Block, size: int) -> bool:
        """Map whole pages covering ``size`` bytes at the start of unmapped ``b`` (``map_block``)."""
        page = b.seg.page
        mapped = -(-size // page) * page
        if self._capacity is not None and self.reserved + mapped > self._capacity:
            return False  # cuMemCreate fails with CUDA_ERROR_OUT_OF_MEMORY
        self._unmapped.discard(b)
        b.mapped = True
        if mapped < b.size:
            rest = _Block(b.seg, b.offset + mapped, b.size - mapped, mapped=False)
            rest.prev, rest.next = b, b.next
            if b.next is not None:
                b.next.prev = rest
            b.next = rest
            self._unmapped.add(rest)
            b.size = mapped
        self._try_merge(b, b.prev)
        self._try_merge(b, b.next)
        self._pools[b.seg.small].add(b)
        self.reserved += mapped
        self._bump()
        return True

    def _unmap_block(self, b: _Block) -> None:
        """Unmap the whole pages inside free block ``b``; drop the segment if all of it is unmapped."""
        page, end_of_b = b.seg.page, b.offset + b.size
        begin, end = -(-b.offset // page) * page, end_of_b // page * page
        if begin >= end:
            return
        pool = self._pools[b.seg.small]
        pool.remove(b)
        for lo, hi, before in ((b.offset, begin, True), (end, end_of_b, False)):
            if hi > lo:  # partial pages stay mapped as free blocks
                part = _Block(b.seg, lo, hi - lo)
                if before:
                    part.prev, part.next = b.prev, b
                    if b.prev is not None:
                        b.prev.next = part
                    b.prev = part
                else:
                    part.prev, part.next = b, b.next
                    if b.next is not None:
                        b.next.prev = part
                    b.next = part
                pool.add(part)
        b.offset, b.size, b.mapped = begin, end - begin, False
        self.reserved -= b.size
        self._try_merge(b, b.prev)
        self._try_merge(b, b.next)
        if b.is_split():
            self._unmapped.add(b)
        else:
            self._segments.remove(b.seg)  # release_expandable_segment


def simulate_cuda_caching(
    events: Iterable[AllocEvent],
    *,
    capacity: int | None = None,
    expandable_segments: bool = False,
    max_split_size: int | None = None,
) -> AllocatorPeaks:
    """Replay an allocation sequence through :class:`CudaCachingAllocator`.

    Args:
        events: the allocations and frees, in program order.
        capacity: bytes the allocator may reserve, or ``None`` for unlimited.
        expandable_segments: model ``expandable_segments:True``.
        max_split_size: ``max_split_size_mb`` in bytes, or ``None`` (unlimited, the default).

    Returns:
        Peaks and end levels; on out-of-memory the replay stops at that event (``oom_event``).

    Raises:
        ConfigError: an event has an unknown kind, frees an unknown id, or re-allocates a live id.

    Example:
        >>> simulate_cuda_caching([AllocEvent("alloc", 0, 11 * 2**20)]).reserved_peak
        12582912
    """
    alloc = CudaCachingAllocator(
        capacity=capacity, expandable_segments=expandable_segments, max_split_size=max_split_size
    )
    for index, event in enumerate(events):
        if event.kind == "alloc":
            if not alloc.malloc(event.block, event.nbytes):
                return alloc.peaks(oom_event=index)
        elif event.kind == "free":
            alloc.free(event.block)
        else:
            raise ConfigError(
                f"expected event kind 'alloc' or 'free'. Received: {event.kind!r} at event {index}."
            )
    return alloc.peaks()
