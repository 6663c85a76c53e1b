"""The scratch of FBGEMM's dynamically quantized linear layer (``quantized::linear_dynamic``, and
``nnmem::dynamic_int8_linear`` standing for it in what-if traces).

``PackedLinearWeight::apply_dynamic_impl`` (aten/src/ATen/native/quantized/cpu/qlinear_dynamic.cpp) makes its
input contiguous, allocates the float32 output and an int32 buffer of the output's shape (``at::empty_like``), then
runs ``at::get_num_threads()`` tasks, each building a ``PackAWithQuantRowOffset`` that allocates its own
``MCB x KCB`` uint8 block and ``MCB`` int32 row offsets outside PyTorch's allocator (fbgemm
src/PackAWithQuantRowOffset.cc). Whether the threads' blocks are live together depends on their timing: a small
step often runs one thread's block after the other's is freed. The rule counts every thread's (the higher end).
"""

from __future__ import annotations

from typing import Any

import torch

from nnmem.cpu import CpuInfo
from nnmem.frontends.pytorch.quantized import fbgemm_blocking
from nnmem.frontends.pytorch.workspace._common import nbytes


def rule_linear_dynamic(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool,
                        info: CpuInfo) -> int:
    """The int32 buffer, a contiguous copy of a strided input, and each thread's packed input block."""
    x = args[0]
    blocking = fbgemm_blocking(info)
    per_thread = 0 if blocking is None else blocking.per_thread
    copy = 0 if x.is_contiguous() else nbytes(x)
    return copy + out.numel() * 4 + torch.get_num_threads() * per_thread


WORKSPACE = {
    torch.ops.quantized.linear_dynamic.default: rule_linear_dynamic,
    torch.ops.nnmem.dynamic_int8_linear.default: rule_linear_dynamic,
}
