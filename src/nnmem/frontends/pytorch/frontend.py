"""The PyTorch frontend's entry points: estimate (fake trace) and measure (real run in a child)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from nnmem import cuda
from nnmem.errors import ConfigError
from nnmem.frontends.pytorch.step import fake_copy, optimizer_name, trace_fake_step
from nnmem.loader import Built, build
from nnmem.report.model import Report, report_from_trace
from nnmem.trace import Trace

__all__ = ["is_torch_model", "estimate_torch", "measure_torch", "build_torch", "shaped_inputs"]


def is_torch_model(model: Any) -> bool:
    return isinstance(model, torch.nn.Module)


def _rules() -> Any:
    try:
        from nnmem.frontends.pytorch import workspace
    except ImportError:  # the rules module is optional while it is being written
        return None
    return workspace.RULES


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


def estimate_torch(model: torch.nn.Module, inputs: Any, *, mode: str, optimizer: Any, loss_fn: Any, target: Any,
                   device: str, name: str, batch: int | None, notes: tuple[str, ...] = ()) -> Report:
    """Estimate a PyTorch step under FakeTensorMode."""
    meta: dict[str, object] = {"optimizer": optimizer_name(optimizer) if mode == "train" else "",
                               "batch": batch or _batch_of(inputs), "torch": torch.__version__}
    trace = trace_fake_step(model, _as_tuple(inputs), mode=mode, optimizer=optimizer, loss_fn=loss_fn,
                            target=target, rules=_rules(), meta=meta)
    all_notes = list(notes)
    target_cuda = cuda.cuda_target(device)
    if target_cuda is not None:
        trace = cuda.without_workspace(trace)
        peaks = cuda_level_peaks(trace, target_cuda)
        all_notes.append(cuda.NOT_VALIDATED)
        return report_from_trace(trace, source="estimate", model=name, device=target_cuda.name, level="reserved",
                                 overrides=peaks, notes=tuple(all_notes))
    if _rules() is None:
        all_notes.append("kernel workspace rules are not available: the allocator level equals the tensor level")
    return report_from_trace(trace, source="estimate", model=name, device=device, notes=tuple(all_notes))


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


def measure_torch(built: Built, *, mode: str, optimizer: Any, device: str, name: str, batch: int | None) -> Report:
    """Run the step for real (call in a child process)."""
    from nnmem.frontends.pytorch.measure import measure_step

    meta: dict[str, object] = {"optimizer": optimizer_name(optimizer) if mode == "train" else "",
                               "batch": batch or _batch_of(built.inputs), "torch": torch.__version__}
    inputs = _as_tuple(built.inputs)
    if any(isinstance(t, torch.Tensor) and t.is_meta for t in inputs):
        inputs = fake_copy(inputs)
    return measure_step(built.model, inputs, mode=mode, optimizer=optimizer, loss_fn=built.loss_fn,
                        target=built.target, name=name, device=device, meta=meta)


def _batch_of(inputs: Any) -> int | None:
    first = inputs if isinstance(inputs, torch.Tensor) else (inputs[0] if isinstance(inputs, (tuple, list)) and inputs
                                                             else None)
    return int(first.shape[0]) if isinstance(first, torch.Tensor) and first.dim() > 0 else None




def tracer(model: Any, inputs: Any, *, spec: str | None, input_shape: Any, mode: str, optimizer: Any,
           loss_fn: Any, target: Any) -> Callable[[int], Any]:
    """A function batch → Trace of the step at that batch, traced under FakeTensorMode.

    A MODEL spec's factory is called at each batch under the meta device; a model with example
    inputs gets inputs (and a target) whose leading dimension is replaced by the batch.
    """
    from nnmem.loader import resolve_factory

    factory = resolve_factory(spec) if spec is not None else None
    example = _batch_of(inputs) if inputs is not None else None

    def trace_at(batch: int) -> Any:
        if factory is not None:
            built, _ = build_torch(factory, batch, spec or "", meta=True)
            x = (shaped_inputs(batch, input_shape, device="meta") if input_shape else built.inputs)
            if x is None:
                raise ConfigError(f"the factory {spec!r} returned only a model: give the input shape")
            return trace_fake_step(built.model, _as_tuple(x), mode=mode, optimizer=optimizer,
                                   loss_fn=loss_fn or built.loss_fn,
                                   target=target if target is not None else built.target, rules=_rules(),
                                   meta={"batch": batch})
        if example is None:
            raise ConfigError("expected inputs whose first dimension is the batch, to rescale them")
        return trace_fake_step(model, _rebatch(_as_tuple(inputs), example, batch), mode=mode, optimizer=optimizer,
                               loss_fn=loss_fn, target=_rebatch(target, example, batch), rules=_rules(),
                               meta={"batch": batch})

    return trace_at


def _rebatch(value: Any, example: int, batch: int) -> Any:
    """Meta tensors like ``value`` whose leading dimension ``example`` becomes ``batch``."""
    if isinstance(value, torch.Tensor):
        shape = (batch, *value.shape[1:]) if value.dim() and value.shape[0] == example else tuple(value.shape)
        return torch.empty(shape, dtype=value.dtype, device="meta")
    if isinstance(value, (tuple, list)):
        return type(value)(_rebatch(v, example, batch) for v in value)
    return value
