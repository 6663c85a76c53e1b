"""The workspace rules of pooling and upsampling: max pooling's dropped indices and layout copies, and the
index/weight tables and layout copies of the upsampling kernels (aten/src/ATen/native/MaxPooling.cpp,
DilatedMaxPool2d.cpp, cpu/UpSampleKernel.cpp)."""

from __future__ import annotations

from typing import Any

import torch

from nnmem.cpu import CpuInfo
from nnmem.frontends.pytorch.workspace._common import aten, nbytes


# ---- max pooling ---------------------------------------------------------------------------------------
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


# ---- upsampling ----------------------------------------------------------------------------------------
def _upsample(taps: int) -> Any:
    """A rule for an upsampling op whose interpolation reads ``taps`` source points per output dimension."""

    def rule(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool, info: CpuInfo) -> int:
        """cpu/UpSampleKernel.cpp. A 4-D input not in channels-last is converted: the input copied to
        channels-last, the result computed channels-last, then copied into the contiguous output (input +
        output bytes, measured with benchmarks/calibrate_workspace.py). The other ranks run
        ``upsample_generic_Nd_kernel_impl``, whose ``compute_indices_weights_*`` allocates, per output
        dimension and tap, an int64 index and a weight of the input's dtype per output position."""
        x = args[0]
        if not isinstance(out, torch.Tensor) or not isinstance(x, torch.Tensor):
            return 0
        if x.dim() == 4:
            return 0 if x.is_contiguous(memory_format=torch.channels_last) else nbytes(x) + nbytes(out)
        per_position = 8 + x.element_size()
        return taps * per_position * sum(int(d) for d in out.shape[2:])

    return rule


def rule_upsample_bicubic2d(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                            training: bool, info: CpuInfo) -> int:
    """``upsample_bicubic2d_kernel_impl`` (cpu/UpSampleKernel.cpp) runs ``upsample_generic_Nd_kernel_impl``
    in every layout: 4 taps per output dimension, each an int64 index and a weight of the input's dtype
    per output position (measured: fp32 and bf16, contiguous and channels-last alike)."""
    x = args[0]
    if not isinstance(out, torch.Tensor) or not isinstance(x, torch.Tensor):
        return 0
    return 4 * (8 + x.element_size()) * sum(int(d) for d in out.shape[2:])


def _upsample_backward(channels_last_ok: bool, channels_last_3d_temp: bool = False) -> Any:
    """A rule for an upsampling backward: the kernel reads ``grad_output.contiguous()`` (in the suggested
    format where it has a channels-last path), a copy when grad_output is not already (the expanded
    gradient of a ``sum``, a channels-last gradient into bicubic); measured per op. ``nearest3d`` on a
    channels-last gradient computes into a temporary the size of grad_input (measured)."""

    def rule(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool, info: CpuInfo) -> int:
        g = args[0]
        if not isinstance(g, torch.Tensor) or g.is_contiguous():
            return 0
        if channels_last_ok and g.dim() == 4 and g.is_contiguous(memory_format=torch.channels_last):
            return 0
        if channels_last_ok and g.dim() == 5 and g.is_contiguous(memory_format=torch.channels_last_3d):
            return nbytes(out) if channels_last_3d_temp and isinstance(out, torch.Tensor) else 0
        return nbytes(g)

    return rule


_UPSAMPLE = {"upsample_nearest1d": 1, "upsample_nearest2d": 1, "upsample_nearest3d": 1,
             "upsample_linear1d": 2, "upsample_bilinear2d": 2, "upsample_trilinear3d": 2}

WORKSPACE = {
    aten.max_pool2d.default: rule_max_pool2d,
    aten.max_pool2d_with_indices_backward.default: rule_max_pool2d_backward,
    **{getattr(getattr(aten, name), overload): _upsample(taps)
       for name, taps in _UPSAMPLE.items() for overload in ("default", "vec")},
    aten.upsample_bicubic2d.default: rule_upsample_bicubic2d,
    aten.upsample_bicubic2d.vec: rule_upsample_bicubic2d,
    **{getattr(aten, f"{name}_backward").default: _upsample_backward(True, name == "upsample_nearest3d")
       for name in _UPSAMPLE},
    aten.upsample_bicubic2d_backward.default: _upsample_backward(False),
}
