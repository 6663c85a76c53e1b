"""Strided float32 1x1 forward convolutions through oneDNN: ``jit_1x1`` with its "reduce to unit stride" buffer
where the output tiles the input, the direct kernel (no buffer; its first convolution reads nchw below 16
channels) where it does not. Seeded draws against the profiler's measurement of the same op."""

from __future__ import annotations

import random
from collections.abc import Callable

import calibrate_workspace as calibrate
import pytest
import torch
from torch import nn


def test_strided_1x1_forward_scratch_matches_measurement(torch_threads: Callable[[int], None]) -> None:
    """Every claimed op (no note) equals the allocator's peak inside it minus its output, at 1-4 threads; every
    draw whose output does not tile its input is claimed (stride 2-4, 1-D and 2-D)."""
    if not torch.backends.mkldnn.is_available():
        pytest.skip("ATen runs these convolutions through oneDNN only in a build with mkldnn")
    rng, failures, ragged_noted = random.Random(5), [], []
    for _ in range(50):
        torch_threads(rng.choice((1, 2, 3, 4)))
        c, o = rng.choice([1, 3, 4, 8, 15, 16, 17, 32, 48]), rng.choice([4, 16, 24, 32, 33])
        s, n, size = rng.choice([2, 2, 3, 4]), rng.randint(1, 8), rng.choice([8, 9, 12, 13, 16, 17, 24])
        one_d, bias = rng.random() < 0.3, rng.random() < 0.5
        conv = (nn.Conv1d if one_d else nn.Conv2d)(c, o, 1, s, bias=bias)
        x = torch.randn(n, c, 2 * size) if one_d else torch.randn(n, c, size, size)

        def step(conv: nn.Module = conv, x: torch.Tensor = x) -> None:
            with torch.inference_mode():
                conv(x)

        (row,) = [r for r in calibrate.measure_ops(step, training=False) if "conv" in r.name]
        what = f"{torch.get_num_threads()} threads {conv} {tuple(x.shape)}"
        ragged = x.shape[-1] % s != 0 or not one_d and x.shape[-2] % s != 0
        if row.note is None and row.predicted != row.scratch:
            failures.append(f"{what}: measured {row.scratch:,} B, rule {row.predicted:,} B")
        if ragged and row.note is not None:
            ragged_noted.append(f"{what}: {row.note}")
    assert not failures, "\n".join(failures)
    assert not ragged_noted, "\n".join(ragged_noted)
