"""Scratch of float32 channels-last convolutions through oneDNN (ideep, nhwc activations).

aten/src/ATen/native/mkldnn/Conv.cpp: with a channels-last input or weight (``mkldnn_conv_use_channels_last``)
the activations are viewed in place (nhwc), the weight is made ``contiguous(ChannelsLast)`` and reordered to
the blocked layout of the oneDNN implementation that runs, grad_weight is copied dense and then
``.to(ChannelsLast)``; a 3-D one the same on ndhwc (``ChannelsLast3d``, layouts with one more spatial letter;
which 3-D shapes are claimed: :func:`.conv_3d.ndhwc_note`). The layouts are those the implementations declare
in ``ONEDNN_VERBOSE`` (oneDNN 3.12; ``b`` is the ISA's channel block, 16 on AVX-512, 8 on AVX2): brgemm
convolutions ``Acdb16a/32a`` forward
(``Acdb8a/16a/24a/32a`` on AVX2), ``Bcda16b/32b`` backward data; ``jit`` backward weights ``ABcd16b16a``
(``Acdb16a`` below 16 input channels on AVX-512); grouped ``jit`` ``aBCde16c16b``; depthwise ``Goihw16g``.
Scratchpads booked by oneDNN (``memory_tracking`` registry; each booking is padded by 128 B) are counted
where the source sizes them from the shape: the padded bias, the depthwise nxc reduction buffers, the brgemm
kernels' batch elements per thread (:func:`brgemm_batch_bytes`), backward data's brgemm scratchpad (unit
stride: :func:`unit_stride_bwd_data`; strided: ``brgconv_strided``, :mod:`.conv_brgemm_bwd`) and the AVX-512
weights' partial sums (:mod:`.conv_bwd_weights`, passed in by the caller). Shapes found off are noted
(:func:`.conv_select.conv_note`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from nnmem.frontends.pytorch.workspace._common import alloc_peak, nbytes, round_up
from nnmem.frontends.pytorch.workspace.conv_brgemm_bwd import brgemm_batch_bytes
from nnmem.frontends.pytorch.workspace.conv_select import dw_jit_bwd_weights, grouped_block, io_block

_BOOK_PAD = 128  # oneDNN memory_tracking registry: each booking's capacity is its size plus the alignment


def _cl_copy(t: torch.Tensor) -> int:
    """Bytes of ``t.contiguous(ChannelsLast)`` (``ChannelsLast3d`` for a 5-D one,
    ``mkldnn_convolution_memory_format``): nothing when it already is (a depthwise or 1x1 weight is)."""
    layout = torch.channels_last_3d if t.dim() == 5 else torch.channels_last
    return 0 if t.is_contiguous(memory_format=layout) else nbytes(t)


def _is_depthwise(c: int, o: int, groups: int) -> bool:
    return groups > 1 and groups == c == o


def _dims(x: torch.Tensor, weight: torch.Tensor) -> tuple[int, int, int, int, int]:
    o, c_per_g = int(weight.shape[0]), int(weight.shape[1])
    k = math.prod(int(d) for d in weight.shape[2:])
    return int(x.shape[1]), o, c_per_g, k, x.element_size()


def _grouped_blocked(o: int, c_per_g: int, k: int, groups: int, e: int, b: int, padded: bool = False) -> int:
    """``aBCde16c16b`` / ``aBCde16b16c``: each group's output and input channels padded to 16; forward and
    backward data take a block of 8 or 4 (``aBCde8c8b``, no padding) where neither count is a multiple of
    16 and that block divides both."""
    o_per_g = o // groups
    small = c_per_g % 16 and o_per_g % 16 and grouped_block(c_per_g, o_per_g, 8) is not None
    if not padded and small:  # neither count a multiple of 16, both of 8 or 4 (layouts in ONEDNN_VERBOSE)
        return o * c_per_g * k * e
    return groups * round_up(o // groups, b) * round_up(c_per_g, b) * k * e


def forward_weight(x: torch.Tensor, weight: torch.Tensor, groups: int, b: int) -> int:
    """Bytes of the weights reordered for the forward kernel (brgemm ``Acdb16a/32a``, grouped ``jit``,
    depthwise ``brdgmm`` with the groups padded to the block)."""
    c, o, c_per_g, k, e = _dims(x, weight)
    if _is_depthwise(c, o, groups):
        return round_up(groups, b) * k * e
    if groups > 1:
        return _grouped_blocked(o, c_per_g, k, groups, e, b)
    return round_up(o, io_block(o, b)) * c * k * e


def unit_stride_bwd_data(nthreads: int) -> int:
    """The scratchpad of an ungrouped unit-stride backward data on nhwc: oneDNN runs it as a forward brgemm
    convolution with the roles swapped (``brg_conv_bwd:avx512_core+brg_conv_fwd:avx512_core``), whose batch
    elements it books plus one 128 B booking (measured the same at 1-3 threads, 3-48 input channels)."""
    return brgemm_batch_bytes(nthreads) + _BOOK_PAD


def nhwc_forward(x: torch.Tensor, weight: torch.Tensor, groups: int, b: int) -> int:
    """Scratch of ``mkldnn_convolution`` with channels-last activations: the input and the weight made
    channels-last, the weight reordered, the brgemm scratchpad of an ungrouped one,
    ``[x, w, out, scratchpad, wei, -wei, -scratchpad, -w, -x]``."""
    scratchpad = brgemm_batch_bytes(torch.get_num_threads()) if groups == 1 else 0
    return _cl_copy(x) + _cl_copy(weight) + scratchpad + forward_weight(x, weight, groups, b)


def _bwd_weights(x: torch.Tensor, weight: torch.Tensor, gy: torch.Tensor, groups: int, bias: bool,
                 conv: tuple[Sequence[int], Sequence[int], Sequence[int]], b: int) -> tuple[int, int]:
    """``(blocked grad_weight, scratchpad)`` bytes of the backward-weights kernel."""
    c, o, c_per_g, k, e = _dims(x, weight)
    if _is_depthwise(c, o, groups) and dw_jit_bwd_weights(tuple(x.shape), tuple(weight.shape), *conv):
        # harness_nxc: (nthr - 1) per-thread partial weights (groups padded to the block) and biases
        gw = round_up(groups, b) * k * e
        spare = min(torch.get_num_threads(), int(gy.shape[0]) * int(gy.shape[2]) * math.ceil(groups / b)) - 1
        if spare <= 0:
            return gw, 0
        return gw, spare * gw + _BOOK_PAD + (spare * groups * 4 + _BOOK_PAD if bias else 0)
    if groups > 1:
        gw = _grouped_blocked(o, c_per_g, k, groups, e, b, padded=True)
        oc_g = o // groups
    else:
        # AVX2 on jit:avx2 (not jit_1x1's 1x1, unit-stride or 2-D tiling its input): three channels flat,
        # O(d)hwi8o (conv_nhwc_avx2)
        tiles = set(conv[0]) == {1} or x.dim() == 4 and all(i % s == 0 for i, s in zip(x.shape[2:], conv[0]))
        flat = b == 8 and c == 3 and not (k == 1 and not any(conv[1]) and tiles)
        gw = round_up(o, b) * (c if flat else round_up(c, b) if c >= b or b == 8 else c) * k * e
        oc_g = o
    padded_bias = groups * round_up(oc_g, b) * 4 + _BOOK_PAD if bias and oc_g % b else 0
    return gw, padded_bias


def nhwc_backward(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, groups: int,
                  conv: tuple[Sequence[int], Sequence[int], Sequence[int]], mask: Sequence[bool],
                  outs: Sequence[Any], b: int, scratchpad: int = 0, data_scratchpad: int = 0) -> int:
    """Scratch of ``mkldnn_convolution_backward`` with channels-last activations.

    grad_output, the input and the weight made channels-last; backward data: grad_input (an output)
    computed in place, the weight reordered (``Bcda16b/32b``, depthwise ``Goihw16g``); backward weights:
    a blocked grad_weight and grad_bias, the scratchpad, grad_bias copied out, grad_weight copied dense and
    then to channels-last. ``scratchpad``: the weights' partial sums the caller sized (:mod:`.conv_bwd_weights`),
    live with the padded bias; ``data_scratchpad``: backward data's (:func:`unit_stride_bwd_data`, or
    ``brgconv_strided``'s), live after the weight's reorder.
    """
    c, o, c_per_g, k, e = _dims(x, weight)
    seq = [_cl_copy(grad_out), _cl_copy(x), _cl_copy(weight)]
    if mask[0]:
        if _is_depthwise(c, o, groups):
            wei = round_up(groups, b) * k * e
        elif groups > 1:
            wei = _grouped_blocked(o, c_per_g, k, groups, e, b)
        else:
            wei = o * round_up(c, io_block(c, b)) * k * e
        seq += [nbytes(x), wei, data_scratchpad, -data_scratchpad, -wei]
    if mask[1] or mask[2]:
        gw, pad = _bwd_weights(x, weight, grad_out, groups, bool(mask[2]), conv, b)
        pad += scratchpad
        gb = o * e if mask[2] else 0
        w = nbytes(weight)
        seq += [gw, pad, gb, -pad, gb, w, w, -w, -gw, -gb]
    fresh = sum(nbytes(t) for t in outs if isinstance(t, torch.Tensor))
    return max(alloc_peak(seq) - fresh, 0)
