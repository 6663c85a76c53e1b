"""The workspace rules of the normalization ops: batch, layer, group and RMS norm, forward and backward.

Each rule follows the CPU kernel it names: aten/src/ATen/native/Normalization.cpp (batch norm),
layer_norm.cpp and cpu/layer_norm_kernel.cpp (layer norm, ``rms_norm``), group_norm.cpp and
cpu/group_norm_kernel.cpp (group norm). Under inference mode the composite ``layer_norm`` /
``group_norm`` / ``rms_norm`` arrive whole, so their rules add the statistics they compute and drop.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from nnmem.cpu import CpuInfo
from nnmem.frontends.pytorch.workspace._common import alloc_peak, aten, nbytes

_OPMATH = 4  # bytes of the float32 accumulators (``opmath_t``) of float32, bfloat16 and float16 kernels


def _copy_unless(t: Any, memory_format: torch.memory_format = torch.contiguous_format) -> int:
    """Bytes of ``t.contiguous(memory_format)``: nothing when ``t`` already is."""
    return 0 if not isinstance(t, torch.Tensor) or t.is_contiguous(memory_format=memory_format) else nbytes(t)


# ---- batch norm ------------------------------------------------------------------------------------------
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


# ---- layer norm ------------------------------------------------------------------------------------------
def _ln_rows(x: torch.Tensor, normalized_shape: Any) -> tuple[int, int]:
    """``(M, N)`` of ``_check_layer_norm_inputs``: rows and the normalized size."""
    n = math.prod(int(d) for d in normalized_shape)
    return (x.numel() // n if n else 0), n


def rule_native_layer_norm(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                           training: bool, info: CpuInfo) -> int:
    """``layer_norm_cpu`` (layer_norm.cpp): ``input.expect_contiguous()`` copies a non-contiguous input (a
    channels-last activation permuted to NHWC, as ConvNeXt's LayerNorm sees it) and keeps it to the end."""
    return _copy_unless(args[0])


def rule_layer_norm_infer(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                          training: bool, info: CpuInfo) -> int:
    """``aten.layer_norm`` under inference mode: ``native_layer_norm``'s contiguous copy plus the per-row
    mean and rstd (``M`` each, the input's dtype) it computes and drops."""
    x = args[0]
    rows, _ = _ln_rows(x, args[1])
    return _copy_unless(x) + 2 * rows * x.element_size()


def rule_native_layer_norm_backward(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                                    training: bool, info: CpuInfo) -> int:
    """``layer_norm_backward_cpu`` (layer_norm.cpp) and ``LayerNormBackwardKernelImplInternal``
    (cpu/layer_norm_kernel.cpp).

    The input is made contiguous (``expect_contiguous``) and kept; when dgamma or dbeta is wanted the
    kernel reduces them in a ``{2 * num_threads, N}`` float32 buffer (``at::get_num_threads()``).
    """
    grad_out, x, shape, mask = args[0], args[1], args[2], args[7]
    _, n = _ln_rows(x, shape)
    buffer = 2 * torch.get_num_threads() * n * _OPMATH if (mask[1] or mask[2]) and args[5] is not None else 0
    return _copy_unless(x) + _copy_unless(grad_out) + buffer


# ---- group norm ------------------------------------------------------------------------------------------
def _gn_format(x: torch.Tensor) -> torch.memory_format:
    """``X.suggest_memory_format()``: channels-last when the strides say so (group_norm.cpp)."""
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        return torch.channels_last
    if x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d) and not x.is_contiguous():
        return torch.channels_last_3d
    return torch.contiguous_format


def rule_native_group_norm(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                           training: bool, info: CpuInfo) -> int:
    """``native_group_norm`` (group_norm.cpp, cpu/group_norm_kernel.cpp): the input made contiguous in its
    suggested format; the channels-last kernel (``GroupNormKernelImplChannelsLastInternal``) reduces into an
    ``{N, 2 * C}`` float32 buffer, the contiguous one needs none."""
    x = args[0]
    fmt = _gn_format(x)
    buffer = 0
    if fmt != torch.contiguous_format:
        buffer = int(x.shape[0]) * 2 * int(x.shape[1]) * _OPMATH
    return _copy_unless(x, fmt) + buffer


def rule_group_norm_infer(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                          training: bool, info: CpuInfo) -> int:
    """``aten.group_norm(input, num_groups, weight, bias, eps, cudnn)`` under inference mode:
    ``native_group_norm``'s scratch plus the ``{N, G}`` mean and rstd it computes and drops."""
    x, groups = args[0], int(args[1])
    stats = 2 * int(x.shape[0]) * groups * x.element_size()
    return rule_native_group_norm((x,), {}, out, training, info) + stats


def rule_native_group_norm_backward(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                                    training: bool, info: CpuInfo) -> int:
    """``GroupNormBackwardKernelImpl`` (cpu/group_norm_kernel.cpp): the per-(sample, channel) sums ``ds`` and
    ``db`` (``{N, C}`` float32 each) come first, then the gradients; grad_output and the input are made
    contiguous in the input's suggested format."""
    grad_out, x = args[0], args[1]
    fmt = _gn_format(x)
    sums = 2 * int(x.shape[0]) * int(x.shape[1]) * _OPMATH
    return _copy_unless(grad_out, fmt) + _copy_unless(x, fmt) + sums


# ---- RMS norm --------------------------------------------------------------------------------------------
def rule_rms_norm_infer(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                        training: bool, info: CpuInfo) -> int:
    """``aten.rms_norm`` under inference mode, float32 (layer_norm.cpp ``rms_norm_symint``, composite):
    ``x.pow(2)``, its ``mean`` over the normalized dims, ``add(eps)`` and ``rsqrt``, then ``x * rstd`` and, with
    a weight, ``* weight``; each step a new tensor. Reduced precision upcasts first (not modelled here)."""
    x, shape = args[0], args[1]
    weight = args[2] if len(args) > 2 else kwargs.get("weight")
    rows, _ = _ln_rows(x, shape)
    if x.dtype != torch.float32 or not isinstance(out, torch.Tensor):
        return 0
    xb, r = nbytes(x), rows * x.element_size()
    seq = [xb, r, r, -r, -xb, xb] + ([] if weight is None else [nbytes(out), -xb])
    return alloc_peak(seq) - nbytes(out)


WORKSPACE = {
    aten.native_batch_norm.default: rule_native_batch_norm,
    aten.native_batch_norm_backward.default: rule_native_batch_norm_backward,
    aten.batch_norm.default: rule_batch_norm_infer,
    aten.native_layer_norm.default: rule_native_layer_norm,
    aten.layer_norm.default: rule_layer_norm_infer,
    aten.native_layer_norm_backward.default: rule_native_layer_norm_backward,
    aten.native_group_norm.default: rule_native_group_norm,
    aten.group_norm.default: rule_group_norm_infer,
    aten.native_group_norm_backward.default: rule_native_group_norm_backward,
    aten.rms_norm.default: rule_rms_norm_infer,
}


def drop_unasked_batch_norm_grads(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
    """The meta kernel of ``native_batch_norm_backward`` returns every gradient; the CPU kernel
    (``batch_norm_backward_cpu_template``, Normalization.cpp) leaves those ``output_mask`` did not ask for
    undefined (grad_input of a first layer whose input needs no gradient)."""
    mask = args[-1]
    if not isinstance(out, tuple) or len(out) != 3 or all(mask):
        return out
    return tuple(t if wanted else None for t, wanted in zip(out, mask))


def contiguous_layer_norm_grad(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
    """The meta kernel of ``native_layer_norm_backward`` gives grad_input grad_output's strides; the CPU kernel
    allocates it contiguous (``layer_norm_backward_cpu``: ``empty_like(X, LEGACY_CONTIGUOUS_MEMORY_FORMAT)``),
    which decides the layout every later kernel sees (a permuted ConvNeXt-style norm hands it on)."""
    if not isinstance(out, tuple) or not isinstance(out[0], torch.Tensor) or out[0].is_contiguous():
        return out
    return (torch.empty_like(out[0], memory_format=torch.contiguous_format), *out[1:])


FAKE_OUTPUTS = {aten.native_batch_norm_backward.default: drop_unasked_batch_norm_grads,
                aten.native_layer_norm_backward.default: contiguous_layer_norm_grad}
