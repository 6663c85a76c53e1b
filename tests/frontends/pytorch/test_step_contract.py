"""The training step is the one a user's loop runs: its output and loss stay live through the optimizer step
(they are the loop's local variables until the next iteration replaces them)."""

from __future__ import annotations

import torch
from torch import nn

import nnmem


def test_output_lives_through_the_optimizer_step() -> None:
    model, x = nn.Linear(64, 4096, bias=False), torch.randn(256, 64)  # output 4 MiB, weights 1 MiB
    report = nnmem.estimate(model, (x,), optimizer="adam")
    output = 256 * 4096 * 4
    weights = 64 * 4096 * 4
    step = [p for p in report.timeline if p.phase == "optimizer"]
    assert step, "the trace has an optimizer phase"
    # live in the optimizer step: weights, gradients, two Adam moments, the input and the 4 MiB output
    assert max(p.tensor_bytes for p in step) >= 4 * weights + output
    measured = nnmem.measure(model, (x,), optimizer="adam")
    assert abs(report.peaks["allocator"] - measured.peaks["allocator"]) <= 0.005 * measured.peaks["allocator"]
