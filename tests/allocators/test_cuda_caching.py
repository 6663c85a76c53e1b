"""CUDA caching allocator model: sequences whose outcome c10/cuda/CUDACachingAllocator.cpp makes certain."""

from __future__ import annotations

import pytest

from nnmem.allocators.cuda_caching import (
    AllocatorPeaks,
    AllocEvent,
    CudaCachingAllocator,
    cpu_allocated,
    cublas_workspace_bytes,
    cuda_segment_size,
    round_cuda_size,
    simulate_cuda_caching,
)
from nnmem.errors import ConfigError

KiB, MiB = 2**10, 2**20


def run(*steps: tuple[str, int] | tuple[str, int, int], **kwargs: object) -> AllocatorPeaks:
    return simulate_cuda_caching([AllocEvent(*s) for s in steps], **kwargs)  # type: ignore[arg-type]


def test_round_size_512_bytes() -> None:
    assert round_cuda_size(1) == 512
    assert round_cuda_size(512) == 512
    assert round_cuda_size(513) == 1024
    assert round_cuda_size(0) == 0  # allocate(0) never calls malloc


def test_segment_sizes() -> None:
    assert cuda_segment_size(1) == 2 * MiB
    assert cuda_segment_size(MiB) == 2 * MiB
    assert cuda_segment_size(MiB + 1) == 20 * MiB
    assert cuda_segment_size(10 * MiB - 512) == 20 * MiB
    assert cuda_segment_size(10 * MiB) == 10 * MiB
    assert cuda_segment_size(11 * MiB) == 12 * MiB


def test_one_byte_takes_512_of_a_2mib_small_segment() -> None:
    p = run(("alloc", 0, 1))
    assert (p.allocated_peak, p.reserved_peak, p.segments, p.oom) == (512, 2 * MiB, 1, False)


def test_exactly_1mib_stays_in_the_small_pool() -> None:
    assert run(("alloc", 0, MiB)).reserved_end == 2 * MiB


def test_just_over_1mib_goes_to_a_20mib_large_segment() -> None:
    p = run(("alloc", 0, MiB + 1))
    assert p.reserved_end == 20 * MiB
    assert p.allocated_end == MiB + 512  # split: remainder ~19 MiB > 1 MiB


def test_11mib_rounds_to_12mib_and_the_1mib_tail_is_not_split() -> None:
    p = run(("alloc", 0, 11 * MiB))
    assert p.reserved_end == 12 * MiB
    # remaining == kSmallSize is not "> kSmallSize": the whole block is handed out and counted
    assert p.allocated_end == 12 * MiB


def test_unsplit_large_block_counts_its_full_size() -> None:
    p = run(("alloc", 0, 19 * MiB + 512 * KiB))
    assert (p.reserved_end, p.allocated_end) == (20 * MiB, 20 * MiB)


def test_free_then_same_size_reuses_the_cached_block() -> None:
    p = run(("alloc", 0, 64 * MiB), ("free", 0), ("alloc", 1, 64 * MiB))
    assert (p.reserved_peak, p.reserved_end, p.segments) == (64 * MiB, 64 * MiB, 1)
    assert p.allocated_end == 64 * MiB


def test_free_keeps_memory_reserved() -> None:
    p = run(("alloc", 0, 64 * MiB), ("free", 0))
    assert (p.allocated_end, p.reserved_end, p.allocated_peak) == (0, 64 * MiB, 64 * MiB)


def test_two_600kib_fit_one_small_segment_a_fourth_needs_another() -> None:
    assert run(("alloc", 0, 600 * KiB), ("alloc", 1, 600 * KiB)).reserved_end == 2 * MiB
    four = run(*[("alloc", i, 600 * KiB) for i in range(4)])
    assert (four.reserved_end, four.segments) == (4 * MiB, 2)
    assert four.allocated_end == 4 * 600 * KiB


def test_split_blocks_merge_back_and_serve_a_bigger_request() -> None:
    p = run(("alloc", 0, 5 * MiB), ("free", 0), ("alloc", 1, 15 * MiB))
    assert (p.reserved_end, p.segments, p.allocated_end) == (20 * MiB, 1, 15 * MiB)


def test_remainder_of_a_split_serves_the_next_request() -> None:
    p = run(("alloc", 0, 5 * MiB), ("alloc", 1, 5 * MiB), ("alloc", 2, 9 * MiB))
    assert (p.reserved_end, p.segments) == (20 * MiB, 1)
    assert p.allocated_end == 5 * MiB + 5 * MiB + 10 * MiB  # last 10 MiB left 0 < 1 MiB: unsplit


def test_best_fit_picks_the_smallest_cached_block() -> None:
    a = CudaCachingAllocator()
    for i, size in enumerate((40 * MiB, 24 * MiB, 32 * MiB)):
        a.malloc(i, size)
    for i in range(3):
        a.free(i)
    a.malloc(9, 30 * MiB)  # fits 32 MiB exactly (remainder 2 MiB > 1 MiB is split)
    assert a.allocated == 30 * MiB
    a.malloc(10, 24 * MiB)
    a.malloc(11, 40 * MiB)
    assert a.reserved == 96 * MiB and a.segments == 3


def test_small_and_large_pools_do_not_share_blocks() -> None:
    p = run(("alloc", 0, 20 * MiB), ("free", 0), ("alloc", 1, 4 * KiB))
    assert p.reserved_end == 22 * MiB


def test_capacity_releases_cached_segments_then_retries() -> None:
    p = run(("alloc", 0, 30 * MiB), ("free", 0), ("alloc", 1, 32 * MiB), capacity=40 * MiB)
    assert not p.oom
    assert (p.reserved_end, p.segments, p.reserved_peak) == (32 * MiB, 1, 32 * MiB)


def test_capacity_exceeded_reports_oom_and_stops() -> None:
    p = run(
        ("alloc", 0, 30 * MiB),
        ("free", 0),
        ("alloc", 1, 32 * MiB),
        ("alloc", 2, 10 * MiB),
        ("free", 1),
        capacity=40 * MiB,
    )
    assert p.oom and p.oom_event == 3
    assert p.allocated_end == 32 * MiB


def test_split_segment_is_not_released_on_oom() -> None:
    a = CudaCachingAllocator(capacity=24 * MiB)
    assert a.malloc(0, 2 * MiB)  # 20 MiB segment, split
    assert not a.malloc(1, 19 * MiB)  # 18 MiB free tail too small; 20 + 20 > 24; split: not freed
    assert a.oom and a.reserved == 20 * MiB


def test_empty_cache_returns_unsplit_segments() -> None:
    a = CudaCachingAllocator()
    a.malloc(0, 30 * MiB)
    a.malloc(1, 4 * KiB)
    a.free(0)
    a.empty_cache()
    assert (a.reserved, a.segments) == (2 * MiB, 1)


def test_max_split_size_stops_oversize_blocks_serving_small_requests() -> None:
    steps = (("alloc", 0, 100 * MiB), ("free", 0), ("alloc", 1, 12 * MiB))
    assert run(*steps).reserved_end == 100 * MiB
    limited = run(*steps, max_split_size=64 * MiB)
    assert limited.reserved_end == 112 * MiB


def test_max_split_size_releases_oversize_blocks_before_oom() -> None:
    steps = (("alloc", 0, 100 * MiB), ("free", 0), ("alloc", 1, 12 * MiB))
    p = run(*steps, max_split_size=64 * MiB, capacity=110 * MiB)
    assert not p.oom and p.reserved_end == 12 * MiB


def test_expandable_segments_reserve_less_for_growing_sizes() -> None:
    steps: list[tuple[str, int, int] | tuple[str, int]] = []
    for n in range(1, 6):  # batch grows: each step's tensor is a bit bigger than the cached one
        steps += [("alloc", n, (30 + 2 * n) * MiB), ("free", n)]
    plain = run(*steps)
    expandable = run(*steps, expandable_segments=True)
    assert expandable.reserved_peak < plain.reserved_peak
    assert plain.reserved_end == sum((30 + 2 * n) * MiB for n in range(1, 6))
    assert expandable.reserved_end == 40 * MiB  # 20 MiB pages for the large pool
    assert expandable.segments == 1


def test_expandable_small_pool_maps_2mib_pages() -> None:
    p = run(("alloc", 0, 1), ("alloc", 1, MiB), ("alloc", 2, MiB), expandable_segments=True)
    assert (p.reserved_end, p.allocated_end, p.segments) == (4 * MiB, 512 + 2 * MiB, 1)


def test_expandable_fills_the_gap_and_grows_at_the_end() -> None:
    p = run(("alloc", 0, 30 * MiB), ("alloc", 1, 30 * MiB), expandable_segments=True)
    assert (p.reserved_end, p.allocated_end, p.segments) == (60 * MiB, 60 * MiB, 1)


def test_expandable_unmaps_free_pages_when_full() -> None:
    steps = (("alloc", 0, 20 * MiB), ("alloc", 1, 20 * MiB), ("free", 0), ("alloc", 2, 30 * MiB))
    # Without a limit the segment grows by two pages at its end: 80 MiB mapped.
    assert run(*steps, expandable_segments=True).reserved_end == 80 * MiB
    # At 60 MiB the first mapping fails; the free page 0 is unmapped and the retry fits.
    p = run(*steps, expandable_segments=True, capacity=60 * MiB)
    assert (p.oom, p.reserved_end, p.allocated_end, p.segments) == (False, 60 * MiB, 50 * MiB, 1)
    assert run(*steps, expandable_segments=True, capacity=50 * MiB).oom


def test_expandable_release_drops_an_empty_segment() -> None:
    a = CudaCachingAllocator(expandable_segments=True)
    a.malloc(0, 30 * MiB)
    a.free(0)
    a.empty_cache()
    assert (a.reserved, a.segments) == (0, 0)


def test_zero_byte_alloc_costs_nothing() -> None:
    assert run(("alloc", 0, 0), ("free", 0)) == AllocatorPeaks(0, 0, 0, 0, 0, False)


def test_peaks_track_the_high_water_mark() -> None:
    a = CudaCachingAllocator()
    a.malloc(0, 50 * MiB)
    a.free(0)
    a.reset_peaks()
    assert (a.allocated_peak, a.reserved_peak) == (0, 50 * MiB)


@pytest.mark.parametrize(
    ("steps", "match"),
    [
        ((("free", 3),), "allocated block"),
        ((("alloc", 1, 10), ("alloc", 1, 10)), "still allocated"),
        ((("alloc", 1, -1),), "nbytes >= 0"),
        ((("resize", 1, 1),), "'alloc' or 'free'"),
    ],
)
def test_bad_sequences_raise_config_error(steps: tuple[tuple[str, int, int], ...], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        run(*steps)


def test_bad_options_raise_config_error() -> None:
    with pytest.raises(ConfigError, match="max_split_size"):
        CudaCachingAllocator(max_split_size=10 * MiB)
    with pytest.raises(ConfigError, match="capacity"):
        CudaCachingAllocator(capacity=0)


def test_cublas_workspace_defaults() -> None:
    assert cublas_workspace_bytes((9, 0)) == 32 * MiB
    assert cublas_workspace_bytes((10, 0)) == 32 * MiB
    assert cublas_workspace_bytes((8, 0)) == 8 * MiB + 128 * KiB == 8519680
    assert cublas_workspace_bytes((7, 5)) == 8519680


def test_cpu_allocator_reports_requested_bytes() -> None:
    assert cpu_allocated(1) == 1 and cpu_allocated(1000) == 1000
