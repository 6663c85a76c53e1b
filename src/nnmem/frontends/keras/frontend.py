"""The Keras 3 frontend: ``train_on_batch`` / ``predict_on_batch`` steps on this process's backend.

Keras picks its backend once per process (``KERAS_BACKEND``); each backend package has ``trace.py``
(``trace_step(step, meta=...) -> Trace``) and ``measure.py`` (``measure_step(step, name=..., meta=...)``).
Estimates and measurements are CPU steps at the allocator level; an estimate for a CUDA GPU replays the traced
step through that backend's GPU allocator (:mod:`.gpu`), modelled, not measured.
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import keras
import numpy as np

from nnmem import cpu, cuda
from nnmem.errors import ConfigError, UnsupportedError
from nnmem.frontends.base import StepRequest
from nnmem.frontends.keras.common import KerasStep, accumulation_steps, is_keras_model, optimizer_label, prepare
from nnmem.frontends.keras.data import materialize, rebatch, step_data, unpack
from nnmem.frontends.keras.gpu import KerasGpu, keras_gpu
from nnmem.frontends.keras.transport import load_file, model_payload
from nnmem.loader import build, resolve_factory
from nnmem.report.model import Report, report_from_trace
from nnmem.simulate import simulate
from nnmem.trace import Trace

__all__ = ["FRONTEND", "KerasFrontend", "BACKENDS", "backend_module", "from_factory"]

BACKENDS = ("torch", "jax", "tensorflow")

# What the user's own run may do differently from the estimated step, on TensorFlow.
_TF_NOTES = (
    "schedule: the peak is for the ops in the graph's construction order, one at a time (`NNMEM_TF_MEASURE=pinned "
    "nnmem measure` runs that order); a plain train_on_batch runs ready ops concurrently in an order that follows "
    "timing, on the graph Grappler rewrote: the allocator range covers the orders modelled, and its peak differs "
    "between processes (`nnmem measure --runs N` shows the spread on this model)",
    "BFC layout: the estimate replays TensorFlow's allocator from the model's build; holes the rest of the setup "
    "leaves can hand a tensor a chunk up to 2x its size",
)
_TF_LOOP_NOTE = ("sequential schedule: TensorFlow's default executor runs while-loop iterations concurrently and "
                 "orders ops by their measured cost, so a plain train_on_batch of this step can peak above the "
                 "estimate")


def backend_module(part: str, name: str | None = None) -> Any:
    """A backend's ``trace`` module (``trace_step``) or ``measure`` module (``measure_step``), on this
    process's Keras backend by default."""
    name = name or str(keras.backend.backend())
    if name not in BACKENDS:
        raise UnsupportedError(f"the Keras backend {name!r} is not supported: use torch, jax or tensorflow")
    return importlib.import_module(f"nnmem.frontends.keras.{name}.{part}")


def from_factory(factory: Callable[[int], Any], batch: int) -> tuple[Any, Any, Any, Any]:
    """Call a Keras factory: ``factory(batch) -> model`` or ``(model, x[, y[, loss]])``."""
    built = build(factory, batch)
    if not is_keras_model(built.model):
        raise ConfigError(f"expected the factory to return a keras.Model. Received: {type(built.model).__name__}")
    x = unpack(built.inputs) if built.inputs is not None else None
    return built.model, x, built.target, built.loss_fn


def _meta(step: KerasStep, batch: int | None) -> dict[str, object]:
    meta: dict[str, object] = {"batch": batch or step.batch, "keras": keras.__version__,
                               "keras_backend": str(keras.backend.backend()),
                               "dtype_policy": str(step.model.dtype_policy.name), **cpu.describe().meta()}
    if step.mode == "train":
        meta["optimizer"] = optimizer_label(step.model)
        cycle = accumulation_steps(step.model)
        if cycle > 1:  # the update step, the highest of the cycle (ops.cond's branch)
            meta["accumulate"] = cycle
        meta["trainable_bytes"] = sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize
                                      for v in step.model.trainable_weights)
    return meta


def _gpu(request: StepRequest) -> KerasGpu | None:
    """The GPU the request is estimated for, as this process's backend sees it (None: the CPU).

    Raises:
        UnsupportedError: TensorFlow in this process splits its first GPU into several virtual devices, each with
            its own BFC allocator and memory limit: one step on one of them is not what the estimate models.
    """
    gpu = keras_gpu(request.device, str(keras.backend.backend()))
    if gpu is None or gpu.backend != "tensorflow":
        return gpu
    import tensorflow as tf

    physical = tf.config.list_physical_devices("GPU")
    logical = (tf.config.get_logical_device_configuration(physical[0]) or []) if physical else []
    if len(logical) > 1:
        raise UnsupportedError(f"TensorFlow splits GPU 0 into {len(logical)} virtual devices here (set_logical_device_"
                               "configuration), each with its own allocator and memory limit; the estimate models "
                               "one whole GPU: estimate without the split, with budget= one device's memory_limit")
    if logical and logical[0].memory_limit is not None:  # the process's own limit, in MiB
        return replace(gpu, configured_limit=int(logical[0].memory_limit) << 20)
    return gpu


def _trace(step: KerasStep, meta: dict[str, object], gpu: KerasGpu | None, **options: Any) -> Trace:
    """The step traced on this process's backend, as ``gpu`` runs it (None: this CPU).

    On a GPU: torch's trace without the CPU kernels' scratch; JAX's buffers as its GPU client allocates them;
    TensorFlow's step compiled with XLA as Keras runs it there (:mod:`.tensorflow.xla`), or the graph executor's
    replayed through the GPU BFC allocator (``options``: the trace module's, e.g. TensorFlow's ``quick_range``).
    """
    if gpu is None or gpu.backend == "torch":
        trace = backend_module("trace").trace_step(step, meta=meta, **options)
        return trace if gpu is None else cuda.without_workspace(trace)
    if gpu.backend == "jax":
        return backend_module("trace").trace_step(step, meta=meta, gpu=gpu.target.compute_capability, **options)
    from nnmem.frontends.keras.tensorflow import xla

    if gpu.xla and xla.supports_xla(step.model):
        return xla.trace_step(step, meta=meta, gpu=gpu.target.compute_capability)
    trace = backend_module("trace").trace_step(step, meta=meta, gpu=gpu.bfc, **options)
    if gpu.xla:  # Keras falls back to the graph executor for this model
        trace.meta["gpu_step"] = ("a layer of this model does not support XLA (supports_jit=False), so Keras runs "
                                  "the graph executor's step on a GPU too: estimated so")
    return trace


def _torch_cuda_peaks(trace: Trace, gpu: KerasGpu) -> dict[str, int]:
    from nnmem.frontends.pytorch.frontend import cuda_level_peaks

    return cuda_level_peaks(trace, gpu.target)


def _step(request: StepRequest, batch: int) -> tuple[KerasStep, Any, tuple[str, ...]]:
    """The prepared step of the request (a spec's factory called at ``batch``), its loss, and notes on its data."""
    model, inputs, target, loss_fn = request.model, request.inputs, request.target, request.loss_fn
    if isinstance(model, str):
        model, x, y, loss = from_factory(resolve_factory(model), batch)
        inputs = x if inputs is None and not request.input_shape else inputs
        target = y if target is None else target
        loss_fn = loss if loss_fn is None else loss_fn
    x, y, note = step_data(model, inputs, target, request.input_shape, batch, request.mode)
    step = prepare(model, unpack(x), y, mode=request.mode, optimizer=request.optimizer, loss=loss_fn,
                   accumulate=request.accumulate)
    return step, loss_fn, (note,) if note else ()


_TF_ACCUMULATION_NOTE = (
    "range: not modelled across an accumulation cycle: its K - 1 steps that add to the accumulators and the one "
    "that updates leave the allocator other free chunks than the update steps the range replays, so a plain run "
    "can peak above the high end (keras_conv1d_gru at batch 8 in 4 micro-batches: +4.9 %)")


class KerasFrontend:
    """Keras 3 models, ``.keras`` files and MODEL specs whose factory builds a Keras model."""

    name = "keras"

    def load(self, request: StepRequest) -> StepRequest:
        _gpu(request)  # an unknown device or a non-CUDA accelerator fails here, with the reason
        if request.checkpoint is not None or request.optimizer_in_backward:
            raise UnsupportedError("checkpoint plans and the optimizer in backward are estimated for PyTorch "
                                   "models so far; a Keras model takes keras.RematScope (nnmem whatif "
                                   "--technique remat:full)")
        if not request.set_to_none:
            raise UnsupportedError("set_to_none applies to PyTorch's optimizer.zero_grad; a Keras step has no "
                                   "gradients between steps")
        if request.precision is not None:
            raise UnsupportedError("precision= applies to PyTorch models so far; for a Keras model set a dtype "
                                   "policy (keras.config.set_dtype_policy('mixed_bfloat16')) before building it")
        if isinstance(request.model, str) and request.model.endswith(".keras"):
            return request.with_(model=load_file(request.model))
        return request

    def estimate(self, request: StepRequest) -> Report:
        request = self.load(request)
        gpu = _gpu(request)
        step, _, notes = _step(request, request.batch or 1)
        trace = _trace(step, _meta(step, request.batch), gpu)
        if trace.meta.get("unmodelled") and gpu is None:  # kernel paths this CPU takes that no rule models
            notes = (*str(trace.meta["unmodelled"]).splitlines(), *notes)
        if trace.meta.get("gpu_step"):  # a GPU step other than the default's
            notes = (str(trace.meta["gpu_step"]), *notes)
        if trace.framework == "keras-tensorflow" and "xla.temp_bytes" not in trace.meta:
            notes = (*notes, *((_TF_LOOP_NOTE,) if trace.meta.get("while_loops") else ()), *_TF_NOTES)
            notes = (*notes, str(trace.meta["grappler_skipped"])) if trace.meta.get("grappler_skipped") else notes
            notes = (*notes, str(trace.meta["loop_casts"])) if trace.meta.get("loop_casts") else notes
            notes = (*notes, _TF_ACCUMULATION_NOTE) if trace.meta.get("accumulate") else notes
        if gpu is None:
            return report_from_trace(trace, source="estimate", model=request.name, device="cpu", notes=notes)
        overrides = _torch_cuda_peaks(trace, gpu) if gpu.backend == "torch" else None
        return report_from_trace(trace, source="estimate", model=request.name, device=gpu.name, level=gpu.level,
                                 overrides=overrides, notes=(*notes, *gpu.notes()))

    def device_notes(self, request: StepRequest) -> tuple[str, ...]:
        """What figures on the request's GPU rest on (modelled, the backend's allocator and its limit)."""
        gpu = _gpu(request)
        return () if gpu is None else gpu.notes()

    def device_budget(self, request: StepRequest) -> tuple[int, str] | None:
        """The bytes the backend's allocator may use on the request's catalog GPU and the level that decides an
        OOM there; None on the CPU or a bare "cuda" (unknown memory)."""
        gpu = _gpu(request)
        if gpu is None or gpu.limit is None:
            return None
        return gpu.limit, gpu.level

    def tracer(self, request: StepRequest) -> Callable[[int], Trace]:
        """The model is built once (a spec's factory at batch 1); inputs and target are rebatched as zeros.

        On TensorFlow the traces carry the quick range's high end (a few of the executor's orders on the graph as
        traced and as Grappler rewrites it: ``peak_range(quick=True)``), which :meth:`peak_of` hands the batch
        search: a plain ``fit`` runs its ops concurrently and can peak far above the sequential order (two im2col
        buffers at once).
        """
        request = self.load(request)
        gpu = _gpu(request)
        first, loss_fn, _ = _step(request, 1)
        options = {"quick_range": True} if keras.backend.backend() == "tensorflow" else {}

        def trace_at(batch: int) -> Trace:
            step = prepare(first.model, rebatch(first.x, batch), rebatch(first.y, batch), mode=request.mode,
                           optimizer=request.optimizer, loss=loss_fn, accumulate=request.accumulate)
            meta = {**_meta(step, batch), "batch": batch}
            return _trace(step, meta, gpu, **options)

        return trace_at

    def peak_of(self, request: StepRequest) -> Callable[[Trace], int] | None:
        """On TensorFlow, the higher of the sequential peak and the quick range's high end (what a plain step
        can reach decides an OOM); on torch with a GPU, the caching allocator's reserved peak; elsewhere None (the
        trace's allocator level)."""
        gpu = _gpu(request)
        if gpu is not None and gpu.backend == "torch":
            return lambda trace: int(_torch_cuda_peaks(trace, gpu)["reserved"])
        if keras.backend.backend() != "tensorflow":
            return None

        def peak(trace: Trace) -> int:
            high = trace.meta.get("peak_high")
            sequential = simulate(trace).peaks["allocator"]
            return max(sequential, int(high)) if isinstance(high, int) else sequential

        return peak

    def measure(self, request: StepRequest, *, timeout_s: float | None) -> Report:
        """The model travels to the child as its Keras config with the classes of its custom layers and is
        built afresh there (see :mod:`nnmem.frontends.keras.transport`); a spec's factory is called there."""
        from nnmem.runner.child import run_in_child

        request = self.load(request)
        if _gpu(request) is not None:
            raise UnsupportedError(f"nnmem measure runs Keras steps on this machine's CPU; device {request.device!r} "
                                   "is estimated only (on a GPU machine, benchmarks/cuda_validate.py --keras "
                                   "measures the Keras steps there)")
        backend = str(keras.backend.backend())
        spec = request.model if isinstance(request.model, str) else None
        if spec is None:
            x, y, _ = step_data(request.model, request.inputs, request.target, request.input_shape, request.batch,
                                request.mode)
            request = request.with_(inputs=materialize(x), target=materialize(y), input_shape=None)
        payload = model_payload(request.model) if spec is None else None
        light = request.with_(model=spec)
        tf_schedule = os.environ.get("NNMEM_TF_MEASURE", "")  # the TensorFlow measurement's schedule option

        def work() -> dict[str, Any]:
            os.environ["KERAS_BACKEND"] = backend
            if tf_schedule:
                os.environ["NNMEM_TF_MEASURE"] = tf_schedule
            else:  # the fork server keeps the environment it started with: a caller's earlier choice is not ours
                os.environ.pop("NNMEM_TF_MEASURE", None)
            os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")  # before TensorFlow is first imported
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            from nnmem.frontends.keras import frontend as here
            from nnmem.frontends.keras.transport import model_from_payload

            measure_module = here.backend_module("measure", backend)
            if backend == "tensorflow":  # a pinned measurement's thread pools, set before TF starts
                measure_module.sequential_runtime()
            real = light if payload is None else light.with_(model=model_from_payload(payload))
            step, _, _ = here._step(real, real.batch or 1)
            step = replace(step, x=materialize(step.x), y=materialize(step.y))  # the step runs: real arrays
            return measure_module.measure_step(step, name=real.name, meta=here._meta(step, real.batch)).to_dict()

        preload = None
        if backend == "jax":  # the exact malloc peak needs the counting library loaded at the child's start
            from nnmem.runner.mallocpeak import library

            preload = library()
        return Report.from_dict(run_in_child(work, timeout_s=timeout_s, preload=preload,
                                             env={"KERAS_BACKEND": backend}))


FRONTEND = KerasFrontend()
