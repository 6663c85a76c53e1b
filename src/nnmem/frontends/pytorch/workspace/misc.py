"""The workspace rules of the other ops with kernel scratch: embedding backward, citing the ATen source it
follows."""

from __future__ import annotations

from typing import Any

from nnmem.cpu import CpuInfo
from nnmem.frontends.pytorch.workspace._common import aten, nbytes


def rule_embedding_backward(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                            training: bool, info: CpuInfo) -> int:
    """``embedding_dense_backward`` makes a strided grad contiguous first (aten/src/ATen/native/Embedding.cpp)."""
    grad = args[0]
    return 0 if grad.is_contiguous() else nbytes(grad)


WORKSPACE = {
    aten.embedding_dense_backward.default: rule_embedding_backward,
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
