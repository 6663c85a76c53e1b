"""The TensorFlow kernels' memory rules: Einsum scratch and TensorListFromTensor's row copies."""

from __future__ import annotations

import os

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
