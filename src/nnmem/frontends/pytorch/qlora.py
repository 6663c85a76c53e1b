"""QLoRA: linear layers frozen in 4-bit NF4 (bitsandbytes) with trainable low-rank adapters (peft's LoRA), modelled.

bitsandbytes' 4-bit kernels need a GPU, so this step cannot be measured on a CPU: nnmem traces the model with each
targeted ``nn.Linear`` replaced by :class:`TracedLoRA4bit`, a stand-in that holds and does what the real layers hold
and do (bitsandbytes/nn/modules.py ``Linear4bit``, bitsandbytes/autograd/_functions.py ``MatMul4Bit``,
peft/tuners/lora/bnb.py ``Linear4bit``):

- **Resident**: the weight packed two values per byte (``Params4bit``: ``ceil(K*N/2)`` uint8), its block scales
  (``QuantState``: one per 64 values; with double quantization, as the QLoRA paper trains, one uint8 each plus one
  float32 per 256 of them and a 256-entry code book), the bias in the compute dtype, and the adapters
  ``lora_A`` (``r x K``) and ``lora_B`` (``N x r``) in float32 (peft's ``autocast_adapter_dtype``).
- **Forward**: the input cast to the compute dtype (bfloat16), the weight dequantized to a transient ``N x K``
  compute-dtype matrix, the product, the output cast back; the adapters' path on a float32 copy of the input,
  scaled and added. ``MatMul4Bit`` saves only the packed weight for backward (no activation).
- **Backward**: the weight dequantized again (transient) for the input's gradient; the adapters' gradients as any
  linear layer's.

Every other parameter is frozen (peft trains the adapters only), so gradients and optimizer state are the
adapters'. ``nnmem.what_if(..., techniques=["qlora:16"])`` reports the row as modelled, not measured.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
from torch import nn

from nnmem.errors import ConfigError, UnsupportedError

__all__ = ["TracedLoRA4bit", "qlora", "qlora_rank", "qlora_targets", "MODELLED_NOTE"]

BLOCK = 64  # bitsandbytes' 4-bit block size
NESTED_BLOCK = 256  # double quantization's block of scales
COMPUTE = torch.bfloat16
MODELLED_NOTE = ("modelled, not measured: QLoRA's 4-bit kernels (bitsandbytes) need a GPU; the step is traced with "
                 "stand-ins that hold and allocate what they do (packed NF4 weight and scales, dequantized weight "
                 "per call, float32 adapters)")


def qlora_rank(technique: str) -> int:
    """R of "qlora:R" (the adapters' rank).

    Raises:
        ConfigError: not a positive integer.
    """
    try:
        rank = int(technique.partition(":")[2])
    except ValueError:
        rank = 0
    if rank < 1:
        raise ConfigError(f"expected qlora:R with R the adapters' rank, a positive integer (e.g. qlora:16). "
                          f"Received: {technique!r}")
    return rank


def qlora_targets(model: nn.Module) -> list[str]:
    """The ``nn.Linear`` layers QLoRA quantizes and adapts: every one but the last (the output head, which peft's
    "all-linear" leaves out) and ``nn.MultiheadAttention``'s projection (read by the attention itself).

    Raises:
        UnsupportedError: none.
    """
    inside_attention = {f"{name}.{child}" if name else child for name, m in model.named_modules()
                        if isinstance(m, nn.MultiheadAttention) for child, _ in m.named_children()}
    linear = [path for path, m in model.named_modules()
              if path and type(m) is nn.Linear and path not in inside_attention]
    if len(linear) < 2:
        raise UnsupportedError("qlora:R adapts the nn.Linear layers before the output head, and the model has "
                               f"{'none' if not linear else 'only its head'}")
    return linear[:-1]


def _packed_bytes(numel: int) -> int:
    """Bytes of a 4-bit weight and its double-quantized block scales (bitsandbytes ``quantize_4bit`` with
    ``compress_statistics=True``)."""
    blocks = -(-numel // BLOCK)
    nested = -(-blocks // NESTED_BLOCK)
    return -(-numel // 2) + blocks + 4 * nested + 4 * 256 + 4 + 4 * 16  # + code book, offset, NF4 code


class _MatMul4Bit(torch.autograd.Function):
    """``MatMul4Bit`` (bitsandbytes/autograd/_functions.py): forward dequantizes the weight for the product and keeps
    nothing but the packed weight; backward dequantizes it again for the input's gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, bias: torch.Tensor | None, out_features: int,
                in_features: int) -> torch.Tensor:
        ctx.shape = (out_features, in_features)
        weight = x.new_empty(ctx.shape)
        return nn.functional.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        weight = grad.new_empty(ctx.shape)
        return grad @ weight, None, None, None


class TracedLoRA4bit(nn.Module):
    """A QLoRA layer for a trace: the packed 4-bit weight (a frozen uint8 parameter of its bytes), the frozen bias in
    the compute dtype, and the trainable float32 adapters."""

    def __init__(self, linear: nn.Linear, rank: int, alpha: float | None = None) -> None:
        super().__init__()
        n, k = linear.out_features, linear.in_features
        self.in_features, self.out_features = k, n
        self.packed = nn.Parameter(torch.empty(_packed_bytes(n * k), dtype=torch.uint8, device="meta"),
                                   requires_grad=False)
        self.bias = None if linear.bias is None else nn.Parameter(
            torch.empty(n, dtype=COMPUTE, device="meta"), requires_grad=False)
        self.lora_A = nn.Linear(k, rank, bias=False, device="meta")
        self.lora_B = nn.Linear(rank, n, bias=False, device="meta")
        self.scaling = (alpha if alpha is not None else 2.0 * rank) / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _MatMul4Bit.apply(x.to(COMPUTE), self.bias, self.out_features, self.in_features).to(x.dtype)
        adapted = self.lora_B(self.lora_A(x.to(torch.float32))) * self.scaling
        return out + adapted.to(x.dtype)


def qlora(model: nn.Module, technique: str, mode: str) -> AbstractContextManager[None]:
    """A context in which the targeted layers are :class:`TracedLoRA4bit` stand-ins and every other parameter is
    frozen (both put back after).

    Raises:
        ConfigError: a malformed rank. UnsupportedError: inference (QLoRA is a way to train), or no layer to adapt.
    """
    rank = qlora_rank(technique)
    if mode != "train":
        raise UnsupportedError("qlora:R is a way to train (frozen 4-bit weights, trainable adapters); for "
                               "inference in int8 use quantize:int8")
    return _swapped(model, qlora_targets(model), rank)


@contextmanager
def _swapped(model: nn.Module, targets: list[str], rank: int) -> Iterator[None]:
    from nnmem.frontends.pytorch.step import swapped_modules

    trainable = [p for p in model.parameters() if p.requires_grad]
    try:
        for p in trainable:
            p.requires_grad_(False)
        with swapped_modules(model, targets, lambda linear: TracedLoRA4bit(linear, rank)):  # type: ignore[arg-type]
            yield
    finally:
        for p in trainable:
            p.requires_grad_(True)
