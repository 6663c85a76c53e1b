"""Inference-mode kernels that reach the tracker whole: a Linear on an input whose leading dimensions do not
fold (ATen copies it contiguous) and eval-mode dropout (ATen returns the input itself). Estimated against the
same step measured."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import nnmem

SOURCE = """
    import torch
    from torch import nn


    class Permuted(nn.Module):
        def __init__(self, perm, bias):
            super().__init__()
            self.perm = perm
            self.linear = nn.Linear(24, 40, bias=bias)
            self.drop = nn.Dropout(0.2)

        def forward(self, x):
            return self.linear(self.drop(torch.relu_(x.permute(*self.perm) * 2)))


    def make(batch):
        torch.manual_seed(0)
        return Permuted({perm}, {bias}), torch.randn(batch, *{shape})
"""


@pytest.mark.parametrize("shape, perm, bias", [
    ((24, 50), (0, 2, 1), True),          # x.transpose(1, 2): leading dims do not fold -> a contiguous copy
    ((24, 50), (0, 2, 1), False),
    ((50, 24), (1, 0, 2), True),          # sequence-first
    ((50, 24), (0, 1, 2), False),         # contiguous: a view, no copy
    ((3, 5, 24, 7), (0, 1, 2, 4, 3), True),
    ((1, 24, 50), (0, 1, 3, 2), True),    # a size-1 dimension does not matter
])
def test_inference_linear_and_dropout_match_the_measured_step(tmp_path: Path, shape: tuple[int, ...],
                                                              perm: tuple[int, ...], bias: bool) -> None:
    path = tmp_path / "permuted.py"
    path.write_text(textwrap.dedent(SOURCE.format(perm=perm, bias=bias, shape=shape)))
    spec = f"{path}:make"
    estimated = nnmem.estimate(spec, batch=6, mode="infer").peaks["allocator"]
    measured = nnmem.measure(spec, batch=6, mode="infer").peaks["allocator"]
    assert abs(estimated - measured) <= 0.005 * measured, (estimated, measured)
