"""Kernel scratch and real output sizes of PyTorch's CPU kernels, op by op.

A fake (meta) kernel returns outputs of the right shape but allocates nothing else, while the real CPU
kernel may allocate and free scratch inside the op: oneDNN reorders of the source, weights and
destination to blocked layouts, primitive scratchpads, temporaries of composite kernels. Each rule below
gives, for one op overload, the peak of the allocator's running sum inside the real kernel (relative to
just before it) minus the bytes of the op's new outputs. The sequences of allocations were read from
``python benchmarks/calibrate_workspace.py`` (torch 2.13.0, oneDNN 3.12, AVX-512, fp32) and from the
PyTorch sources named in each rule; ``tests/test_workspace.py`` checks each rule against a real profiler
measurement of the same op.

A rule only ever sees shapes, dtypes, strides and flags, so it runs unchanged on fake and real tensors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["RULES", "WorkspaceRules", "lstm_workspace_bytes"]

aten = torch.ops.aten
_PAGE = 4096  # oneDNN rnn_utils::set_offsets: each workspace section starts on a 4 KiB page


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


def _block() -> int:
    """Channel block of oneDNN's blocked layouts: nChw16c with AVX-512, nChw8c with AVX2 and below."""
    return 16 if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else 8


# ---- convolution (oneDNN through ideep) ----------------------------------------------------------------
def _mkldnn_conv(x: torch.Tensor, weight: torch.Tensor, groups: int) -> bool:
    """Whether ATen's _select_conv_backend picks mkldnn (aten/src/ATen/native/Convolution.cpp use_mkldnn).

    fp32 NC(H)W input with batch > 1 on a build with mkldnn enabled; batch 1 with small kernels falls back
    to the im2col kernels, which this module does not model.
    """
    return (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled and x.dtype == torch.float32
            and x.dim() in (3, 4) and x.shape[0] > 1 and x.is_contiguous() and weight.dim() == x.dim())


def _conv_dims(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, groups: int) -> tuple[int, ...]:
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


def conv_forward(x: torch.Tensor, weight: torch.Tensor, bias: Any, out: torch.Tensor, groups: int) -> int:
    """Scratch of ``mkldnn_convolution`` on NCHW input (aten/src/ATen/native/mkldnn/Conv.cpp).

    With a plain NCHW input, ideep reorders the source to nChw16c (not when ``ic < 16``: oneDNN's
    first-layer kernels read nchw directly), the weights to a blocked layout, an unaligned bias to a
    padded copy (+128 B, measured), computes into a blocked destination with channels padded to 16, and
    ``mkldnn_to_dense`` copies that into the dense output. Sequence measured:
    ``[bias, src, wei, dst, -wei, -src, -bias, out, -dst]``.
    """
    if not _mkldnn_conv(x, weight, groups):
        return 0
    n, c, o, s_in, s_out, k, e = _conv_dims(x, weight, out, groups)
    b = _block()
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
    if not (_mkldnn_conv(x, weight, 1)):
        return 0
    dense = _nbytes(out)
    src, wei = _nbytes(x), _nbytes(weight)
    return _peak([src, wei, dense, -wei, -src, dense, dense, -dense, -dense]) - dense


def conv_backward(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias_defined: bool,
                  groups: int, mask: Sequence[bool], outs: Sequence[Any]) -> int:
    """Scratch of ``mkldnn_convolution_backward`` (aten/src/ATen/native/mkldnn/Conv.cpp).

    backward_data: grad_output reordered to nChw16c, weights reordered, a blocked grad_input then copied
    dense. backward_weights: grad_output reordered again, the source reordered (nchw kept for ic <= 3,
    8-channel blocks for 4 <= ic <= 8), blocked grad_weight/grad_bias then copied dense. A non-contiguous
    grad_output is first made contiguous. oneDNN's bwd-weights reduction scratchpad (per-thread partial
    sums, a few tens of KB) and the bwd-data scratchpad of strided convolutions are not modelled.
    """
    if not _mkldnn_conv(x, weight, groups):
        return 0
    n, c, o, s_in, s_out, k, e = _conv_dims(x, weight, grad_out, groups)
    b = _block()
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


def _rule_convolution(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool) -> int:
    x, weight, bias = args[0], args[1], args[2]
    transposed, groups = bool(args[6]), int(args[8])
    if transposed:
        return conv_transpose_forward(x, weight, out)
    return conv_forward(x, weight, bias, out, groups)


def _rule_conv_nd(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool) -> int:
    """``aten.conv1d/conv2d``: seen instead of ``aten.convolution`` under ``torch.inference_mode``."""
    x, weight = args[0], args[1]
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    groups = int(args[6]) if len(args) > 6 else int(kwargs.get("groups", 1))
    return conv_forward(x, weight, bias, out, groups)


def _rule_conv_transpose_nd(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool) -> int:
    return conv_transpose_forward(args[0], args[1], out)


def _rule_convolution_backward(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool) -> int:
    grad_out, x, weight = args[0], args[1], args[2]
    transposed, groups, mask = bool(args[7]), int(args[9]), args[10]
    if transposed:
        return 0  # not modelled yet: deconvolution backward goes through a different oneDNN path
    return conv_backward(grad_out, x, weight, bool(mask[2]), groups, mask, out)


# ---- LSTM (oneDNN RNN through ideep) -------------------------------------------------------------------
def _good_ld(dim: int, elsize: int) -> int:
    """oneDNN rnn_utils::get_good_ld: 64-byte aligned, and not a multiple of 256 (4K aliasing)."""
    ld = _rnd(dim, 64 // elsize)
    return ld + 64 // elsize if ld % 256 == 0 else ld


def lstm_workspace_bytes(seq_len: int, batch: int, input_size: int, hidden: int, elsize: int = 4) -> int:
    """Bytes of the workspace output of one ``mkldnn_rnn_layer`` call (one layer, one direction).

    oneDNN rnn_utils::set_offsets places each section on a 4 KiB page: the gates
    (T·B·ld(4H)), ht (T·B·ld(H)), three states sections of (L+1)·(T+1)·B·ld(max(I, H)) and two of
    (L+1)·(T+1)·B·ld(H) with L = 1 (ws_states_iter is registered twice there). The section count was
    fitted to, and is checked against, real workspace sizes over T, B, I and H (tests/test_workspace.py).
    """
    ld_states, ld_h, ld_gates = (_good_ld(max(input_size, hidden), elsize), _good_ld(hidden, elsize),
                                 _good_ld(4 * hidden, elsize))
    gates = seq_len * batch * ld_gates * elsize
    ht = seq_len * batch * ld_h * elsize
    states_wide = 2 * (seq_len + 1) * batch * ld_states * elsize
    states_h = 2 * (seq_len + 1) * batch * ld_h * elsize
    pages = (_rnd(gates, _PAGE) + _rnd(ht, _PAGE) + 3 * _rnd(states_wide, _PAGE) + 2 * _rnd(states_h, _PAGE))
    return pages


def _lstm_scratchpad(seq_len: int, batch: int, hidden: int, elsize: int) -> int:
    """oneDNN RNN scratchpad: scratch_gates for all T (merged layer GEMM) plus three small page-sized
    sections and 568 B, as measured for fp32 LSTM layers (calibrate_workspace: mkldnn_rnn_layer)."""
    return _rnd(seq_len * batch * _good_ld(4 * hidden, elsize) * elsize, _PAGE) + 3 * _PAGE + 568


def _rnn_layer_scratch(x: torch.Tensor, w_ih: torch.Tensor, hidden: int) -> int:
    """Bias (4H), layer and iteration weights reordered to ldigo with a good leading dimension, and the
    primitive scratchpad, all freed before the op returns (ATen mkldnn/RNN.cpp mkldnn_rnn_layer)."""
    seq_len, batch, input_size = int(x.shape[0]), int(x.shape[1]), int(x.shape[2])
    e = x.element_size()
    ld = _good_ld(4 * hidden, e)
    return 4 * hidden * e + input_size * ld * e + hidden * ld * e + _lstm_scratchpad(seq_len, batch, hidden, e)


def _rule_mkldnn_rnn_layer(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool) -> int:
    """Arguments: input (T, B, I) — ATen passes it sequence-first whatever ``batch_first`` says —, four
    weights, hx, cx, reverse, batch_sizes, mode, hidden_size (9), num_layers, has_biases, bidirectional,
    batch_first, train (15)."""
    x, w_ih, hidden = args[0], args[1], int(args[10])
    return _rnn_layer_scratch(x, w_ih, hidden) if x.dim() == 3 else 0


def _sizes_mkldnn_rnn_layer(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> list[int] | None:
    """Real output sizes of ``mkldnn_rnn_layer``: the meta kernel's workspace is far smaller than oneDNN's."""
    x, hidden, train = args[0], int(args[10]), bool(args[15])
    if not train or x.dim() != 3:
        return None
    sizes = [t.untyped_storage().nbytes() for t in out]
    sizes[3] = lstm_workspace_bytes(int(x.shape[0]), int(x.shape[1]), int(x.shape[2]), hidden, x.element_size())
    return sizes


def _rule_mkldnn_rnn_layer_backward(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                                    training: bool) -> int:
    """Weights reordered to ldgoi (both), blocked copies of the weight gradients, three bias-sized buffers
    and the scratchpad (measured sequence, calibrate_workspace: mkldnn_rnn_layer_backward)."""
    x, w_hh = args[0], args[2]
    hidden = int(w_hh.shape[1])
    seq_len, batch, input_size = int(x.shape[0]), int(x.shape[1]), int(x.shape[2])
    e = x.element_size()
    ld = _good_ld(4 * hidden, e)
    return (input_size + hidden) * ld * e + 3 * 4 * hidden * e + _lstm_scratchpad(seq_len, batch, hidden, e)


def _rule_lstm_infer(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool) -> int:
    """``aten.lstm.input`` as seen under inference mode: the whole stack runs inside the op.

    Per layer and direction (ATen mkldnn/RNN.cpp mkldnn_rnn): the layer's output, hy and cy, the bias,
    the weights packed for MKL GEMM (rows padded to 16) and the scratchpad; the previous layer's output is
    freed after the next layer ran; h_n and c_n are stacked at the end. The inference scratchpad is taken
    as the training one (the measured one is 4-8 KiB larger: unresolved).
    """
    x, params, num_layers = args[0], args[2], int(args[4])
    bidirectional, batch_first = bool(args[7]), bool(args[8])
    if x.dim() != 3 or not torch.backends.mkldnn.enabled or x.dtype != torch.float32:
        return 0
    seq_len, batch = (int(x.shape[1]), int(x.shape[0])) if batch_first else (int(x.shape[0]), int(x.shape[1]))
    e, dirs = x.element_size(), 2 if bidirectional else 1
    hidden = int(params[1].shape[1])
    seq: list[int] = []
    prev = 0
    size = int(x.shape[2])
    for _ in range(num_layers):
        layer_out = 0
        for _ in range(dirs):
            o = seq_len * batch * hidden * e
            weights = (4 * hidden * e + _rnd(size, 16) * 4 * hidden * e + _rnd(hidden, 16) * 4 * hidden * e
                       + _lstm_scratchpad(seq_len, batch, hidden, e))
            seq += [o, 2 * batch * hidden * e, weights, -weights]
            layer_out += o
        seq += [-prev]
        prev, size = layer_out, hidden * dirs
    fresh = sum(_nbytes(t) for t in out)
    return max(_peak(seq + [2 * num_layers * dirs * batch * hidden * e]) - fresh, 0)


def _rule_transformer_encoder_layer_fwd(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                                        training: bool) -> int:
    """The fused encoder layer (nn.TransformerEncoderLayer fast path in inference,
    aten/src/ATen/native/transformers/transformer.cpp): the packed q/k/v projection (3 x src) and the
    feed-forward hidden activation (B x S x dim_feedforward) are live together (measured)."""
    src, w_ffn1 = args[0], args[14]
    tokens = src.numel() // int(src.shape[-1])
    return 3 * _nbytes(src) + tokens * int(w_ffn1.shape[0]) * src.element_size()


# ---- normalisation and pooling -------------------------------------------------------------------------
def _rule_native_batch_norm(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool) -> int:
    """Two per-channel temporaries (aten/src/ATen/native/Normalization.cpp batch_norm_cpu_transform_input)."""
    x = args[0]
    return 2 * int(x.shape[1]) * 4 if x.dim() > 1 else 0


def _rule_batch_norm_infer(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool) -> int:
    """``aten.batch_norm`` under inference mode: per-channel alpha and beta (Normalization.cpp)."""
    return _rule_native_batch_norm(args, kwargs, out, training)


def _rule_native_batch_norm_backward(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                                     training: bool) -> int:
    """A temporary the size of the input (batch_norm_backward_cpu_template computes grad_out * x_hat)."""
    mask = args[-1]
    return _nbytes(args[1]) if mask[0] and bool(args[7]) else 0


def _rule_max_pool2d(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool) -> int:
    """``aten.max_pool2d`` (seen under inference mode) runs max_pool2d_with_indices and drops the int64
    indices (aten/src/ATen/native/MaxPooling.cpp): 8 bytes per output element."""
    return out.numel() * 8


# ---- the rule table ------------------------------------------------------------------------------------
Rule = Callable[[tuple[Any, ...], dict[str, Any], Any, bool], int]
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
    aten.lstm.input: _rule_lstm_infer,
    aten._transformer_encoder_layer_fwd.default: _rule_transformer_encoder_layer_fwd,
}

SIZES: dict[Any, SizeRule] = {
    aten.mkldnn_rnn_layer.default: _sizes_mkldnn_rnn_layer,
}


class WorkspaceRules:
    """The ``OpRules`` of nnmem's PyTorch tracker: a dictionary lookup per op, then a small rule."""

    def workspace(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool) -> int:
        """Transient scratch the real CPU kernel allocates and frees inside the op, in bytes."""
        rule = WORKSPACE.get(func)
        if rule is None:
            return 0
        return max(int(rule(args, kwargs, out, training)), 0)

    def output_bytes(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> list[int] | None:
        """Real storage bytes of each output (flatten order) where the fake kernel's sizes differ."""
        rule = SIZES.get(func)
        return None if rule is None else rule(args, kwargs, out)


RULES = WorkspaceRules()
