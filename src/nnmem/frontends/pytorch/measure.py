"""Measure a real PyTorch step on the CPU with the protocol of the core issue.

Warm-up (2 steps for train, 1 for infer); then
- tensor level: one step under the same dispatch-mode tracker the estimate uses, over real tensors;
- allocator level: one profiled priming step (the profiler only reports frees of blocks whose
  allocation it saw), then a profiled step whose ``[memory]`` events are summed in time order.
Absolute peak = bytes of live storages before the step + the peak rise during the step.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._pytree import tree_flatten

from nnmem.frontends.pytorch.quantized import packed_modules
from nnmem.frontends.pytorch.step import prepare_step, run_step, tensor_attributes, trace_prepared
from nnmem.report.model import Report, report_from_trace

__all__ = ["NeedsMallocCounter", "measure_step", "allocator_rise", "storage_bytes", "quiet_stderr"]

WARMUP = {"train": 2, "infer": 1}


def measure_step(model: torch.nn.Module, inputs: tuple[Any, ...], *, mode: str, optimizer: Any,
                 loss_fn: Callable[..., Any] | None, target: Any, name: str, device: str,
                 meta: dict[str, object], micro_steps: int = 1, in_backward: bool = False,
                 set_to_none: bool = True) -> Report:
    """Run the step for real and report both levels (call it inside a child process; ``micro_steps``: see
    :func:`.step.run_step`; ``in_backward``: :func:`.step.prepare_step`)."""
    opt = prepare_step(model, mode, optimizer, in_backward)
    step = {"mode": mode, "opt": opt, "loss_fn": loss_fn, "target": target, "micro_steps": micro_steps,
            "set_to_none": set_to_none}
    for _ in range(WARMUP[mode]):
        run_step(model, inputs, **step)
    trace = trace_prepared(model, inputs, meta=meta, **step)
    traced_resident = _live_storage_bytes(model, inputs, target, opt)
    if packed_modules(model):  # FBGEMM's packed weights and buffers live outside c10: count malloc instead
        return _measure_packed(model, inputs, step, trace, traced_resident, name=name, device=device)
    with quiet_stderr():  # the priming step makes c10 warn of blocks allocated before profiling
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
            run_step(model, inputs, **step)
        # counted after the priming step, right before the profiled one: a step that draws at random (LayerDrop
        # skips a layer, whose parameters then have no gradient) leaves other storages live than the step before
        resident = _live_storage_bytes(model, inputs, target, opt)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            run_step(model, inputs, **step)
    allocator_peak = resident + allocator_rise(prof)
    notes: tuple[str, ...] = ()
    if traced_resident != trace.resident_bytes:
        notes = (f"live storages before the step: {traced_resident} B counted directly, "
                 f"{trace.resident_bytes} B by the tracker",)
    return report_from_trace(trace, source="measure", model=name, device=device,
                             overrides={"allocator": allocator_peak}, notes=notes)


class NeedsMallocCounter(Exception):
    """The step holds memory outside PyTorch's allocator (FBGEMM's packed weights): measure it in a child started
    with the malloc counter (:mod:`nnmem.runner.mallocpeak`)."""


def _measure_packed(model: torch.nn.Module, inputs: tuple[Any, ...], step: dict[str, Any], trace: Any,
                    resident: int, *, name: str, device: str) -> Report:
    """The allocator level of a step with dynamically quantized layers: PyTorch's live storages (their float32
    biases included) + the packed weights' bytes outside c10 (:func:`.quantized.measure_packed`) + the rise of the
    malloc high-water mark over the step (PyTorch's blocks and FBGEMM's per-thread buffers alike)."""
    from nnmem.frontends.pytorch.quantized import measure_packed, packed_biases
    from nnmem.runner.mallocpeak import counters

    count = counters()
    if count is None:
        raise NeedsMallocCounter
    biases = storage_bytes(packed_biases(model))
    outside = measure_packed(model, count)
    gc.collect()
    count.reset_peak()
    before = count.current()
    run_step(model, inputs, **step)
    rise = count.peak() - before
    note = (f"measured with the malloc counter: {outside:,} B of packed weights outside PyTorch's allocator, "
            f"the step's malloc high-water rise {rise:,} B")
    return report_from_trace(trace, source="measure", model=name, device=device,
                             overrides={"allocator": resident + biases + outside + rise}, notes=(note,))


@contextmanager
def quiet_stderr() -> Iterator[None]:
    """Silence the C++ side's stderr (file descriptor 2) for the duration."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def allocator_rise(prof: Any) -> int:
    """Peak of the running sum of the profiler's ``[memory]`` events, in bytes (never below 0)."""
    sizes: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        size = getattr(event.extra_fields, "alloc_size", None)
        if size is not None and str(getattr(event.extra_fields, "device", "cpu")).startswith("cpu"):
            sizes.append((event.start_time_ns, size))
        stack.extend(event.children)
    running = peak = 0
    for _, size in sorted(sizes, key=lambda item: item[0]):
        running += size
        peak = max(peak, running)
    return peak


def _live_storage_bytes(model: torch.nn.Module, inputs: Any, target: Any,
                        opt: Any) -> int:
    tensors: list[Any] = [*model.parameters(), *model.buffers(), *(t for _, _, t in tensor_attributes(model))]
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    if opt is not None:
        tensors += [v for state in opt.state.values() for v in state.values()]
    tensors += tree_flatten((inputs, target))[0]
    return storage_bytes(tensors)


def storage_bytes(tensors: list[Any]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views and shared storages counted once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            seen[storage.data_ptr() or id(storage)] = storage.nbytes()
    return sum(seen.values())
