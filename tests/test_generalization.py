"""Estimate vs a real measurement on the fixed CI sample of the randomized suite (benchmarks/generalization.py).

The sample is the first cases of the fixed seed's draw, not hand-picked. Per case the targets are the
issue's: tensor level within 0.5 %, allocator level within 10 % of the measurement. A case whose estimate
notes a kernel path of this CPU that no rule models is skipped with the note. A case that misses today is
``xfail(strict=True)`` with the measured figures: when a fix makes it pass, the test fails, and the entry goes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import generalization  # noqa: E402

import nnmem  # noqa: E402

pytestmark = pytest.mark.accuracy

TENSOR_MAX, ALLOCATOR_MAX = 0.005, 0.10

KNOWN_MISSES: dict[int, str] = {
}
"""Sample cases that miss today, by index, with the measured figures (an AVX-512 CPU with bf16)."""

RANDOM_STEPS: dict[int, str] = {
    16: "Wav2Vec2ForCTC train adagrad b2: LayerDrop skips a layer when torch.rand draws under 0.1, so the real "
        "step's peak differs between steps (1,191,286 B with a layer skipped, 1,865,206 B with none; the estimate "
        "runs every layer: 1,865,206 B; SpecAugment's numpy mask moves no peak at this size)",
}
"""Sample cases whose step draws at random what it runs: the estimate takes each draw the way that holds the most (a
layer kept, a mask at its largest) and says so in a note, so it must hold the measured peak (the safe direction),
not match it."""


def _param(case: generalization.Case) -> object:
    marks = []
    if case.index in KNOWN_MISSES:
        marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[case.index]))
    return pytest.param(case, id=case.label, marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in generalization.sample()])
def test_estimate_matches_measurement(case: generalization.Case) -> None:
    built = case.build()
    est = nnmem.estimate(built.model, built.inputs, **case.step_args)
    notes = generalization.unmodelled_notes(est)
    if notes:
        pytest.skip(notes)
    meas = nnmem.measure(built.model, built.inputs, timeout_s=300, **case.step_args)
    if case.index in RANDOM_STEPS:
        assert any("upper bound" in note for note in est.notes), RANDOM_STEPS[case.index]
        for level in ("tensor", "allocator"):
            assert est.peaks[level] >= meas.peaks[level], f"{level}: {RANDOM_STEPS[case.index]}"
        return
    for level, limit in (("tensor", TENSOR_MAX), ("allocator", ALLOCATOR_MAX)):
        e, m = est.peaks[level], meas.peaks[level]
        assert abs(e - m) <= limit * m, f"{level}: estimated {e:,} B, measured {m:,} B ({(e - m) / m:+.2%}); " \
                                        f"{built.config}"
