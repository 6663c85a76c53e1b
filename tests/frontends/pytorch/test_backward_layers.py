"""Backward ops are named after the layer whose forward made their autograd node (the tracker names nodes in
module post-hooks: its dispatch mode runs below autograd, where outputs have no grad_fn yet)."""

from __future__ import annotations

import torch
from torch import nn

import nnmem


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(self.norm(x)))  # functional ops of the block itself


class _Chain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block() for _ in range(3))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x * 2.0)


def test_backward_ops_are_named_after_their_forward_layer() -> None:
    report = nnmem.estimate(_Chain(), (torch.randn(8, 5, 16),), optimizer="sgd")
    backward = [p.layer for p in report.timeline if p.phase == "backward"]
    assert {"head", "blocks.2.fc", "blocks.1.norm", "blocks.0"} <= set(backward)
    # the blocks' backward runs in reverse: every op of blocks.2 comes before the first of blocks.1
    order = [int(layer.split(".")[1]) for layer in backward if layer.startswith("blocks.")]
    assert order == sorted(order, reverse=True)
    assert order[0] == 2 and order[-1] == 0


def test_inference_names_no_backward() -> None:
    report = nnmem.estimate(_Chain(), (torch.randn(8, 5, 16),), mode="infer")
    assert all(p.phase == "forward" for p in report.timeline)
