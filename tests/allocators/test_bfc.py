"""TensorFlow's BFC allocator model: sequences whose outcome tensorflow/core/common_runtime/bfc_allocator.cc fixes."""

from __future__ import annotations

from nnmem.allocators.bfc import BFC_STEPS, BFCAllocator, StepBuffers, bfc_round, resident_state, steady_state_chunks


def test_requests_round_to_256_bytes() -> None:
    assert bfc_round(0) == 0
    assert bfc_round(1) == 256
    assert bfc_round(256) == 256
    assert bfc_round(257) == 512


def test_bfc_replay_hands_out_unsplit_chunks() -> None:
    bfc = BFCAllocator()
    big, chunk = bfc.alloc(1_800_000)
    assert chunk == 2 << 20  # the first 2 MiB region is under 2x the request: handed out whole
    assert bfc.alloc(1000)[1] == 1024  # a new (4 MiB) region, split: 1000 B rounded to 256 B
    bfc.release(big)
    assert bfc.alloc(1 << 20)[1] == 1 << 20  # the freed 2 MiB chunk is 2x this request: split
    assert bfc.in_use == (1 << 20) + 1024


def test_random_initializers_leave_holes_that_later_variables_fill() -> None:
    """keras_lstm's build as the BFC log shows it: the LSTM kernel lands whole in the embedding's 249,600 B hole."""
    resident = [(256_000, 2), (131_072, 2), (262_144, 0), (2_048, 0), (5_120, 2), (256, 0)]
    held, _, _ = steady_state_chunks(resident, [], [], [], [])
    # under 2x the request, handed out unsplit (249,600 B in the real build, whose 256 B seed tensors sit there too)
    assert held[0] == 256_000 and held[1] == 249_856
    assert sum(held) == 775_424  # the real build leaves 777,216 B in use (small tensors besides)


def test_a_variable_that_adopts_a_step_buffer_leaves_a_hole_handed_out_whole() -> None:
    """AssignVariableOp adopts its value's buffer (a BatchNorm's moving mean): the variable moves into the step's
    space and its old chunk joins the free one beside it. The next step's 1 KiB request finds that 1,280 B chunk,
    under twice its size, and gets it whole; the variable moves on past it, and the third step's request gets
    1,536 B."""
    resident = [(256, 0)]
    sizes, alloc_at, free_at = [1024, 256], [0, 0], [1, 1]
    _, chunks, _ = steady_state_chunks(resident, sizes, alloc_at, free_at, [0, 0])
    assert chunks == [1024, 256]  # written in place: every step finds the same free space
    _, chunks, _ = steady_state_chunks(resident, sizes, alloc_at, free_at, [0, 0], adopted=[(1, 1, 0)])
    assert chunks[0] == 1536


def test_a_chunk_that_would_waste_128_mib_is_split() -> None:
    """bfc_allocator.cc splits a free chunk under twice the request when handing it out whole would waste
    ``max_internal_fragmentation_bytes`` (128 MiB): a 300 MiB request in a freed 512 MiB region gets 300 MiB."""
    bfc = BFCAllocator()
    big, chunk = bfc.alloc(512 << 20)
    assert chunk == 512 << 20
    bfc.release(big)
    assert bfc.alloc(300 << 20)[1] == 300 << 20  # 212 MiB of waste: split
    bfc.release(bfc.alloc(1 << 20)[0])
    small = BFCAllocator()
    small.release(small.alloc(256 << 20)[0])
    assert small.alloc(129 << 20)[1] == 256 << 20  # 127 MiB of waste, under twice the request: handed out whole


def test_a_gpu_allocator_without_growth_maps_its_whole_limit_as_one_region() -> None:
    """Without allow_growth (a GPU's default) the first region is the memory limit (the constructor's
    ``curr_region_allocation_bytes_ = RoundedBytes(total_memory)``): a 1.8 MB request is split off it (the CPU's
    first 2 MiB region would hand it out whole), and freed chunks merge back into the one region."""
    gpu = BFCAllocator(1 << 30, growth=False)
    first, chunk = gpu.alloc(1_800_000)
    assert chunk == bfc_round(1_800_000) and gpu.regions == 1 and gpu.reserved == 1 << 30
    second = gpu.alloc(1 << 20)[0]
    gpu.release(first)
    assert gpu.alloc(1_000_000)[1] == bfc_round(1_800_000)  # best fit: the 1.8 MB hole, under twice the request
    gpu.release(second)
    assert gpu.regions == 1 and not gpu.oom


def test_a_request_over_the_limit_is_an_oom_the_replay_counts_past() -> None:
    gpu = BFCAllocator(4 << 20, growth=False)
    assert gpu.alloc(3 << 20)[1] == 4 << 20  # the whole region: under twice the request
    assert not gpu.oom
    gpu.alloc(2 << 20)  # nothing left under the limit: TensorFlow's Extend fails
    assert gpu.oom and gpu.in_use == 6 << 20


def test_growth_regions_double_and_stop_at_the_limit() -> None:
    """allow_growth: 2 MiB, then 4 MiB, ... each region no larger than the memory left under the limit."""
    grow = BFCAllocator(7 << 20)
    grow.alloc(2 << 20)
    grow.alloc(2 << 20)  # a second region of 4 MiB
    assert grow.reserved == 6 << 20
    grow.alloc(1 << 20)  # the 4 MiB region has 2 MiB left: no new region
    grow.alloc(1 << 20)
    grow.alloc(1 << 20)  # 1 MiB left under the 7 MiB limit: an 8 MiB region is cut to it
    assert grow.reserved == 7 << 20 and grow.regions == 3 and not grow.oom


def test_a_gpu_allocator_needs_its_limit() -> None:
    import pytest

    with pytest.raises(ValueError, match="memory limit"):
        BFCAllocator(growth=False)


def test_a_step_after_steps_in_another_order_is_handed_other_chunks() -> None:
    """The free chunks a step finds are those the steps before it left. Order B alone: its 1 MiB and 2 MiB
    requests get chunks of their size. After two steps of order A, which moves the 256 B variable (it adopts a
    step buffer) to the start of the first 2 MiB region, B's 1 MiB request is handed the 2,096,896 B left there
    whole (under twice the request) and its 2 MiB one the 4 MiB region whole: 6,291,200 B instead of 3,145,984."""
    sizes = [1 << 20, 2 << 20, 256]
    order_a = StepBuffers(sizes, [0, 1, 2], [1, 2, 2], [0, 0, 0], adopted=[(2, 2, 0)])
    order_b = StepBuffers(sizes, [0, 2, 1], [2, 2, 1], [0, 0, 0], adopted=[(1, 2, 0)])
    chunks = {}
    for name, before in (("a", order_a), ("b", order_b)):
        state, held = resident_state([(256, 0)])
        assert held == [256]
        for _ in range(BFC_STEPS - 1):
            state.step(before)
        chunks[name], _ = state.step(order_b)
    assert chunks["b"] == [1 << 20, 2 << 20, 256]
    assert chunks["a"] == [2_096_896, (4 << 20) - 256, 256]


def test_a_copied_allocator_state_replays_on_its_own() -> None:
    """A copy replays another step from the same free chunks, leaving the original as it was."""
    state, _ = resident_state([(256, 0), (4096, 1)])
    step = StepBuffers([1 << 20, 3000], [0, 1], [1, 1], [0, 5000])
    state.step(step)
    free, in_use, where = list(state.bfc.free), state.bfc.in_use, list(state.where)
    copied = state.copy()
    # the 4 KiB variable adopts the new buffer: it moves into the free 4 MiB region, handed out whole
    chunks, scratch = copied.step(StepBuffers([3 << 20], [0], [0], [0], adopted=[(0, 0, 1)]))
    assert chunks == [4 << 20] and scratch == [0]
    assert copied.bfc.in_use == in_use - 4096 + (4 << 20) and copied.where[1] != where[1]
    assert state.bfc.free == free and state.bfc.in_use == in_use and state.where == where
