"""The attention rules (workspace/attention.py) against real measurements of whole steps.

Seeded random configurations of nn.MultiheadAttention, TransformerEncoder/DecoderLayer (the inference fast
path's fused kernels in several configurations) and F.scaled_dot_product_attention (the CPU flash kernel, with
grouped-query heads, masks and the dropout's math path), at batch 1 and odd sizes, train and infer, plus a
HuggingFace Llama with grouped-query attention. Each estimate is compared with ``nnmem.measure`` of the same
step. A case whose estimate says a kernel path of this CPU is not modelled is skipped with that note; run this
file under ``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`` too.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nnmem
from nnmem.frontends.pytorch.workspace._common import NOT_MODELLED

TENSOR_MAX, ALLOCATOR_MAX = 0.005, 0.02


class Mha(nn.Module):
    """nn.MultiheadAttention on x (self) or on x and a memory (cross), with the drawn masks."""

    def __init__(self, mha: nn.MultiheadAttention, cross: bool, need_weights: bool, mask: str) -> None:
        super().__init__()
        self.mha, self.cross, self.need_weights, self.mask = mha, cross, need_weights, mask

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        kv = memory if self.cross else x
        steps = x.shape[1 if self.mha.batch_first else 0]
        batch = x.shape[0 if self.mha.batch_first else 1]
        attn = nn.Transformer.generate_square_subsequent_mask(steps) if self.mask in ("causal", "both") else None
        padding = None
        if self.mask in ("padding", "both"):
            padding = torch.zeros(batch, kv.shape[1 if self.mha.batch_first else 0], dtype=torch.bool)
            padding[:, -2:] = True
        return self.mha(x, kv, kv, attn_mask=attn, key_padding_mask=padding, need_weights=self.need_weights)[0]


class Stack(nn.Module):
    """An encoder or decoder layer stack called with the drawn masks."""

    def __init__(self, stack: nn.Module, decoder: bool, mask: str) -> None:
        super().__init__()
        self.stack, self.decoder, self.mask = stack, decoder, mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, steps = x.shape[0], x.shape[1]
        causal = self.mask in ("causal", "both")
        attn = nn.Transformer.generate_square_subsequent_mask(steps) if causal else None
        padding = None
        if self.mask in ("padding", "both"):
            padding = torch.zeros(batch, steps, dtype=torch.bool)
            padding[:, -3:] = True
        if self.decoder:
            return self.stack(x, x, tgt_mask=attn, tgt_is_causal=causal, tgt_key_padding_mask=padding)
        return self.stack(x, mask=attn, src_key_padding_mask=padding, is_causal=causal)


class Sdpa(nn.Module):
    """Projections into F.scaled_dot_product_attention (grouped-query heads when kv_heads < heads)."""

    def __init__(self, dim: int, heads: int, kv_heads: int, mask: str, dropout: float) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.mask, self.dropout = heads, kv_heads, mask, dropout
        self.head_dim = dim // heads
        self.q, self.kv = nn.Linear(dim, dim), nn.Linear(dim, 2 * kv_heads * self.head_dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, n, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        keep = torch.ones(n, n, dtype=torch.bool).tril()
        mask = {"bool": keep, "float": torch.zeros(b, 1, n, n).masked_fill(~keep, float("-inf"))}.get(self.mask)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.mask == "causal",
                                           dropout_p=self.dropout if self.training else 0.0,
                                           enable_gqa=self.kv_heads != self.heads)
        return self.out(y.transpose(1, 2).reshape(b, n, -1))


Case = tuple[str, str, Callable[[random.Random], tuple[nn.Module, tuple[Any, ...]]]]


def _mha(cross: bool, need_weights: bool, mask: str, batch_first: bool = True) -> Callable[..., Any]:
    def make(rng: random.Random) -> tuple[nn.Module, tuple[Any, ...]]:
        heads = rng.choice([2, 4])
        embed, steps, batch = heads * rng.randint(6, 16), rng.randint(17, 41), rng.choice([1, 3, 5])
        model = Mha(nn.MultiheadAttention(embed, heads, batch_first=batch_first), cross, need_weights, mask)
        shape = (batch, steps, embed) if batch_first else (steps, batch, embed)
        return model, (torch.randn(shape), torch.randn(shape))
    return make


def _stack(decoder: bool, norm_first: bool, activation: str, mask: str, layers: int = 2) -> Callable[..., Any]:
    def make(rng: random.Random) -> tuple[nn.Module, tuple[Any, ...]]:
        heads = rng.choice([2, 4])
        d, ff, steps, batch = heads * rng.randint(6, 16), rng.randint(20, 150), rng.randint(9, 37), rng.choice([1, 3])
        kw: dict[str, Any] = {"dim_feedforward": ff, "activation": activation, "norm_first": norm_first,
                              "batch_first": True}
        if decoder:
            stack: nn.Module = nn.TransformerDecoder(nn.TransformerDecoderLayer(d, heads, **kw), layers)
        else:
            stack = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, heads, **kw), layers,
                                          enable_nested_tensor=False)
        return Stack(stack, decoder, mask), (torch.randn(batch, steps, d),)
    return make


def _sdpa(kv_ratio: int, mask: str, dropout: float = 0.0) -> Callable[..., Any]:
    def make(rng: random.Random) -> tuple[nn.Module, tuple[Any, ...]]:
        kv_heads = rng.choice([1, 2])
        heads, steps, batch = kv_heads * kv_ratio, rng.randint(23, 97), rng.choice([1, 2, 3])
        dim = heads * rng.choice([8, 16, 24])
        return Sdpa(dim, heads, kv_heads, mask, dropout), (torch.randn(batch, steps, dim),)
    return make


CASES: list[Case] = [
    ("mha self need_weights", "infer", _mha(False, True, "none")),
    ("mha self causal+padding", "infer", _mha(False, False, "both")),
    ("mha cross padding", "infer", _mha(True, False, "padding")),
    ("mha causal seq-first", "train", _mha(False, False, "causal", batch_first=False)),
    ("encoder post-norm relu", "infer", _stack(False, False, "relu", "none")),
    ("encoder pre-norm gelu causal", "infer", _stack(False, True, "gelu", "causal")),
    ("encoder pre-norm padding", "infer", _stack(False, True, "relu", "padding", layers=1)),
    ("encoder post-norm both masks", "infer", _stack(False, False, "gelu", "both")),
    ("encoder pre-norm", "train", _stack(False, True, "gelu", "padding")),
    ("decoder pre-norm causal", "infer", _stack(True, True, "relu", "causal", layers=1)),
    ("decoder post-norm gelu", "train", _stack(True, False, "gelu", "causal", layers=1)),
    ("sdpa gqa causal", "train", _sdpa(4, "causal")),
    ("sdpa gqa bool mask", "train", _sdpa(2, "bool")),
    ("sdpa float mask", "train", _sdpa(1, "float")),
    ("sdpa gqa dropout (math path)", "train", _sdpa(2, "none", dropout=0.1)),
    ("sdpa gqa", "infer", _sdpa(4, "none")),
]


def _check(model: nn.Module, inputs: tuple[Any, ...], mode: str, allocator_max: float = ALLOCATOR_MAX) -> None:
    est = nnmem.estimate(model, inputs, mode=mode, optimizer="adamw")
    unmodelled = [n for n in est.notes if NOT_MODELLED in n]
    if unmodelled:
        pytest.skip("; ".join(unmodelled))
    meas = nnmem.measure(model, inputs, mode=mode, optimizer="adamw", timeout_s=120)
    for level, limit in (("tensor", TENSOR_MAX), ("allocator", allocator_max)):
        e, m = est.peaks[level], meas.peaks[level]
        assert abs(e - m) <= limit * m, f"{level}: estimated {e:,} B, measured {m:,} B ({(e - m) / m:+.2%})"


@pytest.mark.parametrize(("label", "mode", "make"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_attention_step_matches_measurement(label: str, mode: str, make: Callable[..., Any]) -> None:
    rng = random.Random(f"{label}-{mode}")  # a fixed draw per case
    torch.manual_seed(0)
    model, inputs = make(rng)
    _check(model, inputs, mode)


def test_llama_grouped_query_attention_train_exact() -> None:
    """HuggingFace Llama with grouped-query heads (SDPA with enable_gqa: the CPU flash kernel reads the shared
    K/V heads in place, nothing repeated): exact at the tensor level."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=64, num_attention_heads=4, num_key_value_heads=1,
                                   intermediate_size=96, vocab_size=256, attn_implementation="sdpa")
    torch.manual_seed(0)
    model, ids = transformers.LlamaForCausalLM(cfg), torch.randint(0, 256, (3, 57))
    est = nnmem.estimate(model, (ids,), mode="train", optimizer="adamw")
    meas = nnmem.measure(model, (ids,), mode="train", optimizer="adamw", timeout_s=120)
    assert est.peaks["tensor"] == meas.peaks["tensor"]
    assert abs(est.peaks["allocator"] - meas.peaks["allocator"]) <= ALLOCATOR_MAX * meas.peaks["allocator"]
