"""Float32 channels-last convolutions (nhwc; ndhwc in 3-D) through oneDNN on AVX2 (8-channel blocks): which kernels
run and the scratchpads the nhwc sequence (:mod:`.conv_nhwc`) adds for them; 2-D (nhwc, 1-D viewed as 2-D) the same,
its strided 1x1 weights' gradient on ``jit_1x1:avx2`` gathering the source (``rtus``) where the output tiles the
input, its depthwise weights' gradient outside ``jit_uni_dw`` on the grouped ``jit:avx2`` kernel.

Forward on ``brg_conv_fwd:avx2`` / ``brgconv_1x1:avx2`` (the batch elements, as 2-D; grouped ones too, with their
own weights: :func:`grouped_forward`), depthwise on ``brdgmm_dw:avx2`` (as 2-D). Ungrouped backward data at unit
stride on ``brg_conv_bwd:avx2+brg_conv_fwd:avx2`` (:func:`.conv_nhwc.unit_stride_bwd_data`). Backward weights on
``jit:avx2`` (``jit_avx2_conv_bwd_weights_kernel_f32_t::init_conf`` in cpu/x64/jit_avx2_conv_kernel_f32.cpp, its
reducers from ``jit_avx2_convolution_bwd_weights_t::pd_t::init_balancers``), ``jit_1x1:avx2``
(``jit_avx2_1x1_convolution_bwd_weights_t``) or, where the direct kernel refuses, ``gemm`` (:mod:`.conv_gemm`).
Which calls are claimed: :func:`ndhwc_avx2_note`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from nnmem.cpu import CpuInfo
from nnmem.frontends.pytorch.workspace._common import NOT_MODELLED, round_up
from nnmem.frontends.pytorch.workspace.conv_brgemm_bwd import brgemm_batch_bytes
from nnmem.frontends.pytorch.workspace.conv_bwd_weights import (
    _avx2_3d_refuses,
    _direct_refuses,
    _div_up,
    _halve,
    _reducer,
    dw_jit_bwd_weights,
)

if TYPE_CHECKING:  # conv_select imports this module through conv_3d
    from nnmem.frontends.pytorch.workspace.conv_select import ConvCall

_BOOK_PAD = 128  # memory_tracking registry: each booking's capacity is its size plus the alignment
_BLK = 8  # simd_w of the avx2 kernels
_MAX_BUFFER = 1 << 21  # init_balancers' "just a heuristic" reducer buffer


def weights_kernel(call: ConvCall) -> str | None:
    """The kernel of an ndhwc weights' gradient on AVX2 (ungrouped, or grouped and not depthwise), or None for
    ``gemm`` or a grouped one not followed: ``jit_1x1:avx2`` for an ungrouped unpadded unit-stride 1x1, else
    ``jit:avx2`` unless its ``init_conf`` refuses (``kw < 14``; no front or back padding; ``kd <= id``,
    ``kh <= ih``, ``t_pad < kh``; the other paddings below the kernel; no dilation). Grouped with three input
    channels a group (``flat``, ``gOdhwi8o``) or in all: None (measured on gemm)."""
    c, o, g = call.x_shape[1], call.w_shape[0], call.groups
    if g > 1 and g == c == o and len(call.x_shape) == 4:  # 2-D depthwise: jit_uni_dw, else the grouped jit:avx2
        dw = dw_jit_bwd_weights(call.x_shape, call.w_shape, call.stride, call.padding, call.dilation)
        return None if dw or call.w_shape[-1] >= 14 or _direct_refuses(call, False) else "jit:avx2"
    if g > 1 and (g == c == o or c // g == 3 or c == 3):
        return None
    one_by_one = all(k == 1 for k in call.w_shape[2:]) and not any(call.padding)
    if g == 1 and one_by_one and all(s == 1 for s in call.stride):
        return "jit_1x1:avx2"
    if g == 1 and one_by_one and _rtus(call):
        return "jit_1x1:avx2"
    three_d = len(call.x_shape) == 5
    if call.w_shape[-1] >= 14 or three_d and _avx2_3d_refuses(call) or _direct_refuses(call, False):
        return None
    return "jit:avx2"


def _rtus(call: ConvCall) -> bool:
    """Whether a strided 2-D 1x1 runs ``jit_1x1:avx2`` gathering its source at unit stride (``rtus_prepare``, in
    cpu/x64/jit_uni_1x1_conv_utils.hpp: the output tiles the input, ``ih == oh * sh`` and ``iw == ow * sw``)."""
    return len(call.x_shape) == 4 and any(s > 1 for s in call.stride) and all(
        i == o * s for i, o, s in zip(call.x_shape[2:], call.out_sizes, call.stride))


def _weights_reducers(call: ConvCall, with_bias: bool, nthreads: int) -> int | None:
    """The reducers' scratchpad of the weights' gradient (the padded bias is :mod:`.conv_nhwc`'s)."""
    kernel = weights_kernel(call)
    g = call.groups
    mb, ic = call.x_shape[0], call.x_shape[1] // g
    oc, od = call.w_shape[0] // g, call.out_sizes[0] if len(call.x_shape) == 5 else 1
    nb_oc = _div_up(oc, _BLK)
    if kernel == "jit:avx2":
        ic_block = ic if ic == 3 else _BLK  # flat: three channels as one block
        taps = math.prod(call.w_shape[2:])
        total = _reducer(nthreads, taps * ic_block * _BLK, g * _div_up(ic, ic_block) * nb_oc, mb * od, _MAX_BUFFER)
        return total + (_reducer(nthreads, _BLK, g * nb_oc, mb, _MAX_BUFFER) if with_bias else 0)
    if kernel == "jit_1x1:avx2":
        nb_ic = _div_up(ic, _BLK)
        ic_blocking, oc_blocking = _halve(nb_ic, 9), _halve(nb_oc, 32)
        job = oc_blocking * ic_blocking * _BLK * _BLK
        max_buffer = nthreads * job * 8
        njobs = _div_up(nb_oc, oc_blocking) * _div_up(nb_ic, ic_blocking)
        total = _reducer(nthreads, job, njobs, mb * math.prod(call.out_sizes), max_buffer, two_d=True)
        # rtus_prepare_space_info: on nhwc ``is * ic`` floats a thread, the source at unit stride
        rtus = nthreads * math.prod(call.out_sizes) * ic * 4 + _BOOK_PAD if _rtus(call) else 0
        return total + rtus + (_reducer(nthreads, _BLK, nb_oc, mb, max_buffer) if with_bias else 0)
    return None


def ndhwc_avx2_scratchpads(call: ConvCall, mask: Sequence[bool], nthreads: int) -> tuple[int, int]:
    """``(weights' reducers, backward data's scratchpad)`` in bytes of an ungrouped ndhwc backward on AVX2, for
    :func:`.conv_nhwc.nhwc_backward`: the input gradient's at unit stride is the brgemm forward's batch elements
    and one booking (:func:`.conv_nhwc.unit_stride_bwd_data`)."""
    if call.groups != 1:  # grouped: claimed without the input's gradient only (ndhwc_avx2_note)
        return (_weights_reducers(call, bool(mask[2]), nthreads) or 0) if mask[1] else 0, 0
    data = brgemm_batch_bytes(nthreads) + _BOOK_PAD if mask[0] and all(s == 1 for s in call.stride) else 0
    weights = (_weights_reducers(call, bool(mask[2]), nthreads) or 0) if mask[1] else 0
    return weights, data


def grouped_forward(call: ConvCall, x: torch.Tensor, weight: torch.Tensor) -> int | None:
    """Scratch bytes of a grouped (not depthwise) ndhwc forward on AVX2, or None for any other call: oneDNN runs it
    on ``brg_conv_fwd:avx2`` / ``brgconv_1x1:avx2`` with grouped weights (``gAcdeb8a``-like: each group's output
    channels padded to the brgemm block :func:`.conv_select.io_block` picks), and the batch elements per
    thread; ATen's channels-last copies of a contiguous input and weight come first, as in :mod:`.conv_nhwc`."""
    c, o, g = call.x_shape[1], call.w_shape[0], call.groups
    if call.backward or call.dtype != torch.float32 or call.one_d or g == 1 or g == c == o:
        return None
    from nnmem.frontends.pytorch.workspace.conv_nhwc import _cl_copy  # both import conv_select, which imports this
    from nnmem.frontends.pytorch.workspace.conv_select import io_block

    o_g = o // g
    weights = g * round_up(o_g, io_block(o_g, _BLK)) * (c // g) * math.prod(call.w_shape[2:]) * call.itemsize
    return _cl_copy(x) + _cl_copy(weight) + brgemm_batch_bytes(torch.get_num_threads()) + weights


def ndhwc_avx2_note(call: ConvCall, info: CpuInfo) -> str | None:
    """Why a float32 ndhwc convolution on AVX2 is not sized, or None. Claimed (seeded draws exact at 1-4 threads):
    ungrouped ones forward and backward (a strided input gradient runs ``brgconv_strided``, whose note
    :func:`.conv_select.conv_note` gives first), grouped and undilated depthwise forwards, a grouped weights'
    gradient on ``jit:avx2`` without the input's. Noted: depthwise backward (the grouped ``jit:avx2`` kernels on
    ``aBCdef8b8c`` weights or ``gemm``), a grouped input gradient (``brg_conv_bwd`` on grouped weights,
    ``brgconv_strided``, ``gemm``: measured above the dense rule), a grouped weights' gradient on ``gemm`` (and,
    from conv_note, on more than twice as many threads as groups), a dilated depthwise forward (``jit:avx2`` or
    ``gemm``, measured above the weights' reorder)."""
    three_d = len(call.x_shape) == 5
    where = f"channels-last {3 if three_d else 1 if call.one_d else 2}-D convolution through oneDNN (ISA {info.isa}"
    if call.dtype != torch.float32:
        return f"{where}, {call.dtype}): {NOT_MODELLED}"
    depthwise = 1 < call.groups == call.x_shape[1] == call.w_shape[0]
    dilated = any(d != 1 for d in call.dilation)
    if call.grad_input and any(s > 1 for s in call.stride) and (three_d or not depthwise):  # unit stride only
        return f"{where}, strided input gradient on brgconv_strided): {NOT_MODELLED}"
    if not three_d and call.groups == 1 and math.prod(call.out_sizes) == 1 and torch.get_num_threads() > 1:
        # brg_conv_fwd (forward, and the unit-stride input gradient) picks its output-channel block by threads
        # (brg_blocking_t::est_eff): measured Acdb16a for 20 or 24 output channels, where io_block says 24
        return f"{where}, one output position on the brgemm kernels): {NOT_MODELLED}"
    one_by_one = math.prod(call.w_shape[2:]) == 1
    if call.backward and depthwise and (three_d or dilated and one_by_one):  # 2-D: conv_nhwc / conv_gemm
        return f"{where}, {'dilated 1x1 ' if not three_d else ''}depthwise backward): {NOT_MODELLED}"
    if call.one_d and call.groups > 1 and not depthwise:
        return f"{where}, grouped): {NOT_MODELLED}"
    if call.backward and call.groups > 1 and not depthwise and (call.grad_input or weights_kernel(call) is None):
        return f"{where}, grouped backward with its input's gradient or on gemm): {NOT_MODELLED}"
    if not call.backward and depthwise and dilated and (three_d or not one_by_one):  # not on brdgmm_dw
        return f"{where}, dilated depthwise forward on jit:avx2 or gemm): {NOT_MODELLED}"
    return None
