"""The workspace rules of the convolution ops: read the call, pick ATen's kernel, size its scratch.

Forward: ``aten.convolution`` and, under inference mode, ``aten.conv1d/2d/3d``, ``aten.conv_transpose1d/2d/3d``;
backward: ``aten.convolution_backward``. The kernel choice is :mod:`.conv_select`'s; the sizes are
:mod:`.conv_onednn`'s (float32 nchw through oneDNN), :mod:`.conv_nhwc`'s (channels-last through oneDNN) and
:mod:`.conv_im2col`'s (ATen's im2col kernel); oneDNN's backward-weights scratchpad :mod:`.conv_bwd_weights`'s.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch

from nnmem.cpu import CpuInfo
from nnmem.frontends.pytorch.workspace._common import aten, nbytes
from nnmem.frontends.pytorch.workspace.conv_bf16 import (
    bf16_1x1_modelled,
    bf16_backward_modelled,
    bf16_bwd_weights_scratch,
    bf16_depthwise_bias,
    bf16_depthwise_bwd_weights,
    bf16_depthwise_modelled,
    one_by_one,
)
from nnmem.frontends.pytorch.workspace.conv_bf16_1x1 import bwd_weights as bf16_1x1_bwd_weights
from nnmem.frontends.pytorch.workspace.conv_bf16_1x1 import fwd_or_bwd_data as bf16_1x1_fwd_or_bwd_data
from nnmem.frontends.pytorch.workspace.conv_bf16_3d import (
    bf16_3d_backward_claims,
    bf16_3d_backward_scratchpads,
    bf16_3d_forward_scratchpad,
)
from nnmem.frontends.pytorch.workspace.conv_bf16_amx_bwd import amx_backward_claims, amx_backward_scratch
from nnmem.frontends.pytorch.workspace.conv_bf16_brgemm import brgemm_forward as bf16_brgemm_forward
from nnmem.frontends.pytorch.workspace.conv_bf16_more import (
    bf16_brdgmm_3d_forward,
    bf16_grouped_forward,
    brdgmm_3d_forward_scratch,
)
from nnmem.frontends.pytorch.workspace.conv_bf16_transpose import (
    bf16_strided_backward_claims,
    bf16_strided_data_scratch,
    bf16_strided_data_weights,
)
from nnmem.frontends.pytorch.workspace.conv_brgemm_bwd import strided_bwd_data, strided_bwd_weights
from nnmem.frontends.pytorch.workspace.conv_bwd_weights import bwd_weights_kernel, bwd_weights_scratch
from nnmem.frontends.pytorch.workspace.conv_gemm import gemm_backward, gemm_forward, gemm_nhwc_backward
from nnmem.frontends.pytorch.workspace.conv_gemm_bf16 import backward_claims as gemm_bf16_backward_claims
from nnmem.frontends.pytorch.workspace.conv_gemm_bf16 import backward_scratch as gemm_bf16_backward
from nnmem.frontends.pytorch.workspace.conv_gemm_bf16 import forward_claims as gemm_bf16_forward_claims
from nnmem.frontends.pytorch.workspace.conv_gemm_bf16 import forward_scratch as gemm_bf16_forward
from nnmem.frontends.pytorch.workspace.conv_grouped_strided_bwd import grouped_strided_data
from nnmem.frontends.pytorch.workspace.conv_im2col import slow2d_backward, slow2d_forward
from nnmem.frontends.pytorch.workspace.conv_native import (
    slow3d_backward,
    slow3d_forward,
    slow_dilated_backward,
    slow_dilated_forward,
)
from nnmem.frontends.pytorch.workspace.conv_nhwc import nhwc_backward, nhwc_forward, unit_stride_bwd_data
from nnmem.frontends.pytorch.workspace.conv_nhwc_avx2 import grouped_forward as ndhwc_grouped_forward
from nnmem.frontends.pytorch.workspace.conv_nhwc_avx2 import ndhwc_avx2_scratchpads
from nnmem.frontends.pytorch.workspace.conv_onednn import conv_backward, conv_forward
from nnmem.frontends.pytorch.workspace.conv_select import (
    ConvCall,
    bf16_amx_forward,
    bf16_forward_modelled,
    conv_backend,
    conv_call,
    copied_input,
    onednn_3d_backward,
    onednn_3d_forward,
    onednn_gemm,
    onednn_nhwc,
)
from nnmem.frontends.pytorch.workspace.conv_transpose import (
    slow_transpose_backward,
    slow_transpose_forward,
    transpose_backward,
    transpose_forward,
)


def _forward(x: torch.Tensor, weight: torch.Tensor, bias: Any, out: Any, call: ConvCall | None,
             info: CpuInfo) -> int:
    if call is None or not isinstance(out, torch.Tensor):
        return 0
    backend = conv_backend(call, info)
    if backend == "slow2d":
        return slow2d_forward(call, nbytes(out))
    if backend.startswith("slow_dilated"):
        return slow_dilated_forward(call, nbytes(out))
    if backend == "slow3d":
        return slow3d_forward(call, nbytes(out))
    if backend == "slow_transpose2d":
        return slow_transpose_forward(call) or 0
    pad_3d = bf16_3d_forward_scratchpad(call, info, bias is not None) if backend == "mkldnn" else None
    if pad_3d is not None:  # bfloat16 3-D: jit_bf16 / jit_bf16_1x1 (conv_bf16_3d)
        return conv_forward(x, weight, bias, out, 1, info.onednn_block, call.stride, scratchpad=pad_3d)
    if backend == "mkldnn" and bf16_1x1_modelled(call, info):  # jit_bf16_1x1: its scratchpad first
        pad = bf16_1x1_fwd_or_bwd_data(one_by_one(call, bias is not None), torch.get_num_threads(), False)
        return conv_forward(x, weight, bias, out, 1, info.onednn_block, call.stride, scratchpad=pad)
    if backend == "mkldnn" and bf16_depthwise_modelled(call, info):  # jit_dw: the bias converted to float32
        if call.one_d:  # the 4-D views ATen hands oneDNN
            x, weight = x.unsqueeze(2), weight.unsqueeze(2)
        pad = bf16_depthwise_bias(call, bias is not None)
        return conv_forward(x, weight, bias, out, call.groups, info.onednn_block, call.stride, scratchpad=pad)
    amx = bf16_amx_forward(call, info) if backend == "mkldnn" else None
    if amx is not None:  # brg_conv_fwd on AMX: conv_bf16_amx
        return amx
    brgemm = bf16_brgemm_forward(call, info) if backend == "mkldnn" else None
    if brgemm is not None:  # brg_conv_fwd:avx512_core_bf16 on channels-last: conv_bf16_brgemm
        return brgemm
    if backend == "mkldnn" and gemm_bf16_forward_claims(call, info):  # bfloat16 on gemm:jit: conv_gemm_bf16
        return gemm_bf16_forward(call, bias is not None)
    if backend == "mkldnn" and bf16_grouped_forward(call, info):  # grouped bfloat16 on jit_bf16: conv_bf16_more
        return conv_forward(x, weight, bias, out, call.groups, info.onednn_block, call.stride)
    if backend == "mkldnn" and bf16_brdgmm_3d_forward(call, info):  # 3-D depthwise bfloat16: conv_bf16_more
        return brdgmm_3d_forward_scratch(call, nbytes(out))
    if backend == "mkldnn_transpose" and call.dtype == torch.bfloat16:  # conv_bf16_transpose (conv_note if None)
        return transpose_forward(call, bias is not None, info) or 0
    if call.dtype != torch.float32 and not bf16_forward_modelled(call, info):
        return 0  # not modelled: conv_note says so
    if len(call.x_shape) != 4 and not onednn_3d_forward(call, backend) and not onednn_nhwc(call) \
            and backend != "mkldnn_transpose":  # 3-D transposed: conv_transpose
        return 0  # not modelled: conv_note says so
    if backend == "mkldnn" and onednn_nhwc(call):
        grouped_3d = ndhwc_grouped_forward(call, x, weight) if info.onednn_block == 8 else None  # conv_nhwc_avx2
        if grouped_3d is not None:
            return grouped_3d
        if call.one_d:  # the 4-D views ATen hands oneDNN
            x, weight = x.unsqueeze(2), weight.unsqueeze(2)
        return nhwc_forward(x, weight, call.groups, info.onednn_block)
    copy, call = copied_input(call, backend)
    if call.x_layout != "contiguous" and not call.one_d and backend != "mkldnn_transpose":  # transposed: below
        return 0  # not modelled: conv_note says so
    if backend == "mkldnn" and onednn_gemm(call, info)[0]:  # gemm: conv_gemm (conv_note where not sized)
        copy = call.x_bytes if call.one_d and call.x_layout != "contiguous" else copy
        return copy + (gemm_forward(call, torch.get_num_threads(), info.onednn_block) or 0)
    if backend == "mkldnn":  # a strided input is made contiguous first, and stays live
        copy = call.x_bytes if call.one_d and call.x_layout != "contiguous" else copy
        return copy + conv_forward(x, weight, bias, out, call.groups, info.onednn_block, call.stride)
    if backend == "mkldnn_transpose":  # conv_transpose; None: not modelled, conv_note says so
        return transpose_forward(call, bias is not None, info) or 0
    return 0


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str, default: Any) -> Any:
    return args[index] if len(args) > index else kwargs.get(name, default)


def _call_convolution(args: tuple[Any, ...], kwargs: dict[str, Any]) -> ConvCall | None:
    """``aten.convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)``."""
    return conv_call(args[0], args[1], args[3], args[4], args[5], bool(args[6]), args[7], int(args[8]))


def _call_conv_nd(args: tuple[Any, ...], kwargs: dict[str, Any]) -> ConvCall | None:
    """``aten.conv1d/conv2d(input, weight, bias, stride, padding, dilation, groups)`` (seen under inference
    mode, where they do not decompose into ``aten.convolution``)."""
    return conv_call(args[0], args[1], _arg(args, kwargs, 3, "stride", 1), _arg(args, kwargs, 4, "padding", 0),
                     _arg(args, kwargs, 5, "dilation", 1), False, 0, int(_arg(args, kwargs, 6, "groups", 1)))


def _same_input(x: torch.Tensor, weight: torch.Tensor, padding: str, dilation: Any) -> tuple[torch.Tensor, Any]:
    """``convolution_same`` (Convolution.cpp) for ``aten.conv1d/2d/3d.padding``: "valid" is padding 0; "same"
    pads each spatial side by ``dilation * (kernel - 1) / 2``, and where that total is odd, first copies the
    input one element longer on the right (``constant_pad_nd``). Returns the input the convolution reads (a
    meta tensor when copied) and its symmetric padding."""
    dims = x.dim() - 2
    if padding != "same":
        return x, 0
    dil = [int(d) for d in dilation] if isinstance(dilation, (list, tuple)) else [int(dilation)]
    dil = dil * dims if len(dil) == 1 else dil
    totals = [d * (int(k) - 1) for d, k in zip(dil, weight.shape[2:])]
    extra = [t % 2 for t in totals]
    if not any(extra):
        return x, [t // 2 for t in totals]
    shape = (*x.shape[:2], *(int(s) + e for s, e in zip(x.shape[2:], extra)))
    return torch.empty(shape, dtype=x.dtype, device="meta"), [t // 2 for t in totals]


def _call_conv_nd_padding(args: tuple[Any, ...], kwargs: dict[str, Any]) -> ConvCall | None:
    """``aten.conv1d/2d/3d.padding(input, weight, bias, stride, padding: str, dilation, groups)`` (inference
    mode, ``padding="same"`` or ``"valid"``), read as the ``aten.convolution`` it becomes."""
    dilation = _arg(args, kwargs, 5, "dilation", 1)
    x, padding = _same_input(args[0], args[1], str(_arg(args, kwargs, 4, "padding", "valid")), dilation)
    return conv_call(x, args[1], _arg(args, kwargs, 3, "stride", 1), padding, dilation, False, 0,
                     int(_arg(args, kwargs, 6, "groups", 1)))


def _call_conv_transpose_nd(args: tuple[Any, ...], kwargs: dict[str, Any]) -> ConvCall | None:
    """``aten.conv_transpose1d/2d(input, weight, bias, stride, padding, output_padding, groups, dilation)``."""
    return conv_call(args[0], args[1], _arg(args, kwargs, 3, "stride", 1), _arg(args, kwargs, 4, "padding", 0),
                     _arg(args, kwargs, 7, "dilation", 1), True, _arg(args, kwargs, 5, "output_padding", 0),
                     int(_arg(args, kwargs, 6, "groups", 1)))


def _call_convolution_backward(args: tuple[Any, ...], kwargs: dict[str, Any]) -> ConvCall | None:
    """``aten.convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
    transposed, output_padding, groups, output_mask)``."""
    call = conv_call(args[1], args[2], args[4], args[5], args[6], bool(args[7]), args[8], int(args[9]))
    return None if call is None else dataclasses.replace(call, backward=True, grad_input=bool(args[10][0]))


def rule_convolution(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool,
                     info: CpuInfo) -> int:
    return _forward(args[0], args[1], args[2], out, _call_convolution(args, kwargs), info)


def rule_conv_nd(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool, info: CpuInfo) -> int:
    bias = _arg(args, kwargs, 2, "bias", None)
    return _forward(args[0], args[1], bias, out, _call_conv_nd(args, kwargs), info)


def rule_conv_nd_padding(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool,
                         info: CpuInfo) -> int:
    x = args[0]
    padded, _ = _same_input(x, args[1], str(_arg(args, kwargs, 4, "padding", "valid")),
                            _arg(args, kwargs, 5, "dilation", 1))
    copy = nbytes(padded) if padded is not x else 0  # the padded copy stays live across the convolution
    bias = _arg(args, kwargs, 2, "bias", None)
    return copy + _forward(padded, args[1], bias, out, _call_conv_nd_padding(args, kwargs), info)


def rule_conv_transpose_nd(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool,
                           info: CpuInfo) -> int:
    bias = _arg(args, kwargs, 2, "bias", None)
    return _forward(args[0], args[1], bias, out, _call_conv_transpose_nd(args, kwargs), info)


def rule_convolution_backward(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool,
                              info: CpuInfo) -> int:
    grad_out, x, weight, mask = args[0], args[1], args[2], args[10]
    call = _call_convolution_backward(args, kwargs)
    if call is None:
        return 0
    fresh = sum(nbytes(t) for t in out if isinstance(t, torch.Tensor))
    backend = conv_backend(call, info)
    if backend == "slow2d":
        return slow2d_backward(call, grad_out, mask, fresh)
    if backend.startswith("slow_dilated"):
        return slow_dilated_backward(call, grad_out, mask, fresh)
    if backend == "slow3d":
        return slow3d_backward(call, grad_out, mask, fresh)
    if backend == "mkldnn_transpose":  # conv_transpose; None: not modelled, conv_note says so
        return transpose_backward(call, grad_out, mask, out, info) or 0
    if backend == "slow_transpose2d":
        return slow_transpose_backward(call, grad_out, mask, out) or 0
    if backend == "mkldnn" and amx_backward_claims(call, info):  # brg_conv_bwd / brgconv_bwd_w on AMX
        contiguous = 0 if grad_out.is_contiguous() else nbytes(grad_out)
        return amx_backward_scratch(call, mask, contiguous, fresh)
    if backend == "mkldnn" and gemm_bf16_backward_claims(call, info):  # bfloat16 weights' gradient on gemm:jit
        return gemm_bf16_backward(call, grad_out, x, weight, mask, fresh)
    if backend == "mkldnn" and bf16_3d_backward_claims(call, info):  # bfloat16 3-D: conv_bf16_3d
        data, weights, first = bf16_3d_backward_scratchpads(call, mask, torch.get_num_threads())
        return conv_backward(grad_out, x, weight, bool(mask[2]), 1, mask, out, info.onednn_block,
                             scratchpad=weights, first=first, weights_block=16, data_scratchpad=data)
    if backend == "mkldnn" and bf16_1x1_modelled(call, info):
        problem, nthreads = one_by_one(call, bool(mask[2])), torch.get_num_threads()
        data = bf16_1x1_fwd_or_bwd_data(problem, nthreads, True) if mask[0] else 0
        brg = bool(mask[0]) and problem.strided  # a strided input gradient runs brgconv_strided (nhwc)
        data = (bf16_strided_data_scratch(call, nthreads) or 0) if brg else data
        weights = bf16_1x1_bwd_weights(problem, nthreads) if mask[1] else 0
        return conv_backward(grad_out, x, weight, bool(mask[2]), 1, mask, out, info.onednn_block, brg,
                             scratchpad=weights, first=False, weights_block=16, data_scratchpad=data,
                             data_weights=bf16_strided_data_weights(call, nthreads) if brg else None)
    if backend == "mkldnn" and bf16_depthwise_modelled(call, info):
        weights = bf16_depthwise_bwd_weights(call, bool(mask[2]), torch.get_num_threads()) if mask[1] else 0
        return conv_backward(grad_out, x, weight, bool(mask[2]), call.groups, mask, out, info.onednn_block,
                             scratchpad=weights)
    strided_bf16 = backend == "mkldnn" and bf16_strided_backward_claims(call, info)  # brgconv_strided's input grad
    if strided_bf16 and len(call.x_shape) == 5:  # bfloat16 3-D: conv_bf16_3d's weights' gradient
        _, weights, first = bf16_3d_backward_scratchpads(call, (False, *mask[1:]), torch.get_num_threads())
        data = (bf16_strided_data_scratch(call, torch.get_num_threads()) or 0) if mask[0] else 0
        return conv_backward(grad_out, x, weight, bool(mask[2]), 1, mask, out, info.onednn_block, True,
                             scratchpad=weights, first=first, weights_block=16, data_scratchpad=data,
                             data_weights=bf16_strided_data_weights(call, torch.get_num_threads()))
    if backend == "mkldnn" and (bf16_backward_modelled(call, info) or strided_bf16):
        first = call.x_shape[1] < 16  # jit_bf16's first convolution: nchw source, Acdb16a weights
        scratchpad = bf16_bwd_weights_scratch(call, bool(mask[2]), torch.get_num_threads()) if mask[1] else 0
        data = (bf16_strided_data_scratch(call, torch.get_num_threads()) or 0) if strided_bf16 and mask[0] else 0
        wei = bf16_strided_data_weights(call, torch.get_num_threads()) if strided_bf16 else None
        return conv_backward(grad_out, x, weight, bool(mask[2]), 1, mask, out, info.onednn_block, strided_bf16,
                             scratchpad=scratchpad, first=first, weights_block=16, data_scratchpad=data,
                             data_weights=wei)
    if backend != "mkldnn" or call.dtype != torch.float32 or len(call.x_shape) not in (4, 5):
        return 0  # conv_note says so
    if len(call.x_shape) == 5 and not onednn_nhwc(call) and not onednn_3d_backward(call, info, backend):
        return 0  # conv_note says so
    if onednn_nhwc(call):
        conv = (call.stride, call.padding, call.dilation)
        full_mask = mask
        gemm_weights = onednn_gemm(call, info)[1] and (mask[1] or mask[2])
        if gemm_weights:  # the weights' gradient on gemm: conv_gemm after grad_input (conv_note where not sized)
            mask = (mask[0], False, False)
        if call.one_d:  # the 4-D views ATen hands oneDNN
            grad_out, x, weight = grad_out.unsqueeze(2), x.unsqueeze(2), weight.unsqueeze(2)
        extra = 0  # the AVX-512 kernels reduce the weights' partial sums over batch threads
        if mask[1] and call.groups == 1 and \
                bwd_weights_kernel(call, info.onednn_block, nxc=True) in ("jit:avx512_core", "jit_1x1:avx512_core"):
            extra = bwd_weights_scratch(call, bool(mask[2]), info.onednn_block, torch.get_num_threads(),
                                        nxc=True) or 0
        data = 0
        if mask[0] and call.groups == 1 and info.onednn_block == 16:  # brgemm kernels (conv_note otherwise)
            data = (strided_bwd_data(call, torch.get_num_threads(), 16) or 0) if any(st > 1 for st in call.stride) \
                else unit_stride_bwd_data(torch.get_num_threads())
        if info.onednn_block == 8:  # AVX2 nhwc / ndhwc: conv_nhwc_avx2
            extra, data = ndhwc_avx2_scratchpads(call, mask, torch.get_num_threads())
        if gemm_weights:  # below AVX-512 grad_input runs brg_conv_bwd:avx2 with the same batch buffers (measured)
            data = unit_stride_bwd_data(torch.get_num_threads()) if mask[0] and info.onednn_block < 16 else data
            copies = nhwc_backward(grad_out, x, weight, call.groups, conv, (False,) * 3, (), info.onednn_block)
            peak = nhwc_backward(grad_out, x, weight, call.groups, conv, mask, (), info.onednn_block, extra, data)
            return gemm_nhwc_backward(call, full_mask, copies, peak, fresh, torch.get_num_threads(),
                                      info.onednn_block) or 0
        return nhwc_backward(grad_out, x, weight, call.groups, conv, mask, out, info.onednn_block, extra, data)
    copied, call = copied_input(call, backend)
    if call.x_layout != "contiguous" and not call.one_d:
        return 0  # conv_note says so
    # convolution_backward makes a strided input contiguous first (1-D: view1d_as_2d), live through the kernel
    copy = call.x_bytes if call.one_d and call.x_layout != "contiguous" else copied
    gemm = onednn_gemm(call, info)
    if gemm[0] or gemm[1] and (mask[1] or mask[2]):  # gemm: conv_gemm (conv_note where not sized)
        # a dense strided input gradient runs brgconv_strided (3-D: the weights' gradient alone on gemm)
        strided = call.groups == 1 and bool(mask[0]) and any(s > 1 for s in call.stride)
        data_pad = (strided_bwd_data(call, torch.get_num_threads(), info.onednn_block) or 0) if strided else 0
        grouped = grouped_strided_data(call, torch.get_num_threads(), info.onednn_block) if mask[0] else None
        if grouped is not None:  # a grouped one on brgconv_strided too: conv_grouped_strided_bwd
            strided, data_pad = True, grouped[0]
        jit_data = None if gemm[0] and grouped is None else conv_backward(
            grad_out, x, weight, False, call.groups, (mask[0], False, False), (), info.onednn_block, strided,
            data_scratchpad=data_pad, data_weights=grouped[1] if grouped else
            strided_bwd_weights(call, torch.get_num_threads(), info.onednn_block))  # AVX2: the blocking's ic_block
        contiguous = 0 if grad_out.is_contiguous() else nbytes(grad_out)
        return copy + (gemm_backward(call, gemm, mask, contiguous, jit_data, fresh, torch.get_num_threads(),
                                     info.onednn_block) or 0)
    strided_nhwc = call.groups == 1 and any(s > 1 for s in call.stride)
    data = (strided_bwd_data(call, torch.get_num_threads(), info.onednn_block) or 0) if strided_nhwc and mask[0] else 0
    grouped = grouped_strided_data(call, torch.get_num_threads(), info.onednn_block) if mask[0] else None
    if grouped is not None:  # a grouped one on brgconv_strided: conv_grouped_strided_bwd
        strided_nhwc, data = True, grouped[0]
    scratchpad = 0
    if mask[1]:  # the weights' reduction over threads (conv_note when not sized)
        scratchpad = bwd_weights_scratch(call, bool(mask[2]), info.onednn_block, torch.get_num_threads()) or 0
    # a strided 1x1 one on the direct kernel (3-D; 2-D below AVX-512 where its output does not tile the input)
    # reads 1 to 3 channels on nc(d)hw (3 on jit:avx2)
    first_3d = None
    if math.prod(call.w_shape[2:]) == 1 and any(s > 1 for s in call.stride) and \
            bwd_weights_kernel(call, info.onednn_block) in ("jit:avx2", "jit:avx512_core"):
        first_3d = call.x_shape[1] <= 3 if info.onednn_block == 16 else call.x_shape[1] == 3
    # 3-D on jit:avx2 (4 to 15 channels): 8-channel blocks, 1x1 kernels too (2-D ones run jit_1x1)
    avx2_3d = len(call.x_shape) == 5 and bwd_weights_kernel(call, info.onednn_block) == "jit:avx2"
    return copy + conv_backward(grad_out, x, weight, bool(mask[2]), call.groups, mask, out, info.onednn_block,
                                strided_nhwc, scratchpad, first=first_3d, weights_block=8 if avx2_3d else None,
                                data_scratchpad=data, data_weights=grouped[1] if grouped else
                                strided_bwd_weights(call, torch.get_num_threads(), info.onednn_block))


CONV_CALLS: dict[Any, Callable[[tuple[Any, ...], dict[str, Any]], ConvCall | None]] = {
    aten.convolution.default: _call_convolution,
    aten.conv1d.default: _call_conv_nd,
    aten.conv2d.default: _call_conv_nd,
    aten.conv_transpose1d.default: _call_conv_transpose_nd,
    aten.conv_transpose2d.input: _call_conv_transpose_nd,
    aten.conv3d.default: _call_conv_nd,
    aten.conv1d.padding: _call_conv_nd_padding,
    aten.conv2d.padding: _call_conv_nd_padding,
    aten.conv3d.padding: _call_conv_nd_padding,
    aten.conv_transpose3d.input: _call_conv_transpose_nd,
    aten.convolution_backward.default: _call_convolution_backward,
}


WORKSPACE = {
    aten.convolution.default: rule_convolution,
    aten.conv1d.default: rule_conv_nd,
    aten.conv2d.default: rule_conv_nd,
    aten.conv3d.default: rule_conv_nd,
    aten.conv1d.padding: rule_conv_nd_padding,
    aten.conv2d.padding: rule_conv_nd_padding,
    aten.conv3d.padding: rule_conv_nd_padding,
    aten.conv_transpose1d.default: rule_conv_transpose_nd,
    aten.conv_transpose2d.input: rule_conv_transpose_nd,
    aten.convolution_backward.default: rule_convolution_backward,
}
