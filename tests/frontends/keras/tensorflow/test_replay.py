"""The TensorFlow graph replay: while-loop gradient accumulators and nested function calls."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

if os.environ.get("KERAS_BACKEND") != "tensorflow":
    pytest.skip("needs KERAS_BACKEND=tensorflow", allow_module_level=True)

from nnmem.frontends.keras.tensorflow import replay, trace  # noqa: E402

BATCH = 8


def test_call_depth_counts_nested_function_calls(zoo_step: Callable[..., Any]) -> None:
    assert trace.trace_step(zoo_step("keras_mlp", "infer", BATCH), meta={}).meta["call_depth"] == 0
    depth = trace.trace_step(zoo_step("keras_mixed_float16", "train", BATCH), meta={}).meta["call_depth"]
    assert isinstance(depth, int) and depth >= 1  # the loss-scale optimizer's tf.cond


def test_rnn_gradient_accumulators_keep_each_recomputed_state(zoo_step: Callable[..., Any]) -> None:
    step = zoo_step("keras_lstm", "train", BATCH)
    cf, _ = trace._concrete(step)
    functions = replay.functions_of(cf.graph)
    loop = next(o for o in cf.graph.get_operations()
                if o.type in replay.WHILES and not o.name.startswith("gradient_tape/"))
    body = functions[loop.get_attr("body").name].graph
    graph_replay = replay.Replay(functions)
    state = BATCH * 128 * 4  # h and c: (8, 128) float32
    kept = {}
    for k, out in enumerate(body.outputs):
        if out.op.type == "TensorListPushBack":
            pushed = out.op.inputs[1]
            key = (pushed.op.type, replay._carried_state(body, pushed), pushed.shape.rank)
            kept[key] = graph_replay._accumulated(loop, k)
    assert kept[("Placeholder", True, 2)] == 31 * state  # 32 tokens: the first state is the loop's input
    assert kept[("Placeholder", True, 0)] == 31 * 256  # the time counter: a 256 B chunk per iteration
    assert kept[("ReadVariableOp", False, 2)] == 0  # the kernel read each iteration is the variable itself
    assert kept[("TensorListGetItem", False, 2)] == 0  # x_t: an element of the input list, already held
    assert kept[("Tanh", False, 2)] == 32 * state


def test_gradient_loop_iterations_in_flight_hold_their_kernel_gradients(zoo_step: Callable[..., Any]) -> None:
    """The LSTM's gradient loop: each iteration's h^T dz (128 x 512) and x^T dz (64 x 512) wait for the sum of
    the earlier iterations' ones, up to parallel_iterations (32 = the 32 tokens) of them; the high end holds them."""
    step = zoo_step("keras_lstm", "train", BATCH)
    cf, _ = trace._concrete(step)
    functions = replay.functions_of(cf.graph)
    loop = next(o for o in cf.graph.get_operations()
                if o.type in replay.WHILES and o.name.startswith("gradient_tape/"))
    assert replay.in_flight(loop) == 32
    waiting = replay.waiting_bytes(functions[loop.get_attr("body").name].graph)
    kernels = (64 + 128) * 512 * 4 + 512 * 4  # the kernels' and the bias' per-iteration gradients
    small = 16 * BATCH * 128 * 4  # a few (8, 128) gate gradients meeting the carried dh / dc
    assert kernels <= waiting <= kernels + small
    graph_replay = replay.Replay(functions)
    graph_replay.run([loop], {t.name for t in cf.graph.inputs}, [(trace.Phase.BACKWARD, "")])
    assert graph_replay.overlap == [31 * (waiting + 256)]  # and each iteration's loop condition, a 256 B chunk


def test_a_lowered_gradient_loop_accumulates_into_its_zeros(zoo_step: Callable[..., Any]) -> None:
    """The LSTM's gradient loop sums each kernel's per-iteration gradient into a loop variable that starts as a
    ``Fill`` of zeros. The functional While kernel keeps the zeros until it returns and hands back new buffers; lowered
    to frames (the default executor) the zeros are the sum's buffer: the kernels' and bias' gradient sums, one
    buffer each instead of two."""
    step = zoo_step("keras_lstm", "train", BATCH)
    cf, _ = trace._concrete(step)
    graph = cf.graph
    ops = [o for o in graph.get_operations() if o.name.startswith("gradient_tape/") and
           (o.type in replay.WHILES or (o.type == "Fill" and "/while/zeros" in o.name))]
    assert [o.type for o in ops].count("Fill") == 3  # (64, 512), (128, 512), (512,)
    sums = (64 + 128) * 512 * 4 + 512 * 4
    allocated = {}
    for lowered in (False, True):
        graph_replay = replay.Replay(replay.functions_of(graph), lowered=lowered)
        graph_replay.run(ops, {t.name for t in graph.inputs}, [(trace.Phase.BACKWARD, "")] * len(ops),
                         keep=[t.name for o in ops if o.type in replay.WHILES for t in o.outputs])
        allocated[lowered] = sum(graph_replay.sizes)
    assert allocated[False] - allocated[True] == sums


def test_a_loop_without_carried_arrays_does_not_overlap() -> None:
    """Only a value that depends on a carried array can make an iteration wait: a loop that only sums scalars
    (its counter and a scalar total) adds nothing to the high end, whatever its parallel_iterations."""
    import tensorflow as tf

    @tf.function
    def f(x: Any) -> Any:
        return tf.while_loop(lambda i, s: i < 5, lambda i, s: (i + 1, s + tf.reduce_sum(x * 2.0)),
                             (tf.constant(0), tf.constant(0.0)), parallel_iterations=7, maximum_iterations=5)

    graph = f.get_concrete_function(tf.TensorSpec((64, 64), tf.float32)).graph
    functions = replay.functions_of(graph)
    loop = next(o for o in graph.get_operations() if o.type in replay.WHILES)
    assert replay.in_flight(loop) == 5  # parallel_iterations 7, but 5 iterations in all
    assert replay.waiting_bytes(functions[loop.get_attr("body").name].graph) == 0


def test_only_a_kernels_own_scratch_takes_one_allocator_chunk() -> None:
    """An einsum's transposed operand is one request (the BFC hands it one chunk); a loop's rise is many buffers,
    each rounded already: it keeps the bytes requested, whatever chunk a single request of that size would get."""
    import tensorflow as tf

    @tf.function
    def f(k: Any, q: Any) -> Any:
        scores = tf.einsum("aecd,abcd->acbe", k, q)
        return tf.while_loop(lambda i, s: i < 3, lambda i, s: (i + 1, s * 2.0), (tf.constant(0), scores))[1]

    spec = tf.TensorSpec((8, 64, 4, 16), tf.float32)
    graph = f.get_concrete_function(spec, spec).graph
    ops = [o for o in graph.get_operations() if o.type in ("Einsum", *replay.WHILES)]
    graph_replay = replay.Replay(replay.functions_of(graph))
    graph_replay.run(ops, {t.name for t in graph.inputs}, [(trace.Phase.FORWARD, "")] * len(ops))
    assert graph_replay.single == [op.type == "Einsum" for op in ops] == [True, False]
    assert graph_replay.scratch_chunks([4096, 4096], [3000, 3000]) == [4096, 3000]


def test_assigned_values_the_variable_adopts(zoo_step: Callable[..., Any]) -> None:
    """AssignVariableOp adopts its value's buffer when it is the value's last user (``forward_input``): in
    keras_two_branch_cnn's Adam step, the BatchNorm's moving statistics, the loss metric's total and count and the
    optimizer's iteration. TensorFlow's allocation log of the real step (``benchmarks/tf_alloc_log.py``) shows
    these five 256 B buffers outliving the step that made them; Adam's slots and the weights are updated in place
    (AssignSub/AssignAdd), and no weight moves."""
    from nnmem.frontends.keras.common import resident_variables
    from nnmem.frontends.keras.tensorflow.schedule import execution_order, reachable
    from nnmem.trace import Phase

    step = zoo_step("keras_two_branch_cnn", "train", BATCH)
    cf, _ = trace._concrete(step)
    graph = cf.graph
    ops = execution_order(graph, reachable(graph))
    graph_replay = replay.Replay(replay.functions_of(graph))
    graph_replay.run(ops, {t.name for t in graph.inputs}, [(Phase.FORWARD, "")] * len(ops),
                     keep=[t.name for t in graph.outputs])
    variables = resident_variables(step.model, "train")
    handles = trace.variable_handles(step, graph)
    moved = sorted(str(variables[r][0].name) for _, _, r in graph_replay.adoptions(handles))
    assert moved == ["count", "iteration", "moving_mean", "moving_variance", "total"]
    assert all(graph_replay.sizes[b] == 256 for _, b, _ in graph_replay.adopted)


_COPY_ON_WRITE = r"""
import tensorflow as tf
v = tf.Variable(tf.zeros((256, 1024)))  # 1 MiB
@tf.function
def step(x):
    w = v.read_value()
    update = v.assign_sub(x)
    with tf.control_dependencies([update]):  # the read is still held when the update runs
        return tf.reduce_sum(w)
x = tf.ones((256, 1024))
step(x)
for _ in range(4):
    tf.config.experimental.reset_memory_stats("CPU:0")
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    step(x)
    print(tf.config.experimental.get_memory_info("CPU:0")["peak"] - before)
"""


def test_an_update_while_a_read_is_held_copies_the_variable() -> None:
    """AssignSubVariableOp on a variable whose read is still held copies it first (PrepareToUpdateVariable): the
    replay's copy block is what the real step's BFC peak rises by. The real steps alternate between 1 MiB + 256 B
    and 2 MiB - 256 B (the copy lands in a free chunk under twice its size every other step, handed out whole):
    the bytes requested are the lower one."""
    import subprocess
    import sys

    import tensorflow as tf

    from nnmem.frontends.keras.tensorflow.schedule import execution_order, reachable
    from nnmem.trace import Phase

    v = tf.Variable(tf.zeros((256, 1024)))

    @tf.function
    def step(x: Any) -> Any:
        w = v.read_value()
        update = v.assign_sub(x)
        with tf.control_dependencies([update]):
            return tf.reduce_sum(w)

    graph = step.get_concrete_function(tf.TensorSpec((256, 1024))).graph
    ops = execution_order(graph, reachable(graph))
    graph_replay = replay.Replay(replay.functions_of(graph))
    graph_replay.run(ops, {t.name for t in graph.inputs}, [(Phase.FORWARD, "")] * len(ops),
                     keep=[t.name for t in graph.outputs])
    copies = [(ops[i].type, graph_replay.sizes[b]) for i, b, _ in graph_replay.adopted]
    assert copies == [("AssignSubVariableOp", 1 << 20)]
    rise = max(sum(s for s, a, f in zip(graph_replay.sizes, graph_replay.alloc_at, graph_replay.free_at)
                   if a <= i and (f < 0 or f >= i)) for i in range(len(ops)))
    env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-c", _COPY_ON_WRITE], env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    measured = [int(line) for line in done.stdout.split()[-4:]]
    assert rise == min(measured) == (1 << 20) + 256
