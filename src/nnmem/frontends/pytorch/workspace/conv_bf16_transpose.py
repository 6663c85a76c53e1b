"""Scratch of bfloat16 transposed convolutions (1-D to 3-D) and of strided input gradients on ``avx512_core_bf16``.

oneDNN's ``ref_deconvolution`` / ``brg_deconv`` (src/cpu/ref_deconvolution.hpp, x64/jit_brgemm_deconv.cpp) run a
deconvolution's forward as the backward data of the convolution it transposes, nesting that kernel's registry
(+128 B): ``jit_bf16`` / ``jit_bf16_1x1`` at unit stride, ``brgconv_strided`` strided (:mod:`.conv_bf16_strided_bwd`),
``gemm:jit`` dilated and strided. A bias no ``jit`` / ``ref`` kernel adds makes the convolution write float32 into
``key_deconv_bias``. The backward runs the convolution's forward and backward weights, roles swapped (``jit_bf16``,
``jit_bf16_1x1``, ``gemm:jit``: :mod:`.conv_bf16`, :mod:`.conv_bf16_1x1`, :mod:`.conv_bf16_3d`,
:mod:`.conv_gemm_bf16`); ideep's allocations around them are :mod:`.conv_transpose`'s. Measured with
``ONEDNN_VERBOSE`` and the profiler: tests/frontends/pytorch/test_conv_bf16_transpose.py.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from nnmem.cpu import CpuInfo
from nnmem.frontends.pytorch.workspace._common import alloc_peak, book, round_up
from nnmem.frontends.pytorch.workspace.conv_bf16_1x1 import OneByOne
from nnmem.frontends.pytorch.workspace.conv_grouped_strided_bwd import bf16_plan, bf16_weights
from nnmem.frontends.pytorch.workspace.matmul import MODELLED_ISA, MODELLED_THREADS

if TYPE_CHECKING:  # conv_select imports this module for its note
    from nnmem.frontends.pytorch.workspace.conv_select import ConvCall

_BLOCK = 16
_BF16, _F32 = 2, 4


def _as_convolution(call: ConvCall) -> ConvCall:
    from nnmem.frontends.pytorch.workspace.conv_transpose import _as_convolution as as_conv

    return dataclasses.replace(as_conv(call), backward=False, grad_input=False)


def _out_sizes(call: ConvCall) -> tuple[int, ...]:
    from nnmem.frontends.pytorch.workspace.conv_transpose import transposed_out_sizes

    return transposed_out_sizes(call)


def _claims(call: ConvCall, info: CpuInfo) -> bool:
    """Dense 1-D, 2-D or 3-D NC(D)HW bfloat16 deconvolutions on ``avx512_core_bf16`` at 1-4 threads, with an
    output (an empty one allocates nothing the kernels size)."""
    return (call.dtype == torch.bfloat16 and call.transposed and call.groups == 1 and len(call.x_shape) in (4, 5)
            and call.x_layout == "contiguous" and call.w_layout != "channels_last" and info.isa == MODELLED_ISA
            and torch.get_num_threads() in MODELLED_THREADS and min(_out_sizes(call)) > 0
            and math.prod(call.x_shape) > 0)


def _one_by_one(call: ConvCall) -> bool:
    """The transposed convolution is a 1x1 ``jit_bf16_1x1`` takes (:func:`.conv_bf16.bf16_1x1_modelled`'s shape
    test): unpadded, the stride tiling the output (3-D: at unit stride, no ``rtus``)."""
    from nnmem.frontends.pytorch.workspace.conv_bf16_3d import _unit_1x1

    conv = _as_convolution(call)
    if len(call.x_shape) == 5:
        return _unit_1x1(conv)
    return math.prod(call.w_shape[2:]) == 1 and not any(call.padding) and \
        all(o * s == i for o, s, i in zip(conv.out_sizes, conv.stride, conv.x_shape[2:]))


def _problem(call: ConvCall) -> OneByOne:
    """The 1x1 problem ``jit_bf16_1x1``'s ``init_conf`` sees for the convolution (no bias: the deconvolution adds
    it)."""
    from nnmem.frontends.pytorch.workspace.conv_bf16 import one_by_one
    from nnmem.frontends.pytorch.workspace.conv_bf16_3d import _one_by_one as one_by_one_3d

    conv = _as_convolution(call)
    return one_by_one_3d(conv, False) if len(call.x_shape) == 5 else one_by_one(conv, False)


def _unit_kernel(call: ConvCall) -> str | None:
    """The convolution backward-data kernel a unit-stride deconvolution runs, where sized: "jit_1x1", "jit"."""
    if _one_by_one(call):
        return "jit_1x1"
    if any(s != 1 for s in call.stride):
        return None
    if _as_convolution(call).kernel_outside():
        return None
    return "jit"


def bf16_transpose_forward(call: ConvCall, bias: bool, info: CpuInfo) -> int | None:
    """Scratch bytes of a bfloat16 ``mkldnn_convolution_transpose`` (the output excluded), or None where not
    sized. Sequence ``[pad, src, wei, dst, -wei, -src, -pad, out, -dst]`` (the float32 port's), blocked
    ``aBcd16b`` source and destination, weights padded to 16 both ways, ``pad`` the deconvolution's scratchpad."""
    from nnmem.frontends.pytorch.workspace.conv_bf16_1x1 import fwd_or_bwd_data

    if not _claims(call, info):
        return None
    if any(st > 1 for st in call.stride) and (not _one_by_one(call) or all(d == 1 for d in call.dilation)):
        return _strided_forward(call, bias)  # brgconv_strided, ahead of jit_bf16_1x1 where undilated
    kernel = _unit_kernel(call)
    if kernel is None:
        return None
    n, c = call.x_shape[:2]
    o, k = call.w_shape[1], math.prod(call.w_shape[2:])
    s_in, s_out = math.prod(call.x_shape[2:]), math.prod(_out_sizes(call))
    nested = 0
    if kernel == "jit_1x1":
        problem = _problem(call)
        nested = fwd_or_bwd_data(problem, torch.get_num_threads(), True)
        if bias and problem.strided:  # rtus gathers the float32 input gradient: twice the bfloat16 bytes
            unit = fwd_or_bwd_data(dataclasses.replace(problem, strided=False), torch.get_num_threads(), True)
            nested = unit + book(2 * (nested - unit - 128))  # the rtus booking (+128 B) doubled
    pad = book(nested) + (book(n * round_up(o, _BLOCK) * s_out * _F32) if bias else 0)
    src = n * round_up(c, _BLOCK) * s_in * _BF16
    wei = round_up(o, _BLOCK) * round_up(c, _BLOCK) * k * _BF16
    dst = n * round_up(o, _BLOCK) * s_out * _BF16
    out = n * o * s_out * _BF16
    return alloc_peak([pad, src, wei, dst, -wei, -src, -pad, out, -dst]) - out


def _strided_forward(call: ConvCall, bias: bool) -> int | None:
    """A strided deconvolution on ``brgconv_strided`` (nhwc): ``brg_deconv`` (bias in the kernel) where the output
    is a multiple of the stride, else ``ref_deconvolution``, whose bias makes the convolution write float32 into
    ``key_deconv_bias``. Sequence ``[pad, src, wei, out, -wei, -src, -pad, out_cl, out, -out, -out_cl]`` (the
    float32 port's) with ``AcdB{ic_block}a2b`` weights (:func:`bf16_strided_data_weights`)."""
    if any(d != 1 for d in call.dilation):  # brgconv_strided refuses dilation
        return _gemm_forward(call, bias)
    conv = _as_convolution(call)
    uneven = any(i % st for i, st in zip(conv.x_shape[2:], conv.stride))
    f32 = bias and uneven
    dst_dsz = _F32 if f32 else _BF16
    nested = bf16_strided_data_scratch(conv, torch.get_num_threads(), dst_dsz)
    wei = bf16_strided_data_weights(conv, torch.get_num_threads(), dst_dsz)
    if nested is None or wei is None:
        return None
    n, c = call.x_shape[:2]
    o = call.w_shape[1]
    s_in, s_out = math.prod(call.x_shape[2:]), math.prod(_out_sizes(call))
    out = n * o * s_out * _BF16
    pad = book(nested) + (book(n * o * s_out * _F32) if f32 else 0)
    src = 0 if c == 1 or s_in == 1 else n * c * s_in * _BF16
    out_cl = 0 if o == 1 or s_out == 1 else out
    return alloc_peak([pad, src, wei, out, -wei, -src, -pad, out_cl, out, -out, -out_cl]) - out


def _gemm_forward(call: ConvCall, bias: bool) -> int | None:
    """A dilated strided deconvolution on ``gemm:jit``'s backward data (plain layouts; the scratchpad
    :func:`.conv_gemm_bf16.bwd_data_scratchpad`'s, the same for a float32 result), its bias through float32:
    ``[pad, dst, -pad, out, -dst]``."""
    from nnmem.frontends.pytorch.workspace.conv_gemm_bf16 import _jcp, bwd_data_scratchpad

    nested = bwd_data_scratchpad(_jcp(_as_convolution(call), False), torch.get_num_threads())
    if nested is None:
        return None
    out = call.x_shape[0] * call.w_shape[1] * math.prod(_out_sizes(call)) * _BF16
    pad = book(nested) + (book(2 * out) if bias else 0)
    return alloc_peak([pad, out, -pad, out, -out]) - out


def _weights_kernel(call: ConvCall) -> str | None:
    """The kernel of the transposed convolution's weights' gradient (the convolution's backward weights, roles
    swapped): "jit_1x1", "jit" (``jit_bf16``), "gemm" (``gemm:jit`` where ``jit_bf16`` refuses), None where not
    sized."""
    from nnmem.frontends.pytorch.workspace.conv_bf16 import jit_bf16_bwd_weights
    from nnmem.frontends.pytorch.workspace.conv_bf16_3d import _jit_bf16_bwd_weights as jit_bf16_bwd_weights_3d
    from nnmem.frontends.pytorch.workspace.conv_gemm_bf16 import _jcp, _jit_bwd_weights_takes, bwd_weights_scratchpad

    conv = _as_convolution(call)
    if _one_by_one(call):
        return "jit_1x1"
    takes = jit_bf16_bwd_weights_3d if len(call.x_shape) == 5 else jit_bf16_bwd_weights
    if takes(conv) and not conv.kernel_outside():
        return "jit"
    if _jit_bwd_weights_takes(conv) and not conv.kernel_outside():
        return None  # jit_bf16 shapes its port does not size
    return "gemm" if bwd_weights_scratchpad(_jcp(conv, False), torch.get_num_threads()) is not None else None


def _weights_seq(call: ConvCall, kernel: str, mask: Sequence[bool]) -> list[int]:
    """The weights' gradient's allocations: blocked ``grad_output`` (the source; nchw for a first convolution, one
    of fewer than 16 channels above 1x1) and input, blocked gradient, the nested scratchpad, the bias gradient,
    the dense gradient; plain layouts on gemm."""
    from nnmem.frontends.pytorch.workspace.conv_bf16 import bf16_bwd_weights_scratch
    from nnmem.frontends.pytorch.workspace.conv_bf16_1x1 import bwd_weights
    from nnmem.frontends.pytorch.workspace.conv_bf16_3d import bwd_weights_scratch as bwd_weights_scratch_3d
    from nnmem.frontends.pytorch.workspace.conv_gemm_bf16 import _jcp, bwd_weights_scratchpad

    conv, nthreads = _as_convolution(call), torch.get_num_threads()
    n, c = call.x_shape[:2]
    o, k = call.w_shape[1], math.prod(call.w_shape[2:])
    s_x, s_gy = math.prod(call.x_shape[2:]), math.prod(_out_sizes(call))
    gb, w = (o * _BF16 if mask[2] else 0), c * o * k * _BF16
    if kernel == "gemm":
        pad = book(bwd_weights_scratchpad(_jcp(conv, False), nthreads) or 0)
        return [w, pad, gb, -pad, gb, w, -w, -gb]
    three_d = len(call.x_shape) == 5
    if kernel == "jit_1x1":  # 3-D's uses_permw_transposition adds oc <= 64 (conv_bf16_3d)
        problem = _problem(call)
        permw = conv.out_sizes[-2] > 14 and conv.out_sizes[-1] > 14 and problem.oc <= 64 if three_d else None
        pad = book(bwd_weights(problem, nthreads, permw))
    elif three_d:
        pad = book(bwd_weights_scratch_3d(conv, False, nthreads))
    else:
        pad = book(bf16_bwd_weights_scratch(conv, False, nthreads))
    first = o < _BLOCK and kernel == "jit"
    gy2 = 0 if first else n * round_up(o, _BLOCK) * s_gy * _BF16
    xs = n * round_up(c, _BLOCK) * s_x * _BF16
    gw = round_up(c, _BLOCK) * (o if first else round_up(o, _BLOCK)) * k * _BF16
    return [gy2, xs, gw, pad, gb, -pad, -xs, -gy2, gb, w, -gw, -gb]


def bf16_transpose_backward(call: ConvCall, grad_out: torch.Tensor, mask: Sequence[bool], outs: Sequence[Any],
                            info: CpuInfo) -> int | None:
    """Scratch bytes of a bfloat16 ``mkldnn_convolution_transpose_backward`` (the fresh gradients excluded), or
    None where not sized: the float32 port's sequence (:func:`.conv_transpose.transpose_backward`) with the
    bfloat16 kernels' layouts and scratchpads: the input gradient on the convolution's forward (``jit_bf16``,
    ``jit_bf16_1x1``: :func:`.conv_onednn.conv_forward`), the weights' per :func:`_weights_kernel`."""
    from nnmem.frontends.pytorch.workspace.conv_bf16_1x1 import fwd_or_bwd_data
    from nnmem.frontends.pytorch.workspace.conv_bf16_3d import _forward_pads
    from nnmem.frontends.pytorch.workspace.conv_onednn import conv_forward
    from nnmem.frontends.pytorch.workspace.conv_select import _jit_bf16_forward_pads

    if not _claims(call, info):
        return None
    conv = _as_convolution(call)
    one, kernel = _one_by_one(call), _weights_kernel(call)
    pads = _forward_pads if len(call.x_shape) == 5 else _jit_bf16_forward_pads
    if kernel is None or call.grad_input and not one and not pads(conv):
        return None  # the input gradient: another forward kernel where jit_bf16's paddings refuse it
    n, c = call.x_shape[:2]
    o = call.w_shape[1]
    seq = [0 if grad_out.is_contiguous() else n * o * math.prod(_out_sizes(call)) * _BF16]
    if mask[0]:
        gx = torch.empty(call.x_shape, dtype=call.dtype, device="meta")
        weight = torch.empty((c, o, *call.w_shape[2:]), dtype=call.dtype, device="meta")
        gy = torch.empty((n, o, *_out_sizes(call)), dtype=call.dtype, device="meta")
        fwd = book(fwd_or_bwd_data(_problem(call), torch.get_num_threads(), False)) if one else 0
        data = conv_forward(gy, weight, None, gx, 1, _BLOCK, call.stride, scratchpad=fwd)
        seq += [data + gx.numel() * _BF16, -data]
    if mask[1] or mask[2]:
        seq += _weights_seq(call, kernel, mask)
    fresh = sum(int(t.untyped_storage().nbytes()) for t in outs if isinstance(t, torch.Tensor))
    return max(alloc_peak(seq) - fresh, 0)


def _strided_data(call: ConvCall, nthreads: int, dst_dsz: int) -> tuple[int, int] | None:
    from nnmem.frontends.pytorch.workspace.conv_bf16_strided_bwd import problem, scratchpad

    if any(d != 1 for d in call.dilation) or len(call.x_shape) not in (4, 5):
        return None
    if call.groups != 1:  # grouped (and depthwise: None): conv_grouped_strided_bwd
        return bf16_plan(call, nthreads, dst_dsz)
    p = problem(call.x_shape, call.w_shape, call.stride, call.padding, nthreads, dst_dsz, call.groups)
    return None if p is None else scratchpad(p)


def bf16_strided_data_scratch(call: ConvCall, nthreads: int, dst_dsz: int = _BF16) -> int | None:
    """``brgconv_strided``'s bfloat16 backward-data scratchpad for a strided dense or grouped 1-D / 2-D / 3-D call
    (:func:`.conv_bf16_strided_bwd.scratchpad`; grouped: :func:`.conv_grouped_strided_bwd.bf16_plan`), or None
    where not sized (dilated, depthwise, few output channels a group, unit stride)."""
    planned = _strided_data(call, nthreads, dst_dsz)
    return None if planned is None else planned[0]


def bf16_strided_data_weights(call: ConvCall, nthreads: int, dst_dsz: int = _BF16) -> int | None:
    """Bytes of the weights ideep reorders for that kernel (``IhwO{ic_block}i2o``: the input channels padded to
    the blocking's ``ic_block``, the output channels to VNNI pairs), or None where not sized."""
    planned = _strided_data(call, nthreads, dst_dsz)
    if planned is None:
        return None
    if call.groups != 1:  # gIhwO{ic_block}i2o: each group's output channels in VNNI pairs
        return bf16_weights(call, planned[1])
    o, c = call.w_shape[:2]
    return round_up(o, 2) * round_up(c, planned[1]) * math.prod(call.w_shape[2:]) * _BF16


def bf16_strided_backward_claims(call: ConvCall, info: CpuInfo) -> bool:
    """Whether a bfloat16 ``convolution_backward`` with a strided input gradient is sized: what
    :func:`.conv_bf16.bf16_backward_modelled` (3-D: :func:`.conv_bf16_3d.bf16_3d_backward_claims`) takes but for
    the stride, the input gradient on ``brgconv_strided`` (:func:`bf16_strided_data_scratch`)."""
    from nnmem.frontends.pytorch.workspace.conv_bf16 import bf16_1x1_modelled, bf16_backward_modelled
    from nnmem.frontends.pytorch.workspace.conv_bf16_3d import bf16_3d_backward_claims

    if call.dtype != torch.bfloat16 or not call.backward or not call.grad_input or call.transposed:
        return False
    if all(s == 1 for s in call.stride) or info.isa != MODELLED_ISA:
        return False
    weights = bf16_3d_backward_claims if len(call.x_shape) == 5 else bf16_backward_modelled
    if not weights(dataclasses.replace(call, grad_input=False), info) and not _ragged_1x1(call, info) \
            and not bf16_1x1_modelled(call, info):  # a tiling 1x1: jit_bf16_1x1's weights (conv_bf16_1x1)
        return False
    return bf16_strided_data_scratch(call, torch.get_num_threads()) is not None


def _ragged_1x1(call: ConvCall, info: CpuInfo) -> bool:
    """A strided 2-D 1x1 whose output does not tile the input (``jit_bf16_1x1``'s ``rtus`` refuses it): its
    weights' gradient runs the direct ``jit_bf16`` (:func:`.conv_bf16.jit_bf16_bwd_weights`), as measured."""
    from nnmem.frontends.pytorch.workspace.conv_bf16 import jit_bf16_bwd_weights

    if len(call.x_shape) != 4 or math.prod(call.w_shape[2:]) != 1 or any(call.padding):
        return False
    if torch.get_num_threads() not in MODELLED_THREADS or math.prod(call.out_sizes) == 1:
        return False
    tiles = all(o * st == i for o, st, i in zip(call.out_sizes, call.stride, call.x_shape[2:]))
    return not tiles and jit_bf16_bwd_weights(call)


def bf16_transpose_claims(call: ConvCall, info: CpuInfo) -> bool:
    """Whether a bfloat16 transposed convolution (forward, or backward whatever its mask) is sized here."""
    if not call.backward:
        return bf16_transpose_forward(call, False, info) is not None
    meta = torch.empty(0, dtype=call.dtype, device="meta")
    return bf16_transpose_backward(call, meta, (call.grad_input, True, True), (), info) is not None
