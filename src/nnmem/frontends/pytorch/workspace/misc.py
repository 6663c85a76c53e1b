"""The workspace rules of the other ops with kernel scratch: embedding backward, a linear layer on an input whose
leading dimensions do not fold, binary ops on inputs of mixed dtypes, eval-mode dropout; each cites the
ATen source it follows."""

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


def _folds(x: Any) -> bool:
    """Whether ``x.view(-1, x.size(-1))`` is a view: every leading stride is the next one times its size
    (aten/src/ATen/native/LinearAlgebra.cpp ``should_fold``; size-1 dimensions do not matter)."""
    dims = [(int(n), int(s)) for n, s in zip(x.shape[:-1], x.stride()[:-1]) if int(n) != 1]
    return all(stride == stride_next * size_next for (_, stride), (size_next, stride_next) in zip(dims, dims[1:]))


def rule_linear(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool, info: CpuInfo) -> int:
    """``aten.linear`` reaches the tracker whole only under ``inference_mode`` (autograd decomposes it
    otherwise). On an input of 3 or more dimensions whose leading dimensions do not fold into one
    (``x.transpose(0, 1)``), ``linear`` → ``matmul`` (aten/src/ATen/native/Linear.cpp ``linear``,
    LinearAlgebra.cpp ``_matmul_impl``) folds it into a contiguous copy before a 2-D product where the weight
    requires a gradient (``should_fold``); a frozen weight (or autocast's cast copy) takes ``bmm``, which
    copies nothing on ATen's kernels (oneDNN's copies: :func:`.matmul.linear_copies`). Measured without a
    dispatch mode, float32, float16 and bfloat16: the copy is the input's bytes, with and without bias."""
    x, w = args[0], args[1]
    if x.dim() < 3 or _folds(x) or not (isinstance(w, torch.Tensor) and w.requires_grad):
        return 0
    return nbytes(x)


def rule_promoted_inputs(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool,
                         info: CpuInfo) -> int:
    """A binary op whose tensor inputs have different dtypes (a float16 ``add`` into a float32 residual under
    autocast; a float gradient times a bool mask, as ``amax``/``max`` backward's ``scale_grad_by_count``): on a
    CPU, ``TensorIteratorBase::compute_types`` (aten/src/ATen/TensorIterator.cpp) gives
    each input of another dtype than the common one a converted copy (``op.tensor().to(common_dtype_)``,
    ``promote_inputs_to_common_dtype``), freed when the op ends; and an output of another dtype (the in-place
    ``add_`` of a float16 tensor and a float32 one) a temporary of the common dtype, copied back
    (``cast_common_dtype_to_outputs``). Zero-dimensional inputs (scalars) are left out: a few bytes."""
    tensors = [a for a in args[:2] if isinstance(a, torch.Tensor)]
    if len(tensors) < 2 or tensors[0].dtype == tensors[1].dtype:
        return 0
    common = torch.result_type(tensors[0], tensors[1])
    size = common.itemsize if hasattr(common, "itemsize") else torch.empty((), dtype=common).element_size()
    total = sum(t.numel() * size for t in tensors if t.dim() > 0 and t.dtype != common)
    written = out if isinstance(out, torch.Tensor) else None
    if written is not None and written.dtype != common:
        total += written.numel() * size
    return total


_BINARY = ("add", "sub", "mul", "div", "maximum", "minimum")
def rule_reduced_mean(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool,
                      info: CpuInfo) -> int:
    """``mean`` into a float16 / bfloat16 result on a CPU (aten/src/ATen/native/ReduceOps.cpp ``mean_out``:
    "cast_fp32 -> sum -> div -> cast_bf16_or_fp16"): a float32 result of the output's elements, and inside
    ``sum_out`` the input converted to float32 (``make_reduction``), live together. Measured: a float16 mean
    over the heads of ``[5, 1, 16, 16]`` attention weights, 10,240 B (nn.MultiheadAttention's averaged weights
    under autocast)."""
    x = args[0]
    if not isinstance(x, torch.Tensor) or not isinstance(out, torch.Tensor):
        return 0
    result = kwargs.get("dtype") or out.dtype
    if result not in (torch.float16, torch.bfloat16):
        return 0
    return out.numel() * 4 + (x.numel() * 4 if x.dtype != torch.float32 else 0)


WORKSPACE = {
    aten.mean.dim: rule_reduced_mean,
    aten.mean.default: rule_reduced_mean,
    aten.embedding_dense_backward.default: rule_embedding_backward,
    aten.linear.default: rule_linear,
    **{getattr(aten, name).Tensor: rule_promoted_inputs for name in _BINARY if hasattr(getattr(aten, name), "Tensor")},
    **{getattr(aten, name + "_").Tensor: rule_promoted_inputs for name in ("add", "sub", "mul", "div")},
}


def dropout_returns_input(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
    """``dropout`` and its feature/alpha variants return their input itself when not training or when p is 0
    (``aten/src/ATen/native/Dropout.cpp`` ``_dropout_impl``: ``if (p == 0 || !train || input.numel() == 0)
    return input``); the fake kernel returns a new tensor, a copy no real run allocates (an inference step
    reaches ``aten.dropout`` itself under ``inference_mode``)."""
    p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
    train = args[2] if len(args) > 2 else kwargs.get("train", True)
    return args[0] if (p == 0 or not train) else out


FAKE_OUTPUTS = {op: dropout_returns_input for op in (aten.dropout.default, aten.feature_dropout.default,
                                                    aten.alpha_dropout.default, aten.feature_alpha_dropout.default)}
