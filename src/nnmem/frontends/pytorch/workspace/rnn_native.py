"""The workspace rules of the recurrent layers that run on ATen's native cells under inference mode.

``nn.RNN`` (tanh, relu) and ``nn.GRU`` always, and ``nn.LSTM`` where oneDNN is not used (``proj_size``, or a
type the CPU's oneDNN lacks), run aten/src/ATen/native/RNN.cpp: ``_rnn_impl`` stacks ``FullLayer`` or
``FullBidirectionalLayer`` (``PackedLayer`` ... for a PackedSequence, the ``.data`` overloads) over
``SimpleCell`` / ``GRUCell`` / ``LSTMCell``. Under inference mode the whole stack is one op (``aten.gru.input``
...), so every tensor it makes is scratch: the sequences below replay those sources, tensor by tensor. In
training the same code runs op by op and the tracker sees each tensor; no rule is needed there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import is_fake

from nnmem.cpu import CpuInfo
from nnmem.frontends.pytorch.workspace._common import alloc_peak, aten, nbytes
from nnmem.frontends.pytorch.workspace.matmul import (
    AMX_ISA,
    MODELLED_ISA,
    MODELLED_THREADS,
    OnednnMatmul,
    linear_batched,
    matmul_scratch,
    onednn_matmul,
    onednn_scratchpad,
)

MatmulScratch = Callable[[int, int, int], int]  # (m, k, n) -> scratch bytes of one linear's matmul


@dataclass(frozen=True, slots=True)
class _Cell:
    """One recurrent cell's shapes: gates per step (G·H wide), hidden H, step output ``out`` (H, or P)."""

    gates: int
    hidden: int
    out: int
    lstm: bool


def _step(cell: _Cell, batch: int, e: int, first: bool, hh: int = 0) -> list[int]:
    """One cell call with the input projection precomputed (``pre_compute_input``); its new hidden state
    (the step output, kept by the layer) stays allocated, everything else is freed.

    SimpleCell: ``nonlinearity(linear_hh(h).add_(x))``. GRUCell: ``linear_hh(h)`` (3H), the new gate and
    ``(h - new_gate)`` (the new state); ``hh``: the scratch of ``linear_hh``'s matmul (oneDNN's, in bfloat16),
    live after its output. LSTMCell: ``linear_hh(h)`` (4H) gates, ``forgetgate * cx``,
    ``ingate * cellgate``, ``cy.tanh()``, ``outgate * tanh`` (hy), ``matmul_hr(hy)`` with a projection;
    the previous cell state dies when the new hidden pair replaces it (the first one is a view of ``cx``).
    """
    s, g = batch * cell.hidden * e, batch * cell.gates * e
    if not cell.lstm:
        if cell.gates == cell.hidden:  # SimpleCell
            return [g, hh, -hh, s, -g]
        return [g, hh, -hh, s, s, -s, -g]  # GRUCell
    seq = [g, hh, -hh, s, s, -s, s, s, -s]
    if cell.out != cell.hidden:
        seq += [batch * cell.out * e, -s]
    return seq + [-g] + ([] if first else [-s])


def _direction(cell: _Cell, seq_len: int, batch: int, e: int, hh: int = 0) -> list[int]:
    """The T cell calls of one direction of one layer."""
    out: list[int] = []
    for t in range(seq_len):
        out += _step(cell, batch, e, t == 0, hh)
    return out


def native_sequence(cell: _Cell, seq_len: int, batch: int, size: int, num_layers: int, dirs: int, e: int,
                    copy_first: bool, matmul: MatmulScratch | None = None, first: int | None = None) -> list[int]:
    """Signed allocation sizes of one ``_rnn_impl`` call (ATen RNN.cpp), in bytes, in order.

    ``linear_ih`` projects a whole layer input at once (T·B·G·H). The first layer's input is a transposed
    view under ``batch_first``; ``at::matmul`` folds it to 2-D for weights that require a gradient
    (``should_fold``), which copies it (T·B·I, freed after the product): ``copy_first``. ``matmul`` sizes the
    projections' own scratch (oneDNN's bfloat16 matmuls: live after their output, freed with the call);
    ``first``, where given, the first layer's projection's instead (a batch-first input's batched product).
    """
    steps = seq_len * batch * cell.out * e  # one direction's stacked output
    last = batch * cell.out * e  # a direction's last step output: kept as its final hidden state
    proj = seq_len * batch * cell.gates * e
    seq: list[int] = []
    prev = 0
    hh = matmul(batch, cell.out, cell.gates) if matmul else 0
    for layer in range(num_layers):
        copy = seq_len * batch * size * e if copy_first and layer == 0 else 0
        ih = matmul(seq_len * batch, size, cell.gates) if matmul else 0
        if layer == 0 and first is not None:
            ih = first
        project = [copy, proj, ih, -ih, -copy]
        run = _direction(cell, seq_len, batch, e, hh)
        if dirs == 1:  # FullLayer: project, run, stack, free the steps and the projection
            seq += [*project, *run, steps, -(steps - last), -proj]
        else:  # FullBidirectionalLayer: both directions' steps live until the concatenation returns
            seq += [*project, *run, steps, *project, -proj]
            seq += [*run, steps, 2 * steps, -2 * steps, -2 * (steps - last), -proj]
        seq += [-prev]
        prev, size = dirs * steps, dirs * cell.out
    finals = num_layers * dirs
    seq += [finals * last]  # at::stack of the final hidden states
    if cell.lstm:
        seq += [finals * batch * cell.hidden * e]  # and of the final cell states
    return seq


def _packed_forward(cell: _Cell, sizes: list[int], e: int) -> list[int]:
    """``PackedLayer``: the batch shrinks from step to step; the rows that end are sliced off the hidden
    state into ``hiddens`` (an LSTM's cell state then outlives its step), concatenated at the end."""
    out, total = cell.out * e, sum(sizes)
    seq, owned_c, kept_c, last = [total * cell.gates * e], 0, 0, sizes[0]
    for b in sizes:
        if b < last:
            kept_c, owned_c = kept_c + owned_c, 0
        seq += _step(cell, b, e, True)
        if cell.lstm:
            seq, owned_c = [*seq, -owned_c], b * cell.hidden * e
        last = b
    final = sizes[0] * (out + (cell.hidden * e if cell.lstm else 0))
    return [*seq, total * out, final, -total * out, -total * cell.gates * e, -(kept_c + owned_c)]


def _packed_reverse(cell: _Cell, sizes: list[int], e: int) -> list[int]:
    """``ReversedPackedLayer``: from the last step back; where the batch grows, the hidden state is
    concatenated with the rows of the initial one that start there (freed after that step's cell)."""
    out, total = cell.out * e, sum(sizes)
    seq, owned_c, rows = [total * cell.gates * e], 0, sizes[-1]
    for b in reversed(sizes):
        grown = b * out if b > rows else 0
        seq.append(grown)
        if grown and cell.lstm:
            seq, owned_c = [*seq, b * cell.hidden * e, -owned_c], b * cell.hidden * e
        seq += [*_step(cell, b, e, True), -grown]
        if cell.lstm:
            seq, owned_c = [*seq, -owned_c], b * cell.hidden * e
        rows = b
    return [*seq, total * out, -(total - sizes[0]) * out, -total * cell.gates * e]


def packed_sequence(cell: _Cell, sizes: list[int], num_layers: int, dirs: int, e: int) -> list[int]:
    """Signed allocation sizes of one packed ``_rnn_impl`` call (PackedLayer, PackedBidirectionalLayer)."""
    data = sum(sizes) * cell.out * e  # one direction's packed output
    seq: list[int] = []
    prev = 0
    for _ in range(num_layers):
        seq += _packed_forward(cell, sizes, e)
        if dirs == 2:
            seq += [*_packed_reverse(cell, sizes, e), 2 * data, -2 * data]
        seq += [-prev]
        prev = dirs * data
    finals = num_layers * dirs * sizes[0]
    return [*seq, finals * cell.out * e, finals * cell.hidden * e if cell.lstm else 0]


def batch_sizes_of(t: Any) -> list[int] | None:
    """The values of a PackedSequence's ``batch_sizes`` (or of packing lengths): the fake trace keeps them real
    (fake_kernels.py); None for a fake tensor, whose values are unknown."""
    if is_fake(t) or not isinstance(t, torch.Tensor):
        return None
    return [int(v) for v in t.tolist()]


def _cell_of(params: list[torch.Tensor], hx: Any) -> _Cell:
    """The cell of a call: LSTM takes ``[h0, c0]`` (h0 P wide with a projection), the others one state."""
    gates = int(params[0].shape[0])
    if isinstance(hx, (list, tuple)):
        return _Cell(gates, int(hx[1].shape[-1]), int(hx[0].shape[-1]), True)
    hidden = int(hx.shape[-1])
    return _Cell(gates, hidden, hidden, False)


def native_matmul_scratch(x: torch.Tensor, info: CpuInfo) -> MatmulScratch | None:
    """The scratch of the cells' ``at::linear`` matmuls where ATen sends them to oneDNN (bfloat16): each is an
    ``addmm`` of ``[m, k] @ [k, n]`` (a ``[T, B, k]`` projection folded to ``T·B`` rows) on ``brg_matmul``,
    sized by :func:`.matmul.onednn_scratchpad` (on ``avx512_core_bf16`` or AMX; the weight goes transposed).
    None where that is not modelled here (another ISA or thread count); the note says so. Float32 and float16
    run ATen's gemm: no scratch. A batch-first input's first projection does not fold: :func:`_first_projection`."""
    if x.dtype != torch.bfloat16 or not onednn_matmul(x.dtype, 1 << 30, 1, info):
        return lambda m, k, n: 0
    if info.isa not in (MODELLED_ISA, AMX_ISA) or torch.get_num_threads() not in MODELLED_THREADS:
        return None
    nthr = torch.get_num_threads()

    def scratch(m: int, k: int, n: int) -> int:
        if not onednn_matmul(x.dtype, m * k, n, info):
            return 0  # checksize: small products stay on ATen's gemm
        # at::linear(input, weight): the weight goes as weight.t() (transposed tag; AMX copies it so)
        call = OnednnMatmul(1, k, m, 1, False, True) if n == 1 else OnednnMatmul(m, k, n, 1, False, True)
        size = onednn_scratchpad(call, nthr, info.isa, x.dtype)
        if size is None:
            raise _NotModelled
        return size
    return scratch


def _first_projection(x: torch.Tensor, params: list[Any], has_biases: bool, info: CpuInfo) -> int | None:
    """Scratch of ``linear_ih`` on a batch-first input's sequence-first view (``input.transpose(0, 1)``), where
    it is not a 2-D product: ``matmul`` runs ``bmm`` over copies (:func:`.matmul.linear_copies`, measured op
    by op in test_autocast_recurrent.py). None for a 2-D product (the fold's sizes apply); raises
    :class:`_NotModelled` where the batched call is not modelled."""
    view = x.transpose(0, 1)
    bias = params[1] if has_biases else None
    if not linear_batched(view, params[0], bias):
        return None
    size = matmul_scratch(aten.linear.default, (view, params[0], bias), {}, info)
    if size is None:
        raise _NotModelled
    return size


class _NotModelled(Exception):
    """A cell's matmul whose brgemm blocking the port refuses (oneDNN would pick another kernel)."""


def native_modelled(args: tuple[Any, ...], info: CpuInfo) -> bool:
    """Whether :func:`rule_native_infer` sizes this call's matmul scratch (always for float32 and float16)."""
    x, hx, params = args[0], args[1], args[2]
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        return True
    matmul = native_matmul_scratch(x, info)
    if matmul is None:
        return False
    cell, size, dirs = _cell_of(params, hx), int(x.shape[2]), 2 if bool(args[7]) else 1
    if cell.lstm and x.dtype == torch.bfloat16:
        return False  # the projection's matmul inside the LSTM cell is not added here
    seq_len, batch = _sequence_dims(x, bool(args[8]))
    try:
        matmul(batch, cell.out, cell.gates)
        for layer in range(int(args[4])):
            matmul(seq_len * batch, size if layer == 0 else dirs * cell.out, cell.gates)
        if bool(args[8]) and x.dtype == torch.bfloat16:
            _first_projection(x, params, bool(args[3]), info)
    except _NotModelled:
        return False
    return True


def _sequence_dims(x: torch.Tensor, batch_first: bool) -> tuple[int, int]:
    """(T, B) of a 3-D recurrent input."""
    return (int(x.shape[1]), int(x.shape[0])) if batch_first else (int(x.shape[0]), int(x.shape[1]))


def rule_native_infer(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool, info: CpuInfo) -> int:
    """``aten.{rnn_tanh,rnn_relu,gru,lstm}.input`` on native cells under inference mode. Arguments: input,
    hx (a list [h0, c0] for LSTM), params, has_biases, num_layers, dropout, train, bidirectional,
    batch_first. Dropout only runs with ``train`` (then the op is decomposed and traced op by op)."""
    x, hx, params, num_layers = args[0], args[1], args[2], int(args[4])
    bidirectional, batch_first = bool(args[7]), bool(args[8])
    if x.dim() != 3:
        return 0  # unbatched input: nn.RNNBase adds the batch dimension before the op, so 3-D always
    seq_len, batch = _sequence_dims(x, batch_first)
    cell = _cell_of(params, hx)
    copy_first = batch_first and bool(params[0].requires_grad) and seq_len > 1 and batch > 1
    # an LSTM's cells (projection matmuls) and blockings the matmul port refuses: not added (the note says so)
    matmul = None if cell.lstm else native_matmul_scratch(x, info)
    shape = (cell, seq_len, batch, int(x.shape[2]), num_layers, 2 if bidirectional else 1, x.element_size(),
             copy_first)  # copy_first (trainable weights: the fold) and a batched first projection exclude each other
    try:
        batched = matmul is not None and batch_first and x.dtype == torch.bfloat16
        seq = native_sequence(*shape, matmul, _first_projection(x, params, bool(args[3]), info) if batched else None)
    except _NotModelled:
        seq = native_sequence(*shape, None)
    fresh = sum(nbytes(t) for t in out)
    return max(alloc_peak(seq) - fresh, 0)


def rule_packed_infer(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool, info: CpuInfo) -> int:
    """``aten.{rnn_tanh,rnn_relu,gru,lstm}.data`` (a PackedSequence) under inference mode. Arguments: data,
    batch_sizes, hx, params, has_biases, num_layers, dropout, train, bidirectional. Without the batch
    sizes' values (a fake tensor: they came from the weights) nothing is modelled: rnn.recurrent_note says so."""
    sizes = batch_sizes_of(args[1])
    if sizes is None or not sizes:
        return 0
    seq = packed_sequence(_cell_of(args[3], args[2]), sizes, int(args[5]), 2 if bool(args[8]) else 1,
                          args[0].element_size())
    return max(alloc_peak(seq) - sum(nbytes(t) for t in out), 0)


def _is_contiguous(sizes: list[int], strides: list[int]) -> bool:
    """Whether a strided view is dense row-major (``Tensor::is_contiguous``: size-1 dims' strides ignored)."""
    expected = 1
    for size, stride in zip(reversed(sizes), reversed(strides)):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def rule_pack(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool, info: CpuInfo) -> int:
    """``aten._pack_padded_sequence(input, lengths, batch_first)`` (PackedSequence.cpp): each block of steps
    that shares a batch size is sliced from the time-major input and made ``contiguous()`` (a copy unless the
    slice is dense), and all blocks live until ``at::cat`` has made the packed data."""
    lengths = batch_sizes_of(args[1])
    if not lengths:
        return 0
    x, batch_first = args[0], bool(args[2])
    sizes, strides = list(x.shape), list(x.stride())
    if batch_first:
        sizes[0], sizes[1], strides[0], strides[1] = sizes[1], sizes[0], strides[1], strides[0]
    row = x.element_size()
    for size in sizes[2:]:
        row *= size
    copies, prev, batch = [], 0, len(lengths)
    for i in range(batch):
        length = lengths[batch - 1 - i]
        if length > prev:
            block = [length - prev, batch - i, *sizes[2:]]
            if not _is_contiguous(block, strides):
                copies.append(block[0] * block[1] * row)
            prev = length
    fresh = sum(nbytes(t) for t in out)
    return max(alloc_peak([*copies, fresh, *(-c for c in copies)]) - fresh, 0)


# The ops whose inference-mode call runs the whole native stack (lstm.input only off oneDNN: rnn.py).
NATIVE_INFER = (aten.gru.input, aten.rnn_tanh.input, aten.rnn_relu.input)
PACKED = (aten.gru.data, aten.rnn_tanh.data, aten.rnn_relu.data, aten.lstm.data)
WORKSPACE = {**dict.fromkeys(NATIVE_INFER, rule_native_infer), **dict.fromkeys(PACKED, rule_packed_infer),
             aten._pack_padded_sequence.default: rule_pack}
