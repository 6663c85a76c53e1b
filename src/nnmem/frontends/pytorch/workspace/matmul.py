"""When ATen runs a matmul through oneDNN, whose scratch no rule models: the note for such a call.

Follows aten/src/ATen/native/mkldnn/Matmul.cpp (``use_mkldnn_{bf16,fp16,bf32}_matmul``, ``checksize``).
"""

from __future__ import annotations

from typing import Any

import torch

from nnmem.cpu import CpuInfo
from nnmem.frontends.pytorch.workspace._common import NOT_MODELLED, aten, dtype_name


def onednn_matmul(dtype: torch.dtype, a_numel: int, n: int, info: CpuInfo) -> bool:
    """Whether ATen runs a matmul through oneDNN (aten/src/ATen/native/mkldnn/Matmul.cpp
    ``use_mkldnn_{bf16,fp16,bf32}_matmul`` and ``checksize``: the type supported by the CPU and
    ``m * k * n`` (times the batch) above 16^3; float32 only at ``set_float32_matmul_precision("medium")``)."""
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled) or a_numel * n <= 16 ** 3:
        return False
    if dtype == torch.bfloat16:
        return info.onednn_bf16
    if dtype == torch.float16:
        return info.onednn_fp16
    return dtype == torch.float32 and info.onednn_bf16 and torch.get_float32_matmul_precision() == "medium"


def _matmul_operands(func: Any, args: tuple[Any, ...]) -> tuple[torch.Tensor, int] | None:
    """The left operand of a matmul op and the right one's last dimension."""
    if func in (aten.mm.default, aten.bmm.default, aten.matmul.default):
        a, b = args[0], args[1]
    elif func in (aten.addmm.default, aten.baddbmm.default, aten.addbmm.default, aten._addmm_activation.default):
        a, b = args[1], args[2]
    elif func is aten.linear.default:  # input @ weight.T: n is the weight's first dimension
        a, b = args[0], args[1]
        return (a, int(b.shape[0])) if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) else None
    else:
        return None
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or b.dim() < 1:
        return None
    return a, int(b.shape[-1])


def matmul_note(func: Any, args: tuple[Any, ...], info: CpuInfo) -> str | None:
    """Why the scratch of a matmul op call is not modelled on this CPU, or None (not a matmul, or not oneDNN's)."""
    operands = _matmul_operands(func, args)
    if operands is None:
        return None
    a, n = operands
    if not onednn_matmul(a.dtype, a.numel(), n, info):
        return None
    return f"{dtype_name(a.dtype)} matmul through oneDNN (ISA {info.isa}): {NOT_MODELLED}"
