"""A Keras step on TensorFlow as Keras runs it on a GPU: compiled with XLA, its buffers from XLA's buffer assignment.

Keras resolves ``jit_compile="auto"`` to True when TensorFlow sees a GPU and every layer supports XLA
(``Trainer._resolve_auto_jit_compile``, ``model_supports_jit``), so on a GPU ``train_on_batch`` and
``predict_on_batch`` run their step function as ``tf.function(jit_compile=True)``: one XLA executable whose
arguments are the variables and the data, whose variable updates alias their inputs (the HLO's
``input_output_alias``, TensorFlow's resource-update aliasing) and whose temporaries are one allocation from the
device's BFC allocator. The estimate takes the step's HLO from TensorFlow (``experimental_get_compiler_ir``, from
``tf.TensorSpec`` s: nothing batch-sized is allocated) and compiles it for this CPU with JAX's XLA client to read
the buffer assignment (``get_compiled_memory_stats``). The GPU compiler fuses differently and adds cuDNN
workspaces (not modelled); the largest cuBLAS workspace a matmul gets is added (``gemm_workspace``).
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from nnmem.allocators.bfc import bfc_round
from nnmem.errors import TraceError, first_line
from nnmem.frontends.keras.common import KerasStep, array_nbytes, flat_arrays, layer_infos, resident_variables
from nnmem.frontends.keras.jax import hlo
from nnmem.frontends.keras.tensorflow.trace import _idle_variables, _step_function
from nnmem.trace import Block, Category, Op, Phase, Trace

__all__ = ["supports_xla", "trace_step"]


def supports_xla(model: Any) -> bool:
    """Whether Keras compiles ``model``'s step with XLA on a GPU: every layer supports it (``model_supports_jit``)."""
    return all(getattr(layer, "supports_jit", True) for layer in model._flatten_layers())


def _hlo(step: KerasStep) -> bytes:
    """The serialized HLO module of the step's function compiled with ``jit_compile=True``, traced from specs."""
    fn, args = _step_function(step)
    flat = keras.tree.flatten(args)
    specs = [a for a in flat if isinstance(a, tf.TensorSpec)]

    def call(*tensors: Any) -> Any:
        given = iter(tensors)
        return fn.python_function(*keras.tree.pack_sequence_as(
            args, [next(given) if isinstance(a, tf.TensorSpec) else a for a in flat]))

    try:
        compiled = tf.function(call, autograph=False, jit_compile=True)
        return bytes(compiled.experimental_get_compiler_ir(*specs)(stage="hlo_serialized"))
    except (ValueError, TypeError, tf.errors.OpError) as err:
        raise TraceError(f"TensorFlow could not compile the step with XLA: {first_line(err)}") from err


def _compile(proto: bytes) -> tuple[Any, str]:
    """XLA's memory statistics and optimized HLO text of the module, compiled for this CPU by JAX's client."""
    from jax._src import xla_bridge
    from jax._src.lib import xla_client

    backend = xla_bridge.get_backend("cpu")
    module = xla_client._xla.mlir.hlo_to_stablehlo(proto)
    executable = backend.compile_and_load(module, backend.devices()[:1], xla_client.CompileOptions())
    return executable.get_compiled_memory_stats(), executable.hlo_modules()[0].to_string()


def trace_step(step: KerasStep, *, meta: dict[str, object], gpu: tuple[int, int]) -> Trace:
    """The XLA step on a GPU of compute capability ``gpu``: the variables and the data resident, then one op that
    allocates XLA's temporaries (freed after it) and the outputs that alias no argument, every buffer rounded to
    the BFC allocator's 256 B.

    Raises:
        TraceError: TensorFlow cannot compile the step with XLA (an op without an XLA kernel).
    """
    from nnmem.frontends.keras.jax.trace import gemm_workspace

    stats, text = _compile(_hlo(step))
    used = resident_variables(step.model, step.mode)
    resident = [*used, *_idle_variables(step, {id(v) for v, _, _ in used})]
    blocks = [Block(i, bfc_round(array_nbytes(v)), category, layer, Phase.SETUP, -1, -1)
              for i, (v, category, layer) in enumerate(resident)]
    data = flat_arrays((step.x, step.y) if step.mode == "train" else step.x)
    blocks += [Block(len(blocks) + i, bfc_round(array_nbytes(a)), Category.INPUTS, "", Phase.SETUP, -1, -1)
               for i, a in enumerate(data)]
    workspace = gemm_workspace(hlo.parse(text), gpu)
    temp = bfc_round(int(stats.temp_size_in_bytes) + workspace)
    new_outputs = bfc_round(int(stats.output_size_in_bytes - stats.alias_size_in_bytes))
    phase = Phase.FORWARD if step.mode == "infer" else Phase.BACKWARD
    n = len(blocks)
    blocks += [Block(n, temp, Category.TEMPORARIES, "", phase, 0, 0),
               Block(n + 1, new_outputs, Category.ACTIVATIONS, "", phase, 0, -1)]
    ops = (Op(0, "xla.execute", phase, "", temp + new_outputs, temp, 0),)
    info = {**meta, "tensorflow": tf.__version__, "keras": keras.__version__, "batch": step.batch,
            "executor": "XLA (jit_compile=True, as Keras compiles on a GPU)",
            "allocator_model": "GPU BFC (GPU_0_bfc): 256-byte chunks",
            "xla.argument_bytes": int(stats.argument_size_in_bytes),
            "xla.output_bytes": int(stats.output_size_in_bytes),
            "xla.alias_bytes": int(stats.alias_size_in_bytes), "xla.temp_bytes": int(stats.temp_size_in_bytes),
            "xla.gemm_workspace_bytes": workspace}
    return Trace("keras-tensorflow", step.mode, tuple(blocks), ops, layer_infos(step.model), info)
