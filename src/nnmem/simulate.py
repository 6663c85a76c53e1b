"""Trace → live bytes over time, peak per level, breakdown at the peak, per-layer attribution."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from nnmem.trace import Category, Level, Trace

__all__ = ["Simulation", "simulate", "category_series", "layer_high_water"]


@dataclass(frozen=True, slots=True)
class Simulation:
    """Live bytes of a trace over time.

    Attributes:
        tensor_live: live storage bytes right after each op's outputs exist, in bytes.
        allocator_live: the same plus the op's transient kernel workspace, in bytes.
        peaks: peak bytes per level ("tensor", "allocator").
        peak_ops: index of the op at which each level peaks (-1: before the first op).
        breakdown: bytes per category at each level's peak; sums to that level's peak.
        layer_bytes: bytes live at each level's peak, grouped by owning layer path.
    """

    tensor_live: tuple[int, ...]
    allocator_live: tuple[int, ...]
    peaks: dict[str, int]
    peak_ops: dict[str, int]
    breakdown: dict[str, dict[str, int]]
    layer_bytes: dict[str, dict[str, int]]


def simulate(trace: Trace) -> Simulation:
    """Replay the trace's allocations and frees.

    A block is live at op ``i`` when ``alloc_op <= i <= free_op`` (frees are recorded after the op
    that last saw the block, so a block freed "after op i" still counts at op i).

    Args:
        trace: the traced step.

    Returns:
        The timeline and its peaks at the tensor and allocator levels.
    """
    live = trace.resident_bytes
    tensor_live: list[int] = []
    allocator_live: list[int] = []
    for op in trace.ops:
        live += op.alloc_bytes
        tensor_live.append(live)
        allocator_live.append(live + op.workspace)
        live -= op.free_bytes
    peaks: dict[str, int] = {}
    peak_ops: dict[str, int] = {}
    for level, series in ((Level.TENSOR, tensor_live), (Level.ALLOCATOR, allocator_live)):
        if series and max(series) >= trace.resident_bytes:
            index = max(range(len(series)), key=series.__getitem__)
            peaks[level.value], peak_ops[level.value] = series[index], index
        else:
            peaks[level.value], peak_ops[level.value] = trace.resident_bytes, -1
    breakdown: dict[str, dict[str, int]] = {}
    layer_bytes: dict[str, dict[str, int]] = {}
    for level in (Level.TENSOR, Level.ALLOCATOR):
        index = peak_ops[level.value]
        cats, layers = _live_at(trace, index)
        if level is Level.ALLOCATOR and index >= 0 and trace.ops[index].workspace:
            workspace = trace.ops[index].workspace
            cats[Category.WORKSPACE.value] = cats.get(Category.WORKSPACE.value, 0) + workspace
            layer = trace.ops[index].layer
            layers[layer] = layers.get(layer, 0) + workspace
        breakdown[level.value] = cats
        layer_bytes[level.value] = layers
    return Simulation(
        tensor_live=tuple(tensor_live),
        allocator_live=tuple(allocator_live),
        peaks=peaks,
        peak_ops=peak_ops,
        breakdown=breakdown,
        layer_bytes=layer_bytes,
    )


def _live_at(trace: Trace, index: int) -> tuple[dict[str, int], dict[str, int]]:
    """Bytes per category and per layer of the blocks live at op ``index``."""
    cats: dict[str, int] = defaultdict(int)
    layers: dict[str, int] = defaultdict(int)
    for block in trace.blocks:
        alive = block.alloc_op <= index and (block.free_op < 0 or block.free_op >= index)
        if alive:
            cats[block.category.value] += block.nbytes
            layers[block.layer] += block.nbytes
    order = [c.value for c in Category]
    return {c: cats[c] for c in order if cats.get(c)}, dict(layers)


def category_series(trace: Trace) -> dict[str, tuple[int, ...]]:
    """Live bytes of each category right after each op (the tensor level, split by what the bytes are for).

    The series of a category is zero at every op where nothing of it is live; categories never live are left
    out. Summed over categories, op by op, they equal :attr:`Simulation.tensor_live`.
    """
    n = len(trace.ops)
    deltas: dict[str, list[int]] = {}
    for block in trace.blocks:
        delta = deltas.setdefault(block.category.value, [0] * (n + 1))
        delta[max(block.alloc_op, 0)] += block.nbytes
        if block.free_op >= 0:
            delta[block.free_op + 1] -= block.nbytes
    series: dict[str, tuple[int, ...]] = {}
    for category in (c.value for c in Category):
        if category not in deltas:
            continue
        live, values = 0, []
        for change in deltas[category][:n]:
            live += change
            values.append(live)
        if any(values):
            series[category] = tuple(values)
    return series


def layer_high_water(trace: Trace) -> dict[str, dict[str, int]]:
    """Per layer and category, the most bytes the layer holds at once during the step (e.g. its gradients once
    backward made them all, its optimizer state, its activations at the end of forward)."""
    events: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    for block in trace.blocks:
        key = (block.layer, block.category.value)
        events[key].append((max(block.alloc_op, 0), block.nbytes))
        if block.free_op >= 0:
            events[key].append((block.free_op + 1, -block.nbytes))
    high: dict[str, dict[str, int]] = defaultdict(dict)
    for (layer, category), changes in events.items():
        live = most = 0
        for _, change in sorted(changes):  # at one index, frees (negative) come before allocations
            live += change
            most = max(most, live)
        if most:
            high[layer][category] = most
    return dict(high)
