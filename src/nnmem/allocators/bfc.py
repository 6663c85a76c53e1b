"""TensorFlow's BFC ("best-fit with coalescing") allocator, replayed: the chunk each request is handed.

Rules from ``tensorflow/core/common_runtime/bfc_allocator.h`` and ``bfc_allocator.cc``: requests round up to
256 B; the smallest free chunk that fits serves a request and is split only when it is at least twice the
request or would waste 128 MiB; a freed chunk merges with free neighbours of its region; a new region is added
when nothing fits.
The TensorFlow frontend (``nnmem.frontends.keras.tensorflow``) feeds it the step's buffers to learn the
allocator level. Imports no framework.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence
from copy import copy
from dataclasses import dataclass

__all__ = ["AllocatorState", "BFC_MAX_INTERNAL_FRAGMENTATION", "BFC_MIN_ALLOCATION", "BFC_STEPS", "BFCAllocator",
           "StepBuffers", "bfc_round", "resident_state", "steady_state_chunks"]

BFC_MIN_ALLOCATION = 256
"""bfc_allocator.h: ``kMinAllocationSize = 256``, in bytes; every chunk is a multiple."""

BFC_MAX_INTERNAL_FRAGMENTATION = 128 << 20
"""bfc_allocator.cc, ``BFCAllocator::AllocateRawInternal``: a chunk is also split when handing it out whole would
waste at least this many bytes (``max_internal_fragmentation_bytes``, 128 MiB unless ``fragmentation_fraction``
is set)."""

BFC_FIRST_REGION = 2 << 20
"""bfc_allocator.cc, ``BFCAllocator::BFCAllocator``: with ``allow_growth`` the first region is 2 MiB, in bytes."""

BFC_STEPS = 3
"""Steps :func:`steady_state_chunks` replays; chunk sizes come from the last (the free chunks a step finds are
those the previous step left: 2 warm-up steps and a measured one, as the TensorFlow measurement runs them)."""


def bfc_round(nbytes: int) -> int:
    """Bytes the BFC allocator hands out for a request of ``nbytes``: a multiple of 256, 0 for an empty tensor.

    bfc_allocator.cc, ``BFCAllocator::RoundedBytes``.
    """
    if nbytes <= 0:
        return 0
    return -(-nbytes // BFC_MIN_ALLOCATION) * BFC_MIN_ALLOCATION


class BFCAllocator:
    """TensorFlow's BFC allocator for one device, replayed: which chunk each request gets, and the bytes in use.

    A request is rounded up to 256 B and served by the smallest free chunk that fits (ties: lowest address;
    ``BFCAllocator::FindChunkPtr`` over bins sorted by size, then address); the chunk is split when it is at
    least twice the request or would waste :data:`BFC_MAX_INTERNAL_FRAGMENTATION`, otherwise the whole chunk is
    handed out and counts as in use. Freed
    chunks merge with free neighbours of the same region (``FreeAndMaybeCoalesce``). With no fitting chunk a
    region is added (``Extend``): ``curr_region_allocation_bytes_``, 2 MiB at first with ``allow_growth``,
    doubled until the request fits, and doubled after each extension that did not need doubling, and never more
    than the memory left under the allocator's ``limit``. Without ``allow_growth`` (``growth=False``, a GPU's
    default) the first region is the whole ``limit`` (the constructor's ``curr_region_allocation_bytes_ =
    RoundedBytes(total_memory)``), allocated at the first request. A request that fits nowhere under the limit
    is an OOM in TensorFlow; the replay records it (:attr:`oom`) and adds a region of the request's size so that
    the bytes the step would need can still be counted.

    Args:
        limit: the allocator's ``memory_limit`` in bytes (None: no limit, the CPU allocator's case).
        growth: ``allow_growth``: regions from 2 MiB, doubling; False: one region of ``limit``.

    Example:
        >>> bfc = BFCAllocator()
        >>> bfc.alloc(1_800_000)[1]  # the first 2 MiB region is under twice the request: handed out whole
        2097152
    """

    def __init__(self, limit: int | None = None, *, growth: bool = True) -> None:
        if not growth and limit is None:
            raise ValueError("a BFC allocator without allow_growth needs its memory limit")
        self.chunks: dict[int, list[int]] = {}  # addr -> [size, in_use, region]
        self.ends: dict[int, int] = {}  # end addr -> addr
        self.free: list[tuple[int, int]] = []  # (size, addr), sorted
        first = BFC_FIRST_REGION if limit is None else min(BFC_FIRST_REGION, limit)
        self.region = bfc_round(first if growth or limit is None else limit)
        self.limit = limit
        self.regions = 0
        self.reserved = 0  # bytes of all regions
        self.in_use = 0
        self.oom = False  # a request found no room under the limit

    def copy(self) -> BFCAllocator:
        """An independent copy (a chunk's entry is replaced, never changed in place: shallow copies suffice)."""
        out = copy(self)
        out.chunks, out.ends, out.free = dict(self.chunks), dict(self.ends), list(self.free)
        return out

    def _extend(self, want: int) -> None:
        """``BFCAllocator::Extend``: add a region that serves ``want`` bytes."""
        available = None if self.limit is None else self.limit - self.reserved
        grew = False
        while want > self.region:
            self.region *= 2
            grew = True
        size = self.region if available is None else min(self.region, available)
        if size < want:  # TensorFlow reports an OOM here; the replay goes on in a region of the request's size
            self.oom, size = True, want
        self.regions += 1
        self.reserved += size
        self._add_free(self.regions << 44, size, self.regions)
        if not grew:
            self.region *= 2

    def _add_free(self, addr: int, size: int, region: int) -> None:
        self.chunks[addr] = [size, 0, region]
        self.ends[addr + size] = addr
        insort(self.free, (size, addr))

    def _take_free(self, addr: int) -> tuple[int, int]:
        size, _, region = self.chunks.pop(addr)
        del self.ends[addr + size]
        self.free.pop(bisect_left(self.free, (size, addr)))
        return size, region

    def alloc(self, nbytes: int) -> tuple[int, int]:
        """Serve a request of ``nbytes``; returns (address, chunk bytes)."""
        want = max(BFC_MIN_ALLOCATION, bfc_round(nbytes))
        at = bisect_left(self.free, (want, -1))
        if at == len(self.free):
            self._extend(want)
            at = bisect_left(self.free, (want, -1))
        size, addr = self.free[at]
        size, region = self._take_free(addr)
        if size >= 2 * want or size - want >= BFC_MAX_INTERNAL_FRAGMENTATION:
            self._add_free(addr + want, size - want, region)
            size = want
        self.chunks[addr] = [size, 1, region]
        self.ends[addr + size] = addr
        self.in_use += size
        return addr, size

    def release(self, addr: int) -> None:
        """Free the chunk at ``addr`` and merge it with free neighbours of its region."""
        size, _, region = self.chunks.pop(addr)
        del self.ends[addr + size]
        self.in_use -= size
        nxt = self.chunks.get(addr + size)
        if nxt is not None and not nxt[1] and nxt[2] == region:
            size += self._take_free(addr + size)[0]
        prev = self.ends.get(addr)
        if prev is not None and not self.chunks[prev][1] and self.chunks[prev][2] == region:
            size += self._take_free(prev)[0]
            addr = prev
        self._add_free(addr, size, region)


class StepBuffers:
    """One replayed step's buffers, as the BFC allocator sees them, in the order its requests come.

    Args:
        sizes: bytes of each step block.
        alloc_at: the op index that allocates each step block.
        free_at: the op index after which each step block is freed (-1: after the last op).
        workspace: bytes each op allocates and frees inside itself (0: none), one entry per op.
        adopted: (op index, step block, resident block) where a variable adopts a step block's buffer: the
            resident block's chunk is freed at that op and the step block's chunk stays, as the variable's,
            through the next steps (a BatchNorm's moving statistics, a metric's total: they move every step
            and split the free space the next step's buffers are fitted into).
    """

    def __init__(self, sizes: Sequence[int], alloc_at: Sequence[int], free_at: Sequence[int],
                 workspace: Sequence[int], adopted: Sequence[tuple[int, int, int]] = ()) -> None:
        self.blocks = len(sizes)
        self.ops = len(workspace)
        born: dict[int, list[int]] = {}
        dying: dict[int, list[int]] = {}
        for b, (at, f) in enumerate(zip(alloc_at, free_at)):
            born.setdefault(at, []).append(b)
            dying.setdefault(f if f >= 0 else len(workspace) - 1, []).append(b)
        adopting = {b: r for _, b, r in adopted}
        # (kind, index, bytes): 0 allocates block `index`, 1 is op `index`'s scratch, 2 frees block `index`,
        # 3 frees block `index` into the resident block `bytes` (the variable adopting it)
        self.events: list[tuple[int, int, int]] = []
        for i, scratch in enumerate(workspace):
            self.events += [(0, b, sizes[b]) for b in born.get(i, ())]
            if scratch:
                self.events.append((1, i, scratch))
            self.events += [(2, b, 0) if b not in adopting else (3, b, adopting[b]) for b in dying.get(i, ())]


@dataclass
class AllocatorState:
    """The allocator between steps: its chunks, and where each resident block lives (adopted ones move)."""

    bfc: BFCAllocator
    where: list[int]

    def copy(self) -> AllocatorState:
        """An independent copy, to replay another step from the same free chunks."""
        return AllocatorState(self.bfc.copy(), list(self.where))

    def step(self, step: StepBuffers) -> tuple[list[int], list[int]]:
        """Replay one step; returns (chunk bytes of each step block, of each op's scratch (0: none))."""
        bfc = self.bfc
        chunks = [0] * step.blocks
        scratch_chunks = [0] * step.ops
        addrs = [0] * step.blocks
        for kind, index, nbytes in step.events:
            if kind == 0:
                addrs[index], chunks[index] = bfc.alloc(nbytes)
            elif kind == 1:
                addr, scratch_chunks[index] = bfc.alloc(nbytes)
                bfc.release(addr)
            elif kind == 2:
                bfc.release(addrs[index])
            else:  # the variable now lives in the block's chunk; its previous one is freed
                bfc.release(self.where[nbytes])
                self.where[nbytes] = addrs[index]
        return chunks, scratch_chunks


def resident_state(resident: list[tuple[int, int]], *,
                   bfc: BFCAllocator | None = None) -> tuple[AllocatorState, list[int]]:
    """The allocator after the blocks live before the first step; returns (its state, each block's chunk bytes).

    Args:
        resident: (bytes, temporaries) of each block live before the step, in creation order: a block is
            created after ``temporaries`` buffers of its size (a variable's initializer's), freed after it,
            which leave the holes later requests are fitted into.
        bfc: the allocator, fresh (None: a CPU's, growing from 2 MiB without a limit).
    """
    bfc = BFCAllocator() if bfc is None else bfc
    kept: list[int] = []
    where: list[int] = []
    for nbytes, temporaries in resident:
        held = [bfc.alloc(nbytes)[0] for _ in range(temporaries)]
        addr, chunk = bfc.alloc(nbytes)
        where.append(addr)
        kept.append(chunk)
        for addr in reversed(held):
            bfc.release(addr)
    return AllocatorState(bfc, where), kept


def steady_state_chunks(resident: list[tuple[int, int]], sizes: list[int], alloc_at: list[int],
                        free_at: list[int], workspace: list[int],
                        adopted: Sequence[tuple[int, int, int]] = (), *,
                        bfc: BFCAllocator | None = None) -> tuple[list[int], list[int], list[int]]:
    """The chunk each resident block, each step block and each op's scratch gets in a steady-state step, in bytes.

    The resident blocks (:func:`resident_state`), then :data:`BFC_STEPS` steps of the same buffers
    (:class:`StepBuffers` says what each argument holds); chunk sizes come from the last.

    Returns:
        (chunk bytes of each resident block, of each step block and of each op's scratch (0: none) in the last
        of :data:`BFC_STEPS`): a scratch request under half a free chunk's size gets the whole chunk (a 21.4 MB
        im2col buffer took a 32 MiB chunk), and the allocator's in-use bytes count the chunk.
    """
    state, kept = resident_state(resident, bfc=bfc)
    step = StepBuffers(sizes, alloc_at, free_at, workspace, adopted)
    chunks: list[int] = []
    scratch_chunks: list[int] = []
    for _ in range(BFC_STEPS):
        chunks, scratch_chunks = state.step(step)
    return kept, chunks, scratch_chunks
