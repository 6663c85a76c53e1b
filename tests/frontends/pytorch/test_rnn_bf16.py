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
from nnmem.frontends.pytorch.workspace.matmul import MODELLED_ISA, MODELLED_THREADS

BF16 = torch.bfloat16


def _require_modelled_cpu() -> None:
    if not torch.backends.mkldnn.is_available() or cpu.describe().isa != MODELLED_ISA:
        pytest.skip(f"bfloat16 matmuls are modelled on ISA {MODELLED_ISA}; this CPU runs {cpu.describe().isa}")


def test_bf16_native_recurrent_inference_scratch_matches_measurement(torch_threads: Callable[[int], None]) -> None:
    _require_modelled_cpu()
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
    _require_modelled_cpu()
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
