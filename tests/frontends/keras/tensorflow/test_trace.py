"""The Keras frontend on TensorFlow: the graph replay against the BFC allocator's real peak of the same step."""

from __future__ import annotations

import functools
import os

import pytest

if os.environ.get("KERAS_BACKEND") != "tensorflow":
    pytest.skip("needs KERAS_BACKEND=tensorflow", allow_module_level=True)
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from nnmem.errors import MeasureError, TraceError  # noqa: E402
from nnmem.frontends.keras.common import prepare, resident_variables  # noqa: E402
from nnmem.frontends.keras.tensorflow import trace as tf_backend  # noqa: E402
from nnmem.runner.child import run_in_child  # noqa: E402
from nnmem.trace import Category, Phase  # noqa: E402
from nnmem.zoo.keras_models import FACTORIES  # noqa: E402

BATCH = 8
LIMIT = 0.15  # the per-case maximum error against the BFC peak (sequential executor)

CASES = [pytest.param(name, mode, id=f"{name}-{mode}") for name in FACTORIES for mode in ("train", "infer")]


def _step(name: str, mode: str, batch: int = BATCH):  # type: ignore[no-untyped-def]
    model, x, y, loss = FACTORIES[name](batch)
    if mode == "train":
        return prepare(model, x, y, mode="train", optimizer="adam", loss=loss)
    return prepare(model, x, None, mode="infer")


RUNS = 2
"""Fresh processes each accuracy case is measured in. With the schedule pinned most peaks repeat to the byte;
a few still move by a chunk or two with the holes the setup leaves (keras_separable_cnn infer: 3,043,840 or
3,142,144 B), so a case passes when the estimate is within :data:`LIMIT` of a peak the step really reached in one
of the runs."""


@functools.cache
def _measured(name: str, mode: str) -> tuple[int, tuple[int, ...], str]:
    """(estimated peak, each run's measured peak, schedule) of one zoo step, :data:`RUNS` fresh processes."""
    import nnmem

    report = nnmem.measure(name, mode=mode, optimizer="adam" if mode == "train" else None, batch=BATCH,
                           runs=RUNS, timeout_s=240)
    return (int(report.meta["estimated_peak"]), tuple(int(p) for p in report.meta["runs_peaks"]),
            str(report.meta["schedule"]))


def test_bfc_allocator_is_on() -> None:
    ones = tf.ones((1024,)) * 2.0  # computed on the CPU device: allocated by its allocator
    assert tf.config.experimental.get_memory_info("CPU:0")["current"] >= ones.shape[0] * 4, "BFC not in use"


@pytest.mark.accuracy
@pytest.mark.parametrize(("name", "mode"), CASES)
def test_estimate_matches_bfc_peak(name: str, mode: str) -> None:
    estimated, peaks, schedule = _measured(name, mode)
    assert schedule == "pinned"
    closest = min(peaks, key=lambda p: abs(estimated - p) / p)
    assert abs(estimated - closest) <= LIMIT * closest, (
        f"estimated {estimated:,} B, measured {', '.join(f'{p:,}' for p in peaks)} B in {RUNS} processes "
        f"({(estimated - closest) / closest:+.1%} from the closest)")


def test_measure_refuses_a_runtime_with_parallel_kernels() -> None:
    tf.constant(1.0) + 1.0  # this process started TensorFlow with its default thread pools
    if tf.config.threading.get_intra_op_parallelism_threads() == tf_backend.MEASURE_INTRA_OP_THREADS:
        pytest.skip("this process runs the measurement's thread pools")
    with pytest.raises(MeasureError, match="intra-op thread"):
        tf_backend.measure_step(_step("keras_mlp", "infer"), name="keras_mlp", meta={})


def test_measure_refuses_a_pool_too_small_for_nested_calls() -> None:
    """The sequential executor blocks an inter-op thread per nested call: too few threads would deadlock."""

    def work() -> str:
        os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
        os.environ["KERAS_BACKEND"] = "tensorflow"
        import tensorflow as tf_child

        from nnmem.errors import MeasureError as Refused
        from nnmem.frontends.keras.tensorflow import trace as backend

        tf_child.config.threading.set_inter_op_parallelism_threads(1)
        tf_child.config.threading.set_intra_op_parallelism_threads(1)
        try:
            backend.measure_step(_step("keras_mixed_float16", "train"), name="keras_mixed_float16", meta={})
        except Refused as err:
            return str(err)
        return "measured"

    message: str = run_in_child(work, timeout_s=240)
    assert "nests function calls" in message


def test_call_depth_counts_nested_function_calls() -> None:
    assert tf_backend.trace_step(_step("keras_mlp", "infer"), meta={}).meta["call_depth"] == 0
    depth = tf_backend.trace_step(_step("keras_mixed_float16", "train"), meta={}).meta["call_depth"]
    assert isinstance(depth, int) and depth >= 1  # the loss-scale optimizer's tf.cond


def test_bfc_replay_hands_out_unsplit_chunks() -> None:
    bfc = tf_backend._BFC()
    big, chunk = bfc.alloc(1_800_000)
    assert chunk == 2 << 20  # the first 2 MiB region is under 2x the request: handed out whole
    assert bfc.alloc(1000)[1] == 1024  # a new (4 MiB) region, split: 1000 B rounded to 256 B
    bfc.release(big)
    assert bfc.alloc(1 << 20)[1] == 1 << 20  # the freed 2 MiB chunk is 2x this request: split
    assert bfc.in_use == (1 << 20) + 1024


def test_trace_categories_and_meta() -> None:
    step = _step("keras_mlp", "train")
    trace = tf_backend.trace_step(step, meta={"batch": BATCH})
    cats = {b.category for b in trace.blocks}
    assert {Category.PARAMETERS, Category.OPTIMIZER_STATE, Category.INPUTS, Category.GRADIENTS} <= cats
    grads = sum(b.nbytes for b in trace.blocks if b.category is Category.GRADIENTS)
    params = sum(b.nbytes for b in trace.blocks if b.category is Category.PARAMETERS)
    assert params <= grads < 2 * params  # one gradient per trainable variable, in a BFC chunk of at least its size
    assert trace.framework == "keras-tensorflow" and trace.meta["optimizer"] == "adam"
    assert {op.phase for op in trace.ops} == {Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER}
    layers = {b.layer for b in trace.blocks if b.category is Category.SAVED_ACTIVATIONS}
    assert any(path.startswith("keras_mlp/dense") for path in layers)
    assert sum(b.nbytes for b in trace.blocks if b.alloc_op < 0) == trace.resident_bytes


def test_frozen_layers_have_no_gradients_or_slots() -> None:
    step = _step("keras_partly_frozen", "train")
    trace = tf_backend.trace_step(step, meta={})
    trainable = sum(tf_backend.bfc_round(int(np.prod(v.shape)) * 4) for v in step.model.trainable_variables)
    grads = [b.nbytes for b in trace.blocks if b.category is Category.GRADIENTS]
    assert len(grads) == len(step.model.trainable_variables)
    assert trainable <= sum(grads) < 2 * trainable  # BFC chunks: at least the request, under twice it
    frozen = {b.layer for b in trace.blocks if b.category is Category.GRADIENTS}
    assert not any(path.split("/")[-1].startswith("frozen_") for path in frozen)
    slots = [layer for _, c, layer in resident_variables(step.model, "train") if c is Category.OPTIMIZER_STATE]
    assert not any("frozen_" in layer for layer in slots)


def test_mixed_float16_halves_activations() -> None:
    step = _step("keras_mixed_float16", "infer")
    trace = tf_backend.trace_step(step, meta={})
    conv = max(b.nbytes for b in trace.blocks if b.alloc_op >= 0)
    assert conv == tf_backend.bfc_round(BATCH * 32 * 32 * 32 * 2)  # the first conv's float16 output


def test_estimate_allocates_nothing_batch_sized() -> None:
    step = _step("keras_two_branch_cnn", "train", batch=512)
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    trace = tf_backend.trace_step(step, meta={})
    assert tf.config.experimental.get_memory_info("CPU:0")["current"] - before < 1 << 20
    assert max(b.nbytes for b in trace.blocks) >= 512 * 32 * 32 * 32 * 4


def test_wrong_input_shape_is_a_trace_error() -> None:
    model, x, y, loss = FACTORIES["keras_mlp"](BATCH)
    step = prepare(model, x, y, mode="train", optimizer="adam", loss=loss)
    bad = type(step)(step.model, np.zeros((BATCH, 100), "float32"), y, "train", BATCH)
    with pytest.raises(TraceError, match="rejected inputs"):
        tf_backend.trace_step(bad, meta={})


def test_einsum_scratch_counts_transposed_operands_and_output() -> None:
    a = tf.TensorSpec((8, 64, 4, 16), tf.float32)

    @tf.function
    def scores(k: tf.Tensor, q: tf.Tensor) -> tf.Tensor:
        return tf.einsum("aecd,abcd->acbe", k, q)

    @tf.function
    def plain(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        return tf.einsum("bij,bjk->bik", x, w)

    op = next(o for o in scores.get_concrete_function(a, a).graph.get_operations() if o.type == "Einsum")
    assert tf_backend._einsum_scratch(op) == 2 * 8 * 64 * 4 * 16 * 4  # both operands copied, output in place
    b = tf.TensorSpec((8, 32, 32), tf.float32)
    op = next(o for o in plain.get_concrete_function(b, b).graph.get_operations() if o.type == "Einsum")
    assert tf_backend._einsum_scratch(op) == 0  # already batch-matmul order: no copies


def test_rnn_gradient_accumulators_keep_each_recomputed_state() -> None:
    step = _step("keras_lstm", "train")
    cf, _ = tf_backend._concrete(step)
    functions = tf_backend._functions_of(cf.graph)
    loop = next(o for o in cf.graph.get_operations()
                if o.type in tf_backend._WHILES and not o.name.startswith("gradient_tape/"))
    body = functions[loop.get_attr("body").name].graph
    replay = tf_backend._Replay(functions)
    state = BATCH * 128 * 4  # h and c: (8, 128) float32
    kept = {}
    for k, out in enumerate(body.outputs):
        if out.op.type == "TensorListPushBack":
            pushed = out.op.inputs[1]
            key = (pushed.op.type, tf_backend._carried_state(body, pushed), pushed.shape.rank)
            kept[key] = replay._accumulated(loop, k)
    assert kept[("Placeholder", True, 2)] == 31 * state  # 32 tokens: the first state is the loop's input
    assert kept[("Placeholder", True, 0)] == 31 * 256  # the time counter: a 256 B chunk per iteration
    assert kept[("ReadVariableOp", False, 2)] == 0  # the kernel read each iteration is the variable itself
    assert kept[("TensorListGetItem", False, 2)] == 0  # x_t: an element of the input list, already held
    assert kept[("Tanh", False, 2)] == 32 * state


def test_tensor_list_from_tensor_copies_each_row() -> None:
    t = tf.TensorSpec((32, 8, 10), tf.float32)
    assert tf_backend._list_copy_bytes(t) == 32 * tf_backend.bfc_round(8 * 10 * 4)  # 320 B rows: 512 B chunks


def test_recurrent_estimates_say_the_default_executor_can_peak_higher() -> None:
    import nnmem

    lstm = nnmem.estimate("keras_lstm", mode="infer", batch=BATCH)
    mlp = nnmem.estimate("keras_mlp", mode="infer", batch=BATCH)
    assert any("while-loop iterations concurrently" in n for n in lstm.notes)
    assert not any("while-loop" in n for n in mlp.notes)


def test_estimates_say_which_schedule_they_model() -> None:
    import nnmem

    report = nnmem.estimate("keras_mlp", mode="train", batch=BATCH)
    assert any(n.startswith("schedule:") and "construction order" in n for n in report.notes)
    assert any(n.startswith("BFC layout:") for n in report.notes)


@pytest.mark.accuracy
def test_pinned_schedule_repeats_between_processes() -> None:
    """Unpinned, this step peaked anywhere from 6.30 to 8.14 MB at batch 8 (16 processes): its backward kernels
    ran in an order that followed heap addresses. Pinned, every process runs the same order."""
    _, peaks, _ = _measured("keras_separable_cnn", "train")
    assert max(peaks) - min(peaks) <= 0.01 * min(peaks), peaks


def _traced_graph(name: str, mode: str = "train"):  # type: ignore[no-untyped-def]
    cf, _ = tf_backend._concrete(_step(name, mode))
    return cf.graph


def test_execution_order_runs_mergeable_kernels_back_to_back() -> None:
    graph = _traced_graph("keras_separable_cnn")
    order = tf_backend._execution_order(graph, tf_backend._reachable(graph))
    position = {op.name: i for i, op in enumerate(order)}
    assert len(order) == len(position) == len(tf_backend._reachable(graph))
    for i, op in enumerate(order):  # topological
        assert all(position[t.op.name] < i for t in op.inputs), op.name
        assert all(position[c.name] < i for c in op.control_inputs), op.name
    pairs = 0
    for op in order:
        if op.type == "BiasAdd" and op.inputs[0].op.type == "Conv2D":
            assert position[op.name] == position[op.inputs[0].op.name] + 1, op.name
            pairs += 1
        if op.type == "BiasAddGrad":
            filters = [c for c in op.inputs[0].consumers() if c.type == "Conv2DBackpropFilter"]
            assert all(abs(position[f.name] - position[op.name]) == 1 for f in filters), op.name
            pairs += len(filters)
    assert pairs == 6  # three separable convolutions: forward bias adds and backward bias gradients


def test_pin_leaves_the_executor_one_order() -> None:
    graph = _traced_graph("keras_mlp")
    tf_backend._pin(graph)
    chain = [op for op in tf_backend._execution_order(graph, tf_backend._reachable(graph))
             if op.type not in tf_backend._UNPINNED]
    for before, op in zip(chain, chain[1:]):
        assert before in op.control_inputs or any(t.op is before for t in op.inputs), (before.name, op.name)


def test_random_initializers_leave_holes_that_later_variables_fill() -> None:
    """keras_lstm's build as the BFC log shows it: the LSTM kernel lands whole in the embedding's 249,600 B hole."""
    resident = [(256_000, 2), (131_072, 2), (262_144, 0), (2_048, 0), (5_120, 2), (256, 0)]
    held, _ = tf_backend._bfc_chunks(resident, [], [], [], [])
    # under 2x the request, handed out unsplit (249,600 B in the real build, whose 256 B seed tensors sit there too)
    assert held[0] == 256_000 and held[1] == 249_856
    assert sum(held) == 775_424  # the real build leaves 777,216 B in use (small tensors besides)


def test_initializer_temporaries_follow_each_variables_initializer() -> None:
    model = FACTORIES["keras_lstm"](BATCH)[0]
    temps = tf_backend._initializer_temporaries(model)
    embedding, lstm = model.layers[0], model.layers[1].cell  # Keras numbers layer names per process: no paths
    assert temps[id(embedding.embeddings)] == tf_backend.RANDOM_INITIALIZER_TEMPORARIES  # RandomUniform
    assert temps[id(lstm.kernel)] == tf_backend.RANDOM_INITIALIZER_TEMPORARIES  # GlorotUniform
    assert temps[id(lstm.recurrent_kernel)] == 0  # Orthogonal: not calibrated
    assert temps[id(lstm.bias)] == 0
