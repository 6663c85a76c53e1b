"""Fake kernels for ops whose PyTorch meta kernel refuses what the CPU kernel runs.

``aten._grouped_mm``'s meta kernel checks the CUDA kernel's bf16-only rule (torch/_meta_registrations.py
``_meta_grouped_mm_common``), while the CPU kernel takes any float dtype; libraries pick the op by
availability (transformers ``integrations/moe.py`` ``_can_use_grouped_mm``), so a float32 MoE runs it for
real and fails under fake tensors. The output rule follows ATen ``create_grouped_gemm_output_tensor``
(aten/src/ATen/native/GroupedMMUtils.h): the last dimension's stride padded to 16 bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["FAKE_KERNELS"]


def _grouped_mm(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: torch.Tensor | None = None,
                bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor | None:
    """The CPU kernel's output; None leaves a bf16 call (which the meta kernel accepts) to the meta kernel."""
    if mat_a.dtype == torch.bfloat16 or mat_a.device.type != "cpu":
        return None
    groups = 0 if offs is None else offs.shape[0]
    if mat_a.dim() == 2 and mat_b.dim() == 2:
        size = [groups, mat_a.shape[0], mat_b.shape[1]]
    elif mat_a.dim() == 2:
        size = [mat_a.shape[0], mat_b.shape[-1]]
    elif mat_b.dim() == 2:
        size = [mat_a.shape[1], mat_b.shape[1]]
    else:
        size = [mat_a.shape[0], mat_a.shape[1], mat_b.shape[-1]]
    dtype = out_dtype or mat_a.dtype
    align = max(16 // dtype.itemsize, 1)
    padded = -(-size[-1] // align) * align
    stride = [size[1] * padded, padded, 1] if len(size) == 3 else [padded, 1]
    return torch.empty_strided(size, stride, dtype=dtype, device=mat_a.device)


# op overload → function(*args, **kwargs) returning the fake output, or None to use the meta kernel.
FAKE_KERNELS: dict[Any, Callable[..., Any]] = {
    torch.ops.aten._grouped_mm.default: _grouped_mm,
}
