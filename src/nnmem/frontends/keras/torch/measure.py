"""Measure a real Keras step on torch (CPU) with the PyTorch frontend's protocol.

Warm-up (2 steps for train, 1 for infer); the tensor level from one step under the same tracker as the estimate,
over real tensors; the allocator level from the torch profiler's ``[memory]`` events of a profiled step after a
profiled priming one (:func:`nnmem.frontends.pytorch.measure.allocator_rise`), on top of the bytes of the live
storages before it: every Keras variable, its gradient, and the data.
"""

from __future__ import annotations

from typing import Any

import torch

from nnmem.frontends.keras.common import KerasStep, flat_arrays, measured_cycle, skipped_updates_note, warm_up
from nnmem.frontends.keras.torch.trace import all_variables, as_torch, call_step, trace_call
from nnmem.frontends.pytorch.measure import allocator_rise, quiet_stderr, storage_bytes
from nnmem.report.model import Report, report_from_trace

__all__ = ["measure_step", "live_variable_bytes"]


def measure_step(step: KerasStep, *, name: str, meta: dict[str, object]) -> Report:
    """Run the Keras step for real (call inside a child process): tensor level by the tracker, allocator by the
    profiler's ``[memory]`` events (the profiled steps run without the tracker). With gradient accumulation
    (``gradient_accumulation_steps``) both over a whole cycle, the highest step."""
    from torch.profiler import ProfilerActivity, profile

    from nnmem.simulate import simulate

    x = as_torch(step.x, lambda a: torch.as_tensor(a))
    y = as_torch(step.y, lambda a: torch.as_tensor(a))
    cycle = measured_cycle(step)
    applied = warm_up(step, lambda: call_step(step, x, y))
    # with gradient accumulation, every step of a cycle: the update step is the highest
    traces = [trace_call(step, x, y, None, meta) for _ in range(cycle)]
    trace = max(traces, key=lambda t: simulate(t).peaks["tensor"])
    resident = _live_bytes(step, x, y)
    with quiet_stderr():
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
            call_step(step, x, y)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            for _ in range(cycle):  # the steps return to the same bytes: the rise is the highest step's
                call_step(step, x, y)
    notes = skipped_updates_note(step, applied, 2 * cycle + 1)
    if resident != trace.resident_bytes:
        notes += (f"live storages before the step: {resident} B counted directly, "
                 f"{trace.resident_bytes} B by the tracker",)
    return report_from_trace(trace, source="measure", model=name, device="cpu",
                             overrides={"allocator": resident + allocator_rise(prof)}, notes=notes)


def live_variable_bytes(model: Any) -> int:
    """Bytes of the storages of every Keras variable (model, optimizer, metrics) and their gradients."""
    return storage_bytes(_variable_tensors(model))


def _variable_tensors(model: Any) -> list[Any]:
    tensors: list[Any] = []
    for v in all_variables(model):
        tensors.append(v._value)
        if v._value.grad is not None:
            tensors.append(v._value.grad)
    return tensors


def _live_bytes(step: KerasStep, x: Any, y: Any) -> int:
    return storage_bytes([*_variable_tensors(step.model), *flat_arrays((x, y))])
