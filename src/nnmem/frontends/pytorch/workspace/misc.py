"""The workspace rules of the other ops with kernel scratch: embedding and batch-norm backward, batch norm
and max pooling, each citing the ATen source it follows."""

from __future__ import annotations

from typing import Any

import torch

from nnmem.cpu import CpuInfo
from nnmem.frontends.pytorch.workspace._common import aten, nbytes


def rule_embedding_backward(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                            training: bool, info: CpuInfo) -> int:
    """``embedding_dense_backward`` makes a strided grad contiguous first (aten/src/ATen/native/Embedding.cpp)."""
    grad = args[0]
    return 0 if grad.is_contiguous() else nbytes(grad)


# ---- normalisation and pooling -------------------------------------------------------------------------
def rule_native_batch_norm(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                           training: bool, info: CpuInfo) -> int:
    """Two per-channel temporaries (aten/src/ATen/native/Normalization.cpp batch_norm_cpu_transform_input)."""
    x = args[0]
    return 2 * int(x.shape[1]) * 4 if x.dim() > 1 else 0


def rule_batch_norm_infer(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                          training: bool, info: CpuInfo) -> int:
    """``aten.batch_norm`` under inference mode: per-channel alpha and beta (Normalization.cpp)."""
    return rule_native_batch_norm(args, kwargs, out, training, info)


def rule_native_batch_norm_backward(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                                    training: bool, info: CpuInfo) -> int:
    """A temporary the size of the input (batch_norm_backward_cpu_template computes grad_out * x_hat)."""
    mask = args[-1]
    return nbytes(args[1]) if mask[0] and bool(args[7]) else 0


def rule_max_pool2d(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool, info: CpuInfo) -> int:
    """``aten.max_pool2d`` (seen under inference mode) runs max_pool2d_with_indices and drops the int64
    indices (aten/src/ATen/native/MaxPooling.cpp): 8 bytes per output element."""
    return out.numel() * 8


def rule_max_pool2d_backward(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                             training: bool, info: CpuInfo) -> int:
    """``aten.max_pool2d_with_indices_backward`` when grad_output and input differ in memory format.

    Keras on torch pools an NCHW view whose gradient arrives channels-last; the CPU kernel then works on
    converted copies. Measured (benchmarks/calibrate_workspace.py style, fp32 and fp16, 2x2 pools): scratch
    = bytes of the input + two float32 copies of grad_output. Same formats: no scratch.
    """
    grad_out, x = args[0], args[1]
    last = torch.channels_last
    if grad_out.dim() != 4 or grad_out.is_contiguous(memory_format=last) == x.is_contiguous(memory_format=last):
        return 0
    return nbytes(x) + 2 * grad_out.numel() * 4


WORKSPACE = {
    aten.native_batch_norm.default: rule_native_batch_norm,
    aten.native_batch_norm_backward.default: rule_native_batch_norm_backward,
    aten.batch_norm.default: rule_batch_norm_infer,
    aten.max_pool2d.default: rule_max_pool2d,
    aten.max_pool2d_with_indices_backward.default: rule_max_pool2d_backward,
    aten.embedding_dense_backward.default: rule_embedding_backward,
}
