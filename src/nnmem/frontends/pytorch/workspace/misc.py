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
