"""Estimate vs a real measurement of the same step, on every zoo model (one configuration each).

The whole grid (every model × SGD, momentum, Adam, AdamW, inference) is ``benchmarks/accuracy.py``; this
subset rotates the configurations over the models so that each optimizer and inference are covered, and
adds both modes for the recurrent nets, whose oneDNN / native kernels are the hardest to model.

A case whose step meets a kernel path that no workspace rule models on this CPU (a bfloat16 convolution
through oneDNN, say: :attr:`WorkspaceRules.notes`) is skipped with those notes as the reason: it would pass
or fail by the CPU it runs on, not by the rules.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import nnmem  # noqa: E402
from nnmem import zoo  # noqa: E402
from nnmem.frontends.pytorch.step import trace_fake_step  # noqa: E402
from nnmem.frontends.pytorch.workspace import WorkspaceRules  # noqa: E402
from nnmem.loader import build  # noqa: E402

pytestmark = pytest.mark.accuracy

CONFIGS = (("train", "sgd"), ("train", "momentum"), ("train", "adam"), ("train", "adamw"), ("infer", "sgd"))
CASES = [(name, *CONFIGS[i % len(CONFIGS)]) for i, name in enumerate(zoo.ACCURACY_ZOO)]
CASES += [("lstm_lm", "infer", "sgd"), ("lstm_lm", "train", "adam"), ("gru_classifier", "infer", "sgd"),
          ("gru_classifier", "train", "adamw")]
CASES = list(dict.fromkeys(CASES))

TENSOR_MAX, ALLOCATOR_MAX = 0.005, 0.10  # the per-case targets (the median target is the benchmark's)
BATCH = 4


def unmodelled(name: str, mode: str, optimizer: str) -> tuple[str, ...]:
    """The kernel paths of this step whose scratch no workspace rule models on this CPU (a fake trace)."""
    built = build(zoo.resolve(name), BATCH, name)
    rules = WorkspaceRules()
    trace_fake_step(built.model, tuple(built.inputs or ()), mode=mode, optimizer=optimizer, loss_fn=built.loss_fn,
                    target=built.target, rules=rules)
    return rules.notes


@pytest.mark.parametrize(("name", "mode", "optimizer"), CASES)
def test_estimate_matches_measurement(name: str, mode: str, optimizer: str) -> None:
    notes = unmodelled(name, mode, optimizer)
    if notes:
        pytest.skip("; ".join(notes))
    est = nnmem.estimate(name, mode=mode, optimizer=optimizer, batch=BATCH)
    meas = nnmem.measure(name, mode=mode, optimizer=optimizer, batch=BATCH, timeout_s=300)
    for level, limit in (("tensor", TENSOR_MAX), ("allocator", ALLOCATOR_MAX)):
        e, m = est.peaks[level], meas.peaks[level]
        assert abs(e - m) <= limit * m, f"{level}: estimated {e:,} B, measured {m:,} B ({(e - m) / m:+.2%})"
    assert est.parameter_count == meas.parameter_count
