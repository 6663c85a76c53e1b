"""The scratchpad of oneDNN's float32 backward-weights convolutions on nc(d)hw: per-thread partial sums.

oneDNN splits the weights' gradient over threads along the batch (``nthr_mb``) and reduces the partial sums
through a scratchpad booked at primitive creation; ideep allocates it for the call. Each booking costs its
size plus its alignment (``registry_t::book``, src/common/memory_tracking.hpp: 128 B, 4 KiB for a barrier
``simple_barrier::ctx_t`` (cpu/x64/cpu_barrier.hpp) and for a ``cpu_reducer_t`` space). Ported from oneDNN
v3.x (cpu/x64): ``jit_avx512_common_1x1_conv_kernel_t::balance`` / ``init_scratchpad``,
``jit_avx512_common_conv_bwd_weights_kernel_f32_t::init_conf`` / ``balance`` / ``init_scratchpad``, the
``init_balancers`` of ``jit_avx2_convolution_bwd_weights_t`` and ``jit_avx2_1x1_convolution_bwd_weights_t``,
and ``reduce_balancer_t::balance`` (cpu_reducer.cpp). 3-D (AVX-512 only): the direct kernel's
``harness_3d_reduction`` balance over ``mb * od``, ``jit_1x1`` on the flattened ``id * ih * iw``. Which kernel
runs: :func:`bwd_weights_kernel`.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nnmem.frontends.pytorch.workspace._common import barriers, book, round_up

if TYPE_CHECKING:  # conv_select imports this module for its note
    from nnmem.frontends.pytorch.workspace.conv_select import ConvCall

_PAGE = 4096  # PAGE_4K, and alignof(simple_barrier::ctx_t) on Linux
_F32 = 4


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class ConvDims:
    """The shape of one 2-D or 3-D convolution as oneDNN's ``jcp`` reads it (channels unpadded, one group); a
    2-D one has depth 1 (``id``, ``od``, ``kd``, ``sd``) and ``three_d`` False."""

    mb: int
    ic: int
    oc: int
    ih: int
    iw: int
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    with_bias: bool
    id: int = 1
    od: int = 1
    kd: int = 1
    sd: int = 1
    three_d: bool = False


def _reduce_balance(nthr: int, job_size: int, njobs: int, reduction: int, max_buffer: int) -> tuple[int, int, int]:
    """``reduce_balancer_t::balance`` (lock-free, as every caller here asks): ``(ngroups, nthr_per_group,
    njobs_per_group_ub)``."""
    min_per_group = max(1, njobs // nthr)
    max_per_group = max(1, max_buffer // (nthr * job_size))
    ngroups = min(njobs // min_per_group, nthr)
    per_group = min(nthr // ngroups, reduction)
    ub = _div_up(njobs, ngroups)
    best = njobs * job_size * reduction
    for c_per_group in range(min_per_group, njobs):
        c_ngroups = min(njobs // c_per_group, nthr)
        c_nthr = min(nthr // c_ngroups, reduction)
        c_ub = _div_up(njobs, c_ngroups)
        if c_nthr > 1 and c_ub > max_per_group:
            continue
        cost = job_size * c_ub * (_div_up(reduction, c_nthr) + (c_nthr != 1))
        if cost < best:
            ngroups, per_group, ub, best = c_ngroups, c_nthr, c_ub, cost
    return ngroups, per_group, ub


def _reducer(nthr: int, job_size: int, njobs: int, reduction: int, max_buffer: int, two_d: bool = False) -> int:
    """``cpu_reducer_t`` (``cpu_reducer_2d_t`` when ``two_d``) ``conf_t::init_scratchpad``, in bytes."""
    ngroups, per_group, ub = _reduce_balance(nthr, job_size, njobs, reduction, max_buffer)
    if per_group == 1:
        return 0
    if two_d:
        return book(ngroups * per_group * ub * job_size * _F32) + barriers(ngroups)
    return book(ngroups * (per_group - 1) * ub * job_size * _F32, _PAGE) + barriers(ngroups)


def dw_jit_bwd_weights(x_shape: Sequence[int], w_shape: Sequence[int], stride: Sequence[int],
                       padding: Sequence[int], dilation: Sequence[int]) -> bool:
    """Whether oneDNN's depthwise backward-weights kernel takes a 2-D depthwise convolution:
    ``jit_uni_dw_conv_bwd_weights_kernel::init_conf`` (jit_uni_dw_conv_kernel_utils.cpp) wants no dilation,
    ``kw <= 3``, ``stride_w <= kw``, each padding at most half the kernel, the input at least the kernel
    high, padding above 1 a multiple of the stride. Otherwise a general kernel runs (``jit`` with the groups'
    channels padded to 16 on nhwc, ``gemm`` on nchw)."""
    if len(x_shape) != 4 or any(d != 1 for d in dilation):
        return False
    (ih, iw), (kh, kw) = x_shape[2:], w_shape[2:]
    (sh, sw), (ph, pw) = stride, padding
    oh, ow = (ih + 2 * ph - kh) // sh + 1, (iw + 2 * pw - kw) // sw + 1
    b_pad = max(0, (oh - 1) * sh + kh - (ih + ph))
    r_pad = max(0, (ow - 1) * sw + kw - (iw + pw))
    return (kw <= 3 and sw <= kw and max(ph, b_pad) <= kh // 2 and max(pw, r_pad) <= kw // 2
            and ih >= kh + (-ph % sh) and (ph <= 1 or ph % sh == 0) and (b_pad <= 1 or b_pad % sh == 0))


def as_float32(value: float) -> float:
    """``value`` rounded to a C ``float``, as oneDNN's heuristics compute."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


def best_divider(value: int, min_divider: int, max_divider: int, find_max: bool, step: int = 1) -> int:
    """``best_divider`` (cpu/x64/jit_uni_1x1_conv_utils.hpp): the divider in range that pads ``value`` least, the
    loss compared as a C ``float``."""
    max_divider = max(1, min(max_divider, value))
    min_divider = max(1, min(min_divider, max_divider))
    best, pick = float("inf"), max_divider
    for divider in range(max_divider, min_divider - 1, -step):
        padded = round_up(value, divider)
        loss = as_float32((padded - value) / padded)
        if (find_max and loss < best) or (not find_max and loss <= best):
            best, pick = loss, divider
    return pick


def _rtus(nthr: int, bcast_blocking: int, d: ConvDims, blk: int, strided: bool) -> int:
    """``rtus_prepare_space_info`` (cpu/x64/jit_uni_1x1_conv_utils.hpp): a strided 1x1 kernel gathers the
    source at unit stride, ``nb_bcast_blocking * is * ic_block`` floats per thread (``d`` is the reduced,
    unit-stride problem)."""
    return book(nthr * bcast_blocking * d.ih * d.iw * blk * _F32) if strided else 0


def avx512_1x1(d: ConvDims, nthreads: int, strided: bool = False) -> int:
    """``jit_1x1:avx512_core`` (``jit_avx512_common_1x1_convolution_bwd_weights_t``) on the unit-stride
    problem ``d``; ``strided`` adds the source gathered at unit stride."""
    blk = 16
    ic, oc, spatial = round_up(d.ic, blk), round_up(d.oc, blk), d.ih * d.iw
    reduce_block = best_divider(spatial, 7, 16, True)
    if spatial % reduce_block:
        reduce_block = best_divider(d.iw, 4, d.iw, False)
    if reduce_block > 256:
        reduce_block = 1
    nb_bcast, nb_load, nb_reduce = ic // blk, oc // blk, _div_up(spatial, reduce_block)

    def cost(n_mb: int, n_oc: int, n_ic: int) -> int:
        rows = _div_up(d.mb * nb_reduce, n_mb)
        return (rows * _div_up(nb_bcast, n_ic) * blk * reduce_block + rows * _div_up(nb_load, n_oc) * blk
                * reduce_block + 12 * _div_up(nb_load, n_oc) * _div_up(nb_bcast, n_ic) * blk * blk)

    nthr_mb = nthr_oc = nthr_ic = 1
    best = cost(1, 1, 1)
    for n_mb in range(1, min(nthreads, d.mb * nb_reduce) + 1):
        par = nthreads // n_mb
        for n_oc in range(1, min(par, nb_load) + 1):
            n_ic = min(par // n_oc, nb_bcast)
            c = cost(n_mb, n_oc, n_ic)
            if c <= best:
                best, nthr_mb, nthr_oc, nthr_ic = c, n_mb, n_oc, n_ic
    if nthreads // 2 < nthr_mb < nthreads:
        nthr_mb = min(d.mb, nthreads)
    nthr = nthr_mb * nthr_oc * nthr_ic
    total = book(oc * ic * (nthr_mb - 1) * _F32) + (barriers(1) if nthr_mb > 1 else 0)
    if d.with_bias:
        total += book(oc * _F32) if oc != d.oc else 0
        total += _reducer(nthr, blk, nb_load, d.mb, nthr * 3 * 5 * 5 * 16 * 16)
    return total + _rtus(nthr, best_divider(nb_bcast, 5, nb_bcast, False), d, blk, strided)


_MIN_OH_REDUCE = 9  # jit_avx512_common_conv_bwd_weights_kernel_f32_t::min_oh_reduce


def avx512_direct(d: ConvDims, nthreads: int, dilated: bool, nxc: bool = False) -> int:
    """``jit:avx512_core`` (``jit_avx512_common_convolution_bwd_weights_t``) on nC(d)hw16c, or on nc(d)hw for a
    first convolution of 1 to 3 channels (``ic_block = ic``); ``nxc``: on n(d)hwc activations, which never take
    the 2-D (oh) reduction harness, and whose padded bias the caller books (:mod:`.conv_nhwc`). A 3-D one takes
    ``harness_3d_reduction``: ``balance`` splits ``mb * od`` and its costs carry the depth (``id / stride_d``,
    ``od``, ``kd``)."""
    blk = 16
    first = d.ic <= 3
    ic_block = d.ic if first else blk
    ic, oc = d.ic if first else round_up(d.ic, blk), round_up(d.oc, blk)
    nb_ic, nb_oc, k = ic // ic_block, oc // blk, d.kd * d.kh * d.kw
    two_d = not dilated and not nxc and not d.three_d and d.oh > _MIN_OH_REDUCE
    ih_r, oh_r = (d.ih, d.oh) if two_d else (1, 1)
    ih_n, oh_n = (1, 1) if two_d else (d.ih, d.oh)
    nthr_oh = max(1, oh_r // _MIN_OH_REDUCE)

    def mem(n_mb: int, n_oc: int, n_ic: int) -> int:
        return (_div_up(d.mb * ih_r, n_mb) * _div_up(nb_ic, n_ic) * ic_block * ih_n * d.iw * d.id // d.sd // d.sh
                // d.sw + _div_up(d.mb * oh_r, n_mb) * _div_up(nb_oc, n_oc) * blk * oh_n * d.ow * d.od
                + 8 * _div_up(nb_oc, n_oc) * _div_up(nb_ic, n_ic) * k * ic_block * blk)

    def comp(n_mb: int, n_oc: int, n_ic: int) -> int:
        return _div_up(d.mb * oh_r, n_mb) * _div_up(nb_oc, n_oc) * _div_up(nb_ic, n_ic)

    mb_max = min(nthreads, d.mb * d.od * nthr_oh)
    splits = [(n_mb, n_oc, min(nthreads // n_mb // n_oc, nb_ic))
              for n_mb in range(1, mb_max + 1) for n_oc in range(1, min(nthreads // n_mb, nb_oc) + 1)]
    pick, best_mem = (1, 1, 1), mem(1, 1, 1)
    for s in splits:
        if mem(*s) <= best_mem:
            pick, best_mem = s, mem(*s)
    best_comp = comp(*pick)
    for s in splits:
        if (comp(*s) <= best_comp and mem(*s) < 1.1 * best_mem) or 4 * comp(*s) <= 3 * best_comp:
            pick, best_comp = s, comp(*s)
    nthr_mb = pick[0]
    if nthreads // 2 < nthr_mb < nthreads:
        nthr_mb = min(d.mb * d.od * nthr_oh, nthreads)
    nthr = nthr_mb * pick[1] * pick[2]
    total = 0
    if nthr_mb > 1:
        total += book((oc * ic * k + oc) * (nthr_mb - 1) * _F32) + barriers(1)
    if d.with_bias:
        total += book(oc * _F32) if d.oc % blk and not nxc else 0
        total += _reducer(nthr, blk, nb_oc, d.mb, nthr * 3 * 5 * 5 * 16 * 16)
    return total


def avx2_direct(d: ConvDims, nthreads: int) -> int:
    """``jit:avx2`` (``jit_avx2_convolution_bwd_weights_t``): nC(d)hw8c, or nc(d)hw for 3 channels; its reducers
    balance over all ``nthreads`` with a 2 MiB buffer heuristic, the weights' over ``mb * od``
    (``init_balancers``)."""
    blk = 8
    ic_block = d.ic if d.ic == 3 else blk
    nb_ic, nb_oc = _div_up(d.ic, ic_block), _div_up(d.oc, blk)
    total = _reducer(nthreads, d.kd * d.kh * d.kw * ic_block * blk, nb_ic * nb_oc, d.mb * d.od, 1 << 21)
    if d.with_bias:
        total += book(round_up(d.oc, blk) * _F32) if d.oc % blk else 0
        total += _reducer(nthreads, blk, nb_oc, d.mb, 1 << 21)
    return total


def _halve(blocks: int, limit: int) -> int:
    """The avx2 1x1 kernel's blocking: divide by 2 or 3 while above ``limit``."""
    while blocks > limit:
        if blocks % 2 == 0:
            blocks //= 2
        elif blocks % 3 == 0:
            blocks //= 3
        else:
            break
    return blocks


def avx2_1x1(d: ConvDims, nthreads: int, strided: bool = False) -> int:
    """``jit_1x1:avx2`` (``jit_avx2_1x1_convolution_bwd_weights_t``) on the unit-stride problem ``d``: a 2-D
    weights reducer over ``mb * oh * ow`` and a bias reducer, both over all ``nthreads``; ``strided`` adds
    the source gathered at unit stride."""
    blk = 8
    nb_ic, nb_oc = _div_up(d.ic, blk), _div_up(d.oc, blk)
    ic_blocking, oc_blocking = _halve(nb_ic, 9), _halve(nb_oc, 32)
    job = oc_blocking * ic_blocking * blk * blk
    max_buffer = nthreads * job * 8
    njobs = _div_up(nb_oc, oc_blocking) * _div_up(nb_ic, ic_blocking)
    total = _reducer(nthreads, job, njobs, d.mb * d.oh * d.ow, max_buffer, two_d=True)
    if d.with_bias:
        total += book(nb_oc * blk * _F32) if d.oc % blk else 0
        total += _reducer(nthreads, blk, nb_oc, d.mb, max_buffer)
    return total + _rtus(nthreads, ic_blocking, d, blk, strided)


def depthwise(d: ConvDims, nthreads: int, block: int) -> int:
    """``jit_uni_dw`` on nChw16c / nChw8c (``harness_mb_reduction``): threads go to channel blocks first,
    the rest split the batch and reduce weights and bias through per-thread buffers
    (``jit_uni_dw_conv_bwd_weights_kernel_t::balance`` / ``init_scratchpad``, jit_uni_dw_conv_kernel_utils.cpp)."""
    groups = round_up(d.ic, block)
    nthr_g = min(groups // block, nthreads)
    nthr_mb = min(max(1, nthreads // nthr_g), d.mb)
    if nthr_mb == 1:
        return 0
    total = book(groups * d.kh * d.kw * (nthr_mb - 1) * _F32)
    return total + (book(groups * (nthr_mb - 1) * _F32) if d.with_bias else 0)


def bwd_weights_kernel(call: ConvCall, block: int, nxc: bool = False) -> str | None:
    """Which float32 nchw backward-weights kernel oneDNN runs for an ungrouped or depthwise 2-D convolution, or an
    ungrouped 3-D one on AVX-512, as ``ONEDNN_VERBOSE`` names it ("jit_dw" for ``jit_uni_dw``); None where no port
    here sizes it (a strided 1x1 kernel whose output does not tile the input, which "reduce to unit stride"
    refuses; ``kw > 14``, which the direct kernels refuse; a depthwise one outside ``jit_uni_dw``; other groups;
    in 3-D: a dilation, a padding the direct kernels refuse (4 to 15 channels on ncdhw run ``jit:avx2``, which
    takes no depth padding), a 3-D one below AVX-512, all of which run ``gemm``: :mod:`.conv_gemm`)."""
    three_d = len(call.x_shape) == 5
    if len(call.x_shape) != 4 and not three_d:
        return None
    if 1 < call.groups == call.x_shape[1] == call.w_shape[0]:  # one group of one channel: a dense one
        return "jit_dw" if dw_jit_bwd_weights(call.x_shape, call.w_shape, call.stride, call.padding,
                                              call.dilation) else None
    if call.groups != 1 or three_d and nxc and block != 16:
        return None
    kw = call.w_shape[-1]
    one_by_one = all(k == 1 for k in call.w_shape[2:]) and not any(call.padding)
    if one_by_one and three_d and all(s == 1 for s in call.stride):
        return "jit_1x1:avx512_core" if block == 16 else "jit_1x1:avx2"
    if three_d and block != 16:  # below AVX-512 jit:avx2 throughout, where it takes the depth, else gemm
        return None if kw > 14 or _avx2_3d_refuses(call) or _direct_refuses(call, False) else "jit:avx2"
    if one_by_one and not three_d and not all(i % s == 0 for i, s in zip(call.x_shape[2:], call.stride)):
        return None if block == 16 or _direct_refuses(call, False) else "jit:avx2"  # avx2: the direct kernel
    if one_by_one and not three_d:
        return "jit_1x1:avx512_core" if block == 16 else "jit_1x1:avx2"
    if kw > 14:
        return None
    # the avx512 direct kernel takes a first convolution only on 1 to 3 channels on nchw (is_1stconv / src_ok),
    # any on nhwc; a 3-D one of 4 to 15 channels runs jit:avx2 (nCdhw8c) where that kernel takes it, else gemm
    first_refused = 4 <= call.x_shape[1] < 16 and not nxc
    if three_d and not first_refused:
        return None if _direct_refuses(call, True) else "jit:avx512_core"
    if three_d:
        return None if nxc or _avx2_3d_refuses(call) or _direct_refuses(call, False) else "jit:avx2"
    kernel = "jit:avx512_core" if block == 16 and not first_refused else "jit:avx2"
    return None if _direct_refuses(call, kernel == "jit:avx512_core") else kernel


def _end_pad(call: ConvCall, dim: int) -> tuple[int, int, int]:
    """``(input, extended kernel, end padding at least 0)`` of spatial ``dim`` (``calculate_end_padding``)."""
    dim %= len(call.out_sizes)
    i, k, o = call.x_shape[2 + dim], call.w_shape[2 + dim], call.out_sizes[dim]
    ext = (k - 1) * call.dilation[dim] + 1
    return i, ext, max(0, (o - 1) * call.stride[dim] + ext - (i + call.padding[dim]))


def _direct_refuses(call: ConvCall, avx512: bool) -> bool:
    """Whether the direct kernel's ``init_conf`` refuses the call (oneDNN then runs ``gemm``): the avx512 one
    (jit_avx512_common_conv_kernel.cpp) a dilated height with a stride, a dilated kernel taller than the input, a
    left or right padding not below the dilated kernel's width or above 28, a top or bottom one above half its
    height; in 3-D any dilation of the depth, a front or back padding not below the kernel's depth, a front
    padding with a kernel as deep as the padded input; the avx2 one (jit_avx2_conv_kernel_f32.cpp) any
    dilation, a padding not below the kernel, a kernel taller than the input."""
    (ih, ext_kh, b_pad), (_, ext_kw, r_pad) = _end_pad(call, -2), _end_pad(call, -1)
    kh = call.w_shape[-2]
    (sh, _), (t_pad, l_pad), (dh, dw) = call.stride[-2:], call.padding[-2:], call.dilation[-2:]
    if len(call.x_shape) == 5:
        i_d, ext_kd, back_pad = _end_pad(call, 0)
        f_pad, kd = call.padding[0], call.w_shape[2]
        if call.dilation[0] > 1 or not (f_pad < ext_kd and back_pad < ext_kd) or (f_pad > 0 and kd >= i_d + f_pad):
            return True
    if avx512:
        return ((dh > 1 and (sh != 1 or ext_kh > ih)) or not (l_pad < ext_kw and r_pad < ext_kw)
                or max(t_pad, b_pad) > ext_kh // 2 or max(l_pad, r_pad) > 28)
    return (dh > 1 or dw > 1 or not (t_pad < ext_kh and b_pad < ext_kh and l_pad < ext_kw and r_pad < ext_kw)
            or kh > ih or t_pad >= kh)


def avx2_bwd_data_refuses(call: ConvCall) -> bool:
    """Whether ``jit_avx2_conv_bwd_data_kernel_f32_t::init_conf`` (jit_avx2_conv_kernel_f32.cpp) refuses an nc(d)hw
    input gradient (dense, or groups of 8-channel blocks), which then runs on gemm: a dilation with a stride,
    unequal height and width strides or a depth stride (a 1-D one: any stride), a strided kernel wider than 3 on
    fewer than 8 channels, a kernel outside the source, or no width unroll (at most 15 registers:
    ``ur_w * nb_ic_blocking + ur_w / stride``, a multiple of the stride) that covers the left overflow (the dilated
    kernel past the left padding), or a right overflow past the unroll's tail."""
    strides = (1,) * (3 - len(call.stride)) + tuple(call.stride)  # (depth, height, width), 1-D and 2-D padded
    dilations = (1,) * (3 - len(call.dilation)) + tuple(call.dilation)
    (sd, sh, sw), ic = strides, call.x_shape[1] // call.groups
    if any(d > 1 and st != 1 for d, st in zip(dilations, strides)) or sw != sh or sd != 1:
        return True
    iw, kw, l_pad = call.x_shape[-1], call.w_shape[-1], call.padding[-1]
    if ic < 8 and kw > 3 and sw > 1 or call.kernel_outside():
        return True
    ext_kw = (kw - 1) * dilations[-1] + 1
    r_pad = (call.out_sizes[-1] - 1) * sw + ext_kw - (iw + l_pad)
    l_overflow = max(0, (ext_kw - 1 - l_pad) // sw)
    nb_ic = _div_up(ic, 8)
    best, ur_w = 0, 1
    for b in range(1, 5):
        if nb_ic % b:
            continue
        u = sw
        while u * b + u // sw <= 15 and u < iw + sw:
            ur = min(u, iw)
            nfmas = _div_up(ur, sw) * b
            if not (l_overflow * sw > ur and ur != iw) and (nfmas > best or nfmas == best and ur_w < ur):
                ur_w, best = ur, nfmas
            u += sw
    if best == 0:
        return True
    tail = iw % ur_w
    r_overflow = max(0, int((ext_kw - 1 - r_pad - tail) / sw))  # C division: truncated towards zero
    return r_overflow * sw > ur_w or iw > ur_w and (ur_w % sw != 0 or r_pad + tail < 0)


def _avx2_3d_refuses(call: ConvCall) -> bool:
    """The depth checks of ``jit_avx2_conv_bwd_weights_kernel_f32_t::init_conf`` (jit_avx2_conv_kernel_f32.cpp):
    no front or back padding (``boundaries_ok``), a kernel no deeper than the input."""
    i_d, _, back_pad = _end_pad(call, 0)
    return call.padding[0] != 0 or back_pad != 0 or call.w_shape[2] > i_d


def _dims(call: ConvCall, with_bias: bool) -> ConvDims:
    """The call's :class:`ConvDims`, a 2-D one with depth 1."""
    n, c, *ins = call.x_shape
    o, _, *ks = call.w_shape
    outs, strides = list(call.out_sizes), list(call.stride)
    if len(ins) == 2:
        ins, ks, outs, strides = [1, *ins], [1, *ks], [1, *outs], [1, *strides]
    return ConvDims(n, c, o, ins[1], ins[2], outs[1], outs[2], ks[1], ks[2], strides[1], strides[2], with_bias,
                    ins[0], outs[0], ks[0], strides[0], len(call.x_shape) == 5)


def bwd_weights_scratch(call: ConvCall, with_bias: bool, block: int, nthreads: int, nxc: bool = False) -> int | None:
    """Bytes of the backward-weights scratchpad ideep allocates for this call, None where not modelled.

    Args:
        call: the convolution (float32, nc(d)hw, ungrouped or depthwise).
        with_bias: whether the bias gradient is computed in the same primitive.
        block: oneDNN's channel block on this CPU (16 on AVX-512, 8 below).
        nthreads: ``dnnl_get_max_threads()``, i.e. ``torch.get_num_threads()``.
        nxc: n(d)hwc activations (sized for the direct AVX-512 kernel only).
    """
    kernel = bwd_weights_kernel(call, block, nxc)
    if kernel is None:
        return None
    d = _dims(call, with_bias)
    strided = d.sh != 1 or d.sw != 1
    # rtus_prepare's unit-stride problem; a 3-D 1x1 one (unit stride only) flattens its depth into the height,
    # as jcp.is = id * ih * iw does
    unit = ConvDims(d.mb, d.ic, d.oc, d.od * d.oh, d.ow, d.od * d.oh, d.ow, 1, 1, 1, 1, with_bias)
    if kernel == "jit_1x1:avx512_core":
        return avx512_1x1(unit, nthreads, strided)
    if kernel == "jit_1x1:avx2":
        return avx2_1x1(unit, nthreads, strided)
    if kernel == "jit_dw":
        return depthwise(d, nthreads, block)
    if kernel == "jit:avx512_core":
        return avx512_direct(d, nthreads, dilated=call.dilation[-2] != 1, nxc=nxc)
    return avx2_direct(d, nthreads)
