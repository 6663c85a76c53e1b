"""Helpers the workspace rules share: the op namespace, the note's wording, allocation arithmetic."""

from __future__ import annotations

from collections.abc import Sequence

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
