"""A traced step's peaks on a CUDA device: replay its blocks through the caching-allocator model.

Framework-neutral: it reads a ``Trace`` (blocks with the op that allocated and the op that freed each) and
turns it into the ordered allocation sequence the CUDA caching allocator would see, then replays it with
:func:`nnmem.allocators.cuda_caching.simulate_cuda_caching`. Not validated on a GPU yet: the trace comes from the CPU's
kernels under fake tensors (CUDA kernels may choose other algorithms and workspaces), the CPU kernel-scratch
rules are left out (they describe oneDNN, not cuDNN), and the cache is empty at the start of the step
except for the blocks live before it (in a real steady state earlier steps may leave cached segments).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from nnmem.allocators.cuda_caching import AllocEvent, cublas_workspace_bytes, simulate_cuda_caching
from nnmem.errors import UnsupportedError
from nnmem.trace import Level, Trace

__all__ = ["CudaTarget", "cuda_target", "cuda_events", "cuda_peaks", "without_workspace", "NOT_VALIDATED"]

NOT_VALIDATED = ("CUDA peaks come from nnmem's model of PyTorch's caching allocator over a CPU-traced step; "
                 "not yet validated on a GPU")

# Compute capability assumed for a bare "cuda" device: Ampere (A100), whose cuBLAS workspace is the
# pre-Hopper default. A catalog name gives the real one.
_DEFAULT_CC = (8, 0)


@dataclass(frozen=True, slots=True)
class CudaTarget:
    """The CUDA device a step is estimated for.

    Attributes:
        name: what the user asked for ("cuda" or a catalog name).
        compute_capability: ``(major, minor)``; decides the cuBLAS workspace size.
        usable_bytes: memory the allocator may reserve, in bytes, or ``None`` when unknown ("cuda").
    """

    name: str
    compute_capability: tuple[int, int]
    usable_bytes: int | None


def cuda_target(device: str) -> CudaTarget | None:
    """``None`` for "cpu"; the CUDA target for "cuda", "cuda:N" or a CUDA catalog name.

    Raises:
        ConfigError: an unknown device name (from the catalog lookup, with close matches).
        UnsupportedError: a catalog device that is not a CUDA GPU (TPU, Apple).
    """
    key = device.strip().lower()
    if key == "cpu":
        return None
    if key == "cuda" or (key.startswith("cuda:") and key[5:].isdigit()):
        return CudaTarget(device, _DEFAULT_CC, None)
    from nnmem.devices import get_device

    found = get_device(device)
    if found.kind != "cuda" or found.compute_capability is None:
        raise UnsupportedError(f"device {device!r} is a {found.kind} device: this version estimates CPU and CUDA "
                               "steps only (device='cpu', 'cuda' or a CUDA GPU from `nnmem devices`)")
    return CudaTarget(found.name, found.compute_capability, found.usable_bytes)


def cuda_events(trace: Trace, *, resident_extra: int = 0) -> list[AllocEvent]:
    """The step's allocation sequence in program order.

    Blocks live before the step come first (in block order), then ``resident_extra`` (a library workspace
    allocated by an earlier step, e.g. cuBLAS's), then per op its new blocks and, after it, its frees.
    """
    events = [AllocEvent("alloc", b.id, b.nbytes) for b in trace.blocks if b.alloc_op < 0]
    if resident_extra:
        events.append(AllocEvent("alloc", len(trace.blocks), resident_extra))
    allocs: dict[int, list[int]] = {}
    frees: dict[int, list[int]] = {}
    for b in trace.blocks:
        if b.alloc_op >= 0:
            allocs.setdefault(b.alloc_op, []).append(b.id)
        if b.free_op >= 0:
            frees.setdefault(b.free_op, []).append(b.id)
    for op in trace.ops:
        events += [AllocEvent("alloc", i, trace.blocks[i].nbytes) for i in allocs.get(op.index, ())]
        events += [AllocEvent("free", i) for i in frees.get(op.index, ())]
    return events


def cuda_peaks(trace: Trace, target: CudaTarget, *, uses_cublas: bool,
               expandable_segments: bool = False) -> dict[str, int]:
    """Peaks of the step on ``target`` at the allocator and reserved levels, in bytes.

    The allocator level is ``max_memory_allocated`` (block sizes rounded to 512 B, plus the cuBLAS
    workspace when the step multiplies matrices); reserved is ``max_memory_reserved`` (whole segments).
    Only the trace's blocks are replayed: the ops' CPU kernel scratch (``Op.workspace``) plays no part.
    """
    workspace = cublas_workspace_bytes(target.compute_capability) if uses_cublas else 0
    peaks = simulate_cuda_caching(cuda_events(trace, resident_extra=workspace),
                                  expandable_segments=expandable_segments)
    return {Level.ALLOCATOR.value: peaks.allocated_peak, Level.RESERVED.value: peaks.reserved_peak}


def without_workspace(trace: Trace) -> Trace:
    """The trace with the CPU kernels' scratch removed (those rules describe oneDNN, not CUDA libraries)."""
    return replace(trace, ops=tuple(replace(op, workspace=0) for op in trace.ops))
