"""bfloat16 GRU and RNN inference on ATen's native cells: their ``at::linear`` projections run through oneDNN's
brgemm matmul, whose scratchpad (workspace/matmul.py) lives inside the one ``aten.gru.input`` / ``rnn_*.input``
op; drawn at random, the op's scratch against the allocator's peak inside it."""

from __future__ import annotations

import random
from collections.abc import Callable

import calibrate_workspace as calibrate
import pytest
import torch
from torch import nn

import nnmem
from nnmem import cpu
from nnmem.frontends.pytorch.workspace import lstm_workspace_bytes
from nnmem.frontends.pytorch.workspace.matmul import AMX_ISA, MODELLED_ISA, MODELLED_THREADS

BF16 = torch.bfloat16


def _require_modelled_cpu(isas: tuple[str, ...] = (MODELLED_ISA,)) -> None:
    if not torch.backends.mkldnn.is_available() or cpu.describe().isa not in isas:
        pytest.skip(f"modelled on ISA {' and '.join(isas)}; this CPU runs {cpu.describe().isa}")


def test_bf16_native_recurrent_inference_scratch_matches_measurement(torch_threads: Callable[[int], None]) -> None:
    """The cells' matmuls on oneDNN's brgemm matmul: avx512_core_bf16, or AMX (workspace/matmul_amx.py)."""
    _require_modelled_cpu((MODELLED_ISA, AMX_ISA))
    rng, claimed, mismatches = random.Random(2), 0, []
    for _ in range(30):
        torch_threads(rng.choice(MODELLED_THREADS))
        kind = rng.choice(["gru", "rnn_tanh", "rnn_relu"])
        i, h = rng.choice([3, 8, 17, 32, 64, 100]), rng.choice([4, 16, 33, 64, 128])
        layers, bi, first = rng.choice([1, 1, 2, 3]), rng.random() < 0.4, rng.random() < 0.4
        seq, batch = rng.choice([1, 2, 5, 12]), rng.choice([1, 2, 3, 8])
        model = (nn.GRU(i, h, layers, bidirectional=bi, batch_first=first) if kind == "gru" else
                 nn.RNN(i, h, layers, nonlinearity=kind[4:], bidirectional=bi, batch_first=first)).to(BF16)
        x = torch.randn(batch, seq, i, dtype=BF16) if first else torch.randn(seq, batch, i, dtype=BF16)
        # under measure_ops' dispatch mode a weight's view loses requires_grad and a batch-first projection
        # takes bmm (matmul.linear_batched): frozen weights take it without the mode too; the trainable
        # weights' path is checked without a mode (test_autocast_recurrent.py)
        model.requires_grad_(not first)

        def step(model: nn.Module = model, x: torch.Tensor = x) -> None:
            with torch.inference_mode():
                model(x)

        rows = [r for r in calibrate.measure_ops(step, training=False)
                if r.name.startswith(f"aten.{kind}") and r.note is None]
        claimed += len(rows)
        mismatches += [f"{torch.get_num_threads()} threads {model} T{seq} B{batch}: measured {r.scratch:,} B, "
                       f"rule {r.predicted:,} B" for r in rows if r.predicted != r.scratch]
    assert not mismatches, "\n".join(mismatches)
    assert claimed >= 25


def test_bf16_batch_first_recurrent_inference_is_sized() -> None:
    """A batch-first input's first projection is ``bmm`` over copies (matmul.py ``linear_copies``): sized, no
    note (it was noted before)."""
    _require_modelled_cpu((MODELLED_ISA, AMX_ISA))
    model = nn.GRU(16, 32, batch_first=True).to(BF16)
    notes = nnmem.estimate(model, (torch.randn(4, 6, 16, dtype=BF16),), mode="infer").notes
    assert not any("matmuls inside" in n for n in notes), notes


def test_bf16_lstm_inference_scratch_is_at_most_a_kilobyte_high(torch_threads: Callable[[int], None]) -> None:
    """bfloat16 LSTM inference through oneDNN's RNN primitive (the brgemm kernels): bfloat16 states and weights in
    VNNI pairs, float32 gates; the registry's small per-thread arrays are taken at their upper end, so each op is
    estimated at most 1 KiB above the allocator's peak inside it and never below."""
    _require_modelled_cpu()
    rng, seen, off = random.Random(3), 0, []
    for _ in range(30):
        torch_threads(rng.choice(MODELLED_THREADS))
        i, h = rng.choice([3, 8, 17, 32, 64, 100]), rng.choice([4, 16, 33, 64, 128])
        layers, bi, first = rng.choice([1, 1, 2, 3]), rng.random() < 0.4, rng.random() < 0.3
        seq, batch = rng.choice([1, 2, 5, 12, 30]), rng.choice([1, 2, 3, 8])
        model = nn.LSTM(i, h, layers, bidirectional=bi, batch_first=first).to(BF16)
        x = torch.randn(batch, seq, i, dtype=BF16) if first else torch.randn(seq, batch, i, dtype=BF16)

        def step(model: nn.Module = model, x: torch.Tensor = x) -> None:
            with torch.inference_mode():
                model(x)

        for r in calibrate.measure_ops(step, training=False):
            if r.name.startswith("aten.lstm") and r.note is None:
                seen += 1
                if not 0 <= r.predicted - r.scratch <= 1024:
                    off.append(f"{torch.get_num_threads()} threads {model} {tuple(x.shape)}: measured "
                               f"{r.scratch:,} B, rule {r.predicted:,} B")
    assert not off, "\n".join(off)
    assert seen >= 25


def test_bf16_lstm_training_workspace_output_has_its_real_size() -> None:
    """``mkldnn_rnn_layer``'s training workspace (an output, saved for backward) in bfloat16: 2-byte gates, states
    and cell states, float32 diff sections (the meta kernel's is far smaller; rnn.lstm_workspace_bytes)."""
    if not torch.backends.mkldnn.is_available() or not cpu.describe().onednn_bf16:
        pytest.skip("no bfloat16 LSTM through oneDNN on this CPU")
    rng, misses = random.Random(4), []
    for _ in range(8):
        seq, batch = rng.choice([1, 5, 14, 28]), rng.choice([1, 3, 7])
        size, hidden = rng.choice([12, 39, 200]), rng.choice([16, 77, 128])
        x = torch.randn(seq, batch, size, dtype=BF16)
        w_ih, w_hh = torch.randn(4 * hidden, size, dtype=BF16), torch.randn(4 * hidden, hidden, dtype=BF16)
        b_ih, b_hh = torch.randn(4 * hidden, dtype=BF16), torch.randn(4 * hidden, dtype=BF16)
        h0, c0 = torch.zeros(batch, hidden, dtype=BF16), torch.zeros(batch, hidden, dtype=BF16)
        out = torch.ops.aten.mkldnn_rnn_layer(x, w_ih, w_hh, b_ih, b_hh, h0, c0, False, [seq], 2, hidden, 1, True,
                                              False, False, True)
        real, rule = out[3].untyped_storage().nbytes(), lstm_workspace_bytes(seq, batch, size, hidden, 2)
        if real != rule:
            misses.append(f"T{seq} B{batch} I{size} H{hidden}: real {real:,} B, rule {rule:,} B")
    assert not misses, "\n".join(misses)
