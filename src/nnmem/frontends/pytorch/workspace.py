"""Kernel scratch and real output sizes of PyTorch's CPU kernels, op by op, for the CPU they run on.

A fake (meta) kernel returns outputs of the right shape but allocates nothing else, while the real CPU
kernel may allocate and free scratch inside the op: oneDNN reorders of the source, weights and
destination to blocked layouts, primitive scratchpads, im2col columns, temporaries of composite kernels.
Each rule below gives, for one op overload, the peak of the allocator's running sum inside the real kernel
(relative to just before it) minus the bytes of the op's new outputs. Which kernel runs depends on the CPU:
ATen sends bfloat16/float16 convolutions and matmuls to oneDNN only where oneDNN's effective ISA supports
the type, and oneDNN's blocked layouts follow its vector width (:mod:`nnmem.cpu`, docs/cpu-isa.md). The
sequences of allocations were read from ``python benchmarks/calibrate_workspace.py`` (torch 2.13.0,
oneDNN 3.12) and from the PyTorch sources named in each rule; ``tests/frontends/pytorch/test_workspace.py``
checks each rule against a real profiler measurement of the same op. A kernel path no rule models for the
CPU gives a note (:func:`note_for`, :attr:`WorkspaceRules.notes`) instead of a silent zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from nnmem.cpu import CpuInfo, describe

__all__ = ["RULES", "ConvCall", "WorkspaceRules", "conv_backend", "conv_call", "lstm_workspace_bytes", "note_for"]

aten = torch.ops.aten
_PAGE = 4096  # oneDNN rnn_utils::set_offsets: each workspace section starts on a 4 KiB page
_NOT_MODELLED = "kernel scratch not modelled; the allocator level may be higher"


def _peak(sequence: Sequence[int]) -> int:
    """Peak of the running sum of signed allocation sizes (frees negative), in bytes."""
    running = peak = 0
    for size in sequence:
        running += size
        peak = max(peak, running)
    return peak


def _rnd(value: int, block: int) -> int:
    return -(-value // block) * block


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# ---- convolution: which kernel ATen picks -------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ConvCall:
    """One convolution as ATen's ``_convolution`` sees it: a 1-D one as 2-D with height 1 (``view1d_as_2d``).

    Only shapes, dtypes and layouts: a rule never runs a tensor op. ``layout`` of a tensor is
    "contiguous", "channels_last" or "strided".
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

    @property
    def x_bytes(self) -> int:
        return math.prod(self.x_shape) * self.itemsize

    @property
    def w_bytes(self) -> int:
        return math.prod(self.w_shape) * self.itemsize


def _layout(t: torch.Tensor) -> str:
    if t.is_contiguous():
        return "contiguous"
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return "channels_last"
    return "strided"


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
    x_layout, w_layout = _layout(x), _layout(weight)
    if dims == 1:  # Convolution.cpp _convolution: input.contiguous(), view1d_as_2d(), view4d()
        x_shape, w_shape = (*x_shape[:2], 1, x_shape[2]), (*w_shape[:2], 1, w_shape[2])
        stride, padding, dilation = (1, *stride), (0, *padding), (1, *dilation)
        output_padding = (0, *output_padding)
        w_layout = "contiguous" if w_layout == "contiguous" else "strided"
    return ConvCall(x_shape, w_shape, x.dtype, x.element_size(), x_layout, w_layout, stride, padding, dilation,
                    bool(transposed), output_padding, int(groups), dims == 1)


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


def conv_note(call: ConvCall, info: CpuInfo) -> str | None:
    """Why this convolution's scratch is not modelled on this CPU, or None when a rule models it."""
    backend, kind = conv_backend(call, info), _dtype_name(call.dtype)
    if backend.startswith("mkldnn") and call.dtype != torch.float32:
        return f"{kind} convolution through oneDNN (ISA {info.isa}): {_NOT_MODELLED}"
    if backend == "mkldnn" and call.x_layout != "contiguous" and not call.one_d:
        return f"{call.x_layout} convolution input through oneDNN: {_NOT_MODELLED}"
    if backend.startswith("mkldnn") and len(call.x_shape) == 5:
        return f"3-D convolution through oneDNN: {_NOT_MODELLED}"
    if backend not in ("mkldnn", "mkldnn_transpose", "slow2d"):
        return f"{kind} convolution on ATen's {backend} kernel (oneDNN ISA {info.isa}): {_NOT_MODELLED}"
    return None


# ---- convolution through oneDNN (ideep), float32 -------------------------------------------------------
def _conv_dims(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> tuple[int, ...]:
    n, c = int(x.shape[0]), int(x.shape[1])
    o = int(out.shape[1])
    s_in, s_out = math.prod(int(d) for d in x.shape[2:]), math.prod(int(d) for d in out.shape[2:])
    k = math.prod(int(d) for d in weight.shape[2:])
    return n, c, o, s_in, s_out, k, x.element_size()


def _conv_weight_blocked(c: int, o: int, k: int, groups: int, e: int, b: int, small_ic: bool) -> int:
    """Bytes of the weights reordered to oneDNN's blocked layout (OIhw16i16o, Acdb16a, Goihw16g)."""
    if groups == 1:
        return _rnd(o, b) * (c if small_ic else _rnd(c, b)) * k * e
    if groups == c == o:  # depthwise: groups padded to the block
        return _rnd(groups, b) * k * e
    return o * (c // groups) * k * e  # grouped: measured equal to the dense weights (calibrate: g4 case)


def conv_forward(x: torch.Tensor, weight: torch.Tensor, bias: Any, out: torch.Tensor, groups: int, b: int) -> int:
    """Scratch of ``mkldnn_convolution`` on a float32 NC(H)W input (aten/src/ATen/native/mkldnn/Conv.cpp).

    ideep reorders the source to nChw16c (nChw8c below AVX-512: ``b`` is oneDNN's channel block; not when
    ``ic < b``: oneDNN's first-layer kernels read nchw directly), the weights to a blocked layout, an
    unaligned bias to a padded copy (+128 B, measured), computes into a blocked destination with channels
    padded to the block, and ``mkldnn_to_dense`` copies that into the dense output. Sequence measured:
    ``[bias, src, wei, dst, -wei, -src, -bias, out, -dst]``.
    """
    n, c, o, s_in, s_out, k, e = _conv_dims(x, weight, out)
    small_ic = groups == 1 and c < b
    src = 0 if small_ic else n * _rnd(c, b) * s_in * e
    wei = _conv_weight_blocked(c, o, k, groups, e, b, small_ic)
    bia = _rnd(o, b) * e + 128 if bias is not None and o % b else 0
    dst = n * _rnd(o, b) * s_out * e
    dense = _nbytes(out)
    return _peak([bia, src, wei, dst, -wei, -src, -bia, dense, -dst]) - dense


def conv_transpose_forward(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> int:
    """Scratch of ``mkldnn_convolution_transpose`` (aten/src/ATen/native/mkldnn/Conv.cpp).

    Measured: source and weight reorders, an unpadded destination, the dense output and one more copy
    of it, ``[src, wei, dst, -wei, -src, out, copy, -dst, -out]``. A further constant ~60 KB buffer seen
    in the measurement (primitive scratchpad) is not modelled.
    """
    dense = _nbytes(out)
    src, wei = _nbytes(x), _nbytes(weight)
    return _peak([src, wei, dense, -wei, -src, dense, dense, -dense, -dense]) - dense


def conv_backward(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias_defined: bool,
                  groups: int, mask: Sequence[bool], outs: Sequence[Any], b: int) -> int:
    """Scratch of ``mkldnn_convolution_backward`` (aten/src/ATen/native/mkldnn/Conv.cpp), float32.

    backward_data: grad_output reordered to nChw16c (nChw8c below AVX-512), weights reordered, a blocked
    grad_input then copied dense. backward_weights: grad_output reordered again, the source reordered (nchw
    kept for ic <= 3, 8-channel blocks for 4 <= ic <= 8), blocked grad_weight/grad_bias then copied dense.
    A non-contiguous grad_output is first made contiguous. oneDNN's bwd-weights reduction scratchpad
    (per-thread partial sums, a few tens of KB) and the bwd-data scratchpad of strided convolutions are not
    modelled.
    """
    n, c, o, s_in, s_out, k, e = _conv_dims(x, weight, grad_out)
    contiguous = 0 if grad_out.is_contiguous() else _nbytes(grad_out)
    seq = [contiguous]
    if mask[0]:
        gy = n * _rnd(o, b) * s_out * e
        wei = _conv_weight_blocked(c, o, k, groups, e, b, False)
        gx_blocked = n * _rnd(c, b) * s_in * e
        gx = _nbytes(x)
        seq += [gy, wei, gx_blocked, -wei, -gy, gx, -gx_blocked]
    if mask[1] or mask[2]:
        first = groups == 1 and c <= 3
        bc = 8 if groups == 1 and 4 <= c <= 8 else b
        gy = n * _rnd(o, bc) * s_out * e
        src = 0 if first else n * _rnd(c, bc) * s_in * e
        if groups == 1:
            gw_blocked = _rnd(o, bc) * (c if first else _rnd(c, bc)) * k * e
        else:
            gw_blocked = _conv_weight_blocked(c, o, k, groups, e, b, False)
        gb = o * e if bias_defined else 0
        seq += [gy, src, gw_blocked, gb, -src, -gy, gb, _nbytes(weight), -gw_blocked, -gb]
    fresh = sum(_nbytes(t) for t in outs if isinstance(t, torch.Tensor))
    return max(_peak(seq) - fresh, 0)


# ---- convolution on ATen's im2col kernel (thnn_conv2d), any dtype ------------------------------------
def _columns(call: ConvCall, channels: int) -> int:
    """Bytes of ``compute_columns2d`` (ConvolutionMM2d.cpp): the batch unfolded, ``N x (C kh kw) x (oh ow)``;
    a view of the input (nothing) for a 1x1 kernel with stride 1 and no padding."""
    n, _, h, w = call.x_shape
    kh, kw = call.w_shape[2], call.w_shape[3]
    if (kh, kw) == (1, 1) and call.stride == (1, 1) and call.padding == (0, 0):
        return 0
    oh = (h + 2 * call.padding[0] - kh) // call.stride[0] + 1
    ow = (w + 2 * call.padding[1] - kw) // call.stride[1] + 1
    return n * channels * kh * kw * oh * ow * call.itemsize


def _slow2d_format(call: ConvCall) -> str:
    """The layout the Slow2d kernels work in: channels-last when the input or the weight is
    (ConvUtils.h ``thnn_conv_use_channels_last``), contiguous otherwise."""
    return "channels_last" if "channels_last" in (call.x_layout, call.w_layout) else "contiguous"


def _made_contiguous(call: ConvCall) -> int:
    """Bytes of ``input.contiguous(fmt)`` and ``weight.contiguous(fmt)`` before the Slow2d kernel (a strided
    1-D input is made contiguous by ``_convolution`` first)."""
    fmt = _slow2d_format(call)
    return ((call.x_bytes if call.x_layout != fmt else 0) + (call.w_bytes if call.w_layout != fmt else 0))


def _slice_copy(shape: tuple[int, ...], itemsize: int, groups: int) -> int:
    """Bytes of ``subtensor(t, 1, groups, g)`` (Convolution.cpp): one group's channels made contiguous, a copy
    unless the batch is 1."""
    return 0 if shape[0] == 1 else math.prod(shape) * itemsize // groups


def slow2d_forward(call: ConvCall, out_bytes: int) -> int:
    """Scratch of the ``Slow2d`` branch of ``_convolution`` (Convolution.cpp) and ``slow_conv2d_forward_out_cpu``
    (ConvolutionMM2d.cpp).

    Input and weight made contiguous; per group a ``subtensor`` copy of the input's channels, the columns
    (``compute_columns2d``), that group's output, the columns freed; ``at::cat`` of the group outputs. One
    group: ``[input, weight, columns, out, -columns]``.
    """
    g = call.groups
    channels = call.x_shape[1] // g
    if g == 1:
        return _made_contiguous(call) + _columns(call, channels)
    slice_in, columns, slice_out = _slice_copy(call.x_shape, call.itemsize, g), _columns(call, channels), out_bytes // g
    seq = [_made_contiguous(call)]
    for _ in range(g):
        seq += [slice_in, columns, slice_out, -columns, -slice_in]
    return _peak([*seq, out_bytes]) - out_bytes


def _bias_sum_buffer(shape: tuple[int, ...], dtype: torch.dtype, layout: str) -> int:
    """Float32 buffers of ``sum_out`` of a bfloat16/float16 NC(H)W tensor over N and the spatial dimensions, in
    bytes (ReduceOps.cpp ``should_use_acc_buffer``): when two reduced dimensions stay apart after coalescing
    (a contiguous NCHW tensor with N > 1, C > 1, H*W > 1; in channels-last N, H and W coalesce into one) it
    sums ``self.to(kFloat)`` into a float32 result, then copies it back."""
    n, c, spatial = shape[0], shape[1], math.prod(shape[2:])
    if dtype not in (torch.bfloat16, torch.float16) or layout != "contiguous" or min(n, c, spatial) <= 1:
        return 0
    return 4 * (math.prod(shape) + c)


def _slow2d_backward_seq(call: ConvCall, gy_shape: tuple[int, ...], gy_layout: str, channels: int,
                         mask: Sequence[bool], sizes: tuple[int, int, int]) -> list[int]:
    """``slow_conv2d_backward_out_cpu`` (ConvolutionMM2d.cpp) on one group: grad_input (its per-thread column
    buffer is a ``std::make_unique``, outside the allocator), grad_bias by ``sum_out`` of grad_output as it
    came, then grad_weight over the input unfolded again; grad_output is made contiguous in the kernel's
    layout in the grad_input and grad_weight phases."""
    gx, gw, gb = sizes
    gy_copy = 0 if gy_layout == _slow2d_format(call) else math.prod(gy_shape) * call.itemsize
    seq: list[int] = []
    if mask[0]:
        seq += [gx, gy_copy, -gy_copy]
    if mask[2]:
        acc = _bias_sum_buffer(gy_shape, call.dtype, gy_layout)
        seq += [gb, acc, -acc]
    if mask[1]:
        columns = _columns(call, channels)
        seq += [gw, gy_copy, columns, -columns, -gy_copy]
    return seq


def slow2d_backward(call: ConvCall, grad_out: torch.Tensor, mask: Sequence[bool], fresh: int) -> int:
    """Scratch of ``convolution_backward``'s ``Slow2d`` branch (Convolution.cpp): input and weight made
    contiguous; per group ``subtensor`` copies of grad_output's and the input's channels, that group's
    gradients (kept), and ``at::cat`` of the group gradients at the end."""
    g, e = call.groups, call.itemsize
    gy_shape = tuple(int(d) for d in grad_out.shape)
    if call.one_d:
        gy_shape = (*gy_shape[:2], 1, gy_shape[2])
    channels = call.x_shape[1] // g
    sizes = (call.x_bytes // g if mask[0] else 0, call.w_bytes // g if mask[1] else 0,
             call.w_shape[0] // g * e if mask[2] else 0)
    seq = [_made_contiguous(call)]
    gy_layout = _layout(grad_out)
    if g == 1:
        return max(_peak(seq + _slow2d_backward_seq(call, gy_shape, gy_layout, channels, mask, sizes)) - fresh, 0)
    gy_g, x_g = _slice_copy(gy_shape, e, g), _slice_copy(call.x_shape, e, g)
    group_shape = (gy_shape[0], gy_shape[1] // g, *gy_shape[2:])
    slice_layout = "channels_last" if gy_layout == "channels_last" else "contiguous"  # suggest_memory_format
    for _ in range(g):
        inner = _slow2d_backward_seq(call, group_shape, slice_layout, channels, mask, sizes)
        seq += [gy_g, x_g, *inner, -gy_g, -x_g]
    seq += [g * s for s in sizes]
    return max(_peak(seq) - fresh, 0)


# ---- convolution rules -------------------------------------------------------------------------------------
def _forward(x: torch.Tensor, weight: torch.Tensor, bias: Any, out: Any, call: ConvCall | None,
             info: CpuInfo) -> int:
    if call is None or not isinstance(out, torch.Tensor):
        return 0
    backend = conv_backend(call, info)
    if backend == "slow2d":
        return slow2d_forward(call, _nbytes(out))
    if call.dtype != torch.float32 or (call.x_layout != "contiguous" and not call.one_d) or len(call.x_shape) != 4:
        return 0  # not modelled: conv_note says so
    if backend == "mkldnn":  # a strided 1-D input is made contiguous first, and stays live
        copy = call.x_bytes if call.one_d and call.x_layout != "contiguous" else 0
        return copy + conv_forward(x, weight, bias, out, call.groups, info.onednn_block)
    if backend == "mkldnn_transpose":
        return conv_transpose_forward(x, weight, out)
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


def _call_conv_transpose_nd(args: tuple[Any, ...], kwargs: dict[str, Any]) -> ConvCall | None:
    """``aten.conv_transpose1d/2d(input, weight, bias, stride, padding, output_padding, groups, dilation)``."""
    return conv_call(args[0], args[1], _arg(args, kwargs, 3, "stride", 1), _arg(args, kwargs, 4, "padding", 0),
                     _arg(args, kwargs, 7, "dilation", 1), True, _arg(args, kwargs, 5, "output_padding", 0),
                     int(_arg(args, kwargs, 6, "groups", 1)))


def _call_convolution_backward(args: tuple[Any, ...], kwargs: dict[str, Any]) -> ConvCall | None:
    """``aten.convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
    transposed, output_padding, groups, output_mask)``."""
    return conv_call(args[1], args[2], args[4], args[5], args[6], bool(args[7]), args[8], int(args[9]))


def _rule_convolution(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool,
                      info: CpuInfo) -> int:
    return _forward(args[0], args[1], args[2], out, _call_convolution(args, kwargs), info)


def _rule_conv_nd(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool, info: CpuInfo) -> int:
    bias = _arg(args, kwargs, 2, "bias", None)
    return _forward(args[0], args[1], bias, out, _call_conv_nd(args, kwargs), info)


def _rule_conv_transpose_nd(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool,
                            info: CpuInfo) -> int:
    bias = _arg(args, kwargs, 2, "bias", None)
    return _forward(args[0], args[1], bias, out, _call_conv_transpose_nd(args, kwargs), info)


def _rule_convolution_backward(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool,
                               info: CpuInfo) -> int:
    grad_out, x, weight, mask = args[0], args[1], args[2], args[10]
    call = _call_convolution_backward(args, kwargs)
    if call is None:
        return 0
    fresh = sum(_nbytes(t) for t in out if isinstance(t, torch.Tensor))
    backend = conv_backend(call, info)
    if backend == "slow2d":
        return slow2d_backward(call, grad_out, mask, fresh)
    if backend != "mkldnn" or call.dtype != torch.float32 or call.x_layout != "contiguous" or len(call.x_shape) != 4:
        return 0  # transposed (oneDNN) backward: not modelled yet; the others: conv_note says so
    return conv_backward(grad_out, x, weight, bool(mask[2]), call.groups, mask, out, info.onednn_block)


# ---- recurrent layers: LSTM through oneDNN (ideep), GRU through ATen's native cells -----------------
# Section sizes follow oneDNN src/cpu/rnn/rnn_utils.hpp (set_workspace_sizes, set_conf) and
# rnn_utils.cpp (set_offsets: every section starts on a 4 KiB page). ATen calls oneDNN once per layer
# and direction (aten/src/ATen/native/mkldnn/RNN.cpp), so L = 1 and D = 1 in oneDNN's formulas.
def _good_ld(dim: int, elsize: int) -> int:
    """oneDNN rnn_utils::get_good_ld: 64-byte aligned, and not a multiple of 256 (4K aliasing)."""
    ld = _rnd(dim, 64 // elsize)
    return ld + 64 // elsize if ld % 256 == 0 else ld


def lstm_workspace_bytes(seq_len: int, batch: int, input_size: int, hidden: int, elsize: int = 4) -> int:
    """Bytes of the workspace output of one training ``mkldnn_rnn_layer`` call (one layer, one direction).

    Page-aligned sections of rnn_utils::set_offsets: ws_gates T·B·ld(4H), ws_ht T·B·ld(H), then with
    (L+1)·(T+1)·B rows each: ws_states_layer, ws_diff_states_layer and ws_diff_states_iter of
    ld(max(I, H)), and ws_states_iter_c and ws_diff_states_iter_c of H (their ld is the plain hidden size,
    "not involved in GEMM"). Checked against real workspace sizes in tests/frontends/pytorch/test_workspace.py.
    """
    e, rows = elsize, 2 * (seq_len + 1) * batch
    gates = seq_len * batch * _good_ld(4 * hidden, e) * e
    ht = seq_len * batch * _good_ld(hidden, e) * e
    states = rows * _good_ld(max(input_size, hidden), e) * e
    states_c = rows * hidden * 4  # cell states are f32 whatever the data type
    return _rnd(gates, _PAGE) + _rnd(ht, _PAGE) + 3 * _rnd(states, _PAGE) + 2 * _rnd(states_c, _PAGE)


# The scratchpad registry adds to oneDNN's "rnn space" one perf_align page and small pointer arrays:
# 568 B in training (merged-GEMM kernels), 856-1016 B with the inference (brgemm) kernels at 2 threads
# (brgemm batch elements per thread; 1 KiB taken). Measured: calibrate_workspace, lstm_lm.
_SCRATCH_EXTRA_TRAIN = _PAGE + 568
_SCRATCH_EXTRA_INFER = _PAGE + 1024


def _lstm_scratchpad(seq_len: int, batch: int, input_size: int, hidden: int, elsize: int, training: bool) -> int:
    """oneDNN RNN scratchpad of one LSTM layer, in bytes.

    Training (forward and backward) merges the layer GEMM over time: scratch_gates for all T steps,
    scratch_ht and scratch_diff_ht. Inference runs the brgemm kernels without a workspace output, so the
    scratchpad also holds ws_states_layer and ws_states_iter_c, and scratch_gates for a single step.
    """
    e = elsize
    gates_row = batch * _good_ld(4 * hidden, e) * e
    ht = _rnd(batch * _good_ld(hidden, e) * e, _PAGE)
    if training:
        return _rnd(seq_len * gates_row, _PAGE) + 2 * ht + _SCRATCH_EXTRA_TRAIN
    rows = 2 * (seq_len + 1) * batch
    states = _rnd(rows * _good_ld(max(input_size, hidden), e) * e, _PAGE) + _rnd(rows * hidden * 4, _PAGE)
    return states + _rnd(gates_row, _PAGE) + ht + _SCRATCH_EXTRA_INFER


def _lstm_weights(input_size: int, hidden: int, elsize: int, training: bool, block: int) -> int:
    """Both weight matrices reordered for the forward kernel, in bytes.

    Training: ldigo with the gates' leading dimension ld(4H) (rnn_utils::set_good_strides). Inference:
    the brgemm layout ldgOi32o (AVX-512; ldgOi16o on AVX2: ``block`` is oneDNN's channel block), which pads
    each gate's H to the N block of 2 vector widths (rnn_brgemm_utils.cpp brgemm_calc_n_block).
    """
    if training:
        return (input_size + hidden) * _good_ld(4 * hidden, elsize) * elsize
    return 4 * _rnd(hidden, 2 * block) * (input_size + hidden) * elsize


def _rnn_layer_scratch(x: torch.Tensor, hidden: int, training: bool, block: int) -> int:
    """Bias (4H), the reordered weights and the scratchpad, all freed before ``mkldnn_rnn_layer``
    returns. Measured sequence: ``[out, hy, cy, bias, workspace, w_layer, w_iter, scratchpad, -...]``."""
    seq_len, batch, input_size = int(x.shape[0]), int(x.shape[1]), int(x.shape[2])
    e = x.element_size()
    return (4 * hidden * e + _lstm_weights(input_size, hidden, e, training, block)
            + _lstm_scratchpad(seq_len, batch, input_size, hidden, e, training))


def _rule_mkldnn_rnn_layer(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                           training: bool, info: CpuInfo) -> int:
    """Arguments: input (T, B, I) — ATen passes it sequence-first whatever ``batch_first`` says —, four
    weights, hx, cx, reverse, batch_sizes, mode, hidden_size (9), num_layers, has_biases, bidirectional,
    batch_first, train (15)."""
    x, hidden = args[0], int(args[10])
    return _rnn_layer_scratch(x, hidden, bool(args[15]), info.onednn_block) if x.dim() == 3 else 0


def _sizes_mkldnn_rnn_layer(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> list[int] | None:
    """Real output sizes of ``mkldnn_rnn_layer``: the meta kernel's workspace is far smaller than oneDNN's."""
    x, hidden, train = args[0], int(args[10]), bool(args[15])
    if not train or x.dim() != 3:
        return None
    sizes = [t.untyped_storage().nbytes() for t in out]
    sizes[3] = lstm_workspace_bytes(int(x.shape[0]), int(x.shape[1]), int(x.shape[2]), hidden, x.element_size())
    return sizes


def _rule_mkldnn_rnn_layer_backward(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                                    training: bool, info: CpuInfo) -> int:
    """Scratch of ``mkldnn_rnn_layer_backward`` (ATen mkldnn/RNN.cpp, oneDNN lstm_backward).

    Measured sequence: a contiguous copy of a strided grad_output, zeros for undefined grad_hy / grad_cy,
    the bias (4H); the outputs (grad_input, grad_hx, grad_cx, both weight gradients, one bias gradient);
    the weights reordered to ldgoi where ld(I) or ld(H) differs from the plain row, the weight gradients
    in ldigo with ld(4H), a bias-sized buffer and the training scratchpad; then frees, and the second
    bias gradient. Arguments: input, four weights, hx, cx, output, hy, cy, grad_output (10), grad_hy,
    grad_cy, ..., workspace.
    """
    x, w_hh, grad_out = args[0], args[2], args[10]
    if x.dim() != 3:
        return 0
    hidden = int(w_hh.shape[1])
    seq_len, batch, input_size = int(x.shape[0]), int(x.shape[1]), int(x.shape[2])
    e = x.element_size()
    ld4 = _good_ld(4 * hidden, e)
    bias, state = 4 * hidden * e, batch * hidden * e
    before = [_nbytes(grad_out) if isinstance(grad_out, torch.Tensor) and not grad_out.is_contiguous() else 0,
              state if args[11] is None else 0, state if args[12] is None else 0, bias]
    # outputs: grad_input, grad_w_ih, grad_w_hh, grad_b_ih, grad_b_hh (4, a copy made last), grad_hx, grad_cx
    fresh = [_nbytes(t) if isinstance(t, torch.Tensor) else 0 for t in out]
    last = fresh.pop(4) if len(fresh) == 7 else 0
    reorders = [4 * hidden * _good_ld(n, e) * e for n in (input_size, hidden) if _good_ld(n, e) != n]
    diff_weights = [input_size * ld4 * e, hidden * ld4 * e]
    inner = [*reorders, *diff_weights, bias, _lstm_scratchpad(seq_len, batch, input_size, hidden, e, True)]
    seq = [*before, *fresh, *inner, *(-n for n in inner), last]
    return max(_peak(seq) - sum(fresh) - last, 0)


def _rule_lstm_infer(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool, info: CpuInfo) -> int:
    """``aten.lstm.input`` as seen under inference mode: the whole stack runs inside the op.

    ATen mkldnn/RNN.cpp mkldnn_rnn: a contiguous sequence-first copy of the input when it is strided
    (``batch_first``); per layer and direction the output, hy and cy, the bias, the weights in the brgemm
    layout and the inference scratchpad; the previous layer's output is freed after the next layer ran
    (two directions are concatenated, not measured); h_n and c_n are stacked at the end.
    """
    x, params, num_layers = args[0], args[2], int(args[4])
    bidirectional, batch_first = bool(args[7]), bool(args[8])
    if x.dim() != 3 or not _lstm_on_onednn(x, info) or x.dtype != torch.float32:
        return 0  # native cells, or oneDNN in bfloat16/float16: not modelled (lstm_note)
    seq_first = x.transpose(0, 1) if batch_first else x
    seq_len, batch = int(seq_first.shape[0]), int(seq_first.shape[1])
    e, dirs = x.element_size(), 2 if bidirectional else 1
    hidden = int(params[1].shape[1])
    seq: list[int] = [0 if seq_first.is_contiguous() else _nbytes(x)]
    prev, size = 0, int(x.shape[2])
    for _ in range(num_layers):
        o = seq_len * batch * hidden * e
        for _ in range(dirs):
            inner = (4 * hidden * e + _lstm_weights(size, hidden, e, False, info.onednn_block)
                     + _lstm_scratchpad(seq_len, batch, size, hidden, e, False))
            seq += [o, 2 * batch * hidden * e, inner, -inner]
        if dirs == 2:
            seq += [dirs * o, -dirs * o]
        seq += [-prev]
        prev, size = dirs * o, hidden * dirs
    fresh = sum(_nbytes(t) for t in out)
    return max(_peak(seq + [2 * num_layers * dirs * batch * hidden * e]) - fresh, 0)


def _rule_gru_infer(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool, info: CpuInfo) -> int:
    """``aten.gru.input`` under inference mode: ATen's native cells (aten/src/ATen/native/RNN.cpp).

    Per layer, FullLayer projects the whole input at once (T·B·3H), then each step allocates
    ``linear_hh(h)`` (B·3H), the new gate and the new hidden state (B·H each), keeps the hidden state and
    frees the rest; the T step outputs are stacked (T·B·H), all but the last freed, then the projection
    and the previous layer's output. Measured sequence, one direction (two: each direction in turn, then
    a concatenation — not measured).
    """
    x, hx, params, num_layers = args[0], args[1], args[2], int(args[4])
    bidirectional, batch_first = bool(args[7]), bool(args[8])
    if x.dim() != 3:
        return 0
    seq_len, batch = (int(x.shape[1]), int(x.shape[0])) if batch_first else (int(x.shape[0]), int(x.shape[1]))
    hidden, e, dirs = int(hx.shape[-1]), x.element_size(), 2 if bidirectional else 1
    gates = int(params[0].shape[0]) // hidden
    state, steps = batch * hidden * e, seq_len * batch * hidden * e
    seq: list[int] = []
    prev = 0
    for _ in range(num_layers):
        for _ in range(dirs):
            projection = steps * gates
            seq += [projection, steps - state, gates * state, state, state, -state, -gates * state, steps,
                    -(steps - state), -projection]
        if dirs == 2:
            seq += [2 * steps, -2 * steps]
        seq += [-prev]
        prev = dirs * steps
    fresh = sum(_nbytes(t) for t in out)
    return max(_peak(seq + [num_layers * dirs * state]) - fresh, 0)


def _rule_embedding_backward(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                             training: bool, info: CpuInfo) -> int:
    """``embedding_dense_backward`` makes a strided grad contiguous first (aten/src/ATen/native/Embedding.cpp)."""
    grad = args[0]
    return 0 if grad.is_contiguous() else _nbytes(grad)


def _rule_transformer_encoder_layer_fwd(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                                        training: bool, info: CpuInfo) -> int:
    """The fused encoder layer (nn.TransformerEncoderLayer fast path in inference,
    aten/src/ATen/native/transformers/transformer.cpp): the packed q/k/v projection (3 x src) and the
    feed-forward hidden activation (B x S x dim_feedforward) are live together (measured)."""
    src, w_ffn1 = args[0], args[14]
    tokens = src.numel() // int(src.shape[-1])
    return 3 * _nbytes(src) + tokens * int(w_ffn1.shape[0]) * src.element_size()


# ---- normalisation and pooling -------------------------------------------------------------------------
def _rule_native_batch_norm(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                            training: bool, info: CpuInfo) -> int:
    """Two per-channel temporaries (aten/src/ATen/native/Normalization.cpp batch_norm_cpu_transform_input)."""
    x = args[0]
    return 2 * int(x.shape[1]) * 4 if x.dim() > 1 else 0


def _rule_batch_norm_infer(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                           training: bool, info: CpuInfo) -> int:
    """``aten.batch_norm`` under inference mode: per-channel alpha and beta (Normalization.cpp)."""
    return _rule_native_batch_norm(args, kwargs, out, training, info)


def _rule_native_batch_norm_backward(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                                     training: bool, info: CpuInfo) -> int:
    """A temporary the size of the input (batch_norm_backward_cpu_template computes grad_out * x_hat)."""
    mask = args[-1]
    return _nbytes(args[1]) if mask[0] and bool(args[7]) else 0


def _rule_max_pool2d(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool, info: CpuInfo) -> int:
    """``aten.max_pool2d`` (seen under inference mode) runs max_pool2d_with_indices and drops the int64
    indices (aten/src/ATen/native/MaxPooling.cpp): 8 bytes per output element."""
    return out.numel() * 8


def _rule_max_pool2d_backward(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                              training: bool, info: CpuInfo) -> int:
    """``aten.max_pool2d_with_indices_backward`` when grad_output and input differ in memory format.

    Keras on torch pools an NCHW view whose gradient arrives channels-last; the CPU kernel then works on
    converted copies. Measured (benchmarks/calibrate_workspace.py style, fp32 and fp16, 2x2 pools): scratch
    = bytes of the input + two float32 copies of grad_output. Same formats: no scratch.
    """
    grad_out, x = args[0], args[1]
    last = torch.channels_last
    if grad_out.dim() != 4 or grad_out.is_contiguous(memory_format=last) == x.is_contiguous(memory_format=last):
        return 0
    return _nbytes(x) + 2 * grad_out.numel() * 4


# ---- kernel paths no rule models on this CPU ----------------------------------------------------------
def _onednn_matmul(dtype: torch.dtype, a_numel: int, n: int, info: CpuInfo) -> bool:
    """Whether ATen runs a matmul through oneDNN (aten/src/ATen/native/mkldnn/Matmul.cpp
    ``use_mkldnn_{bf16,fp16,bf32}_matmul`` and ``checksize``: the type supported by the CPU and
    ``m * k * n`` (times the batch) above 16^3; float32 only at ``set_float32_matmul_precision("medium")``)."""
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled) or a_numel * n <= 16 ** 3:
        return False
    if dtype == torch.bfloat16:
        return info.onednn_bf16
    if dtype == torch.float16:
        return info.onednn_fp16
    return dtype == torch.float32 and info.onednn_bf16 and torch.get_float32_matmul_precision() == "medium"


def _matmul_operands(func: Any, args: tuple[Any, ...]) -> tuple[torch.Tensor, int] | None:
    """The left operand of a matmul op and the right one's last dimension."""
    if func in (aten.mm.default, aten.bmm.default, aten.matmul.default):
        a, b = args[0], args[1]
    elif func in (aten.addmm.default, aten.baddbmm.default, aten.addbmm.default, aten._addmm_activation.default):
        a, b = args[1], args[2]
    elif func is aten.linear.default:  # input @ weight.T: n is the weight's first dimension
        a, b = args[0], args[1]
        return (a, int(b.shape[0])) if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) else None
    else:
        return None
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or b.dim() < 1:
        return None
    return a, int(b.shape[-1])


def _matmul_note(func: Any, args: tuple[Any, ...], info: CpuInfo) -> str | None:
    operands = _matmul_operands(func, args)
    if operands is None:
        return None
    a, n = operands
    if not _onednn_matmul(a.dtype, a.numel(), n, info):
        return None
    return f"{_dtype_name(a.dtype)} matmul through oneDNN (ISA {info.isa}): {_NOT_MODELLED}"


def _lstm_on_onednn(x: torch.Tensor, info: CpuInfo) -> bool:
    """ATen's RNN ``use_mkldnn`` (aten/src/ATen/native/RNN.cpp): float32, or bfloat16 / float16 (inference)
    where the CPU supports the type."""
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled) or x.numel() == 0:
        return False
    if x.dtype == torch.bfloat16:
        return info.onednn_bf16
    if x.dtype == torch.float16:
        return info.onednn_fp16 and not torch.is_grad_enabled()
    return x.dtype == torch.float32


def _recurrent_note(func: Any, args: tuple[Any, ...], info: CpuInfo) -> str | None:
    x = args[0]
    if not isinstance(x, torch.Tensor):
        return None
    kind = _dtype_name(x.dtype)
    if func in (aten.mkldnn_rnn_layer.default, aten.mkldnn_rnn_layer_backward.default):
        return None if x.dtype == torch.float32 else f"{kind} LSTM through oneDNN: {_NOT_MODELLED}"
    if func is aten.lstm.input:
        if x.dtype == torch.float32 and _lstm_on_onednn(x, info):
            return None
        where = "oneDNN" if _lstm_on_onednn(x, info) else "ATen's native cells"
        return f"{kind} LSTM inference on {where} (oneDNN ISA {info.isa}): {_NOT_MODELLED}"
    # GRU cells and the fused transformer kernels run their projections as matmuls inside the op.
    if x.dtype != torch.float32 and _onednn_matmul(x.dtype, 1 << 30, 1, info):
        return f"{kind} matmuls inside {func} run through oneDNN (ISA {info.isa}): {_NOT_MODELLED}"
    return None


_CONV_CALLS: dict[Any, Callable[[tuple[Any, ...], dict[str, Any]], ConvCall | None]] = {
    aten.convolution.default: _call_convolution,
    aten.conv1d.default: _call_conv_nd,
    aten.conv2d.default: _call_conv_nd,
    aten.conv_transpose1d.default: _call_conv_transpose_nd,
    aten.conv_transpose2d.input: _call_conv_transpose_nd,
    aten.convolution_backward.default: _call_convolution_backward,
}
_RECURRENT = frozenset({aten.mkldnn_rnn_layer.default, aten.mkldnn_rnn_layer_backward.default, aten.lstm.input,
                        aten.gru.input, aten._transformer_encoder_layer_fwd.default,
                        aten._native_multi_head_attention.default})


def note_for(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], info: CpuInfo) -> str | None:
    """Why the scratch of this op call is not modelled on this CPU, or None when it is (or needs none).

    Args:
        func: the op overload, e.g. ``torch.ops.aten.convolution.default``.
        args, kwargs: its arguments (real or fake tensors: only shapes, dtypes and layouts are read).
        info: the CPU it runs on (:func:`nnmem.cpu.describe`).

    Returns:
        One line for a report, e.g. "float16 convolution through oneDNN (ISA avx512_core_fp16): kernel
        scratch not modelled; the allocator level may be higher".
    """
    parse = _CONV_CALLS.get(func)
    if parse is not None:
        call = parse(args, kwargs)
        return None if call is None else conv_note(call, info)
    if func in _RECURRENT:
        return _recurrent_note(func, args, info)
    return _matmul_note(func, args, info)


# ---- the rule table ------------------------------------------------------------------------------------
Rule = Callable[[tuple[Any, ...], dict[str, Any], Any, bool, CpuInfo], int]
SizeRule = Callable[[tuple[Any, ...], dict[str, Any], Any], "list[int] | None"]

WORKSPACE: dict[Any, Rule] = {
    aten.convolution.default: _rule_convolution,
    aten.conv1d.default: _rule_conv_nd,
    aten.conv2d.default: _rule_conv_nd,
    aten.conv_transpose1d.default: _rule_conv_transpose_nd,
    aten.conv_transpose2d.input: _rule_conv_transpose_nd,
    aten.convolution_backward.default: _rule_convolution_backward,
    aten.mkldnn_rnn_layer.default: _rule_mkldnn_rnn_layer,
    aten.mkldnn_rnn_layer_backward.default: _rule_mkldnn_rnn_layer_backward,
    aten.native_batch_norm.default: _rule_native_batch_norm,
    aten.native_batch_norm_backward.default: _rule_native_batch_norm_backward,
    aten.batch_norm.default: _rule_batch_norm_infer,
    aten.max_pool2d.default: _rule_max_pool2d,
    aten.max_pool2d_with_indices_backward.default: _rule_max_pool2d_backward,
    aten.lstm.input: _rule_lstm_infer,
    aten.gru.input: _rule_gru_infer,
    aten.embedding_dense_backward.default: _rule_embedding_backward,
    aten._transformer_encoder_layer_fwd.default: _rule_transformer_encoder_layer_fwd,
}

SIZES: dict[Any, SizeRule] = {
    aten.mkldnn_rnn_layer.default: _sizes_mkldnn_rnn_layer,
}


def _unalias_rnn_backward(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
    """The meta kernel of ``mkldnn_rnn_layer_backward`` returns one tensor as both bias gradients
    (torch/_meta_registrations.py); the CPU kernel returns a second storage (a copy made last)."""
    if not isinstance(out, tuple) or len(out) != 7 or out[3] is not out[4]:
        return out
    return (*out[:4], torch.empty_like(out[4]), *out[5:])


FakeFix = Callable[[tuple[Any, ...], dict[str, Any], Any], Any]

FAKE_OUTPUTS: dict[Any, FakeFix] = {
    aten.mkldnn_rnn_layer_backward.default: _unalias_rnn_backward,
}


class WorkspaceRules:
    """The ``OpRules`` of nnmem's PyTorch tracker: a dictionary lookup per op, then a small rule.

    Args:
        cpu: the CPU the kernels run on; the host's (:func:`nnmem.cpu.describe`, under this process's
            ``ONEDNN_MAX_CPU_ISA`` / ``ATEN_CPU_CAPABILITY``) when None.

    Example:
        >>> rules = WorkspaceRules()  # one per trace
        >>> trace = trace_fake_step(model, inputs, mode="infer", ..., rules=rules)  # doctest: +SKIP
        >>> rules.notes  # the kernel paths this trace met that no rule models on this CPU
        ()
    """

    def __init__(self, cpu: CpuInfo | None = None) -> None:
        self._cpu = cpu
        self._notes: dict[str, None] = {}

    @property
    def cpu(self) -> CpuInfo:
        return self._cpu if self._cpu is not None else describe()

    @property
    def notes(self) -> tuple[str, ...]:
        """One line per kernel path met so far whose scratch no rule models on this CPU, in first-seen order."""
        return tuple(self._notes)

    def workspace(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool) -> int:
        """Transient scratch the real CPU kernel allocates and frees inside the op, in bytes."""
        info = self.cpu
        note = note_for(func, args, kwargs, info)
        if note is not None:
            self._notes.setdefault(note)
        rule = WORKSPACE.get(func)
        if rule is None:
            return 0
        return max(int(rule(args, kwargs, out, training, info)), 0)

    def output_bytes(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> list[int] | None:
        """Real storage bytes of each output (flatten order) where the fake kernel's sizes differ."""
        rule = SIZES.get(func)
        return None if rule is None else rule(args, kwargs, out)

    def fake_outputs(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
        """The op's outputs, un-aliased where the fake kernel shares a storage the real kernel does not."""
        fix = FAKE_OUTPUTS.get(func)
        return out if fix is None else fix(args, kwargs, out)


RULES = WorkspaceRules()
