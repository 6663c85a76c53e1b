"""Which kernel ATen runs a CPU convolution on, and the note when no rule models that kernel's scratch.

:func:`conv_call` reads a convolution's arguments into a :class:`ConvCall`; :func:`conv_backend` follows the
CPU branch of ATen's ``_select_conv_backend`` (aten/src/ATen/native/Convolution.cpp), keyed on oneDNN's
effective ISA (:mod:`nnmem.cpu`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from nnmem.cpu import CpuInfo
from nnmem.frontends.pytorch.workspace._common import NOT_MODELLED, dtype_name, round_up
from nnmem.frontends.pytorch.workspace.conv_3d import (
    ncdhw_3d_why,
    ndhwc_note,
    onednn_3d_backward,
    onednn_3d_forward,
)
from nnmem.frontends.pytorch.workspace.conv_bf16 import (
    bf16_1x1_modelled,
    bf16_backward_modelled,
    bf16_depthwise_modelled,
)
from nnmem.frontends.pytorch.workspace.conv_bf16_3d import bf16_3d_claims
from nnmem.frontends.pytorch.workspace.conv_bf16_amx import forward_scratch as amx_forward_scratch
from nnmem.frontends.pytorch.workspace.conv_bf16_amx_bwd import amx_backward_claims
from nnmem.frontends.pytorch.workspace.conv_bf16_brgemm import brgemm_forward as bf16_brgemm_forward
from nnmem.frontends.pytorch.workspace.conv_bf16_more import bf16_more_claims
from nnmem.frontends.pytorch.workspace.conv_bf16_transpose import (
    bf16_strided_backward_claims,
    bf16_transpose_claims,
)
from nnmem.frontends.pytorch.workspace.conv_brgemm_bwd import strided_bwd_data
from nnmem.frontends.pytorch.workspace.conv_bwd_weights import (
    _direct_refuses,
    avx2_bwd_data_refuses,
    bwd_weights_kernel,
    dw_jit_bwd_weights,
)
from nnmem.frontends.pytorch.workspace.conv_gemm import dw_forward_refuses, gemm_sized, grouped_brgconv_strided
from nnmem.frontends.pytorch.workspace.conv_gemm_bf16 import gemm_bf16_claims, inner_product_takes, jit_1x1_takes
from nnmem.frontends.pytorch.workspace.conv_grouped_strided_bwd import grouped_strided_claims
from nnmem.frontends.pytorch.workspace.conv_nhwc_avx2 import ndhwc_avx2_note
from nnmem.frontends.pytorch.workspace.conv_nhwc_avx2 import weights_kernel as ndhwc_weights_kernel
from nnmem.frontends.pytorch.workspace.conv_transpose import transpose_note
from nnmem.frontends.pytorch.workspace.matmul import AMX_ISA, MODELLED_ISA, MODELLED_THREADS


@dataclass(frozen=True, slots=True)
class ConvCall:
    """One convolution as ATen's ``_convolution`` sees it: a 1-D one as 2-D with height 1 (``view1d_as_2d``).

    Only shapes, dtypes and layouts: a rule never runs a tensor op. ``layout`` of a tensor is
    "contiguous", "channels_last" or "strided". ``backward`` marks a ``convolution_backward`` call,
    ``grad_input`` one that computes the input's gradient.
    """

    x_shape: tuple[int, ...]
    w_shape: tuple[int, ...]
    dtype: torch.dtype
    itemsize: int
    x_layout: str
    w_layout: str
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    transposed: bool
    output_padding: tuple[int, ...]
    groups: int
    one_d: bool
    backward: bool = False
    grad_input: bool = False

    @property
    def out_sizes(self) -> tuple[int, ...]:
        """Spatial sizes of a direct (not transposed) convolution's output."""
        return tuple((x + 2 * p - d * (k - 1) - 1) // s + 1 for x, p, d, k, s in
                     zip(self.x_shape[2:], self.padding, self.dilation, self.w_shape[2:], self.stride))

    @property
    def extents(self) -> tuple[int, int, int, int]:
        """``(ext_kh, ext_kw, b_pad, r_pad)`` of a 2-D call as oneDNN's ``init_conf`` computes them: the dilated
        kernel's height and width (``calculate_extended_filter_size``) and the bottom and right paddings
        (``calculate_end_padding``, negative where the kernel stops short of the input's end)."""
        (ih, iw), (kh, kw), (oh, ow) = self.x_shape[2:], self.w_shape[2:], self.out_sizes
        (sh, sw), (t_pad, l_pad), (dh, dw) = self.stride, self.padding, self.dilation
        ext_kh, ext_kw = (kh - 1) * dh + 1, (kw - 1) * dw + 1
        return ext_kh, ext_kw, (oh - 1) * sh + ext_kh - (ih + t_pad), (ow - 1) * sw + ext_kw - (iw + l_pad)

    def kernel_outside(self) -> bool:
        """``kernel_outside_src`` of oneDNN's jit convolutions' ``init_conf`` (any rank): a start or end padding
        (``calculate_end_padding``) as wide as the dilated kernel (``calculate_extended_filter_size``)."""
        for i, k, o, s, pad, dil in zip(self.x_shape[2:], self.w_shape[2:], self.out_sizes, self.stride,
                                        self.padding, self.dilation):
            ext = (k - 1) * dil + 1
            if ext <= pad or ext <= (o - 1) * s + ext - (i + pad):
                return True
        return False

    def r_pad_no_tail(self, ur_w: int) -> int:
        """The right padding of the columns before the width unroll's tail (forward kernels' ``init_conf``)."""
        ow, iw, sw, l_pad = self.out_sizes[-1], self.x_shape[-1], self.stride[-1], self.padding[-1]
        ext_kw = (self.w_shape[-1] - 1) * self.dilation[-1] + 1  # any rank: the width is the last dimension
        return max(0, (ow - ow % ur_w - 1) * sw + ext_kw - (iw + l_pad))

    @property
    def x_bytes(self) -> int:
        return math.prod(self.x_shape) * self.itemsize

    @property
    def w_bytes(self) -> int:
        return math.prod(self.w_shape) * self.itemsize


def tensor_layout(t: torch.Tensor) -> str:
    """A tensor's layout: "contiguous", "channels_last" (4-D ``channels_last`` or 5-D ``channels_last_3d``) or
    "strided"."""
    if t.is_contiguous():
        return "contiguous"
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return "channels_last"
    if t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d):
        return "channels_last"
    return "strided"


def _strides_like(sizes: tuple[int, ...], strides: tuple[int, ...], order: tuple[int, ...]) -> bool:
    """c10's ``is_channels_last_strides_*`` (c10/core/MemoryFormat.h) over the dimensions in ``order``."""
    if strides[1] == 0:
        return False
    low = 0
    for d in order:
        if sizes[d] == 0 or strides[d] < low:
            return False
        if d == 0 and low == strides[1]:
            return False
        low = strides[d] * (sizes[d] if sizes[d] > 1 else 1)
    return True


def strides_like_channels_last(sizes: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """c10's ``is_channels_last_strides_2d_s4`` (c10/core/MemoryFormat.h), behind ``suggest_memory_format``:
    whether 4-D strides read as channels-last (ambiguous N111-like strides fall back to contiguous)."""
    return _strides_like(sizes, strides, (1, 3, 2, 0))


def _expand(value: Any, dims: int, default: int) -> tuple[int, ...]:
    if value is None:
        return (default,) * dims
    values = [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]
    return tuple(values * dims if len(values) == 1 else values)


def conv_call(x: torch.Tensor, weight: torch.Tensor, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
              transposed: bool = False, output_padding: Any = 0, groups: int = 1) -> ConvCall | None:
    """Normalise a convolution's arguments; None where a rule cannot read them (string padding, odd ranks)."""
    if isinstance(padding, str) or x.dim() not in (3, 4, 5) or weight.dim() != x.dim():
        return None
    dims = x.dim() - 2
    stride, padding = _expand(stride, dims, 1), _expand(padding, dims, 0)
    dilation, output_padding = _expand(dilation, dims, 1), _expand(output_padding, dims, 0)
    x_shape, w_shape = tuple(int(d) for d in x.shape), tuple(int(d) for d in weight.shape)
    x_layout, w_layout = tensor_layout(x), tensor_layout(weight)
    strides = tuple(int(v) for v in x.stride())
    if dims == 1:  # Convolution.cpp _convolution: input.contiguous(), view1d_as_2d(), view4d()
        x_shape, w_shape = (*x_shape[:2], 1, x_shape[2]), (*w_shape[:2], 1, w_shape[2])
        strides = (strides[0], strides[1], x_shape[3] * strides[2], strides[2])  # unsqueeze(2)'s strides
        stride, padding, dilation = (1, *stride), (0, *padding), (1, *dilation)
        output_padding = (0, *output_padding)
        w_layout = "contiguous" if w_layout == "contiguous" else "strided"
    if dims in (1, 2) and x_layout == "contiguous" and strides_like_channels_last(x_shape, strides):
        # contiguous and channels-last at once (one channel: a transposed (N, L, 1) or (N, H, W, 1)): ATen's
        # suggest_memory_format of the 4-D view says channels-last, and oneDNN runs it nhwc (ONEDNN_VERBOSE)
        x_layout = "channels_last"
    if dims == 2 and w_layout == "contiguous" and strides_like_channels_last(w_shape, tuple(
            int(v) for v in weight.stride())):  # a depthwise or 1x1 weight of a model moved to channels_last
        w_layout = "channels_last"
    if dims == 3:  # the same for 3-D, input or weight (c10's is_channels_last_strides_3d_s5): ndhwc kernels run
        w_strides, order = tuple(int(v) for v in weight.stride()), (1, 4, 3, 2, 0)
        x_layout = "channels_last" if x_layout == "contiguous" and _strides_like(x_shape, strides, order) \
            else x_layout
        w_layout = "channels_last" if w_layout == "contiguous" and _strides_like(w_shape, w_strides, order) \
            else w_layout
    return ConvCall(x_shape, w_shape, x.dtype, x.element_size(), x_layout, w_layout, stride, padding, dilation,
                    bool(transposed), output_padding, int(groups), dims == 1)


def bf16_forward_modelled(call: ConvCall, info: CpuInfo) -> bool:
    """Whether a bfloat16 convolution's scratch is the float32 forward's sequence with 2-byte elements
    (:func:`.conv_onednn.conv_forward`: blocked source and weights, blocked destination, its dense copy), as
    measured on oneDNN's ``avx512_core_bf16`` kernels at 1-4 threads: a dense (one group) NCHW forward in 1-D or
    2-D that ``jit_bf16_1x1`` refuses (:func:`.conv_gemm_bf16.jit_1x1_takes`; a strided 1x1 whose output does not
    tile the input runs ``jit_bf16``) nor ``ip_convolution`` (:func:`.conv_gemm_bf16.inner_product_takes`), and a
    padding ``jit_bf16`` takes (:func:`_jit_bf16_forward_pads`). Other bfloat16 convolutions (1x1 and depthwise:
    their own rules; grouped, channels-last, 3-D, transposed) measured otherwise and keep their note or another
    rule."""
    if call.dtype != torch.bfloat16 or call.backward or call.transposed or call.groups != 1:
        return False
    if len(call.x_shape) != 4 or call.x_layout != "contiguous" or info.isa != MODELLED_ISA:
        return False
    if torch.get_num_threads() not in MODELLED_THREADS:
        return False
    return not jit_1x1_takes(call) and not inner_product_takes(call) and _jit_bf16_forward_pads(call)


def bf16_amx_forward(call: ConvCall, info: CpuInfo) -> int | None:
    """Scratch bytes of a bfloat16 forward on oneDNN's ``brg_conv_fwd`` / ``brgconv_1x1:avx512_core_amx``
    (:func:`.conv_bf16_amx.forward_scratch`), or None where no rule sizes it: dense or grouped (not depthwise),
    1-D, 2-D (NCHW or channels-last) or 3-D (NCDHW), on ``avx512_core_amx`` at 1-4 threads, a shape the port
    follows (``exec_trans`` with output-space blocking, or an unpadded 1x1)."""
    if call.dtype != torch.bfloat16 or call.backward or call.transposed:
        return None
    if len(call.x_shape) not in (4, 5) or "strided" in (call.x_layout, call.w_layout):
        return None
    if info.isa != AMX_ISA or torch.get_num_threads() not in MODELLED_THREADS:
        return None
    if math.prod(call.x_shape[2:]) == 1:  # one position: nchw is nhwc
        return None
    if call.one_d and onednn_nhwc(call):
        return None
    if not call.one_d and call.x_shape[1] == 1 and not onednn_nhwc(call):
        return None  # one channel in: input and weight read as contiguous either way; ATen goes nhwc on strides
    copies = _amx_nhwc_copies(call) if onednn_nhwc(call) else None
    return amx_forward_scratch(call.x_shape, call.w_shape, call.stride, call.padding, torch.get_num_threads(),
                               call.dilation, copies, call.groups)


def _amx_nhwc_copies(call: ConvCall) -> int:
    """Bytes of ATen's ``contiguous(channels_last)`` copies before a channels-last oneDNN convolution: the input
    and the weight unless already laid out so (one channel, or a 1x1 weight, reads the same either way)."""
    x_copy = call.x_layout == "contiguous" and call.x_shape[1] > 1
    w_copy = call.w_layout == "contiguous" and call.w_shape[1] > 1 and math.prod(call.w_shape[2:]) > 1
    return (call.x_bytes if x_copy else 0) + (call.w_bytes if w_copy else 0)


def _jit_bf16_forward_pads(call: ConvCall) -> bool:
    """``jit_avx512_core_bf16_fwd_kernel_t::init_conf``'s padding checks (else oneDNN runs another kernel): the
    dilated kernel overlaps the source on every side, and neither the left padding nor the right one outside the
    width's tail passes the width unroll ``ur_w = 31 // (nb_oc_blocking + 1)``, the output-channel blocking the
    first loop settles on."""
    if call.kernel_outside():
        return False
    ow, l_pad = call.out_sizes[-1], call.padding[-1]
    nb_oc = -(-call.w_shape[0] // 16)
    blocking = min(4, nb_oc)
    while blocking > 1:
        ur = 31 // (blocking + 1)
        if nb_oc % blocking == 0 and l_pad <= ur and (ow == 1 or ow % ur != 1):
            break
        blocking -= 1
    ur_w = min(31 // (blocking + 1), ow)
    return l_pad <= ur_w and call.r_pad_no_tail(ur_w) <= ur_w


def copied_input(call: ConvCall, backend: str) -> tuple[int, ConvCall]:
    """``(bytes, call)``: ATen's ``mkldnn_convolution(_backward)`` makes a strided (neither contiguous nor
    channels-last) float32 2-D input ``contiguous()`` first, a copy live through the op (measured, forward and
    backward), and runs the contiguous kernels; ``(0, call)`` for any other call."""
    if (backend != "mkldnn" or call.x_layout != "strided" or call.one_d or call.transposed
            or call.dtype != torch.float32 or len(call.x_shape) != 4):
        return 0, call
    return call.x_bytes, dataclasses.replace(call, x_layout="contiguous")


def conv_backend(call: ConvCall, info: CpuInfo) -> str:
    """The CPU branch of ATen's ``_select_conv_backend`` (aten/src/ATen/native/Convolution.cpp).

    ``ConvParams::use_mkldnn``: bfloat16 and float16 go to oneDNN only where ideep reports the type supported
    (``mkldnn_bf16_device_check`` / ``mkldnn_fp16_device_check`` in mkldnn/Utils.h, i.e. oneDNN's effective
    ISA); float32 goes unless its heuristic prefers the native kernels (batch 1 and small kernels). Otherwise
    the native kernels: ``thnn_conv2d`` (ConvolutionMM2d.cpp), the dilated, transposed and 3-D ones, NNPACK.

    Returns:
        "mkldnn", "mkldnn_transpose", "slow2d", "slow_dilated2d", "slow_transpose2d", "slow3d",
        "slow_dilated3d", "slow_transpose3d" or "nnpack".
    """
    dilated = any(d != 1 for d in call.dilation)
    if _use_mkldnn(call, info, dilated):
        return "mkldnn_transpose" if call.transposed else "mkldnn"
    dim = "3d" if len(call.x_shape) == 5 else "2d"
    if call.transposed:
        return f"slow_transpose{dim}"
    if dilated:
        return f"slow_dilated{dim}"
    return "nnpack" if dim == "2d" and _use_nnpack(call) else f"slow{dim}"


def _use_mkldnn(call: ConvCall, info: CpuInfo, dilated: bool) -> bool:
    """``ConvParams::use_mkldnn`` for a dense CPU tensor."""
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return False
    if call.transposed and any(p >= s for p, s in zip(call.output_padding, call.stride)):
        return False
    if call.dtype == torch.bfloat16:
        return info.onednn_bf16
    if call.dtype == torch.float16:
        return info.onednn_fp16
    if call.dtype != torch.float32:
        return False
    n, c, h, w = call.x_shape[:4]
    kh, kw = call.w_shape[-2], call.w_shape[-1]
    strided = any(s != 1 for s in call.stride)
    # "For 1x1 filters, MKLDNN is faster than THNN when multi-threaded"; "for some case, native is faster"
    return ((strided or dilated or n >= 16 or kw != 1 or kh != 1 or torch.get_num_threads() > 1)
            and (call.groups > 1 or (kw > 3 and kh > 3) or n > 1 or n * c * h * w > 20480))


def _use_nnpack(call: ConvCall) -> bool:
    """``ConvParams::use_nnpack`` (reached only when oneDNN declined a float32 convolution)."""
    kh, kw = call.w_shape[2], call.w_shape[3]
    return bool(torch.backends.nnpack.is_available() and torch._C._get_nnpack_enabled()
                and call.dtype == torch.float32 and kh < 17 and kw < 17 and call.padding[0] < kh
                and call.padding[1] < kw and call.x_shape[0] >= 16)


def grouped_block(c_per_g: int, o_per_g: int, b: int) -> int | None:
    """The channel block oneDNN's ``jit`` kernels give a grouped (not depthwise) convolution on nchw: the
    largest of 16, 8, 4 (at most the ISA's block ``b``) dividing both per-group channel counts (layouts
    ``aBcd16b/8b/4b`` in ``ONEDNN_VERBOSE``); None when none does, and oneDNN runs its ``gemm`` kernel."""
    return next((bg for bg in (16, 8, 4) if bg <= b and c_per_g % bg == 0 and o_per_g % bg == 0), None)


def _nhwc_gemm_bwd_weights(call: ConvCall, info: CpuInfo) -> bool:
    """Whether a channels-last convolution's weight gradient runs on oneDNN's gemm kernel: below AVX-512
    the ``jit`` one (``jit_avx2_conv_bwd_weights_kernel_f32::init_conf``) refuses dilation, ``kw >= 14``,
    a kernel higher than the input or a top padding of the kernel's height."""
    if info.onednn_block >= 16:
        return False
    depthwise = call.groups == call.x_shape[1] == call.w_shape[0]
    if depthwise and dw_jit_bwd_weights(call.x_shape, call.w_shape, call.stride, call.padding, call.dilation):
        return False
    kh, kw = call.w_shape[2], call.w_shape[3]
    return (any(d != 1 for d in call.dilation) or kw >= 14 or kh > call.x_shape[2]
            or call.padding[0] >= kh)


def onednn_gemm(call: ConvCall, info: CpuInfo) -> tuple[bool, bool]:
    """``(forward or backward data, backward weights)``: whether oneDNN runs this float32 convolution on its
    ``gemm`` kernel (per-thread im2col buffers, :mod:`.conv_gemm`). On nchw, a grouped one without a channel
    block (below AVX-512, without a block of 8), or with a kernel outside the source (``kernel_outside_src``,
    every jit kernel refuses it), does throughout; one with a block of 4 and a depthwise one outside the
    depthwise kernel do for the weights' gradient (the ``jit`` backward-weights kernels take blocks of 8 and
    16); a 2-D depthwise one does for a forward ``jit_uni_dw`` refuses and for a dilated input gradient. A dense
    one runs its weights' gradient on gemm where :func:`.bwd_weights_kernel` names no kernel; below AVX-512 a
    dense or 8-channel-group one runs each pass ``jit:avx2`` refuses on gemm (:func:`_avx2_forward_refuses`,
    :func:`.avx2_bwd_data_refuses`, the weights' kernel's paddings and widths). On nhwc, a grouped backward with
    a kernel outside the source (measured), else :func:`_nhwc_gemm_bwd_weights`."""
    c, o, g = call.x_shape[1], call.w_shape[0], call.groups
    if onednn_nhwc(call):
        if g > 1 and call.backward and call.kernel_outside():  # measured: both passes on gemm (nhwc: not sized)
            return True, True
        if info.onednn_block == 8 and not g == c == o:  # conv_nhwc_avx2 (2-D and 3-D)
            return False, call.backward and ndhwc_weights_kernel(call) is None
        one_by_one = math.prod(call.w_shape[2:]) == 1 and not any(call.padding)  # jit_1x1 (dilation moot)
        return False, not one_by_one and _nhwc_gemm_bwd_weights(call, info)
    if g == 1:  # a dense ncdhw weights' gradient the direct kernels refuse (bwd_weights_kernel): gemm
        avx2, unit = info.onednn_block == 8, all(st == 1 for st in call.stride)
        data = avx2 and (call.grad_input and unit and avx2_bwd_data_refuses(call) if call.backward
                         else _avx2_forward_refuses(call))
        return data, (call.backward
                       and bwd_weights_kernel(call, info.onednn_block) is None)
    if g == c == o:
        weights = not dw_jit_bwd_weights(call.x_shape, call.w_shape, call.stride, call.padding, call.dilation)
        if len(call.x_shape) != 4:
            return False, weights
        if call.backward:  # jit_uni_dw's backward data takes no dilation
            return any(d != 1 for d in call.dilation), weights
        return dw_forward_refuses(call, 6 if info.onednn_block == 16 else 4), weights
    if call.kernel_outside():
        return True, True
    block = grouped_block(c // g, o // g, info.onednn_block)
    data = block is None or block == 4 and info.onednn_block < 16  # jit_avx2 takes blocks of 8 only
    # 3-D: a padding the AVX-512 direct kernel refuses sends a 16-channel-block weights' gradient to gemm (measured;
    # 2-D ones measured otherwise: not followed)
    refused = (call.backward and len(call.x_shape) == 5 and block == 16 and info.onednn_block == 16
               and _direct_refuses(call, True))
    if block == 8 and info.onednn_block == 8:  # shapes jit:avx2 refuses run gemm (measured)
        if not call.backward:
            return data or _avx2_forward_refuses(call), False  # e.g. a 1-D kernel of 8 padded by 4
        data = data or call.grad_input and avx2_bwd_data_refuses(call) and not (
            any(st > 1 for st in call.stride) and grouped_brgconv_strided(call))
        refused = call.w_shape[-1] > 14 or _direct_refuses(call, False)
    return data, block is None or block == 4 or refused


def _avx2_flat(call: ConvCall) -> bool:
    """Whether a grouped nchw forward without a channel block may run on ``jit:avx2`` with a flat source instead
    of gemm (``jit_avx2_conv_fwd_kernel_f32::init_conf``: output channels a group a multiple of 8, a kernel
    inside the source; measured for 1-3 input channels a group on AVX2 and AVX-512, 4-7 ran gemm). Not sized:
    the width checks that send some of these to gemm are not followed."""
    c, o, g = call.x_shape[1], call.w_shape[0], call.groups
    if call.backward or onednn_nhwc(call) or g == 1 or g == c == o or (o // g) % 8 or call.kernel_outside():
        return False
    return c // g <= 3


def io_block(channels: int, b: int) -> int:
    """The brgemm convolutions' channel block: on AVX-512 16 up to 16 channels, 32 above; on AVX2 the channels
    rounded up to 8 up to 24, above that 32 or 24, whichever pads less (32 on a tie)."""
    if b == 16:
        return 16 if channels <= 16 else 32
    if channels <= 24:
        return round_up(channels, 8)
    return min((32, 24), key=lambda blk: round_up(channels, blk))


def onednn_nhwc(call: ConvCall) -> bool:
    """``mkldnn_conv_use_channels_last`` (mkldnn/Utils.h): a 2-D convolution (a 1-D one viewed as 2-D) whose
    input or weight suggests ``ChannelsLast``, or a 3-D one whose input or weight suggests ``ChannelsLast3d``, runs
    on nhwc (ndhwc) activations."""
    return len(call.x_shape) in (4, 5) and "channels_last" in (call.x_layout, call.w_layout)


def _brgemm_relo(call: ConvCall, info: CpuInfo) -> bool:
    """Whether oneDNN's brgemm forward (AVX-512, nhwc, float32) relays a one-channel input out per thread
    (``try_relo_wi`` / ``try_relo_whi`` in cpu/x64/jit_brgemm_conv_utils.cpp: ic 1, no dilation, a kernel wider
    than 1, or taller than 1 with more than 4 output columns): its scratchpad then holds per-thread input
    buffers (``exec_trans``) that are not sized here. A dilated or 1x1 one takes the modelled constant."""
    if not (onednn_nhwc(call) and call.dtype == torch.float32 and call.groups == 1 and call.w_shape[1] == 1
            and info.onednn_block == 16 and all(d == 1 for d in call.dilation)):
        return False
    kh, kw = call.w_shape[2], call.w_shape[3]
    return kw > 1 or kh > 1 and call.out_sizes[-1] > 4


def conv_note(call: ConvCall, info: CpuInfo) -> str | None:
    """Why this convolution's scratch is not modelled on this CPU, or None when a rule models it."""
    backend, kind = conv_backend(call, info), dtype_name(call.dtype)
    note = _float32_note(call, info, backend)
    if note is not None:
        return note
    if backend.startswith("mkldnn") and call.dtype != torch.float32 and not bf16_forward_modelled(call, info) \
            and not bf16_backward_modelled(call, info) and not bf16_1x1_modelled(call, info) \
            and not bf16_depthwise_modelled(call, info) and bf16_amx_forward(call, info) is None \
            and not amx_backward_claims(call, info) and not bf16_3d_claims(call, info) \
            and not gemm_bf16_claims(call, info) and bf16_brgemm_forward(call, info) is None \
            and not bf16_transpose_claims(call, info) and not bf16_strided_backward_claims(call, info) \
            and not bf16_more_claims(call, info):
        return f"{kind} convolution through oneDNN (ISA {info.isa}): {NOT_MODELLED}"
    if gemm_bf16_claims(call, info) or bf16_more_claims(call, info):  # sized whole: no other kernel's note
        return None
    # A channels-last input is modelled (the Keras-torch zoo's NHWC convolutions measure exact); other strides
    # are not.
    if backend == "mkldnn" and call.x_layout == "strided" and not call.one_d:
        if copied_input(call, backend)[0] == 0:
            return f"{call.x_layout} convolution input through oneDNN: {NOT_MODELLED}"
        call = dataclasses.replace(call, x_layout="contiguous")  # the contiguous copy runs: its note, if any
    depthwise = call.groups == call.x_shape[1] == call.w_shape[0]
    if backend == "mkldnn" and not call.backward and _brgemm_relo(call, info):
        return f"single-channel channels-last convolution with an input relayout on oneDNN's brgemm kernel " \
               f"(exec_trans, ISA {info.isa}): {NOT_MODELLED}"
    if backend == "mkldnn" and onednn_nhwc(call) and info.onednn_block == 8 and len(call.x_shape) == 4 \
            and call.dtype == torch.float32 and (note := ndhwc_avx2_note(call, info)):  # 2-D: conv_nhwc_avx2
        return note
    if backend == "mkldnn" and onednn_nhwc(call) and call.groups > 1 and not depthwise and info.onednn_block < 8 \
            and len(call.x_shape) == 4:  # 3-D: ndhwc_note
        return f"grouped channels-last convolution through oneDNN (ISA {info.isa}): {NOT_MODELLED}"
    gemm = onednn_gemm(call, info) if backend == "mkldnn" and call.dtype == torch.float32 else (False, False)
    if any(gemm) and _avx2_flat(call):
        return f"grouped convolution with few input channels a group on oneDNN's jit:avx2 kernel (flat source, " \
               f"ISA {info.isa}): {NOT_MODELLED}"
    if any(gemm) and not gemm_sized(call, gemm, torch.get_num_threads(), info.onednn_block):
        what = "depthwise" if depthwise else "grouped" if call.groups > 1 else "dense"
        return f"{what} convolution on oneDNN's gemm kernel (ISA {info.isa}, this shape): {NOT_MODELLED}"
    if gemm[0] and len(call.x_shape) == 4:  # the whole op on gemm, sized by conv_gemm: no jit kernel's note
        return None
    if backend in ("mkldnn_transpose", "slow_transpose2d"):  # conv_transpose's rules and note
        note = transpose_note(call, info, backend)
        if note is not None or backend == "slow_transpose2d":
            return note
    if (backend == "mkldnn" and not call.backward and call.groups == 1 and math.prod(call.w_shape[2:]) == 1
            and len(call.x_shape) == 4 and max(call.stride) > 2  # 3-D: the direct kernels, sized (no rtus)
            and all(i == o * s for i, o, s in zip(call.x_shape[2:], call.out_sizes, call.stride))  # else direct
            and bf16_amx_forward(call, info) is None  # brgconv_1x1 on AMX: conv_bf16_amx_1x1
            and bf16_brgemm_forward(call, info) is None):  # brgconv_1x1:avx512_core_bf16: conv_bf16_brgemm_1x1
        return f"strided 1x1 convolution (stride {max(call.stride)}) through oneDNN: {NOT_MODELLED}"
    if (backend == "mkldnn" and call.backward and call.groups == 1 and not any(call.padding)
            and call.w_shape[2:] == call.x_shape[2:]
            and not (call.dtype == torch.bfloat16 and info.isa == MODELLED_ISA)):  # bfloat16: inner_product_takes
        # a kernel as large as its input: oneDNN runs the backward as an inner product (ip:any+brg_matmul)
        return f"convolution backward as an inner product through oneDNN (ISA {info.isa}): {NOT_MODELLED}"
    if (backend == "mkldnn" and call.backward and call.dtype == torch.float32 and call.groups == 1
            and call.x_layout == "contiguous" and len(call.x_shape) == 4 and not onednn_nhwc(call)
            and info.onednn_block == 16 and bwd_weights_kernel(call, 16) is None):
        # on gemm (conv_gemm), measured below AVX-512 only (seeded 2-D draws exact on avx2): noted on AVX-512
        return f"convolution weights' gradient through oneDNN (ISA {info.isa}, this shape): {NOT_MODELLED}"
    if (backend == "mkldnn" and call.backward and call.grad_input and call.groups == 1
            and any(s > 1 for s in call.stride)
            and strided_bwd_data(call, torch.get_num_threads(), info.onednn_block) is None
            and not bf16_strided_backward_claims(call, info)):  # bfloat16: conv_bf16_strided_bwd
        # oneDNN's brgconv_strided computes it with per-thread brgemm batches and buffers in its scratchpad,
        # sized by conv_brgemm_bwd where the blocking does not change it
        return f"strided convolution's input gradient on oneDNN's brgconv_strided (ISA {info.isa}): {NOT_MODELLED}"
    if (backend == "mkldnn" and call.backward and call.grad_input and call.groups > 1 and not depthwise
            and any(s > 1 for s in call.stride) and not grouped_strided_claims(call, info)):
        # a grouped one runs brgconv_strided too (grouped weights, aCdeb16c): sized by conv_grouped_strided_bwd
        # on avx512_core (more than 16 output channels a group), not on avx2 (9-16 a group, or an AVX2 CPU)
        return (f"grouped strided convolution's input gradient on oneDNN's brgconv_strided (ISA {info.isa}): "
                f"{NOT_MODELLED}")
    if (backend == "mkldnn" and call.backward and call.groups > 1 and not depthwise
            and torch.get_num_threads() >= 2 * call.groups
            and not (onednn_nhwc(call) and info.onednn_block == 8)):  # conv_nhwc_avx2
        # the grouped jit kernels give each group a thread first; with threads to spare they split the batch
        # and reduce through a scratchpad (balance() in jit_avx512_common_conv_kernel.cpp), not sized here
        return (f"grouped convolution backward through oneDNN on {torch.get_num_threads()} threads "
                f"(ISA {info.isa}): {NOT_MODELLED}")
    if backend == "mkldnn" and len(call.x_shape) == 5 and onednn_nhwc(call) \
            and bf16_brgemm_forward(call, info) is None and (note := ndhwc_note(call, info)):
        return note
    if backend.endswith("3d") and any(layout == "channels_last" and (shape[1] == 1 or math.prod(shape[2:]) == 1)
                                      for layout, shape in ((call.x_layout, call.x_shape),
                                                            (call.w_layout, call.w_shape))):
        # contiguous and channels-last-3d at once: ATen's native 3-D kernels' contiguous() copies nothing, the
        # rules (which read the layout as oneDNN does) count a copy
        return f"one-channel channels-last-3d operand on ATen's {backend} kernel: {NOT_MODELLED}"
    if (backend == "mkldnn" and len(call.x_shape) == 5 and not onednn_3d_forward(call, backend)
            and not onednn_3d_backward(call, info, backend) and not onednn_nhwc(call)
            and not bf16_3d_claims(call, info) and not bf16_transpose_claims(call, info)
            and not bf16_strided_backward_claims(call, info)):
        return f"3-D convolution through oneDNN ({ncdhw_3d_why(call, info)}, ISA {info.isa}): {NOT_MODELLED}"
    if backend not in ("mkldnn", "mkldnn_transpose", "slow2d", "slow_dilated2d", "slow_dilated3d", "slow3d"):
        return f"{kind} convolution on ATen's {backend} kernel (oneDNN ISA {info.isa}): {NOT_MODELLED}"
    return None


def _float32_note(call: ConvCall, info: CpuInfo, backend: str) -> str | None:
    """Float32 oneDNN paths found off by randomly drawn shapes (seeded draws in
    tests/frontends/pytorch/test_conv_strided_backward.py): a padded 1x1 kernel (oneDNN runs it on a direct
    kernel, not jit_1x1, with other buffers); on nhwc, a weights' gradient the direct kernel refuses (oneDNN's
    gemm) and a 1x1 one of few channels or a stride (jit_1x1 on nhwc reduces and gathers otherwise than the nchw
    port sizes)."""
    if backend != "mkldnn" or call.dtype != torch.float32 or call.groups != 1 or len(call.x_shape) != 4:
        return None
    one_by_one = math.prod(call.w_shape[2:]) == 1
    if one_by_one and any(call.padding):
        return f"padded 1x1 convolution through oneDNN (ISA {info.isa}): {NOT_MODELLED}"
    if call.backward and onednn_nhwc(call) and info.onednn_block == 16:
        if bwd_weights_kernel(call, info.onednn_block, nxc=True) is None:
            return f"channels-last convolution weights' gradient on oneDNN's gemm (ISA {info.isa}): {NOT_MODELLED}"
        if one_by_one and (call.x_shape[1] < 16 or any(s > 1 for s in call.stride)):
            # jit_1x1 on nhwc: fewer than 16 input channels measured up to 6.5 % above the nchw port, strided
            # ones gather per thread otherwise; 16 and more at unit stride within 256 B above (seeded draws)
            return f"1x1 channels-last convolution backward through oneDNN (ISA {info.isa}): {NOT_MODELLED}"
    return None


def _avx2_forward_refuses(call: ConvCall) -> bool:
    """``jit_avx2_conv_fwd_kernel_f32_t::init_conf``'s shape checks (oneDNN then runs ``gemm``): the dilated kernel
    overlapping the source on every side, the left padding within the width unroll (3, at most the output's
    width), no padding with a kernel wider than 7 unless unit-strided, and the right padding past the unrolled
    columns within a recomputed unroll."""
    if call.kernel_outside():
        return True
    ow, kw, sw, (t_pad, l_pad) = call.out_sizes[-1], call.w_shape[-1], call.stride[-1], call.padding[-2:]
    ur_w = min(3, ow)
    if l_pad > ur_w or (kw > 7 and (t_pad or l_pad) and any(s != 1 for s in call.stride)):
        return True
    if call.r_pad_no_tail(ur_w) > ur_w * sw and ow // ur_w > 1:
        ur_w = min(call.r_pad_no_tail(ur_w) // sw + ow % ur_w, min(ow, 15 // 2))
        return ur_w < max(l_pad, call.r_pad_no_tail(ur_w))
    return False
