"""The scratchpad of oneDNN's ``brgconv_strided`` backward data (``brgemm_convolution_bwd_strided_t``), the kernel
a strided, ungrouped convolution's input gradient runs on (float32 on AVX-512 and AVX2, bfloat16 on
``avx512_core_bf16``).

Ported from oneDNN 3.12 (the version torch 2.13 bundles), src/cpu/x64/jit_brgemm_conv_bwd_utils.cpp
``init_jcp`` / ``init_conf`` / ``init_scratchpad``. Each booking is aligned to a page (``P4K``), so the
scratchpad is, per thread: a batch of ``brgemm_batch_element_t`` (40 B each) rounded to a page, the output
gradient copied with the kernel's overflow rows and columns (``odp * ohp * owp * oc``, rounded to a page of
elements), a one-byte mask per block rounded to a page; plus a page of alignment per booking; when the input
width is not a multiple of the stride, an output buffer of ``iw_block * stride_w * ic`` elements per thread
rounded to a page (sized only where the widest block fits in one page, so that ``est_eff``'s pick does not
matter). An accumulation buffer (bfloat16: ``ic_block * ceil(iw_block / stride)`` floats per thread) depends on
the blocking: those calls are not sized here. 2-D and 3-D alike. On AVX2 (``brgconv_strided:avx2``) the
blocking is ported (:mod:`.conv_strided_bwd_avx2`), so every float32 nc(d)hw call is sized, with the weights'
input channels padded to the chosen block.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from nnmem.frontends.pytorch.workspace.conv_strided_bwd_avx2 import avx2_blocking

if TYPE_CHECKING:  # conv_select imports this module for its note
    from nnmem.frontends.pytorch.workspace.conv_select import ConvCall

_P4K = 4096
_BATCH_ELEMENT = 40  # sizeof(brgemm_batch_element_t): two pointers, vvpad top and bottom, the s8s8 flag

# init_jcp's is_regression_shape: (ic, oc, ih, iw, oh, ow, kh, kw, stride) on which another kernel runs
_REGRESSION = {
    (512, 1024, 8, 8, 4, 4, 4, 4, 2), (1024, 2048, 4, 4, 2, 2, 4, 4, 2), (64, 128, 513, 513, 256, 256, 3, 3, 2),
    (32, 64, 1025, 1025, 512, 512, 3, 3, 2), (128, 256, 257, 257, 128, 128, 3, 3, 2),
    (256, 512, 49, 41, 23, 19, 5, 5, 2), (64, 128, 14, 14, 7, 7, 4, 4, 2), (1, 64, 28, 28, 14, 14, 4, 4, 2),
}


def _book(size: int) -> int:
    """``book(..., P4K)``: the size and a page of alignment (nothing for size 0)."""
    return size + _P4K if size else 0


def brgemm_batch_bytes(nthreads: int) -> int:
    """The brgemm convolution kernels' batch elements (``key_brgemm_primitive_batch``): per thread a page's worth
    (``adjusted_batch_size``: 103 elements, 4,120 B), booked page-aligned (P4K) — the whole scratchpad of a
    forward kernel that needs no buffers (measured: 4,096 + 4,120 B per thread at 1-4 threads)."""
    return _book(nthreads * -(-_P4K // _BATCH_ELEMENT) * _BATCH_ELEMENT)


def _page(value: int) -> int:
    return -(-value // _P4K) * _P4K


def _regression(call: ConvCall) -> bool:
    """The float32 shapes ``init_jcp`` sends to another kernel "due to low performance" (2-D ones only: it asks
    ``id == od == 1``, which a 3-D call with depth 1 passes too)."""
    if len(call.x_shape) == 5 and (call.x_shape[2] != 1 or call.out_sizes[0] != 1):
        return False
    (ih, iw), (kh, kw), (oh, ow) = call.x_shape[-2:], call.w_shape[-2:], call.out_sizes[-2:]
    ic, oc = call.x_shape[1], call.w_shape[0]
    if ic == 128 and oc == 256 and (ih, iw, oh, ow) == (101, 85, 49, 41):
        return True
    if ic == 3 and oc == 128 and (ih, iw, oh, ow) == (207, 175, 101, 85):
        return True
    return call.stride[-2:] == (2, 2) and kh == kw and (ic, oc, ih, iw, oh, ow, kh, kw, 2) in _REGRESSION


def _dense_strided(call: ConvCall) -> bool:
    """Whether a float32 call's input gradient runs ``brgconv_strided`` as sized here: strided, ungrouped,
    undilated, 2-D or 3-D (1-D viewed as 2-D), not a regression shape."""
    if call.groups != 1 or len(call.x_shape) not in (4, 5) or any(d != 1 for d in call.dilation):
        return False
    return call.itemsize == 4 and any(s > 1 for s in call.stride) and not _regression(call)


def _avx2(call: ConvCall, nthreads: int) -> tuple[int, int] | None:
    """``(scratchpad bytes, reordered weights' bytes)`` of ``brgconv_strided:avx2`` (``init_scratchpad`` for the
    blocking :func:`.conv_strided_bwd_avx2.avx2_blocking` picks: batch elements for ``kd_block * kh_block * kw``
    taps rounded to pages, the output gradient's copy, the block mask, an uneven width's output buffer; the
    weights in ``Ihwo{ic_block}i``, input channels padded to ``ic_block``), or None where no blocking is found."""
    b = avx2_blocking(call.x_shape, call.w_shape, call.stride, call.padding, nthreads)
    if b is None:
        return None
    taps, oc = math.prod(call.w_shape[2:]), call.w_shape[0]
    batch = -(-_page(b.kd_block * b.kh_block * b.kw * _BATCH_ELEMENT) // _BATCH_ELEMENT)  # adjusted_batch_size
    total = (_book(nthreads * batch * _BATCH_ELEMENT) + _book(nthreads * _page(b.odp * b.ohp * b.owp * oc) * 4)
             + _book(nthreads * _page(b.nb_id * b.nb_ih * b.nb_sp)))
    if b.uneven:
        total += _book(nthreads * _page(b.iw_block * b.sw * b.ic) * 4)
    return total, oc * -(-b.ic // b.ic_block) * b.ic_block * taps * 4


def strided_bwd_weights(call: ConvCall, nthreads: int, block: int) -> int | None:
    """Bytes of ``brgconv_strided``'s reordered weights where the blocking sets them (AVX2, ``block`` 8: the input
    channels padded to the chosen ``ic_block``); None elsewhere (AVX-512: :func:`.conv_select.io_block`'s)."""
    if block != 8 or not _dense_strided(call) or "channels_last" in (call.x_layout, call.w_layout):
        return None
    sized = _avx2(call, nthreads)
    return None if sized is None else sized[1]


def strided_bwd_data(call: ConvCall, nthreads: int, block: int) -> int | None:
    """Bytes of ``brgconv_strided``'s backward-data scratchpad for a strided, ungrouped, undilated float32 2-D or
    3-D call: on AVX2 (``block`` 8) for the blocking it picks (:func:`_avx2`); on AVX-512 (``block`` 16, oneDNN's
    channel block) None where it depends on the blocking (an input width that is not a multiple of the stride,
    more blocks than a page of mask bytes, a batch of more than a page). None too where another kernel runs
    (dilation, the regression shapes) or for bfloat16 (its accumulation buffer). A 3-D one copies ``odp`` output
    planes (its ``back_ovf`` reads the undilated ``kd``, as ``init_conf`` does)."""
    if block not in (8, 16) or not _dense_strided(call):
        return None
    if block == 8:  # nc(d)hw only: channels-last ones keep their notes (conv_nhwc, conv_nhwc_avx2)
        sized = None if "channels_last" in (call.x_layout, call.w_layout) else _avx2(call, nthreads)
        return None if sized is None else sized[0]
    planes, positions = 1, 1
    for i, k, o, s, pad in zip(call.x_shape[2:], call.w_shape[2:], call.out_sizes, call.stride, call.padding):
        end_pad = (o - 1) * s + k - (i + pad)  # calculate_end_padding, may be negative
        planes *= o + max(0, k - 1 - pad) // s + max(0, k - 1 - end_pad) // s  # odp, ohp, owp
        positions *= i
    iw, sw, ic = call.x_shape[-1], call.stride[-1], call.x_shape[1]
    taps = math.prod(call.w_shape[2:])
    if taps * _BATCH_ELEMENT > _P4K or positions // iw * -(-iw // sw) > _P4K:
        return None
    # an uneven width (has_uneven_iw) runs exec_trans with an output buffer of iw_block * stride_w * ic elements
    # per thread, rounded to a page: a page whatever block est_eff picks while the widest (rnd_up(iw, stride_w))
    # fits in one
    uneven = _book(nthreads * _P4K * call.itemsize) if iw % sw else 0
    if iw % sw and -(-iw // sw) * sw * sw * ic > _P4K:
        return None
    oc = call.w_shape[0]
    return (brgemm_batch_bytes(nthreads) + _book(nthreads * _page(planes * oc) * call.itemsize)
            + _book(nthreads * _P4K) + uneven)
