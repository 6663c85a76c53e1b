"""The fused transformer kernels (``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` inference fast
paths) in reduced precision and under torch.autocast: the tracker replays them op by op (fused.py); drawn at
random, estimated against the same step run for real. Before, these were one float32 kernel each with a note
(the zoo's encoder +15 % under autocast bf16, -1.8 % in half bf16)."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

import nnmem
from nnmem import cpu
from nnmem.frontends.pytorch.measure import measure_step
from nnmem.frontends.pytorch.workspace._common import NOT_MODELLED

HOST = cpu.describe()


def _scratch_unmodelled_here(notes: tuple[str, ...], dtype: torch.dtype) -> bool:
    """Whether every note says only that oneDNN's kernel scratch is not modelled on this CPU, for a type this CPU
    sends to oneDNN (bf16 from AVX-512, fp16 with AVX512-FP16: Sapphire Rapids, not AMD Zen 4): then the
    tensor level must still be exact and the allocator level at least what the estimate says."""
    through_onednn = HOST.onednn_bf16 if dtype == torch.bfloat16 else HOST.onednn_fp16
    return through_onednn and bool(notes) and all(f"matmul through oneDNN (ISA {HOST.isa}): {NOT_MODELLED}" in n
                                                  for n in notes)


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int, need_weights: bool, average: bool, mask: str) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.need_weights, self.average, self.mask = need_weights, average, mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, steps, _ = x.shape
        masks: dict[str, torch.Tensor] = {}
        if self.mask == "padding":
            padding = torch.zeros(batch, steps, dtype=torch.bool, device=x.device)
            padding[:, -1] = True
            masks["key_padding_mask"] = padding
        elif self.mask == "causal":
            masks["attn_mask"] = torch.triu(torch.ones(steps, steps, dtype=torch.bool, device=x.device), 1)
        out, weights = self.mha(x, x, x, need_weights=self.need_weights, average_attn_weights=self.average,
                                **masks)
        return out if weights is None else out + weights.sum()


class _Encoder(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, norm_first: bool, activation: str, layers: int) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(dim, heads, hidden, batch_first=True, norm_first=norm_first,
                                           activation=activation)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)


def _draw(rng: random.Random) -> tuple[nn.Module, torch.Tensor]:
    heads = rng.choice([1, 2, 4])
    dim = heads * rng.choice([8, 16, 32])
    steps, batch = rng.choice([1, 3, 16, 40]), rng.choice([1, 2, 5])
    if rng.random() < 0.5:
        model: nn.Module = _Attention(dim, heads, rng.random() < 0.5, rng.random() < 0.5,
                                      rng.choice(["none", "padding", "causal"]))
    else:
        model = _Encoder(dim, heads, rng.choice([2 * dim, 3 * dim + 5]), rng.random() < 0.5,
                         rng.choice(["relu", "gelu"]), rng.choice([1, 2]))
    return model.eval(), torch.randn(batch, steps, dim)


@pytest.mark.parametrize("technique", ["autocast:bf16", "autocast:fp16", "half:bf16", "half:fp16"])
def test_fused_attention_in_lower_precision_equals_the_real_step(technique: str) -> None:
    rng, misses = random.Random(["autocast:bf16", "autocast:fp16", "half:bf16", "half:fp16"].index(technique)), []
    precision = technique.partition(":")[2] if technique.startswith("autocast") else technique
    dtype = torch.bfloat16 if technique.endswith("bf16") else torch.float16
    for _ in range(4):
        model, x = _draw(rng)
        estimated = nnmem.estimate(model, (x,), mode="infer", precision=precision)
        nnmem.apply_technique(model, technique)
        measured = measure_step(model, (x,), mode="infer", optimizer=None, loss_fn=None, target=None, name="draw",
                                device="cpu", meta={})
        if _scratch_unmodelled_here(estimated.notes, dtype):
            if (estimated.peaks["tensor"] != measured.peaks["tensor"]
                    or estimated.peaks["allocator"] > measured.peaks["allocator"]):
                misses.append(f"{type(model).__name__} {list(x.shape)}: estimated {estimated.peaks}, "
                              f"measured {measured.peaks} (oneDNN's scratch noted)")
        elif estimated.notes:
            misses.append(f"{type(model).__name__} {list(x.shape)}: noted {estimated.notes}")
        elif estimated.peaks != measured.peaks:
            misses.append(f"{type(model).__name__} {list(x.shape)}: estimated {estimated.peaks}, "
                          f"measured {measured.peaks}")
    assert not misses, "\n".join(misses)


def test_the_zoo_encoder_under_autocast_has_no_note() -> None:
    """No note of the fused kernel; a CPU whose bf16 matmuls' oneDNN scratch is not modelled says only that."""
    report = nnmem.estimate("transformer_encoder", batch=8, mode="infer", precision="bf16")
    assert not report.notes or _scratch_unmodelled_here(report.notes, torch.bfloat16), report.notes
