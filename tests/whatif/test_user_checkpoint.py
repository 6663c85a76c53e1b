"""A model that calls torch.utils.checkpoint itself (HuggingFace's gradient checkpointing does) is estimated
with the generator states its regions keep, like nnmem's own plans: estimate equals the real step."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import nnmem


class SelfCheckpointed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
                                    for _ in range(4))
        self.head = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + checkpoint(block, x, use_reentrant=False)
        return self.head(x)


def test_a_models_own_checkpoint_regions_are_counted() -> None:
    torch.manual_seed(0)
    model, inputs = SelfCheckpointed(), (torch.randn(16, 8, 32),)
    est = nnmem.estimate(model, inputs, optimizer="adam")
    meas = nnmem.measure(model, inputs, optimizer="adam", timeout_s=120)
    # the allocator level (the profiler's) sees the generator states; a measurement's tensor level does not
    assert est.peaks["allocator"] == meas.peaks["allocator"], (est.peaks, meas.peaks)
