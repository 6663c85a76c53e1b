"""Scratch of float32 convolutions through oneDNN (ideep): reorders to blocked layouts, blocked results.

Each function follows aten/src/ATen/native/mkldnn/Conv.cpp and the sequence of allocations measured with
``benchmarks/calibrate_workspace.py``; ``b`` is oneDNN's channel block (16 on AVX-512, 8 below).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from nnmem.frontends.pytorch.workspace._common import alloc_peak, nbytes, round_up
from nnmem.frontends.pytorch.workspace.conv_select import grouped_block, io_block


def _conv_dims(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> tuple[int, ...]:
    n, c = int(x.shape[0]), int(x.shape[1])
    o = int(out.shape[1])
    s_in, s_out = math.prod(int(d) for d in x.shape[2:]), math.prod(int(d) for d in out.shape[2:])
    k = math.prod(int(d) for d in weight.shape[2:])
    return n, c, o, s_in, s_out, k, x.element_size()


def _conv_weight_blocked(c: int, o: int, k: int, groups: int, e: int, b: int, small_ic: bool) -> int:
    """Bytes of the weights reordered to oneDNN's blocked layout (OIhw16i16o, Acdb16a, Goihw16g); bfloat16 weights
    of a first-layer kernel pair their input channels for VNNI (Acdb16a2b-like: an odd count padded by one)."""
    if groups == 1:
        small = round_up(c, 2) if e == 2 else c
        return round_up(o, b) * (small if small_ic else round_up(c, b)) * k * e
    if groups == c == o:  # depthwise: groups padded to the block
        return round_up(groups, b) * k * e
    return o * (c // groups) * k * e  # grouped: measured equal to the dense weights (calibrate: g4 case)


def _block(c: int, o: int, groups: int, b: int) -> int:
    """The channel block of the activations: a grouped (not depthwise) convolution's own
    (:func:`.conv_select.grouped_block`, which divides the channels), else the ISA's ``b``."""
    if groups == 1 or groups == c == o:
        return b
    return grouped_block(c // groups, o // groups, b) or b


def conv_forward(x: torch.Tensor, weight: torch.Tensor, bias: Any, out: torch.Tensor, groups: int, b: int,
                 stride: tuple[int, ...] = (1, 1), scratchpad: int | None = None) -> int:
    """Scratch of ``mkldnn_convolution`` on a float32 NC(H)W input (aten/src/ATen/native/mkldnn/Conv.cpp).

    ideep reorders the source to nChw16c (nChw8c below AVX-512: ``b`` is oneDNN's channel block, a grouped
    convolution's own block where one divides its channels; not when ``ic < b`` and the kernel is larger
    than 1x1: oneDNN's first-layer kernels read nchw directly), the weights to a blocked layout, an
    unaligned bias to a padded copy (+128 B, measured), computes into a blocked destination with channels
    padded to the block, and ``mkldnn_to_dense`` copies that into the dense output. Sequence measured:
    ``[bias, src, wei, dst, -wei, -src, -bias, out, -dst]``. The padded bias is oneDNN's scratchpad, booked
    with the rest: ``scratchpad`` (all of it, where the caller sizes it: bfloat16 1x1, :mod:`.conv_bf16_1x1`)
    takes its place.
    """
    n, c, o, s_in, s_out, k, e = _conv_dims(x, weight, out)
    # a 1x1 kernel (jit_1x1) reads a padded blocked source; a strided 3-D one runs the direct kernel (no
    # "reduce to unit stride" in 3-D), whose first convolution reads ncdhw, and so does a strided 2-D one whose
    # output does not tile the input (rtus refuses it: measured, and no rtus buffer)
    dims = x.dim() - 2  # a 1-D call's stride comes as the 2-D view's (1, s)
    ragged = k == 1 and any(int(i) != int(t) * st for i, t, st in zip(x.shape[2:], out.shape[2:], stride[-dims:]))
    small_ic = groups == 1 and c < b and (k > 1 or len(stride) == 3 and max(stride) > 1 or ragged)
    b = _block(c, o, groups, b)
    src = 0 if small_ic else n * round_up(c, b) * s_in * e
    wei = _conv_weight_blocked(c, o, k, groups, e, b, small_ic)
    bia = round_up(o, b) * e + 128 if bias is not None and o % b else 0
    dst = n * round_up(o, b) * s_out * e
    dense = nbytes(out)
    pad = 0 if ragged else _rtus_space(c, k, stride, groups, e, b, s_out)
    if scratchpad is not None:
        bia, pad = scratchpad, 0
    return alloc_peak([bia, src, wei, dst, pad, -pad, -wei, -src, -bia, dense, -dst]) - dense


def _rtus_space(c: int, k: int, stride: tuple[int, ...], groups: int, e: int, b: int, s_out: int) -> int:
    """The scratchpad of a strided 1x1 (``jit_1x1``) forward: "reduce to unit stride" gathers the source per
    thread, ``max_threads * nb_reduce * is * ic_block`` elements (``rtus_prepare_space_info``,
    cpu/x64/jit_uni_1x1_conv_utils.hpp), plus the scratchpad registry's 128-byte alignment
    (``memory_tracking::registrar_t::default_alignment``). Sized for stride 2 on 2-D (and 1-D) only, as
    measured; other strided 1x1 kernels get conv_note's note."""
    if k != 1 or groups != 1 or len(stride) != 2 or max(stride) != 2:
        return 0
    return torch.get_num_threads() * -(-c // b) * s_out * b * e + 128


def conv_backward(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias_defined: bool,
                  groups: int, mask: Sequence[bool], outs: Sequence[Any], b: int,
                  strided_nhwc: bool = False, scratchpad: int = 0, first: bool | None = None,
                  weights_block: int | None = None, data_scratchpad: int = 0,
                  data_weights: int | None = None) -> int:
    """Scratch of ``mkldnn_convolution_backward`` (aten/src/ATen/native/mkldnn/Conv.cpp), float32.

    backward_data: grad_output reordered to nChw16c (nChw8c below AVX-512), weights reordered, a blocked
    grad_input then copied dense; ``strided_nhwc`` (a strided ungrouped convolution, which oneDNN runs on
    ``brgconv_strided`` in nhwc): grad_output reordered to nhwc (unless one channel or one position makes
    it nhwc already), weights to ``Bcda16b/32b``,
    an nhwc grad_input, then copied dense through one more temporary of its size. backward_weights:
    grad_output reordered again, the source reordered (nchw kept for ic <= 3, for ic == 3 below AVX-512;
    8-channel blocks for 4 <= ic < 16 on AVX-512, where ``jit:avx2`` runs; both only above 1x1 kernels),
    blocked grad_weight, oneDNN's ``scratchpad`` (per-thread partial sums, :mod:`.conv_bwd_weights`),
    grad_bias, then both copied dense. A non-contiguous grad_output is first made contiguous. The bwd-data
    scratchpad of strided convolutions (``brgconv_strided``) is the caller's ``data_scratchpad``. ``first`` and
    ``weights_block`` override the float32 kernels' first-convolution test and channel block for the weights'
    gradient (bfloat16's ``jit_bf16``: first below 16 channels, blocks of 16, :mod:`.conv_bf16`);
    ``data_scratchpad`` is backward data's own (bfloat16 1x1's store buffer, ``brgconv_strided``'s batches and
    buffers: :mod:`.conv_brgemm_bwd`), live while it runs.
    """
    n, c, o, s_in, s_out, k, e = _conv_dims(x, weight, grad_out)
    b = _block(c, o, groups, b)
    contiguous = 0 if grad_out.is_contiguous() else nbytes(grad_out)
    seq = [contiguous]
    if mask[0] and strided_nhwc:  # brgconv_strided: nhwc grad_output and grad_input, Bcda16b/32b weights
        gy, gx = (0 if o == 1 or s_out == 1 else n * o * s_out * e), nbytes(x)  # nchw already is nhwc
        wei = (round_up(o, 2) if e == 2 else o) * round_up(c, io_block(c, b)) * k * e  # 2 B: oc in VNNI pairs
        wei = wei if data_weights is None else data_weights  # bfloat16: the blocking's ic_block (conv_bf16_transpose)
        seq += [gy, wei, gx, data_scratchpad, -data_scratchpad, -wei, -gy, gx, gx, -gx, -gx]
    elif mask[0]:
        gy = n * round_up(o, b) * s_out * e
        wei = _conv_weight_blocked(c, o, k, groups, e, b, False)
        gx_blocked = n * round_up(c, b) * s_in * e
        gx = nbytes(x)
        seq += [gy, wei, gx_blocked, data_scratchpad, -data_scratchpad, -wei, -gy, gx, -gx_blocked]
    if mask[1] or mask[2]:
        if first is None:  # jit:avx2 keeps nchw for 3 only
            first = groups == 1 and (c <= 3 if b == 16 else c == 3) and k > 1
        bc = weights_block or (8 if groups == 1 and 4 <= c < 16 and k > 1 else b)
        gy = n * round_up(o, bc) * s_out * e
        src = 0 if first else n * round_up(c, bc) * s_in * e
        if groups == 1:
            gw_blocked = round_up(o, bc) * (c if first else round_up(c, bc)) * k * e
        else:
            gw_blocked = _conv_weight_blocked(c, o, k, groups, e, b, False)
        gb = o * e if bias_defined else 0
        seq += [gy, src, gw_blocked, scratchpad, gb, -scratchpad, -src, -gy, gb, nbytes(weight), -gw_blocked, -gb]
    fresh = sum(nbytes(t) for t in outs if isinstance(t, torch.Tensor))
    return max(alloc_peak(seq) - fresh, 0)
