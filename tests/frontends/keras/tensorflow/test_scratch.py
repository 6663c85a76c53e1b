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
    assert scratch.rule_of("MatMul").memory is scratch.Memory.NEW  # no rule: a new buffer, no scratch


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


def test_a_float16_step_names_its_eigen_kernels_on_a_cpu_without_avx512_fp16(zoo_step: Callable[..., Any]) -> None:
    graph_ops = _graph_ops(zoo_step("keras_mixed_float16", "train", 4))
    note = scratch.eigen_fallback_note(graph_ops, ("avx2", "avx512f", "avx512bw"))
    assert note is not None and "float16" in note and "Conv2DBackpropFilter" in note
    assert scratch.eigen_fallback_note(graph_ops, ("avx512bw", "avx512_fp16")) is None
    assert scratch.eigen_fallback_note(_graph_ops(zoo_step("keras_mlp", "train", 4)), ("avx2",)) is None
