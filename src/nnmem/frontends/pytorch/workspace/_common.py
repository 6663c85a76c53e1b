"""Helpers the workspace rules share: the op namespace, the note's wording, allocation arithmetic."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path

import torch

aten = torch.ops.aten
NOT_MODELLED = "kernel scratch not modelled; the allocator level may be higher"


def alloc_peak(sequence: Sequence[int]) -> int:
    """Peak of the running sum of signed allocation sizes (frees negative), in bytes."""
    running = peak = 0
    for size in sequence:
        running += size
        peak = max(peak, running)
    return peak


def div_up(value: int, block: int) -> int:
    """How many ``block``s cover ``value`` (oneDNN's ``div_up``)."""
    return -(-value // block)


def round_up(value: int, block: int) -> int:
    """``value`` rounded up to a multiple of ``block``."""
    return -(-value // block) * block


def nbytes(t: torch.Tensor) -> int:
    """Bytes of a tensor's elements."""
    return t.numel() * t.element_size()


def dtype_name(dtype: torch.dtype) -> str:
    """"float16" for ``torch.float16``."""
    return str(dtype).replace("torch.", "")


BOOK_ALIGN, PAGE = 128, 4096  # oneDNN memory_tracking's default alignment; a 4 KiB page (PAGE_4K)


def book(size: int, align: int = BOOK_ALIGN) -> int:
    """Bytes one oneDNN ``registry_t::book`` adds: the size and its alignment (at least 128 B; nothing for size 0)."""
    return size + max(align, BOOK_ALIGN) if size else 0


def barriers(count: int) -> int:
    """``book<simple_barrier::ctx_t>(key, count)``: page-aligned, page-sized contexts."""
    return book(count * PAGE, PAGE)


_CACHE_GUESS = {1: 32 * 1024, 2: 512 * 1024}  # platform::get_per_core_cache_size's guesses when the CPU does not say
_SYS_CPU = Path("/sys/devices/system/cpu")


@cache
def per_core_cache(level: int) -> int:
    """Bytes of data cache at ``level`` per core, as oneDNN reads it (``platform::get_per_core_cache_size``: xbyak's
    cache size over the cores sharing it, SMT threads of one core counted once): cpu0's level-``level`` data or
    unified cache in sysfs over the physical cores in its ``shared_cpu_list``; oneDNN's guess where sysfs does not
    say."""
    try:
        for index in sorted((_SYS_CPU / "cpu0" / "cache").glob("index*")):
            if (index / "level").read_text().strip() != str(level) or \
                    (index / "type").read_text().strip() == "Instruction":
                continue
            size = (index / "size").read_text().strip().upper()
            factor = {"K": 1024, "M": 1024 * 1024}.get(size[-1], 1)
            cores = {_core(cpu) for cpu in _cpu_list((index / "shared_cpu_list").read_text())}
            return int(size.rstrip("KM")) * factor // max(len(cores), 1)
    except (OSError, ValueError):
        pass
    return _CACHE_GUESS[level]


def _cpu_list(text: str) -> list[int]:
    """The CPUs of a sysfs list such as ``0-3,8``."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        cpus += range(int(lo), int(hi or lo) + 1)
    return cpus


def _core(cpu: int) -> tuple[str, str] | int:
    """``(package, core)`` of a CPU from its sysfs topology (the CPU itself where that is not readable)."""
    topology = _SYS_CPU / f"cpu{cpu}" / "topology"
    try:
        return (topology / "physical_package_id").read_text().strip(), (topology / "core_id").read_text().strip()
    except OSError:
        return cpu
