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
    return bool(torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled and x.dtype == torch.float32
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
    "not involved in GEMM"). Checked against real workspace sizes in tests/test_workspace.py.
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


def _lstm_weights(input_size: int, hidden: int, elsize: int, training: bool) -> int:
    """Both weight matrices reordered for the forward kernel, in bytes.

    Training: ldigo with the gates' leading dimension ld(4H) (rnn_utils::set_good_strides). Inference:
    the brgemm layout ldgOi32o (AVX-512; ldgOi16o on AVX2), which pads each gate's H to the N block of
    2 vector widths (rnn_brgemm_utils.cpp brgemm_calc_n_block).
    """
    if training:
        return (input_size + hidden) * _good_ld(4 * hidden, elsize) * elsize
    return 4 * _rnd(hidden, 2 * _block()) * (input_size + hidden) * elsize


def _rnn_layer_scratch(x: torch.Tensor, hidden: int, training: bool) -> int:
    """Bias (4H), the reordered weights and the scratchpad, all freed before ``mkldnn_rnn_layer``
    returns. Measured sequence: ``[out, hy, cy, bias, workspace, w_layer, w_iter, scratchpad, -...]``."""
    seq_len, batch, input_size = int(x.shape[0]), int(x.shape[1]), int(x.shape[2])
    e = x.element_size()
    return (4 * hidden * e + _lstm_weights(input_size, hidden, e, training)
            + _lstm_scratchpad(seq_len, batch, input_size, hidden, e, training))


def _rule_mkldnn_rnn_layer(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool) -> int:
    """Arguments: input (T, B, I) — ATen passes it sequence-first whatever ``batch_first`` says —, four
    weights, hx, cx, reverse, batch_sizes, mode, hidden_size (9), num_layers, has_biases, bidirectional,
    batch_first, train (15)."""
    x, hidden = args[0], int(args[10])
    return _rnn_layer_scratch(x, hidden, bool(args[15])) if x.dim() == 3 else 0


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


def _rule_lstm_infer(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool) -> int:
    """``aten.lstm.input`` as seen under inference mode: the whole stack runs inside the op.

    ATen mkldnn/RNN.cpp mkldnn_rnn: a contiguous sequence-first copy of the input when it is strided
    (``batch_first``); per layer and direction the output, hy and cy, the bias, the weights in the brgemm
    layout and the inference scratchpad; the previous layer's output is freed after the next layer ran
    (two directions are concatenated, not measured); h_n and c_n are stacked at the end.
    """
    x, params, num_layers = args[0], args[2], int(args[4])
    bidirectional, batch_first = bool(args[7]), bool(args[8])
    if x.dim() != 3 or not torch.backends.mkldnn.enabled or x.dtype != torch.float32:
        return 0
    seq_first = x.transpose(0, 1) if batch_first else x
    seq_len, batch = int(seq_first.shape[0]), int(seq_first.shape[1])
    e, dirs = x.element_size(), 2 if bidirectional else 1
    hidden = int(params[1].shape[1])
    seq: list[int] = [0 if seq_first.is_contiguous() else _nbytes(x)]
    prev, size = 0, int(x.shape[2])
    for _ in range(num_layers):
        o = seq_len * batch * hidden * e
        for _ in range(dirs):
            inner = (4 * hidden * e + _lstm_weights(size, hidden, e, False)
                     + _lstm_scratchpad(seq_len, batch, size, hidden, e, False))
            seq += [o, 2 * batch * hidden * e, inner, -inner]
        if dirs == 2:
            seq += [dirs * o, -dirs * o]
        seq += [-prev]
        prev, size = dirs * o, hidden * dirs
    fresh = sum(_nbytes(t) for t in out)
    return max(_peak(seq + [2 * num_layers * dirs * batch * hidden * e]) - fresh, 0)


def _rule_gru_infer(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool) -> int:
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


def _rule_embedding_backward(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool) -> int:
    """``embedding_dense_backward`` makes a strided grad contiguous first (aten/src/ATen/native/Embedding.cpp)."""
    grad = args[0]
    return 0 if grad.is_contiguous() else _nbytes(grad)


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


def _rule_max_pool2d_backward(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool) -> int:
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

    def fake_outputs(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
        """The op's outputs, un-aliased where the fake kernel shares a storage the real kernel does not."""
        fix = FAKE_OUTPUTS.get(func)
        return out if fix is None else fix(args, kwargs, out)


RULES = WorkspaceRules()
