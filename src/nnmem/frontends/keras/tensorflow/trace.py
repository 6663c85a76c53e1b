"""The Keras frontend on the TensorFlow backend: a step estimated from the graph of its ``tf.function``.

Keras 3 resolves ``jit_compile="auto"`` to False on a CPU-only machine (``Trainer._resolve_auto_jit_compile``),
so ``train_on_batch`` runs ``one_step_on_data``, a plain ``tf.function``, on TensorFlow's graph executor. The
estimate traces that function afresh for ``tf.TensorSpec`` s of the data (nothing batch-sized is allocated),
orders its ops (:mod:`.schedule`), replays them (:mod:`.replay`) and hands every buffer to the BFC allocator
model (:mod:`nnmem.allocators.bfc`) from the model's build on, each variable after the temporaries of its random
initializer. ``peak_bytes`` is that sequential order's; ``meta["peak_low"]`` / ``["peak_high"]`` the range over the
orders the default executor can run (:mod:`.spread`). Blocks are attributed to the innermost ``Layer.__call__``
that created their op. Not modelled: other initializers' temporaries, kernels' per-thread scratch.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import keras
import tensorflow as tf

from nnmem import cpu
from nnmem.allocators.bfc import bfc_round, steady_state_chunks
from nnmem.errors import ConfigError, TraceError, first_line
from nnmem.frontends.keras.common import (
    KerasStep,
    array_nbytes,
    flat_arrays,
    layer_infos,
    optimizer_label,
    resident_variables,
)
from nnmem.frontends.keras.tensorflow.replay import Replay, call_depth, functions_of, loop_weight_casts, while_loops
from nnmem.frontends.keras.tensorflow.schedule import execution_order, reachable
from nnmem.frontends.keras.tensorflow.scratch import VIEWS, eigen_fallback_note, onednn_enabled
from nnmem.frontends.keras.tensorflow.spread import (
    GRAPPLER_MAX_ELEMENTS,
    GpuBfc,
    const_bytes,
    oversized,
    peak_in_use,
    peak_range,
)
from nnmem.trace import Block, Category, Op, Phase, Trace

__all__ = ["RANDOM_INITIALIZER_TEMPORARIES", "RESOURCE_HANDLE_BYTES", "trace_step"]

RESOURCE_HANDLE_BYTES = 256
"""The BFC chunk each variable's handle holds for the variable's lifetime: ``VarHandleOp``
(``resource_variable_ops.cc``) allocates its output, a scalar ``DT_RESOURCE`` tensor of one ``ResourceHandle``
(device, container and name strings, hash, type and the dtypes-and-shapes list: under 256 B), on the host
allocator, the BFC allocator on a CPU, whose smallest chunk is 256 B. Measured: ten float32 variables of 4
elements take 5,120 B of BFC bytes in use, 512 B each (256 B value, 256 B handle); keras_mlp's 22 training
variables (weights, Adam's slots, iterations, learning rate, the loss tracker's two) left its resident bytes
5,632 B = 22 x 256 B under the BFC's before they were counted."""


@dataclass
class _Spans:
    """What each created graph op ran for: layer calls (op index ranges) and where the phases begin."""

    layers: list[tuple[int, int, str]]
    optimizer_start: int = -1


@contextmanager
def _recording(model: Any) -> Iterator[_Spans]:
    """Record, while the step's function is traced, which ops each ``Layer.__call__`` and the optimizer create."""
    spans = _Spans([])
    original = keras.layers.Layer.__call__

    def count() -> int:
        return len(tf.compat.v1.get_default_graph().get_operations())

    def call(layer: Any, *args: Any, **kwargs: Any) -> Any:
        start = count()
        try:
            return original(layer, *args, **kwargs)
        finally:
            spans.layers.append((start, count(), str(getattr(layer, "path", None) or layer.name)))

    opt = getattr(model, "optimizer", None)
    keras.layers.Layer.__call__ = call  # type: ignore[method-assign]
    if opt is not None:
        apply = opt.apply_gradients

        def traced_apply(*args: Any, **kwargs: Any) -> Any:
            if spans.optimizer_start < 0:
                spans.optimizer_start = count()
            return apply(*args, **kwargs)

        opt.apply_gradients = traced_apply
    try:
        yield spans
    finally:
        keras.layers.Layer.__call__ = original  # type: ignore[method-assign]
        if opt is not None:
            del opt.apply_gradients


def _spec(a: Any) -> Any:
    return tf.TensorSpec(tuple(int(d) for d in a.shape), tf.as_dtype(keras.backend.standardize_dtype(a.dtype)))


def _step_function(step: KerasStep) -> tuple[Any, tuple[Any, ...]]:
    """Keras's own ``tf.function`` for the step and the arguments it is called with (as specs)."""
    model = step.model
    x = keras.tree.map_structure(_spec, step.x)
    if step.mode == "infer":
        model.make_predict_function()
        return model.predict_function, ([(x,)],)
    y = keras.tree.map_structure(_spec, step.y)
    model._maybe_symbolic_build(data_batch=(step.x, step.y, None))
    model.make_train_function()
    for cell in model.train_function.__closure__ or ():  # function(iterator) → _autoconvert_optionals(one_step)
        inner = getattr(cell.cell_contents, "__wrapped__", None)
        if isinstance(inner, tf.types.experimental.PolymorphicFunction):
            return inner, ((x, y, None),)
    raise TraceError("could not find the tf.function of Keras's train step (model.train_function); "
                     "was the model compiled with run_eagerly=True? Compile it without run_eagerly")


def _concrete(step: KerasStep) -> tuple[Any, _Spans]:
    """The step's function traced afresh for specs of its data, and the spans of ops its layers created."""
    fn, args = _step_function(step)
    if getattr(step.model, "jit_compile", False):
        raise ConfigError("the model is compiled with jit_compile=True (XLA); the TensorFlow estimate models the "
                          "graph executor: compile with jit_compile=False (Keras's default on CPU)")
    try:
        with _recording(step.model) as spans:
            # a fresh tracing of the Python function: exact static shapes, no cached relaxed signature
            cf = tf.function(fn.python_function, autograph=False).get_concrete_function(*args)
    except (ValueError, TypeError, tf.errors.InvalidArgumentError) as err:
        shapes = ", ".join(f"{tuple(a.shape)} {keras.backend.standardize_dtype(a.dtype)}"
                           for a in flat_arrays(step.x))
        first = first_line(err)
        raise TraceError(f"the Keras model rejected inputs [{shapes}]: {first}") from err
    return cf, spans

def _where(ops: list[Any], spans: _Spans) -> list[tuple[Phase, str]]:
    """Each op's phase and innermost layer, gradients named after the forward op they differentiate."""
    layer = [""] * len(ops)
    for start, end, path in sorted(spans.layers, key=lambda s: s[0] - s[1]):  # outermost first
        for i in range(start, min(end, len(ops))):
            layer[i] = path
    by_name = {op.name: layer[i] for i, op in enumerate(ops) if layer[i]}
    out: list[tuple[Phase, str]] = []
    for i, op in enumerate(ops):
        if 0 <= spans.optimizer_start <= i:
            out.append((Phase.OPTIMIZER, layer[i]))
        elif op.name.startswith("gradient_tape/"):
            out.append((Phase.BACKWARD, _forward_layer(op.name[len("gradient_tape/"):], by_name)))
        else:
            out.append((Phase.FORWARD, layer[i]))
    return out


def _forward_layer(name: str, by_name: dict[str, str]) -> str:
    parts = name.split("/")
    for end in range(len(parts), 0, -1):
        hit = by_name.get("/".join(parts[:end]))
        if hit is not None:
            return hit
    prefixes = {n.rsplit("/", 1)[0]: p for n, p in by_name.items()}
    for end in range(len(parts), 0, -1):
        hit = prefixes.get("/".join(parts[:end]))
        if hit is not None:
            return hit
    return ""


_RANDOM_INITIALIZERS = (keras.initializers.RandomUniform, keras.initializers.RandomNormal,
                        keras.initializers.TruncatedNormal, keras.initializers.VarianceScaling)
RANDOM_INITIALIZER_TEMPORARIES = 2
"""Buffers of a variable's size a random Keras initializer allocates before the variable's own, on TensorFlow:
the raw random tensor and its scaled copy, freed once the variable holds the shifted result. Calibrated on the
BFC log of a build (``TF_CPP_VMODULE=bfc_allocator=4``: +A +B +C -B -A per GlorotUniform / RandomUniform
variable); see docs/backends/keras-tensorflow.md, "Calibration notes"."""


def _initializer_temporaries(model: Any) -> dict[int, int]:
    """Temporaries of each variable's initializer, by ``id(variable)``: :data:`RANDOM_INITIALIZER_TEMPORARIES`
    for a random initializer, 0 for others (zeros, ones, orthogonal: not calibrated) and unknown ones.

    A layer names a variable's initializer ``<name>_initializer`` (``kernel_initializer``,
    ``embeddings_initializer``) or, for ``recurrent_kernel`` / ``depthwise_kernel`` / ``pointwise_kernel``,
    ``<prefix>_initializer``.
    """
    temps: dict[int, int] = {}
    if not hasattr(model, "_flatten_layers"):  # Keras internals (3.x): without them, no initializer holes
        return temps
    for layer in model._flatten_layers(include_self=True):
        own = [*getattr(layer, "_trainable_variables", ()), *getattr(layer, "_non_trainable_variables", ())]
        for v in own:
            name = str(v.name)
            init = getattr(layer, f"{name}_initializer", None) or getattr(
                layer, f"{name.removesuffix('_kernel')}_initializer", None)
            temps[id(v)] = RANDOM_INITIALIZER_TEMPORARIES if isinstance(init, _RANDOM_INITIALIZERS) else 0
    return temps


def _resident(step: KerasStep, graph: Any, handles: bool = True) -> tuple[list[Block], list[int]]:
    """Blocks live before the step (their bytes as requested), and how many initializer temporaries preceded
    each (creation order). ``handles``: the variables' handles share the allocator (a CPU's; on a GPU they live in
    host memory, as every ``DT_RESOURCE`` tensor does)."""
    blocks: list[Block] = []
    temps = _initializer_temporaries(step.model)
    before: list[int] = []
    used = resident_variables(step.model, step.mode)
    for v, category, layer in used:
        blocks.append(Block(len(blocks), array_nbytes(v), category, layer, Phase.SETUP, -1, -1))
        before.append(temps.get(id(v), 0))
    for leaf in flat_arrays((step.x, step.y) if step.mode == "train" else step.x):
        blocks.append(Block(len(blocks), array_nbytes(leaf), Category.INPUTS, "", Phase.SETUP, -1, -1))
    consts = const_bytes(graph)
    if consts:  # ConstantOp keeps its tensor for the kernel's lifetime: live before and after the step
        blocks.append(Block(len(blocks), consts, Category.BUFFERS, "", Phase.SETUP, -1, -1))
    idle = _idle_variables(step, {id(v) for v, _, _ in used})  # a compiled model's optimizer and metrics
    for v, category, layer in idle:
        blocks.append(Block(len(blocks), array_nbytes(v), category, layer, Phase.SETUP, -1, -1))
    for _, _, layer in (*used, *idle) if handles else ():  # each variable's handle (after the captured blocks)
        blocks.append(Block(len(blocks), RESOURCE_HANDLE_BYTES, Category.BUFFERS, layer, Phase.SETUP, -1, -1))
    return blocks, before + [0] * (len(blocks) - len(before))


def _idle_variables(step: KerasStep, used: set[int]) -> list[tuple[Any, Category, str]]:
    """Variables that live in the process but that an inference step does not use (``used``: the ids of those
    it does): a compiled model's optimizer variables (its iteration count and learning rate before the first
    training step) and its metrics' (the loss tracker's total and count). None for a training step, whose
    resident variables include them."""
    if step.mode == "train":
        return []
    optimizer = getattr(step.model, "optimizer", None)
    idle = [(v, Category.OPTIMIZER_STATE, "") for v in (getattr(optimizer, "variables", None) or ())]
    idle += [(v, Category.BUFFERS, "") for v in getattr(step.model, "metrics_variables", ())]
    seen = set(used)
    out = []
    for v, category, layer in idle:
        if id(v) not in seen:
            seen.add(id(v))
            out.append((v, category, layer))
    return out


def variable_handles(step: KerasStep, graph: Any) -> dict[str, int]:
    """The resident index (:func:`_resident` order) of each variable, by the name of the handle placeholder the
    step's graph captured it as."""
    index: dict[int, int] = {}
    for r, (v, _, _) in enumerate(resident_variables(step.model, step.mode)):
        handle = getattr(getattr(v, "_value", v), "handle", None)
        if handle is not None:
            index[id(handle)] = r
    return {internal.name: index[id(external)] for external, internal in getattr(graph, "captures", ())
            if id(external) in index}


def _held(blocks: list[Block], held: list[int]) -> list[Block]:
    """The resident blocks with what their BFC chunks hold beyond the bytes requested (the 256 B rounding, and
    the whole of a free chunk under twice the request, as an initializer's temporaries leave them) split off
    as :attr:`Category.FRAGMENTATION` blocks of the same layer."""
    out: list[Block] = []
    for b, size in zip(blocks, held):
        out.append(replace(b, id=len(out)))
        if size > b.nbytes:
            out.append(Block(len(out), size - b.nbytes, Category.FRAGMENTATION, b.layer, Phase.SETUP, -1, -1))
    return out


def _categorize(replay: Replay, where: list[tuple[Phase, str]], grads: set[int]) -> list[Category]:
    """Each step block's category: gradients, forward blocks that outlive the forward pass (saved), the rest."""
    forward_end = max((i for i, (p, _) in enumerate(where) if p is Phase.FORWARD and i < len(where)), default=-1)
    cats: list[Category] = []
    for b, (alloc, free) in enumerate(zip(replay.alloc_at, replay.free_at)):
        phase = where[alloc][0]
        if b in grads:
            cats.append(Category.GRADIENTS)
        elif phase is Phase.FORWARD:
            lives_on = free < 0 or where[free][0] is not Phase.FORWARD or free > forward_end
            cats.append(Category.SAVED_ACTIVATIONS if lives_on and replay.ops else Category.ACTIVATIONS)
        else:
            cats.append(Category.TEMPORARIES)
    return cats


def _gradient_blocks(ops: list[Any], replay: Replay, where: list[tuple[Phase, str]]) -> set[int]:
    """Blocks of the tensors the optimizer receives: backward outputs consumed by optimizer ops."""
    index = {op.name: i for i, op in enumerate(ops)}
    first_block: dict[int, int] = {}
    for b, a in enumerate(replay.alloc_at):
        first_block.setdefault(a, b)
    out: set[int] = set()
    for i, op in enumerate(ops):
        if where[i][0] is not Phase.OPTIMIZER:
            continue
        for t in op.inputs:
            j = index.get(t.op.name, -1)
            while j >= 0 and ops[j].type in VIEWS and ops[j].inputs:
                j = index.get(ops[j].inputs[0].op.name, -1)
            if j >= 0 and where[j][0] is Phase.BACKWARD and j in first_block:
                out.add(first_block[j])
    return out


def graph_flops(graph: Any) -> int:
    """Floating-point operations of the graph's ops, as TensorFlow's profiler counts them (``float_operation``:
    the ops with registered FLOP statistics: matmuls, convolutions and their gradients, pointwise ops). Ops
    inside a loop's or a called function's body are not counted."""
    from tensorflow.python.profiler import model_analyzer, option_builder

    options = option_builder.ProfileOptionBuilder(
        option_builder.ProfileOptionBuilder.float_operation()).with_empty_output().build()
    logger = tf.get_logger()
    level = logger.level
    logger.setLevel("ERROR")  # the profiler warns that it was designed for TensorFlow 1
    try:
        return int(model_analyzer.profile(graph, options=options).total_float_ops)
    except (ValueError, TypeError, tf.errors.OpError):
        return 0
    finally:
        logger.setLevel(level)


def trace_step(step: KerasStep, *, meta: dict[str, object], with_range: bool = True,
               quick_range: bool = False, gpu: GpuBfc | None = None) -> Trace:
    """Estimate one Keras step on the TensorFlow backend from the graph of its ``tf.function``.

    Nothing batch-sized is allocated: the function is traced for ``tf.TensorSpec`` s of the data.

    Args:
        with_range: also find the peak range over the executor's orders (``peak_low`` / ``peak_high`` in
            ``meta``; it runs Grappler on the graph). A pinned measurement leaves it out: Grappler's pass in the
            measuring process changes the BFC layout the pinned step then lands in.
        quick_range: with ``with_range``, the few orders of ``peak_range(quick=True)`` (a batch search's high
            end).
        gpu: the step on a GPU: its buffers replayed through a fresh GPU BFC allocator from this factory (its
            memory limit, one region unless it grows), without the CPU kernels' scratch and with the variables'
            handles in host memory. None: the CPU's.

    Raises:
        TraceError: the model rejects the inputs' shapes or dtypes.
        ConfigError: the model is compiled with ``jit_compile=True``.
    """
    cf, spans = _concrete(step)
    graph = cf.graph
    every = graph.get_operations()
    where_of = dict(zip((op.name for op in every), _where(every, spans)))
    kept = reachable(graph)
    ops = execution_order(graph, kept)
    where = [where_of[op.name] for op in ops]
    replay = Replay(functions_of(graph), kernel_scratch=gpu is None)
    replay.run(ops, {t.name for t in graph.inputs}, where, keep=[t.name for t in graph.outputs])
    cats = _categorize(replay, where, _gradient_blocks(ops, replay, where) if step.mode == "train" else set())
    blocks, temporaries = _resident(step, graph, handles=gpu is None)
    resident = [(bfc_round(b.nbytes), t) for b, t in zip(blocks, temporaries)]
    workspace = [w for *_, w in replay.ops]
    handles = variable_handles(step, graph)
    held, chunks, scratch = steady_state_chunks(resident, replay.sizes, replay.alloc_at, replay.free_at, workspace,
                                                replay.adoptions(handles), bfc=None if gpu is None else gpu())
    scratch = replay.scratch_chunks(scratch, workspace)
    sequential = (peak_in_use(sum(b for b, _ in resident), replay.sizes, replay.alloc_at, replay.free_at, workspace),
                  peak_in_use(sum(held), chunks, replay.alloc_at, replay.free_at, scratch))
    # on a GPU, Grappler's rewrite for this process's CPU (oneDNN fusions) is not the GPU's graph: left out
    low, high, threads = (peak_range(graph, kept, resident, sequential, handles, grappler=gpu is None,
                                     quick=quick_range, gpu=gpu) if with_range else (None, None, None))
    blocks = _held(blocks, held)
    base = len(blocks)
    for b, size in enumerate(chunks):
        free = replay.free_at[b]
        blocks.append(Block(base + b, size, cats[b], replay.layers[b] or where[replay.alloc_at[b]][1],
                            where[replay.alloc_at[b]][0], replay.alloc_at[b], free))
    alloc = [0] * len(ops)
    freed = [0] * len(ops)
    for block in blocks[base:]:
        alloc[block.alloc_op] += block.nbytes
        if block.free_op >= 0:
            freed[block.free_op] += block.nbytes
    trace_ops = tuple(Op(i, f"{op.type}:{op.name}", where[i][0], where[i][1], alloc[i], freed[i], scratch[i])
                      for i, op in enumerate(ops))  # scratch as the BFC chunk it gets, like the blocks
    info = {**meta, "tensorflow": tf.__version__, "keras": keras.__version__, "batch": step.batch,
            "executor": "tf.function graph executor (jit_compile=False)",
            "call_depth": call_depth(graph, replay.functions),
            "while_loops": while_loops(graph, replay.functions),
            "allocator_model": ("BFC: 256-byte chunks, sequential schedule" if gpu is None
                                else "GPU BFC (GPU_0_bfc): 256-byte chunks, sequential schedule"),
            "peak_low": low, "peak_high": high, "inter_op_threads": threads, "flops": graph_flops(graph),
            "flops_counter": "TensorFlow's profiler on the step's graph, ops inside loops and called "
                             "functions left out"}
    bodies = [op for f in replay.functions.values() if getattr(f, "graph", None) is not None
              for op in f.graph.get_operations()]  # a while loop's cell runs its matmuls in its body function
    fallback = eigen_fallback_note([*ops, *bodies], cpu.describe().flags, onednn_enabled()) if gpu is None else None
    if fallback is not None:
        info["unmodelled"] = fallback
    cast, flight = loop_weight_casts(graph, replay.functions)
    if cast and flight > 1:
        info["loop_casts"] = (f"range: a loop casts its weights every iteration (a mixed-precision RNN): up to "
                              f"{flight} iterations run at once, each holding a {cast:,} B copy, which the allocator "
                              "may place in a free chunk of up to twice its size; the high end counts both")
    if with_range and gpu is None and oversized(graph):
        info["grappler_skipped"] = (f"range: a tensor of this step has over {GRAPPLER_MAX_ELEMENTS:,} elements, on "
                                    "which Grappler's optimizer crashes the process: the executor's orders on "
                                    "Grappler's rewrite of the graph are left out of the range")
    if step.mode == "train":
        info["optimizer"] = optimizer_label(step.model)
    return Trace("keras-tensorflow", step.mode, tuple(blocks), trace_ops, layer_infos(step.model), info)
