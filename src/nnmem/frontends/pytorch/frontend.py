"""The PyTorch frontend: build a model or MODEL spec on the meta device, trace its step under
FakeTensorMode (CPU kernel rules, or the CUDA caching-allocator model), measure it for real in a child."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from nnmem import cpu, cuda
from nnmem.errors import ConfigError, MeasureError, UnsupportedError, first_line
from nnmem.frontends.base import StepRequest
from nnmem.frontends.pytorch.step import fake_copy, optimizer_name, trace_fake_step
from nnmem.frontends.pytorch.workspace import WorkspaceRules
from nnmem.loader import Built, build, resolve_factory
from nnmem.report.model import Report, report_from_trace
from nnmem.trace import Trace

__all__ = ["FRONTEND", "PyTorchFrontend", "build_torch", "shaped_inputs", "cuda_level_peaks"]

DEFAULT_OPTIMIZER = "sgd"


def _as_tuple(inputs: Any) -> tuple[Any, ...]:
    if isinstance(inputs, torch.Tensor):
        return (inputs,)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs)
    if isinstance(inputs, dict):
        raise ConfigError("expected inputs as a tensor or a tuple of tensors; pass keyword inputs via a wrapper module")
    raise ConfigError(f"expected inputs as a tensor or a tuple of tensors. Received: {type(inputs).__name__}")


def shaped_inputs(batch: int, input_shape: tuple[tuple[int, ...], ...], dtype: torch.dtype = torch.float32,
                  device: str = "cpu") -> tuple[torch.Tensor, ...]:
    """Zero inputs of shape (batch, *shape) for each shape (no data is needed for memory)."""
    return tuple(torch.zeros((batch, *shape), dtype=dtype, device=device) for shape in input_shape)


def build_torch(factory: Callable[..., Any], batch: int, spec: str, *, meta: bool) -> tuple[Built, list[str]]:
    """Call a factory, under the meta device when ``meta`` (nothing allocated), falling back to a real build."""
    notes: list[str] = []
    if meta:
        try:
            with torch.device("meta"):
                return build(factory, batch, spec), notes
        except Exception as err:  # a factory that cannot run on meta tensors is built for real
            notes.append(f"the factory could not run under the meta device ({type(err).__name__}); "
                         "it was built for real, which allocated its parameters")
    return build(factory, batch, spec), notes


def _from_spec(request: StepRequest, batch: int, *, meta: bool) -> tuple[StepRequest, list[str]]:
    """The request with a MODEL spec's model, inputs, target and loss filled in (those not given)."""
    spec = str(request.model)
    built, notes = build_torch(resolve_factory(spec), batch, spec, meta=meta)
    if not isinstance(built.model, torch.nn.Module):
        raise ConfigError(f"expected the factory {spec!r} to return a torch.nn.Module (or a tuple starting with one). "
                          f"Received: {type(built.model).__name__}")
    inputs = request.inputs
    if inputs is None and request.input_shape:
        inputs = shaped_inputs(batch, request.input_shape, device="meta" if meta else "cpu")
    inputs = built.inputs if inputs is None else inputs
    if inputs is None:
        raise ConfigError(f"the factory {spec!r} returned only a model: give the input shape, e.g. "
                          "--input-shape 3,224,224")
    return request.with_(model=built.model, inputs=inputs,
                         target=built.target if request.target is None else request.target,
                         loss_fn=request.loss_fn or built.loss_fn), notes


def _lowered(request: StepRequest) -> AbstractContextManager[Any]:
    """The request's precision applied to its model while tracing (nothing when it has none)."""
    if request.precision is None:
        return nullcontext()
    from nnmem.frontends.pytorch.precision import lowered, precision_dtype

    kind, _, name = request.precision.partition(":")
    return lowered(request.model, kind, precision_dtype(kind, name))


def _checkpointed(request: StepRequest) -> AbstractContextManager[Any]:
    """The request's checkpoint plan applied to its model while tracing (nothing when it has none)."""
    if request.checkpoint is None:
        return nullcontext()
    from nnmem.frontends.pytorch.checkpointing import checkpointed

    return checkpointed(request.model, request.checkpoint)


def _batch_of(inputs: Any) -> int | None:
    first = inputs if isinstance(inputs, torch.Tensor) else (inputs[0] if isinstance(inputs, (tuple, list)) and inputs
                                                             else None)
    return int(first.shape[0]) if isinstance(first, torch.Tensor) and first.dim() > 0 else None


def _meta(request: StepRequest) -> dict[str, object]:
    return {"optimizer": optimizer_name(request.optimizer) if request.mode == "train" else "",
            "batch": request.batch or _batch_of(request.inputs), "torch": torch.__version__, **cpu.describe().meta()}


def _rebatch(value: Any, example: int, batch: int) -> Any:
    """Meta tensors like ``value`` whose leading dimension ``example`` becomes ``batch``."""
    if isinstance(value, torch.Tensor):
        shape = (batch, *value.shape[1:]) if value.dim() and value.shape[0] == example else tuple(value.shape)
        return torch.empty(shape, dtype=value.dtype, device="meta")
    if isinstance(value, (tuple, list)):
        return type(value)(_rebatch(v, example, batch) for v in value)
    return value


def cuda_level_peaks(trace: Trace, target: cuda.CudaTarget) -> dict[str, int]:
    """Allocator and reserved peaks of a traced step on a CUDA device, in bytes (CPU scratch rules ignored)."""
    uses_cublas = any(op.name in _CUBLAS_OPS for op in trace.ops)
    return cuda.cuda_peaks(trace, target, uses_cublas=uses_cublas)


# Ops that run through cuBLAS on CUDA, whose first call allocates the handle's workspace from the caching
# allocator (aten/src/ATen/cuda/CublasHandlePool.cpp getCurrentCUDABlasHandle); it stays for the process.
_CUBLAS_OPS = frozenset(str(op) for op in (
    torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
    torch.ops.aten.baddbmm.default, torch.ops.aten.addbmm.default, torch.ops.aten.mv.default,
    torch.ops.aten.addmv.default,
))


class PyTorchFrontend:
    """``torch.nn.Module`` models and MODEL specs whose factory returns one."""

    name = "pytorch"

    def load(self, request: StepRequest) -> StepRequest:
        optimizer = DEFAULT_OPTIMIZER if request.optimizer is None else request.optimizer
        if not isinstance(request.model, str) and request.inputs is None:
            raise ConfigError("expected inputs: a tensor or a tuple of tensors the model is called with")
        return request.with_(optimizer=optimizer)

    def _trace(self, request: StepRequest, batch: int | None = None) -> tuple[StepRequest, Trace, list[str]]:
        notes: list[str] = []
        if isinstance(request.model, str):
            request, notes = _from_spec(request, request.batch or 1, meta=True)
        meta: dict[str, object] = _meta(request) if batch is None else {"batch": batch}
        rules = WorkspaceRules()
        with _checkpointed(request), _lowered(request):
            try:
                trace = trace_fake_step(request.model, _as_tuple(request.inputs), mode=request.mode,
                                        optimizer=request.optimizer, loss_fn=request.loss_fn, target=request.target,
                                        rules=rules, meta=meta, micro_steps=min(request.accumulate, 2),
                                        in_backward=request.optimizer_in_backward,
                                        set_to_none=request.set_to_none)
            except RuntimeError as err:
                if "not found in storage" not in str(err):  # torch.utils.checkpoint's selective-policy cache
                    raise
                raise UnsupportedError(
                    "PyTorch refuses selective checkpointing on this model: a region runs other ops when "
                    "recomputed than in forward (state that changes in between, e.g. HuggingFace's KV cache: "
                    "set config.use_cache=False); the plain plan works") from None
        _quantization(request.model, trace, rules, notes)
        if request.accumulate > 1:
            trace.meta["accumulate"] = request.accumulate
        if request.checkpoint is not None:
            trace.meta["checkpoint"] = request.checkpoint
        if request.optimizer_in_backward:
            trace.meta["optimizer_in_backward"] = True
        if not request.set_to_none:
            trace.meta["zero_grad"] = "set_to_none=False"
        if request.precision is not None:
            trace.meta["precision"] = request.precision
        if rules.notes:  # kernel paths this CPU takes that no rule models: a CPU report says so
            trace.meta["unmodelled"] = "\n".join(rules.notes)
        return request, trace, notes

    def estimate(self, request: StepRequest) -> Report:
        request = self.load(request)
        request, trace, notes = self._trace(request)
        notes += [str(trace.meta["data_dependent"])] if "data_dependent" in trace.meta else []
        target_cuda = cuda.cuda_target(request.device)
        if target_cuda is not None:
            trace = cuda.without_workspace(trace)
            return report_from_trace(trace, source="estimate", model=request.name, device=target_cuda.name,
                                     level="reserved", overrides=cuda_level_peaks(trace, target_cuda),
                                     notes=(*notes, cuda.NOT_VALIDATED))
        unmodelled = str(trace.meta.get("unmodelled", "")).splitlines()
        return report_from_trace(trace, source="estimate", model=request.name, device=request.device,
                                 notes=(*unmodelled, *notes))

    def tracer(self, request: StepRequest) -> Callable[[int], Trace]:
        """A MODEL spec's factory is called at each batch under the meta device; a model with example inputs
        gets inputs (and a target) whose leading dimension becomes the batch."""
        request = self.load(request)
        if isinstance(request.model, str):  # inputs come from the factory, or zeros of input_shape, per batch
            spec = request.with_(inputs=None)
            return lambda batch: self._trace(spec.with_(batch=batch), batch)[1]
        example = _batch_of(request.inputs)
        if example is None:
            raise ConfigError("expected inputs whose first dimension is the batch, to rescale them")

        def trace_at(batch: int) -> Trace:
            rebatched = request.with_(inputs=_rebatch(_as_tuple(request.inputs), example, batch),
                                      target=_rebatch(request.target, example, batch))
            return self._trace(rebatched, batch)[1]

        return trace_at

    def device_notes(self, request: StepRequest) -> tuple[str, ...]:
        """On a CUDA device: its figures are modelled, not measured."""
        return (cuda.NOT_VALIDATED,) if cuda.cuda_target(request.device) is not None else ()

    def peak_of(self, request: StepRequest) -> Callable[[Trace], int] | None:
        target_cuda = cuda.cuda_target(request.device)
        if target_cuda is None:
            return None
        return lambda trace: int(cuda_level_peaks(trace, target_cuda)["reserved"])

    def measure(self, request: StepRequest, *, timeout_s: float | None) -> Report:
        import cloudpickle

        from nnmem.frontends.pytorch.portable import dumps
        from nnmem.runner.child import run_in_child

        try:  # parametrized modules travel as their class and state
            payload = dumps(self.load(request))
        except Exception as err:
            raise MeasureError(f"the step cannot be sent to the measuring child process: {type(err).__name__}: "
                               f"{first_line(err)}; define the model at module level or measure a MODEL spec") from err

        def work() -> dict[str, Any]:
            from nnmem.frontends.pytorch.measure import NeedsMallocCounter, measure_step

            request = cloudpickle.loads(payload)
            real = _from_spec(request, request.batch or 1, meta=False)[0] if isinstance(request.model, str) \
                else request
            inputs = _as_tuple(real.inputs)
            if real.checkpoint is not None:
                from nnmem.frontends.pytorch.checkpointing import apply_checkpointing

                apply_checkpointing(real.model, real.checkpoint)
            if real.precision is not None:
                from nnmem.frontends.pytorch.precision import apply_precision, precision_dtype

                kind, _, name = real.precision.partition(":")
                apply_precision(real.model, kind, precision_dtype(kind, name))
            if any(isinstance(t, torch.Tensor) and t.is_meta for t in inputs):
                inputs = fake_copy(inputs)
            try:
                return measure_step(real.model, inputs, mode=real.mode, optimizer=real.optimizer,
                                    loss_fn=real.loss_fn, target=real.target, name=real.name, device=real.device,
                                    meta=_meta(real), micro_steps=min(real.accumulate, 2),
                                    in_backward=real.optimizer_in_backward,
                                    set_to_none=real.set_to_none).to_dict()
            except NeedsMallocCounter:
                return {"needs_malloc_counter": True}

        result = run_in_child(work, timeout_s=timeout_s)
        if result.get("needs_malloc_counter"):  # quantized layers: FBGEMM's memory is seen by malloc only
            from nnmem.runner.mallocpeak import library

            preload = library()
            if preload is None:
                raise UnsupportedError("measuring dynamically quantized layers needs the malloc counter, which "
                                       "needs Linux with glibc and a C compiler (cc or gcc)")
            result = run_in_child(work, timeout_s=timeout_s, preload=preload)
        return Report.from_dict(result)


def _quantization(model: torch.nn.Module, trace: Trace, rules: WorkspaceRules, notes: list[str]) -> None:
    """What an estimate says of quantized layers: the peak range of dynamically quantized ones (their threads'
    buffers overlap or not) and the CPU note on those buffers, quantized modules no rule models, and QLoRA's
    stand-ins and save_on_cpu's traced hooks (modelled, not measured: a note on every device)."""
    from nnmem.frontends.pytorch import offload
    from nnmem.frontends.pytorch.qlora import MODELLED_NOTE, TracedLoRA4bit
    from nnmem.frontends.pytorch.quantized import (
        fbgemm_blocking,
        packed_modules,
        packed_threads_note,
        thread_range,
        unmodelled_note,
    )

    blocking = fbgemm_blocking(rules.cpu)
    if blocking is not None and packed_modules(model):
        rules.notes_add(packed_threads_note(blocking))
        spread = thread_range(trace, blocking)
        if spread is not None and spread[0] < spread[1]:
            trace.meta["peak_low"], trace.meta["peak_high"] = spread
    if (other := unmodelled_note(model)) is not None:
        rules.notes_add(other)
    if any(isinstance(m, TracedLoRA4bit) for m in model.modules()):
        notes.append(MODELLED_NOTE)
    if offload.is_traced_offload(model):
        notes.append(offload.MODELLED_NOTE)


FRONTEND = PyTorchFrontend()
