"""Estimate a Keras step on JAX from XLA's own buffer assignment of the executable Keras jits.

``train_on_batch`` jits ``model.train_step`` with ``donate_argnums=0`` on ``state = (trainable, non_trainable,
optimizer, metrics)`` and ``data = (x, y, None)``; ``predict_on_batch`` jits ``predict_step`` on ``(trainable,
non_trainable)`` (``keras/src/backend/jax/trainer.py``: ``make_train_function``, ``_get_jax_state``). We jit the
same functions with the same donation from ``jax.ShapeDtypeStruct`` s and compile; nothing batch-sized is
allocated. Live during the step (``compiled.memory_analysis()``): every argument, every output that does not
reuse a donated buffer, XLA's temporaries, and the scratch of :mod:`.scratch` read from ``compiled.as_text()``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import jax
import keras

from nnmem.allocators.bfc import bfc_round
from nnmem.errors import TraceError, UnsupportedError
from nnmem.frontends.keras.common import (
    KerasStep,
    array_nbytes,
    flat_arrays,
    layer_infos,
    optimizer_label,
    resident_variables,
)
from nnmem.frontends.keras.jax import hlo
from nnmem.frontends.keras.jax.scratch import (
    Workspace,
    eigen_uncalibrated,
    fusion_workspace,
    rounded_convolution_fusions,
    runtime_bookkeeping,
)
from nnmem.trace import Block, Category, Op, Phase, Trace

__all__ = ["trace_step", "gemm_workspace", "backend_meta", "state_variables", "step_data", "variable_blocks"]


def _struct(a: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(int(d) for d in a.shape), jax.dtypes.canonicalize_dtype(a.dtype))


def _structs(value: Any) -> Any:
    return keras.tree.map_structure(lambda a: None if a is None else _struct(a), value)


def state_variables(model: Any, mode: str) -> tuple[list[Any], ...]:
    """The variable lists Keras passes as ``state``, in ``_get_jax_state``'s order."""
    if mode == "train":
        return (list(model.trainable_variables), list(model.non_trainable_variables),
                list(model.optimizer.variables), list(model.metrics_variables))
    return list(model.trainable_variables), list(model.non_trainable_variables)


def step_data(step: KerasStep) -> tuple[Any, ...]:
    """The ``data`` argument Keras passes to the jitted step."""
    return (step.x, step.y, None) if step.mode == "train" else (step.x,)


def variable_blocks(step: KerasStep) -> list[Block]:
    """The variables resident before the step, as Keras holds them."""
    return [Block(i, array_nbytes(v), category, layer, Phase.SETUP, -1, -1)
            for i, (v, category, layer) in enumerate(resident_variables(step.model, step.mode))]


def backend_meta(step: KerasStep, meta: dict[str, object]) -> dict[str, object]:
    """``meta`` with the JAX and Keras versions, and the optimizer of a train step."""
    meta = {**meta, "jax": jax.__version__, "keras": keras.__version__}
    if step.mode == "train":
        meta["optimizer"] = optimizer_label(step.model)
    return meta


def _step_function(model: Any, mode: str) -> Callable[..., Any]:
    """The function Keras jits for the step (``make_train_function`` / ``make_predict_function``)."""
    if mode == "train":
        return model.train_step  # type: ignore[no-any-return]

    def predict_step(state: Any, data: Any) -> Any:
        outputs, non_trainable = model.predict_step(state, data)
        return outputs, (state[0], non_trainable)

    return predict_step


def _compiled(step: KerasStep) -> Any:
    model = step.model
    if getattr(model, "jit_compile", True) is False or getattr(model, "run_eagerly", False):
        raise UnsupportedError("the Keras model is compiled with jit_compile=False or run_eagerly=True; the JAX "
                               "estimate reads XLA's buffer assignment: compile it with jit_compile=True")
    state = tuple([_struct(v.value) for v in group] for group in state_variables(model, step.mode))
    data = _structs(step_data(step))
    fn = jax.jit(_step_function(model, step.mode), donate_argnums=0)
    try:
        lowered = fn.lower(state, data)
    except (ValueError, TypeError, IndexError) as err:
        shapes = ", ".join(str(tuple(a.shape)) for a in flat_arrays(step.x))
        first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise TraceError(f"the Keras model rejected inputs of shape {shapes}: {first[:300]} — pass inputs "
                         "shaped as the model's Input") from err
    return lowered.compile()


def trace_step(step: KerasStep, *, meta: dict[str, object], gpu: tuple[int, int] | None = None) -> Trace:
    """Estimate the step from the buffer assignment of its compiled XLA executable.

    Nothing batch-sized is allocated: the executable is compiled from shape structs.

    Args:
        step: the prepared step.
        meta: facts for the report (batch, ...); JAX and Keras versions and the optimizer are added.
        gpu: the compute capability of a GPU the step is estimated for (None: this CPU). On a GPU every buffer
            comes from the client's BFC allocator (rounded to 256 B), the CPU kernels' scratch is left out and
            XLA's temporaries gain the largest cuBLAS workspace a matmul of the step gets
            (:func:`gemm_workspace`).

    Returns:
        A trace of framework "keras-jax": the variables and the data resident, then one op that allocates
        the step's outputs and XLA temporaries and frees the temporaries; its workspace is the kernel scratch
        XLA's buffer assignment does not see and the runtime's bookkeeping (:mod:`.scratch`), in bytes. Where
        the scratch depends on how XLA's and YNNPACK's threads overlap, ``meta`` carries ``peak_low`` and
        ``peak_high``: the step's peak with one instruction and one worker at a time, and with all overlapping.

    Raises:
        TraceError: the model rejects the inputs' shapes.
    """
    compiled = _compiled(step)
    stats = compiled.memory_analysis()
    blocks = variable_blocks(step)
    data = flat_arrays(step_data(step))
    blocks += [Block(len(blocks) + i, array_nbytes(a), Category.INPUTS, "", Phase.SETUP, -1, -1)
               for i, a in enumerate(data)]
    new_outputs = int(stats.output_size_in_bytes - stats.alias_size_in_bytes)
    temp = int(stats.temp_size_in_bytes)
    phase = Phase.FORWARD if step.mode == "infer" else Phase.BACKWARD
    module = hlo.parse(compiled.as_text())
    scratch = fusion_workspace(module)
    bookkeeping = runtime_bookkeeping(module, compiled.out_tree.num_leaves)
    if gpu is not None:  # the GPU client's BFC rounds every buffer; no CPU kernel scratch
        blocks = [replace(b, nbytes=bfc_round(b.nbytes)) for b in blocks]
        temp, new_outputs = bfc_round(temp + gemm_workspace(module, gpu)), bfc_round(new_outputs)
        scratch, bookkeeping = Workspace(0, 0, 0), 0
    n = len(blocks)
    blocks += [Block(n, temp, Category.TEMPORARIES, "", phase, 0, 0),
               Block(n + 1, new_outputs, Category.ACTIVATIONS, "", phase, 0, -1)]
    ops = (Op(0, "xla.execute", phase, "", temp + new_outputs, temp, scratch.high + bookkeeping),)
    high = sum(b.nbytes for b in blocks) + scratch.high + bookkeeping
    spread = {"peak_low": high - (scratch.high - scratch.low), "peak_high": high} if scratch.low < scratch.high \
        else {}
    meta = {**backend_meta(step, meta),
            "xla.argument_bytes": int(stats.argument_size_in_bytes),
            "xla.output_bytes": int(stats.output_size_in_bytes),
            "xla.alias_bytes": int(stats.alias_size_in_bytes), "xla.temp_bytes": temp,
            "xla.code_bytes": int(stats.generated_code_size_in_bytes),
            "inputs_bytes": sum(array_nbytes(a) for a in data),
            "xla.max_conv_scratch_bytes": scratch.largest, "xla.conv_workspace_bytes": scratch.high,
            "xla.conv_workspace_low_bytes": scratch.low, "xla.runtime_bookkeeping_bytes": bookkeeping, **spread}
    meta["flops"] = _flops(compiled)
    meta["flops_counter"] = "XLA's cost analysis of the compiled step, pointwise ops included"
    unmodelled = []
    if _integer_dots(module):
        unmodelled.append("not modelled: integer dots (Keras's int8 matmul: s8 x s8 -> s32) run XLA's own "
                          "contraction, whose packing buffers are not modelled; the allocator level may be higher")
    eigen = eigen_uncalibrated(module) if gpu is None else 0
    if eigen:
        unmodelled.append(f"not modelled: {eigen} convolution(s) / dot(s) on XLA's own Eigen kernels whose scratch is "
                          "not ported for this CPU (oneDNN's sgemm below AVX2, grouped convolutions, non-float32 "
                          "operands): the allocator level may be a few % higher or lower (docs/cpu-isa.md)")
    rounded = rounded_convolution_fusions(module)
    if rounded and gpu is None:
        unmodelled.append(f"not modelled: {len(rounded)} YNNPACK fusion(s) round convolutions' or pooling windows' "
                          "values to 16 bits (a mixed-precision policy on XLA:CPU); YNNPACK keeps some of those "
                          "intermediates whole, which the scratch rules do not size: the allocator level may be "
                          "higher (docs/backends/keras-jax.md)")
    if unmodelled:
        meta["unmodelled"] = "\n".join(unmodelled)
    return Trace("keras-jax", step.mode, tuple(blocks), ops, layer_infos(step.model), meta)


def _flops(compiled: Any) -> int:
    """Floating-point operations of the compiled step, as XLA's ``HloCostAnalysis`` counts them (0: not given)."""
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax: one dict per computation
        cost = cost[0] if cost else None
    return int(cost.get("flops", 0)) if isinstance(cost, dict) else 0


def gemm_workspace(module: hlo.Module, compute_capability: tuple[int, int]) -> int:
    """The largest cuBLAS workspace XLA's GPU compiler gives a matmul of the step, in bytes.

    ``gemm_rewriter.cc`` (``GemmWorkspaceRewriteVisitor``) appends an ``s8[workspace]`` output to each cuBLAS
    gemm, part of the executable's temporaries: the operands' bytes, at most ``GemmConfig::kDefaultWorkspace``
    (4 MiB), ``kHopperWorkspace`` (32 MiB) from compute capability 9.0 (``matmul_utils.h``). Read from the CPU
    executable's dots (the GPU compiler may fuse a small one into a Triton kernel instead: a bound).
    """
    cap = (32 if compute_capability[0] >= 9 else 4) << 20
    largest = 0
    for body in module.computations.values():
        for ins in body:
            if ins.opcode == "dot":
                operands = sum(hlo.nbytes(module.types.get(o, "")) or 0 for o in ins.operands)
                largest = max(largest, min(cap, operands))
    return largest


def _integer_dots(module: hlo.Module) -> bool:
    """Whether a dot of the step reads 8- or 4-bit integer operands."""
    return any(ins.opcode == "dot" and any(module.types.get(o, "").startswith(("s8[", "u8[", "s4[", "u4["))
                                           for o in ins.operands)
               for body in module.computations.values() for ins in body)
