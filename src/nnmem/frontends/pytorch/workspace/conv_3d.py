"""Which float32 3-D convolutions through oneDNN the nchw and nhwc rules size, and why the others are not.

ncdhw (:func:`onednn_3d_forward`, :func:`onednn_3d_backward`) runs the 2-D sequence on ``nCdhw16c`` reorders
(:mod:`.conv_onednn`), its weights' gradient on ``jit`` / ``jit_1x1`` (:mod:`.conv_bwd_weights`, 3-D balance), a
strided input gradient on ``brgconv_strided`` (:mod:`.conv_brgemm_bwd`); ndhwc (``channels_last_3d``,
:func:`ndhwc_note`) the nhwc sequence (:mod:`.conv_nhwc`). Kernel choices follow oneDNN 3.12's ``init_conf`` in
cpu/x64/jit_avx512_common_conv_kernel.cpp; the claims were measured on AVX-512 (``avx512_core`` kernels).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from nnmem.cpu import CpuInfo
from nnmem.frontends.pytorch.workspace._common import NOT_MODELLED
from nnmem.frontends.pytorch.workspace.conv_brgemm_bwd import strided_bwd_data
from nnmem.frontends.pytorch.workspace.conv_bwd_weights import (
    _direct_refuses,
    avx2_bwd_data_refuses,
    bwd_weights_kernel,
)
from nnmem.frontends.pytorch.workspace.conv_gemm import gemm_sized
from nnmem.frontends.pytorch.workspace.conv_nhwc_avx2 import ndhwc_avx2_note

if TYPE_CHECKING:  # conv_select imports this module for its note
    from nnmem.frontends.pytorch.workspace.conv_select import ConvCall


def onednn_3d_forward(call: ConvCall, backend: str) -> bool:
    """Whether a 3-D convolution is one whose oneDNN forward the nchw rules size (nCdhw16c reorders as in
    2-D): contiguous, neither transposed nor depthwise, the kernel inside the padded input (else ``gemm``)."""
    return (backend == "mkldnn" and len(call.x_shape) == 5 and not call.backward and not call.transposed
            and call.x_layout == "contiguous" and not 1 < call.groups == call.x_shape[1] == call.w_shape[0]
            and not call.kernel_outside())


def onednn_3d_backward(call: ConvCall, info: CpuInfo, backend: str) -> bool:
    """Whether a float32 3-D ncdhw convolution's oneDNN backward is one the nchw rules size (measured on
    AVX-512 only): contiguous; ungrouped, its input gradient on the direct kernels (``jit`` / ``jit_1x1`` at unit
    stride, the kernel inside the padded input) or on ``brgconv_strided`` where :func:`strided_bwd_data`
    sizes it, its weights' gradient on a kernel :func:`bwd_weights_kernel` names (``jit:avx512_core``, or
    ``jit:avx2`` for 4 to 15 channels) or on ``gemm`` where :mod:`.conv_gemm` sizes it; or grouped
    (not depthwise) with both per-group channel counts multiples of 16, undilated, the kernel inside the padded
    input: the grouped ``jit`` kernels (``aBCdef16b16c``), whose weights' gradient needs whole 16-channel blocks
    per group in 3-D (``oc % oc_block`` in ``init_conf``; ``gemm`` below, where 2-D runs ``jit:avx2``). The
    grouped strided input gradient and the grouped reduction over spare threads keep conv_note's notes."""
    if not (backend == "mkldnn" and len(call.x_shape) == 5 and call.backward and call.dtype == torch.float32
            and call.x_layout == "contiguous"):
        return False
    block, nthreads = info.onednn_block, torch.get_num_threads()
    if call.groups > 1:
        if block != 16:
            return False
        c, o, g = call.x_shape[1], call.w_shape[0], call.groups
        if g == c == o or call.kernel_outside() or any(d != 1 for d in call.dilation):
            return False
        # a padding the direct kernel refuses sends the weights' gradient to gemm (conv_gemm; measured 679,168 B
        # where the grouped jit rule said 84,672 B: a 3x3x3 kernel padded by 1 on a 2x2x2 input)
        return c // g % 16 == 0 and o // g % 16 == 0 and (
            not _direct_refuses(call, True) or gemm_sized(call, (False, True), nthreads, 16))
    unit = all(s == 1 for s in call.stride)
    if call.grad_input and unit and block == 8 and avx2_bwd_data_refuses(call):  # both gradients on gemm
        return bwd_weights_kernel(call, block) is None and gemm_sized(call, (True, True), nthreads, block)
    if call.grad_input and (call.kernel_outside() if unit else strided_bwd_data(call, nthreads, block) is None):
        return False
    return bwd_weights_kernel(call, block) is not None or gemm_sized(call, (False, True), nthreads, block)


def ncdhw_3d_why(call: ConvCall, info: CpuInfo) -> str:
    """What keeps a 3-D convolution outside :func:`onednn_3d_forward` / :func:`onednn_3d_backward`."""
    if call.transposed:
        return "transposed"
    if 1 < call.groups == call.x_shape[1] == call.w_shape[0]:
        return "depthwise: brdgmm_dw forward, gemm backward"
    if call.x_layout != "contiguous":
        return f"{call.x_layout} input"
    if call.kernel_outside():
        return "a padding as wide as its kernel: gemm"
    if call.backward and call.groups > 1:
        return ("grouped backward: per-group channels not multiples of 16 (gemm weights' gradient) or dilated"
                if info.onednn_block == 16 else "grouped backward below AVX-512")
    if call.backward and bwd_weights_kernel(call, info.onednn_block) is None:
        return "weights' gradient on gemm, this shape"
    return "this shape"


def ndhwc_note(call: ConvCall, info: CpuInfo) -> str | None:
    """Why a float32 3-D convolution on ndhwc activations (:func:`onednn_nhwc`) is not sized by the nhwc rules
    (:mod:`.conv_nhwc`, measured on AVX-512 only), or None: below AVX-512; a dilated backward or depthwise forward,
    a padding as wide as the kernel (``gemm`` or other kernels; a dilated dense or grouped forward measured exact);
    a weights' gradient the direct kernel refuses (``gemm``); a unit-stride
    1x1 backward (``jit_1x1``, measured off with a bias, which the call does not show); one input channel (the
    brgemm kernels relay it out per thread, as 2-D's ``_brgemm_relo``); an ungrouped one
    with more than 32 output channels forward, or input channels backward (the brgemm kernels' channel block,
    which ``est_eff`` picks, measured 48 where the 2-D rule's :func:`io_block` says 64)."""
    if info.onednn_block == 8:  # AVX2: conv_nhwc_avx2
        return ndhwc_avx2_note(call, info)
    where = f"channels-last 3-D convolution through oneDNN (ISA {info.isa}"
    if info.onednn_block != 16:
        return f"{where}): {NOT_MODELLED}"
    depthwise = 1 < call.groups == call.x_shape[1] == call.w_shape[0]
    if any(d != 1 for d in call.dilation) and (call.backward or depthwise) or call.kernel_outside():
        return f"{where}, dilated backward or depthwise, or padded as wide as its kernel): {NOT_MODELLED}"
    if call.groups == 1 and call.x_shape[1] == 1:  # 2-D's _brgemm_relo: one channel, relaid out per thread
        return f"{where}, one input channel on the brgemm kernels): {NOT_MODELLED}"
    if call.groups == 1 and (call.x_shape[1] if call.backward else call.w_shape[0]) > 32:
        return f"{where}, more than 32 channels on the brgemm kernels): {NOT_MODELLED}"
    if call.backward and call.groups == 1 and bwd_weights_kernel(call, 16, nxc=True) is None:
        return f"{where}, its weights' gradient on gemm): {NOT_MODELLED}"
    if call.backward and call.groups == 1 and call.w_shape[2:] == (1, 1, 1) and all(s == 1 for s in call.stride):
        # jit_1x1 on ndhwc: seeded draws with a bias measured 0.2-1.3 KB off (exact without one, and strided)
        return f"{where}, unit-stride 1x1 backward): {NOT_MODELLED}"
    return None
