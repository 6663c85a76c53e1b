"""The TensorFlow kernels' memory rules: Einsum scratch and TensorListFromTensor's row copies."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

if os.environ.get("KERAS_BACKEND") != "tensorflow":
    pytest.skip("needs KERAS_BACKEND=tensorflow", allow_module_level=True)

import tensorflow as tf  # noqa: E402

from nnmem.allocators.bfc import bfc_round  # noqa: E402
from nnmem.frontends.keras.tensorflow import scratch  # noqa: E402


def test_einsum_scratch_counts_transposed_operands_and_output() -> None:
    a = tf.TensorSpec((8, 64, 4, 16), tf.float32)

    @tf.function
    def scores(k: tf.Tensor, q: tf.Tensor) -> tf.Tensor:
        return tf.einsum("aecd,abcd->acbe", k, q)

    @tf.function
    def plain(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        return tf.einsum("bij,bjk->bik", x, w)

    op = next(o for o in scores.get_concrete_function(a, a).graph.get_operations() if o.type == "Einsum")
    assert scratch.einsum_scratch(op) == 2 * 8 * 64 * 4 * 16 * 4  # both operands copied, output in place
    assert scratch.scratch_bytes(op) == scratch.einsum_scratch(op)  # the table's rule for Einsum
    b = tf.TensorSpec((8, 32, 32), tf.float32)
    op = next(o for o in plain.get_concrete_function(b, b).graph.get_operations() if o.type == "Einsum")
    assert scratch.einsum_scratch(op) == 0  # already batch-matmul order: no copies


def test_tensor_list_from_tensor_copies_each_row() -> None:
    t = tf.TensorSpec((32, 8, 10), tf.float32)
    assert scratch.list_copy_bytes(t) == 32 * bfc_round(8 * 10 * 4)  # 320 B rows: 512 B chunks


def test_every_rule_cites_its_source() -> None:
    assert all(rule.source for rule in scratch.RULES.values())
    assert scratch.rule_of("Conv2D").memory is scratch.Memory.NEW  # no rule: a new buffer, no scratch


def test_onednn_takes_float16_only_where_tensorflow_says_so() -> None:
    # tensorflow/core/util/util.cc IsDataTypeSupportedByOneDNNOnThisCPU
    epyc = ("avx2", "avx512f", "avx512bw", "avx512_bf16", "avx512_vnni")
    sapphire_rapids = (*epyc, "avx512_fp16", "amx_bf16", "amx_tile")
    assert not scratch.onednn_takes(tf.half, epyc)
    assert scratch.onednn_takes(tf.half, sapphire_rapids)
    assert scratch.onednn_takes(tf.bfloat16, epyc) and not scratch.onednn_takes(tf.bfloat16, ("avx2",))
    assert scratch.onednn_takes(tf.float32, ("avx2",))


def _graph_ops(step: Any) -> list[Any]:
    from nnmem.frontends.keras.tensorflow import trace

    return list(trace._concrete(step)[0].graph.get_operations())


def test_a_float16_step_names_its_unmodelled_eigen_kernels_on_a_cpu_without_avx512_fp16(
        zoo_step: Callable[..., Any]) -> None:
    @tf.function
    def conv3d(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        return tf.nn.conv3d(x, w, [1, 1, 1, 1, 1], "SAME")

    graph_ops = conv3d.get_concrete_function(tf.TensorSpec((4, 6, 8, 8, 16), tf.half),
                                             tf.TensorSpec((3, 3, 3, 16, 8), tf.half)).graph.get_operations()
    note = scratch.eigen_fallback_note(graph_ops, ("avx2", "avx512f", "avx512bw"))
    assert note is not None and "float16" in note and "Conv3D" in note
    assert scratch.eigen_fallback_note(graph_ops, ("avx512bw", "avx512_fp16")) is None
    assert "TF_ENABLE_ONEDNN_OPTS=0" in str(scratch.eigen_fallback_note(graph_ops, ("avx512bw", "avx512_fp16"),
                                                                         onednn=False))
    # keras_mixed_float16 runs only Eigen kernels the rules model (conv, its gradients, matmul)
    fp16_cnn = _graph_ops(zoo_step("keras_mixed_float16", "train", 4))
    assert scratch.eigen_fallback_note(fp16_cnn, ("avx2", "avx512f", "avx512bw")) is None
    assert scratch.eigen_fallback_note(_graph_ops(zoo_step("keras_mlp", "train", 4)), ("avx2",)) is None


_EIGEN_ENV = {"TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPP_MIN_LOG_LEVEL": "2"}
"""Read when TensorFlow loads, which the child does while it unpickles this module's function: set at its start.
Set later, oneDNN stays on, and where it runs float16 (AVX512-FP16: Sapphire Rapids) no Eigen kernel runs."""


def _eigen_rises() -> list[tuple[str, int, int, int]]:
    """In a fresh TensorFlow with oneDNN off (Eigen kernels on any CPU) and the BFC allocator (:data:`_EIGEN_ENV`):
    for half-precision filter and input gradients and a matmul, (case, the BFC peak's rise over one call, the
    output's bytes, the rule's scratch bytes)."""
    import tensorflow as tf_child

    from nnmem.frontends.keras.tensorflow import scratch as rules

    def rise(fn: Any, *args: Any) -> tuple[int, int, int]:
        fn(*args)
        graph_op = next(o for o in fn.get_concrete_function(*args).graph.get_operations()
                        if o.type in ("Conv2DBackpropFilter", "Conv2DBackpropInput", "MatMul"))
        tf_child.config.experimental.reset_memory_stats("CPU:0")
        before = tf_child.config.experimental.get_memory_info("CPU:0")["current"]
        out = fn(*args)
        peak = tf_child.config.experimental.get_memory_info("CPU:0")["peak"]
        return peak - before, int(out.shape.num_elements()) * 2, rules.scratch_bytes(graph_op)

    def zeros(*shape: int) -> Any:
        return tf_child.zeros(shape, tf_child.half)

    def filter_grad(sizes: list[int]) -> Any:
        return tf_child.function(lambda x, dy: tf_child.raw_ops.Conv2DBackpropFilter(
            input=x, filter_sizes=sizes, out_backprop=dy, strides=[1, 1, 1, 1], padding="SAME"))

    def input_grad(sizes: list[int]) -> Any:
        return tf_child.function(lambda w, dy: tf_child.raw_ops.Conv2DBackpropInput(
            input_sizes=sizes, filter=w, out_backprop=dy, strides=[1, 1, 1, 1], padding="SAME"))

    return [
        ("filter 3x3x32x64, 8x16x16", *rise(filter_grad([3, 3, 32, 64]), zeros(8, 16, 16, 32), zeros(8, 16, 16, 64))),
        ("filter 3x3x3x32, 8x32x32", *rise(filter_grad([3, 3, 3, 32]), zeros(8, 32, 32, 3), zeros(8, 32, 32, 32))),
        ("input 3x3x32x64, 8x16x16", *rise(input_grad([8, 16, 16, 32]), zeros(3, 3, 32, 64), zeros(8, 16, 16, 64))),
        ("input 3x3x32x64, 1x16x16", *rise(input_grad([1, 16, 16, 32]), zeros(3, 3, 32, 64), zeros(1, 16, 16, 64))),
        ("matmul 8x64 @ 64x10", *rise(tf_child.function(tf_child.matmul), zeros(8, 64), zeros(64, 10))),
    ]


def test_eigen_conv_backprop_and_half_matmul_scratch_match_tensorflow() -> None:
    """The custom backprop kernels' im2col buffers (a 30 MiB working set whatever the batch; one image at a time
    for an input gradient at batch 1) and the half matmul's float casts, against TensorFlow's BFC peak: the rise
    over a call is the output and the scratch, each in a chunk of at least its bytes and under twice them."""
    from nnmem.runner.child import run_in_child

    rises = run_in_child(_eigen_rises, timeout_s=240, env=_EIGEN_ENV)
    for case, rise, out, scratch_bytes in rises:
        assert scratch_bytes > 0, case
        assert out + scratch_bytes <= rise < 2 * (bfc_round(out) + scratch_bytes), (case, rise, out, scratch_bytes)
    by_case = {case: scratch_bytes for case, _, _, scratch_bytes in rises}
    assert by_case["filter 3x3x3x32, 8x32x32"] > 8 * 32 * 32 * 27 * 2  # sized to the working set, not the batch
    assert by_case["input 3x3x32x64, 1x16x16"] == 16 * 16 * 288 * 2  # one image's patches


def _eigen_conv_rises() -> list[tuple[str, int, int, int, int]]:
    """In a fresh TensorFlow with oneDNN off (:data:`_EIGEN_ENV`): TensorFlow's own depthwise and grouped convolution
    kernels, (case, the BFC peak's rise over one call, the output's BFC bytes, the rule's scratch, the rule's scratch
    on one thread)."""
    import tensorflow as tf_child

    from nnmem.frontends.keras.tensorflow import scratch as rules

    def rise(fn: Any, *args: Any) -> tuple[int, int, int, int]:
        fn(*args)
        graph_op = next(o for o in fn.get_concrete_function(*args).graph.get_operations()
                        if o.type.startswith(("DepthwiseConv2dNative", "Conv2D")))
        tf_child.config.experimental.reset_memory_stats("CPU:0")
        before = tf_child.config.experimental.get_memory_info("CPU:0")["current"]
        out = fn(*args)
        peak = tf_child.config.experimental.get_memory_info("CPU:0")["peak"]
        one_thread = rules.depthwise_scratch(graph_op, threads=1) if graph_op.type != "Conv2D" else \
            rules.scratch_bytes(graph_op)
        return peak - before, bfc_round(int(out.shape.num_elements()) * 4), rules.scratch_bytes(graph_op), one_thread

    def zeros(*shape: int) -> Any:
        return tf_child.zeros(shape)

    conv = {"strides": [1, 1, 1, 1], "padding": "SAME"}
    forward = tf_child.function(lambda x, w: tf_child.raw_ops.DepthwiseConv2dNative(input=x, filter=w, **conv))

    def input_grad(sizes: list[int]) -> Any:
        return tf_child.function(lambda w, dy: tf_child.raw_ops.DepthwiseConv2dNativeBackpropInput(
            input_sizes=sizes, filter=w, out_backprop=dy, **conv))

    def filter_grad(sizes: list[int]) -> Any:
        return tf_child.function(lambda x, dy: tf_child.raw_ops.DepthwiseConv2dNativeBackpropFilter(
            input=x, filter_sizes=sizes, out_backprop=dy, **conv))

    grouped = tf_child.function(lambda x, w: tf_child.raw_ops.Conv2D(input=x, filter=w, **conv))
    return [  # the depthwise cases first: the grouped ones' large freed chunks would be handed out to them whole
        ("forward 5x5x30, 16x12x12", *rise(forward, zeros(16, 12, 12, 30), zeros(5, 5, 30, 1))),
        ("forward 3x3x32x2, 4x20x20", *rise(forward, zeros(4, 20, 20, 32), zeros(3, 3, 32, 2))),
        ("input 5x5x30, 16x12x12", *rise(input_grad([16, 12, 12, 30]), zeros(5, 5, 30, 1), zeros(16, 12, 12, 30))),
        ("filter 5x5x30, 16x12x12", *rise(filter_grad([5, 5, 30, 1]), zeros(16, 12, 12, 30), zeros(16, 12, 12, 30))),
        ("filter 7x7x13x3, 64x10x10", *rise(filter_grad([7, 7, 13, 3]), zeros(64, 10, 10, 13), zeros(64, 10, 10, 39))),
        ("filter 3x3x64, 1x10x10", *rise(filter_grad([3, 3, 64, 1]), zeros(1, 10, 10, 64), zeros(1, 10, 10, 64))),
        ("grouped 3x3x16->32 / 2, 4x16x16", *rise(grouped, zeros(4, 16, 16, 32), zeros(3, 3, 16, 32))),
        ("grouped 5x5x4->16 / 4, 8x10x10", *rise(grouped, zeros(8, 10, 10, 16), zeros(5, 5, 4, 16))),
        ("grouped 7x7x2->12 / 3, 1x30x30", *rise(grouped, zeros(1, 30, 30, 6), zeros(7, 7, 2, 12))),
    ]


def test_eigen_depthwise_and_grouped_scratch_matches_tensorflow() -> None:
    """TensorFlow's own depthwise kernels (oneDNN off: the default on a CPU without AVX512_VNNI, AVX512_BF16,
    AVX_VNNI or AMX): packet-padded windows per shard, the padded filter, and the filter gradient's per-image sums
    (a 64-image 7x7 filter gradient: 501,760 B for a 7,644 B output). The rise over a call lies between the rule on
    one thread and the rule on the pool's threads (how many windows overlap follows timing). A grouped Conv2D
    (``LaunchGrouped``) holds its shuffled input, filter and output: at least those, and under twice them where an
    earlier case's freed chunks are handed out whole."""
    from nnmem.runner.child import run_in_child

    for case, rise, out, scratch_bytes, one_thread in run_in_child(_eigen_conv_rises, timeout_s=240, env=_EIGEN_ENV):
        assert scratch_bytes > 0, case
        high = out + scratch_bytes if case.startswith(("forward", "input", "filter")) else 2 * (out + scratch_bytes)
        assert out + one_thread <= rise <= high, (case, rise, out, scratch_bytes, one_thread)


def _bfc_in_use_after(first_mib: int, second_mib: int) -> int:
    """In a fresh TensorFlow with the BFC allocator on the CPU: the bytes in use once a ``first_mib`` tensor was
    freed and a ``second_mib`` one made in its place."""
    os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf_child

    first = tf_child.zeros((first_mib << 18,), tf_child.float32)
    del first
    before = tf_child.config.experimental.get_memory_info("CPU:0")["current"]
    second = tf_child.zeros((second_mib << 18,), tf_child.float32)
    now = tf_child.config.experimental.get_memory_info("CPU:0")["current"]
    del second
    return int(now - before)


@pytest.mark.parametrize(("first", "second"), [(512, 300), (256, 129)])
def test_the_bfc_model_splits_chunks_where_tensorflow_does(first: int, second: int) -> None:
    """A freed 512 MiB region serves 300 MiB split off (the whole chunk would waste 212 MiB, over TensorFlow's
    128 MiB), a freed 256 MiB one serves 129 MiB whole (127 MiB of waste, under twice the request)."""
    from nnmem.allocators.bfc import BFCAllocator
    from nnmem.runner.child import run_in_child

    model = BFCAllocator()
    model.release(model.alloc(first << 20)[0])
    measured = run_in_child(lambda: _bfc_in_use_after(first, second), timeout_s=120)
    assert measured == model.alloc(second << 20)[1]


def test_the_unmodelled_kernel_note_looks_inside_while_loop_bodies() -> None:
    import keras
    import numpy as np

    import nnmem
    from nnmem import cpu

    class LoopedConv3D(keras.layers.Layer):  # a 3-D convolution run in a while loop's body function
        def build(self, shape: Any) -> None:
            self.w = self.add_weight(shape=(3, 3, 3, shape[-1], shape[-1]))

        def call(self, x: Any) -> Any:
            def body(_: Any, y: Any) -> Any:
                return tf.nn.conv3d(y, tf.cast(self.w, y.dtype), [1, 1, 1, 1, 1], "SAME")

            return keras.ops.fori_loop(0, 2, body, x)

    inputs = keras.Input((4, 8, 8, 4))
    model = keras.Model(inputs, LoopedConv3D(dtype="mixed_float16")(inputs))
    report = nnmem.estimate(model, np.zeros((2, 4, 8, 8, 4), np.float32), mode="infer")
    noted = [n for n in report.notes if n.startswith("not modelled on this CPU")]
    if scratch.onednn_takes(tf.half, cpu.describe().flags):  # oneDNN runs it: nothing to note on this CPU
        assert noted == []
    else:
        assert len(noted) == 1 and "float16 Conv3D" in noted[0]
