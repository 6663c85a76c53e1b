"""bfloat16 grouped forward convolutions on ``avx512_core_bf16``: grouped ones on ``jit_bf16``, 3-D depthwise ones on
``brdgmm_dw``.

A grouped (not depthwise) forward whose per-group channels take a block of 16, 8 or 4 (``ok_to_try_lower_zmm`` in
``jit_avx512_core_bf16_fwd_kernel_t::init_conf``, src/cpu/x64/jit_avx512_core_bf16_conv_kernel.cpp, oneDNN 3.12) runs
the direct kernel in 1-D, 2-D and 3-D, 1x1 kernels included (``jit_bf16_1x1`` takes one group only). Its scratchpad
is empty: ``init_scratchpad`` books a padded bias only where the output channels were padded, and grouped channels
are not. The allocations around it are the float32 grouped forward's (:func:`.conv_onednn.conv_forward`: the
source and the destination in the group's block, ``Goihw``-blocked weights of the dense weights' size) with 2-byte
elements, as measured. An undilated 3-D depthwise forward runs ``brdgmm_dw`` (src/cpu/x64/jit_brdgmm_dw_conv.cpp) on
ndhwc activations: :func:`brdgmm_3d_forward_scratch`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from nnmem.cpu import CpuInfo
from nnmem.frontends.pytorch.workspace._common import alloc_peak, round_up
from nnmem.frontends.pytorch.workspace.conv_gemm_bf16 import _jit_fwd_takes
from nnmem.frontends.pytorch.workspace.matmul import MODELLED_ISA, MODELLED_THREADS

if TYPE_CHECKING:  # conv_select imports this module for its note
    from nnmem.frontends.pytorch.workspace.conv_select import ConvCall

_BF16 = 2
_G_BLOCK = 16  # brdgmm's ch_block on avx512_core_bf16 (bfloat16: dhwioG16g weights)


def bf16_grouped_forward(call: ConvCall, info: CpuInfo) -> bool:
    """Whether a bfloat16 grouped forward runs on ``jit_bf16`` and is sized by the float32 grouped sequence: more
    than one group, not depthwise, NCHW (NCW, NCDHW) source and plain weights, on ``avx512_core_bf16`` at 1-4
    threads, a channel block and paddings ``init_conf`` takes (:func:`.conv_gemm_bf16._jit_fwd_takes`; else
    ``gemm``, :mod:`.conv_gemm_bf16`)."""
    if call.dtype != torch.bfloat16 or call.backward or call.transposed or call.groups == 1:
        return False
    if call.groups == call.x_shape[1] == call.w_shape[0]:  # depthwise: jit_dw / brdgmm_dw
        return False
    if (call.x_layout, call.w_layout) != ("contiguous", "contiguous") or info.isa != MODELLED_ISA:
        return False
    return torch.get_num_threads() in MODELLED_THREADS and _jit_fwd_takes(call)


def bf16_brdgmm_3d_forward(call: ConvCall, info: CpuInfo) -> bool:
    """Whether a bfloat16 3-D depthwise forward runs on ``brdgmm_dw`` (listed first; jit_brdgmm_dw_conv.cpp
    ``init_conf``: one input and one output channel a group, no dilation, ndhwc activations in 3-D) and is sized by
    :func:`brdgmm_3d_forward_scratch`: NCDHW source and plain weights, on ``avx512_core_bf16`` at 1-4 threads."""
    c = call.x_shape[1]
    if call.dtype != torch.bfloat16 or call.backward or call.transposed or len(call.x_shape) != 5:
        return False
    if not call.groups == c == call.w_shape[0] > 1 or any(d != 1 for d in call.dilation):
        return False
    if (call.x_layout, call.w_layout) != ("contiguous", "contiguous") or info.isa != MODELLED_ISA:
        return False
    return torch.get_num_threads() in MODELLED_THREADS


def brdgmm_3d_forward_scratch(call: ConvCall, out_bytes: int) -> int:
    """Scratch bytes of a forward :func:`bf16_brdgmm_3d_forward` takes: ideep reorders the source to ndhwc and the
    weights to ``dhwioG16g`` (groups padded to 16), computes into an ndhwc destination (an empty scratchpad:
    ``init_scratchpad`` books only destination scales), then copies it to the dense output through one more
    temporary of its size, unless one output position makes ndhwc dense already (measured sequence
    ``[src, wei, dst, -wei, -src, out, tmp, -tmp, -dst]``)."""
    g, taps = call.groups, math.prod(call.w_shape[2:])
    src, wei = call.x_bytes, round_up(g, _G_BLOCK) * taps * _BF16
    dst = out_bytes
    tmp = out_bytes if math.prod(call.out_sizes) > 1 else 0
    return alloc_peak([src, wei, dst, -wei, -src, out_bytes, tmp, -tmp, -dst]) - out_bytes


def bf16_more_claims(call: ConvCall, info: CpuInfo) -> bool:
    """Whether a rule here sizes the call (conv_note's test)."""
    return bf16_grouped_forward(call, info) or bf16_brdgmm_3d_forward(call, info)
