"""Recurrent layers: the estimate against a real measurement of the same step, on a seeded random sample.

Each case draws ``nn.RNN`` (tanh, relu), ``nn.LSTM`` (some with ``proj_size``) or ``nn.GRU`` with 1-4 layers,
bidirectional or not, ``batch_first`` or not, with or without biases and inter-layer dropout, batch 1 and
odd sizes, under a linear head; train (Adam) or inference. The kernels depend on the CPU; run this file
under caps too (``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2``): a case whose estimate notes a kernel
path no rule models on this CPU is skipped with the note. ``benchmarks/generalization.py`` draws more.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import nnmem

_spec = importlib.util.spec_from_file_location(
    "calibrate_workspace", Path(__file__).resolve().parents[3] / "benchmarks" / "calibrate_workspace.py")
assert _spec is not None and _spec.loader is not None
calibrate = importlib.util.module_from_spec(_spec)
sys.modules.setdefault(_spec.name, calibrate)
_spec.loader.exec_module(calibrate)

pytestmark = pytest.mark.accuracy

SEED, CASES = 18, 12
TENSOR_MAX, ALLOCATOR_MAX = 0.005, 0.02
KINDS: dict[str, Any] = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}


class Recurrent(nn.Module):
    """A recurrent module under a linear head, optionally over a packed batch."""

    def __init__(self, rnn: nn.RNNBase, lengths: list[int] | None = None, enforce_sorted: bool = False) -> None:
        super().__init__()
        self.rnn, self.lengths, self.enforce_sorted = rnn, lengths, enforce_sorted
        width = (rnn.proj_size or rnn.hidden_size) * (2 if rnn.bidirectional else 1)
        self.head = nn.Linear(width, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.lengths is None:
            return self.head(self.rnn(x)[0])
        packed = nn.utils.rnn.pack_padded_sequence(x, torch.tensor(self.lengths), batch_first=self.rnn.batch_first,
                                                   enforce_sorted=self.enforce_sorted)
        out, _ = nn.utils.rnn.pad_packed_sequence(self.rnn(packed)[0], batch_first=self.rnn.batch_first)
        return self.head(out)


@dataclass(frozen=True, slots=True)
class Case:
    kind: str
    mode: str
    batch: int
    steps: int
    features: int
    kwargs: tuple[tuple[str, Any], ...]

    def build(self) -> tuple[nn.Module, torch.Tensor]:
        torch.manual_seed(0)
        kw = dict(self.kwargs)
        rnn = KINDS[self.kind](self.features, **kw)
        shape = (self.batch, self.steps) if kw["batch_first"] else (self.steps, self.batch)
        return Recurrent(rnn), torch.randn(*shape, self.features)

    def __str__(self) -> str:
        text = " ".join(f"{k}={v}" for k, v in self.kwargs)
        return f"{self.kind}-{self.mode}-b{self.batch}-T{self.steps}-I{self.features}-{text}"


def draw(rng: random.Random, kind: str, mode: str) -> Case:
    """One configuration of ``kind``: every other choice from ``rng``."""
    layers = rng.choice([1, 2, 2, 3, 4])
    hidden = rng.randint(2, 40)
    kw: dict[str, Any] = {"hidden_size": hidden, "num_layers": layers, "bidirectional": rng.random() < 0.5,
                          "batch_first": rng.random() < 0.5, "bias": rng.random() < 0.8,
                          "dropout": rng.choice([0.0, 0.3]) if layers > 1 else 0.0}
    if kind == "rnn":
        kw["nonlinearity"] = rng.choice(["tanh", "relu"])
    if kind == "lstm" and rng.random() < 0.4:
        kw["proj_size"] = rng.randint(1, hidden - 1)
    return Case(kind, mode, rng.choice([1, 2, 3, 5, 7]), rng.randint(1, 16), rng.randint(1, 24), tuple(kw.items()))


def sample(seed: int = SEED, cases: int = CASES) -> list[Case]:
    """The fixed sample: kinds and modes in turn, the rest drawn from ``seed``."""
    rng = random.Random(seed)
    modes = ("infer", "train")
    return [draw(rng, ("rnn", "lstm", "gru")[i % 3], modes[(i // 3) % 2]) for i in range(cases)]


def _compare(model: nn.Module, x: torch.Tensor, mode: str) -> None:
    optimizer = "adam" if mode == "train" else None
    est = nnmem.estimate(model, (x,), mode=mode, optimizer=optimizer)
    if est.notes:
        pytest.skip("; ".join(est.notes))
    meas = nnmem.measure(model, (x,), mode=mode, optimizer=optimizer, timeout_s=120)
    for level, limit in (("tensor", TENSOR_MAX), ("allocator", ALLOCATOR_MAX)):
        e, m = est.peaks[level], meas.peaks[level]
        assert abs(e - m) <= limit * m, f"{level}: estimated {e:,} B, measured {m:,} B ({(e - m) / m:+.2%})"


@pytest.mark.parametrize("case", sample(), ids=str)
def test_recurrent_estimate_matches_measurement(case: Case) -> None:
    model, x = case.build()
    _compare(model, x, case.mode)


# PackedSequence: (kind, layers, bidirectional, proj_size, lengths); inference runs the whole packed stack in one
# ``aten.<kind>.data`` op, whose scratch the rule replays from the batch sizes.
PACKED = [("gru", 1, False, 0, [12, 5, 7]), ("rnn", 2, True, 0, [12, 5, 7, 12]), ("lstm", 2, True, 0, [9, 3, 7, 1, 4]),
          ("lstm", 1, False, 6, [9, 3, 7, 1, 4]), ("rnn", 3, False, 0, [1])]


def _packed(kind: str, layers: int, bidirectional: bool, proj: int,
            lengths: list[int]) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    kw: dict[str, Any] = {"proj_size": proj} if proj else {}
    rnn = KINDS[kind](6, 20, layers, bidirectional=bidirectional, **kw)
    return Recurrent(rnn, lengths).eval(), torch.randn(max(lengths), len(lengths), 6)


@pytest.mark.parametrize(("kind", "layers", "bidirectional", "proj", "lengths"), PACKED)
def test_packed_inference_rule_matches_kernel(kind: str, layers: int, bidirectional: bool, proj: int,
                                              lengths: list[int]) -> None:
    model, x = _packed(kind, layers, bidirectional, proj, lengths)

    def step() -> None:
        with torch.inference_mode():
            model(x)

    op = {"rnn": "rnn_tanh", "lstm": "lstm", "gru": "gru"}[kind]
    (row,) = [r for r in calibrate.measure_ops(step, training=False) if r.name == f"aten.{op}.data"]
    assert row.predicted == row.scratch
    assert row.note is None  # real batch sizes: modelled


# Packed estimates: (kind, layers, bidirectional, proj_size, lengths, batch_first, enforce_sorted); the lengths are
# real in the fake trace, so packing, the packed stack and padding are sized from them. (batch_first with
# enforce_sorted leaves the head a transposed input, whose inference matmul scratch is not modelled yet.)
PACKED_STEPS = [("gru", 2, True, 0, [7, 3, 5], True, False), ("rnn", 1, True, 0, [12, 12, 5, 1], False, True),
                ("lstm", 2, True, 0, [9, 3, 7, 1, 4], True, False), ("lstm", 1, False, 6, [9, 7, 4, 3, 1], False, True)]


@pytest.mark.parametrize("mode", ["infer", "train"])
@pytest.mark.parametrize(("kind", "layers", "bidirectional", "proj", "lengths", "batch_first", "enforce_sorted"),
                         PACKED_STEPS)
def test_packed_estimate_matches_measurement(mode: str, kind: str, layers: int, bidirectional: bool, proj: int,
                                             lengths: list[int], batch_first: bool, enforce_sorted: bool) -> None:
    torch.manual_seed(0)
    kw: dict[str, Any] = {"proj_size": proj} if proj else {}
    rnn = KINDS[kind](6, 20, layers, bidirectional=bidirectional, batch_first=batch_first, **kw)
    model = Recurrent(rnn, lengths, enforce_sorted)
    shape = (len(lengths), max(lengths), 6) if batch_first else (max(lengths), len(lengths), 6)
    est = nnmem.estimate(model, (torch.randn(*shape),), mode=mode, optimizer="adam" if mode == "train" else None)
    assert not any("PackedSequence" in note for note in est.notes)  # real batch sizes: modelled
    _compare(model, torch.randn(*shape), mode)
