"""The workspace rules of LSTM through oneDNN (ideep); the native cells (RNN, GRU, LSTM off oneDNN): rnn_native.

Section sizes follow oneDNN src/cpu/rnn/rnn_utils.hpp (set_workspace_sizes, set_conf) and rnn_utils.cpp
(set_offsets: every section starts on a 4 KiB page). ATen calls oneDNN once per layer and direction
(aten/src/ATen/native/mkldnn/RNN.cpp), so L = 1 and D = 1 in oneDNN's formulas. Also the real size of the
training workspace output (:func:`lstm_workspace_bytes`), the un-aliased fake outputs of the backward, and
the note for recurrent paths no rule models (:func:`recurrent_note`).
"""

from __future__ import annotations

from typing import Any

import torch

from nnmem.cpu import CpuInfo
from nnmem.errors import UnsupportedError
from nnmem.frontends.pytorch.workspace._common import NOT_MODELLED, alloc_peak, aten, dtype_name, nbytes, round_up
from nnmem.frontends.pytorch.workspace.matmul import MODELLED_ISA, MODELLED_THREADS, onednn_matmul
from nnmem.frontends.pytorch.workspace.rnn_native import (
    NATIVE_INFER,
    PACKED,
    batch_sizes_of,
    native_modelled,
    rule_native_infer,
)

_PAGE = 4096  # oneDNN rnn_utils::set_offsets: each workspace section starts on a 4 KiB page


def _good_ld(dim: int, elsize: int) -> int:
    """oneDNN rnn_utils::get_good_ld: 64-byte aligned, and not a multiple of 256 (4K aliasing)."""
    ld = round_up(dim, 64 // elsize)
    return ld + 64 // elsize if ld % 256 == 0 else ld


def lstm_workspace_bytes(seq_len: int, batch: int, input_size: int, hidden: int, elsize: int = 4) -> int:
    """Bytes of the workspace output of one training ``mkldnn_rnn_layer`` call (one layer, one direction).

    Page-aligned sections of rnn_utils::set_offsets: ws_gates T·B·ld(4H), ws_ht T·B·ld(H), then with
    (L+1)·(T+1)·B rows each: ws_states_layer, ws_diff_states_layer and ws_diff_states_iter of
    ld(max(I, H)), and ws_states_iter_c and ws_diff_states_iter_c of H (their ld is the plain hidden size,
    "not involved in GEMM"). In bfloat16 the gates, ws_ht, ws_states_layer and the cell states (``cx``'s type)
    take 2-byte elements and the three diff sections float32 ones (oneDNN's bf16 RNN accumulates its diffs in
    f32): fitted section by section to 14 seeded real workspace sizes, exact. Checked against real workspace
    sizes in tests/frontends/pytorch/test_workspace.py and test_rnn_bf16.py.
    """
    e, acc, rows = elsize, 4, 2 * (seq_len + 1) * batch
    gates = seq_len * batch * _good_ld(4 * hidden, e) * e
    ht = seq_len * batch * _good_ld(hidden, e) * e
    wide = max(input_size, hidden)
    states = round_up(rows * _good_ld(wide, e) * e, _PAGE)
    diff_states = 2 * round_up(rows * _good_ld(wide, acc) * acc, _PAGE)
    states_c = round_up(rows * hidden * e, _PAGE) + round_up(rows * hidden * acc, _PAGE)
    return round_up(gates, _PAGE) + round_up(ht, _PAGE) + states + diff_states + states_c


# The scratchpad registry adds to oneDNN's "rnn space" one perf_align page and small pointer arrays:
# 568 B in training (merged-GEMM kernels), 856-1016 B with the inference (brgemm) kernels at 2 threads
# (brgemm batch elements per thread; 1 KiB taken), 160 B more per thread above 2 (upper ends: 1,160 B measured
# at 3 threads, 1,320 B at 4; float32 and bfloat16). Measured: calibrate_workspace, lstm_lm, seeded draws.
_SCRATCH_EXTRA_TRAIN = _PAGE + 568


def _scratch_extra_infer() -> int:
    return _PAGE + 1024 + 160 * max(0, torch.get_num_threads() - 2)


def _lstm_scratchpad(seq_len: int, batch: int, input_size: int, hidden: int, elsize: int, training: bool) -> int:
    """oneDNN RNN scratchpad of one LSTM layer, in bytes.

    Training (forward and backward) merges the layer GEMM over time: scratch_gates for all T steps,
    scratch_ht and scratch_diff_ht. Inference runs the brgemm kernels without a workspace output, so the
    scratchpad also holds ws_states_layer and ws_states_iter_c, and scratch_gates for a single step, or
    for all T steps at batch 1 ("merged layer compute": rnn_brgemm_utils.cpp, mb <= 1 and T >= 2). In bfloat16
    (inference) the states are 2-byte elements and the gates float32 (measured).
    """
    e, acc = elsize, 4  # the gates accumulate in float32 whatever the data type
    gates_row = batch * _good_ld(4 * hidden, acc) * acc
    ht = round_up(batch * _good_ld(hidden, e) * e, _PAGE)
    if training:
        return round_up(seq_len * gates_row, _PAGE) + 2 * ht + _SCRATCH_EXTRA_TRAIN
    rows = 2 * (seq_len + 1) * batch
    # the cell states take cx's type: float32, or bfloat16 for a bfloat16 LSTM (src_iter_c)
    states = round_up(rows * _good_ld(max(input_size, hidden), e) * e, _PAGE) + round_up(rows * hidden * e, _PAGE)
    merged = seq_len if batch == 1 and seq_len >= 2 else 1
    return states + round_up(merged * gates_row, _PAGE) + ht + _scratch_extra_infer()


def _lstm_weights(input_size: int, hidden: int, elsize: int, training: bool, block: int, batch: int = 2) -> int:
    """Both weight matrices reordered for the forward kernel, in bytes.

    Training: ldigo with the gates' leading dimension ld(4H) (rnn_utils::set_good_strides). Inference:
    the brgemm layout ldgOi32o (AVX-512; ldgOi16o on AVX2: ``block`` is oneDNN's channel block), which pads
    each gate's H to the N block (rnn_brgemm_utils.cpp brgemm_calc_n_block): 2 vector widths, 4 for an
    LSTM at batch 1 on AVX2.
    """
    if training:
        return (input_size + hidden) * _good_ld(4 * hidden, elsize) * elsize
    n_block = 4 * block if block == 8 and batch == 1 else 2 * block
    if elsize == 2:  # bfloat16: each matrix's K rows in VNNI pairs (an odd size padded by one)
        return 4 * round_up(hidden, n_block) * (round_up(input_size, 2) + round_up(hidden, 2)) * elsize
    return 4 * round_up(hidden, n_block) * (input_size + hidden) * elsize


def _rnn_layer_scratch(x: torch.Tensor, hidden: int, training: bool, block: int) -> int:
    """Bias (4H), the reordered weights and the scratchpad, all freed before ``mkldnn_rnn_layer``
    returns. Measured sequence: ``[out, hy, cy, bias, workspace, w_layer, w_iter, scratchpad, -...]``."""
    seq_len, batch, input_size = int(x.shape[0]), int(x.shape[1]), int(x.shape[2])
    e = x.element_size()
    return (4 * hidden * e + _lstm_weights(input_size, hidden, e, training, block)
            + _lstm_scratchpad(seq_len, batch, input_size, hidden, e, training))


def rule_mkldnn_rnn_layer(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                          training: bool, info: CpuInfo) -> int:
    """Arguments: input (T, B, I) — ATen passes it sequence-first whatever ``batch_first`` says —, four
    weights, hx, cx, reverse, batch_sizes, mode, hidden_size (9), num_layers, has_biases, bidirectional,
    batch_first, train (15)."""
    x, hidden = args[0], int(args[10])
    refuse_unsupported(x.dtype, info)
    return _rnn_layer_scratch(x, hidden, bool(args[15]), info.onednn_block) if x.dim() == 3 else 0


def refuse_unsupported(dtype: torch.dtype, info: CpuInfo) -> None:
    """Raise where oneDNN has no LSTM of ``dtype`` on this CPU: autocast casts ``mkldnn_rnn_layer``'s inputs
    after ATen chose oneDNN for the float32 LSTM, and the real step fails there."""
    supported = {torch.bfloat16: info.onednn_bf16, torch.float16: info.onednn_fp16}.get(dtype, True)
    if not supported:
        raise UnsupportedError(f"a {dtype_name(dtype)} LSTM runs through oneDNN here (torch.autocast casts "
                               f"mkldnn_rnn_layer), and oneDNN has no {dtype_name(dtype)} LSTM on this CPU (ISA "
                               f"{info.isa}): PyTorch fails with \"could not create a primitive descriptor\"")


def sizes_mkldnn_rnn_layer(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> list[int] | None:
    """Real output sizes of ``mkldnn_rnn_layer``: the meta kernel's workspace is far smaller than oneDNN's."""
    x, hidden, train = args[0], int(args[10]), bool(args[15])
    if not train or x.dim() != 3:
        return None
    sizes = [t.untyped_storage().nbytes() for t in out]
    sizes[3] = lstm_workspace_bytes(int(x.shape[0]), int(x.shape[1]), int(x.shape[2]), hidden, x.element_size())
    return sizes


def rule_mkldnn_rnn_layer_backward(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
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
    before = [nbytes(grad_out) if isinstance(grad_out, torch.Tensor) and not grad_out.is_contiguous() else 0,
              state if args[11] is None else 0, state if args[12] is None else 0, bias]
    # outputs: grad_input, grad_w_ih, grad_w_hh, grad_b_ih, grad_b_hh (4, a copy made last), grad_hx, grad_cx
    fresh = [nbytes(t) if isinstance(t, torch.Tensor) else 0 for t in out]
    last = fresh.pop(4) if len(fresh) == 7 else 0
    reorders = [4 * hidden * _good_ld(n, e) * e for n in (input_size, hidden) if _good_ld(n, e) != n]
    diff_weights = [input_size * ld4 * e, hidden * ld4 * e]
    inner = [*reorders, *diff_weights, bias, _lstm_scratchpad(seq_len, batch, input_size, hidden, e, True)]
    seq = [*before, *fresh, *inner, *(-n for n in inner), last]
    return max(alloc_peak(seq) - sum(fresh) - last, 0)


def rule_lstm_infer(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool, info: CpuInfo) -> int:
    """``aten.lstm.input`` as seen under inference mode: the whole stack runs inside the op.

    ATen mkldnn/RNN.cpp ``mkldnn_rnn``: a contiguous sequence-first copy of a strided (``batch_first``)
    input, kept to the end; per layer and direction, without biases two zero tensors of the weights' shapes
    passed as biases, then ``mkldnn_rnn_layer``: the output, hy and cy, the bias, the weights in the brgemm
    layout and the inference scratchpad. A direction's output replaces the previous layer's in
    ``layer_output``; the layer input is that output, or the two concatenated, and replaces the previous
    one; h_n and c_n are stacked at the end. Off oneDNN (projections): :func:`.rnn_native.rule_native_infer`.
    """
    x, params, num_layers = args[0], args[2], int(args[4])
    has_biases, bidirectional, batch_first = bool(args[3]), bool(args[7]), bool(args[8])
    if x.dim() != 3:
        return 0
    if not _lstm_on_onednn(x, args[1], info):
        return rule_native_infer(args, kwargs, out, training, info)
    if not _bf16_lstm_modelled(x, info) and x.dtype != torch.float32:
        return 0  # oneDNN in float16, or bfloat16 off the measured ISA: not modelled (recurrent_note)
    seq_first = x.transpose(0, 1) if batch_first else x
    seq_len, batch = int(seq_first.shape[0]), int(seq_first.shape[1])
    e, dirs = x.element_size(), 2 if bidirectional else 1
    hidden, state = int(params[1].shape[1]), int(seq_first.shape[1]) * int(params[1].shape[1]) * e
    o = seq_len * batch * hidden * e
    seq: list[int] = [0 if seq_first.is_contiguous() else nbytes(x)]
    size = int(x.shape[2])
    for layer in range(num_layers):
        for _ in range(dirs):
            zeros = 0 if has_biases else 4 * hidden * (size + hidden) * e
            inner = (4 * hidden * e + _lstm_weights(size, hidden, e, False, info.onednn_block, batch)
                     + _lstm_scratchpad(seq_len, batch, size, hidden, e, False))
            seq += [zeros, o, 2 * state, inner, -inner, -zeros, -(o if layer else 0)]
        if dirs == 2:  # the concatenation replaces the previous layer input
            seq += [2 * o, -(2 * o if layer else 0)]
        size = hidden * dirs
    return max(alloc_peak([*seq, 2 * num_layers * dirs * state]) - sum(nbytes(t) for t in out), 0)


def _bf16_lstm_modelled(x: torch.Tensor, info: CpuInfo) -> bool:
    """A bfloat16 LSTM's inference through oneDNN on the ISA and thread counts measured."""
    return x.dtype == torch.bfloat16 and info.isa == MODELLED_ISA and torch.get_num_threads() in MODELLED_THREADS


def _lstm_on_onednn(x: torch.Tensor, hx: Any, info: CpuInfo) -> bool:
    """ATen's RNN ``use_mkldnn`` (aten/src/ATen/native/RNN.cpp): float32, or bfloat16 / float16 (inference)
    where the CPU supports the type; never with projections (h0 narrower than c0)."""
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled) or x.numel() == 0:
        return False
    if isinstance(hx, (list, tuple)) and len(hx) == 2 and hx[0].shape[-1] != hx[1].shape[-1]:
        return False
    if x.dtype == torch.bfloat16:
        return info.onednn_bf16
    if x.dtype == torch.float16:
        return info.onednn_fp16 and not torch.is_grad_enabled()
    return x.dtype == torch.float32


def recurrent_note(func: Any, args: tuple[Any, ...], info: CpuInfo) -> str | None:
    """Why the scratch of a call of one of the :data:`RECURRENT` ops is not modelled on this CPU, or None."""
    x = args[0]
    if not isinstance(x, torch.Tensor):
        return None
    kind = dtype_name(x.dtype)
    if func in (aten.mkldnn_rnn_layer.default, aten.mkldnn_rnn_layer_backward.default):
        if x.dtype == torch.float32:
            return None
        # inference (train = False): the layer of rule_lstm_infer, reached one by one under autocast
        if func is aten.mkldnn_rnn_layer.default and not bool(args[15]) and _bf16_lstm_modelled(x, info):
            return None
        return f"{kind} LSTM through oneDNN: {NOT_MODELLED}"
    if func in PACKED and batch_sizes_of(args[1]) is None:
        return (f"{kind} {func} over a PackedSequence: its batch sizes come from values the trace does not have: "
                f"{NOT_MODELLED}")
    if func is aten.lstm.input and _lstm_on_onednn(x, args[1], info):
        if x.dtype == torch.float32 or _bf16_lstm_modelled(x, info):
            return None
        return f"{kind} LSTM inference on oneDNN (ISA {info.isa}): {NOT_MODELLED}"
    # GRU cells and the fused transformer kernels run their projections as matmuls inside the op; the native
    # cells' bfloat16 matmuls are sized where rnn_native can (native_modelled).
    if func in NATIVE_INFER and native_modelled(args, info):
        return None
    if x.dtype != torch.float32 and onednn_matmul(x.dtype, 1 << 30, 1, info):
        return f"{kind} matmuls inside {func} run through oneDNN (ISA {info.isa}): {NOT_MODELLED}"
    return None


# The ops whose note is recurrent_note's: the recurrent layers, and the fused transformer kernels.
RECURRENT = frozenset({aten.mkldnn_rnn_layer.default, aten.mkldnn_rnn_layer_backward.default, aten.lstm.input,
                       *NATIVE_INFER, *PACKED, aten._transformer_encoder_layer_fwd.default,
                       aten._native_multi_head_attention.default})


def unalias_rnn_backward(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
    """The meta kernel of ``mkldnn_rnn_layer_backward`` returns one tensor as both bias gradients
    (torch/_meta_registrations.py); the CPU kernel returns a second storage (a copy made last)."""
    if not isinstance(out, tuple) or len(out) != 7 or out[3] is not out[4]:
        return out
    return (*out[:4], torch.empty_like(out[4]), *out[5:])


WORKSPACE = {
    aten.mkldnn_rnn_layer.default: rule_mkldnn_rnn_layer,
    aten.mkldnn_rnn_layer_backward.default: rule_mkldnn_rnn_layer_backward,
    aten.lstm.input: rule_lstm_infer,
}
SIZES = {aten.mkldnn_rnn_layer.default: sizes_mkldnn_rnn_layer}
FAKE_OUTPUTS = {aten.mkldnn_rnn_layer_backward.default: unalias_rnn_backward}
