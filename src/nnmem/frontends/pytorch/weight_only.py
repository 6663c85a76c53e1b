"""Weight-only int8 and int4 quantization of linear layers for inference, on ATen's CPU kernels.

The weights are stored in int8 or int4 and the activations stay in floating point: each layer's product runs on
ATen's weight-only kernels, the ones torchao's CPU layouts call (``Int8WeightOnlyConfig``, ``Int4WeightOnlyConfig``
with ``Int4CPULayout``):

- ``weight-only:int8``: ``aten._weight_int8pack_mm(x, w, scales)``, ``w`` the ``N x K`` int8 weight, ``scales``
  one per output channel (symmetric, ``max |w| / 127``).
- ``weight-only:int4[:G]``: ``aten._weight_int4pack_mm_for_cpu(x, packed, G, scales_and_zeros)``, the weight
  packed two values per byte by ``aten._convert_weight_to_int4pack_for_cpu`` (``N x K/2`` uint8) with a scale
  and a zero point per group of ``G`` input channels (``K/G x N x 2``, asymmetric; torchao's default ``G`` is
  128). The kernel takes ``N`` a multiple of 16 and ``K`` a multiple of ``G``; other layers stay float.

A quantized layer is :class:`WeightOnlyLinear`: its buffers are what the model holds instead of the float
weight, its forward is the kernel call (the input flattened to 2-D, the output reshaped back, the bias added).
The estimate traces the model with the layers swapped for ones of the same shapes on the meta device; ``nnmem
.apply_technique`` swaps them for real, quantizing each weight. The float model's weights are gone in both:
quantizing trades the float32 weight's ``4NK`` bytes for ``NK`` (int8) or ``NK/2`` plus the groups' scales (int4).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import torch
from torch import nn

from nnmem.errors import ConfigError, UnsupportedError

__all__ = ["WeightOnlyLinear", "apply_weight_only", "weight_only", "weight_only_spec", "weight_only_targets"]

INT4_GROUP = 128
"""torchao's default group size for int4 weight-only quantization (``Int4WeightOnlyConfig.group_size``)."""
INT4_N_MULTIPLE = 16
"""``_convert_weight_to_int4pack_for_cpu``: "expect N to be dividable by 16"."""


def weight_only_spec(technique: str) -> tuple[int, int]:
    """(bits, group size) of "weight-only:int8" or "weight-only:int4[:G]" (group 0 for int8: one scale per row).

    Raises:
        ConfigError: another argument.
    """
    _, _, argument = technique.partition(":")
    kind, _, group = argument.partition(":")
    if kind == "int8" and not group:
        return 8, 0
    if kind == "int4":
        try:
            size = int(group) if group else INT4_GROUP
        except ValueError:
            size = 0
        if size in (32, 64, 128, 256):
            return 4, size
    raise ConfigError(f"expected weight-only:int8 or weight-only:int4[:G] with G one of 32, 64, 128, 256 (the "
                      f"input channels sharing a scale; 128 by default). Received: {technique!r}")


def weight_only_targets(model: nn.Module, bits: int, group: int) -> list[str]:
    """Paths of the float32 ``nn.Linear`` layers the kernels take (int4: ``N % 16 == 0`` and ``K % G == 0``);
    as for dynamic quantization, not ``nn.MultiheadAttention``'s ``out_proj`` nor the linear layers of
    ``nn.Transformer*Layer`` (their fast path reads the weight as a tensor).

    Raises:
        UnsupportedError: the model has none.
    """
    from nnmem.frontends.pytorch.quantized import quantization_targets

    try:
        names = quantization_targets(model)
    except UnsupportedError:
        names = []
    if bits == 4:
        names = [n for n in names if _int4_fits(model.get_submodule(n), group)]  # type: ignore[arg-type]
    if not names:
        shape = f" with out_features a multiple of 16 and in_features a multiple of {group}" if bits == 4 else ""
        raise UnsupportedError(f"weight-only int{bits} quantizes nn.Linear layers{shape}, and the model has no "
                               f"float32 nn.Linear{shape and ' like that'} outside attention and nn.Transformer "
                               f"layers")
    return names


def _int4_fits(linear: nn.Linear, group: int) -> bool:
    return linear.out_features % INT4_N_MULTIPLE == 0 and linear.in_features % group == 0


class WeightOnlyLinear(nn.Module):
    """A linear layer with an int8 or int4 weight and a floating-point input, on ATen's weight-only kernels.

    Build it with :meth:`from_linear` (quantizing the weight) or :meth:`shaped_like` (empty buffers of the
    same shapes, for a trace).
    """

    weight_int8: torch.Tensor
    scales: torch.Tensor
    packed: torch.Tensor
    scales_and_zeros: torch.Tensor

    def __init__(self, linear: nn.Linear, bits: int, group: int, device: torch.device | str) -> None:
        super().__init__()
        n, k = linear.out_features, linear.in_features
        self.in_features, self.out_features, self.bits, self.group = k, n, bits, group
        dtype = linear.weight.dtype
        if bits == 8:
            self.register_buffer("weight_int8", torch.empty(n, k, dtype=torch.int8, device=device))
            self.register_buffer("scales", torch.empty(n, dtype=dtype, device=device))
        else:
            self.register_buffer("packed", torch.empty(n, k // 2, dtype=torch.uint8, device=device))
            self.register_buffer("scales_and_zeros", torch.empty(k // group, n, 2, dtype=dtype, device=device))
        self.bias: torch.Tensor | None
        self.register_buffer("bias", None if linear.bias is None else torch.empty(n, dtype=dtype, device=device))

    @classmethod
    def shaped_like(cls, linear: nn.Linear, bits: int, group: int) -> WeightOnlyLinear:
        """The layer with empty buffers on the meta device (what a trace needs)."""
        return cls(linear, bits, group, "meta")

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Linear, bits: int, group: int) -> WeightOnlyLinear:
        """``linear`` quantized: int8 symmetric per output channel, or int4 asymmetric per group of inputs."""
        w = linear.weight.detach()
        layer = cls(linear, bits, group, w.device)
        if bits == 8:
            scales = w.abs().amax(dim=1).clamp(min=1e-8) / 127
            layer.weight_int8.copy_(torch.round(w / scales[:, None]).clamp(-128, 127).to(torch.int8))
            layer.scales.copy_(scales)
        else:
            grouped = w.reshape(layer.out_features, -1, group)
            low, high = grouped.amin(dim=2), grouped.amax(dim=2)
            scales = ((high - low) / 15).clamp(min=1e-8)
            q = torch.round((grouped - low[..., None]) / scales[..., None]).clamp(0, 15)
            layer.packed.copy_(torch.ops.aten._convert_weight_to_int4pack_for_cpu(
                q.reshape(layer.out_features, -1).to(torch.int32), 1))
            zeros = low + 8 * scales  # the kernel dequantizes (q - 8) * scale + zero
            layer.scales_and_zeros.copy_(torch.stack([scales, zeros], dim=2).transpose(0, 1))
        if linear.bias is not None:
            layer.bias.copy_(linear.bias.detach())  # type: ignore[union-attr]
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if self.bits == 8:
            out = torch.ops.aten._weight_int8pack_mm(flat, self.weight_int8, self.scales)
        else:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat.contiguous(), self.packed, self.group,
                                                             self.scales_and_zeros)
        out = out.reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        group = f", group={self.group}" if self.bits == 4 else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, int{self.bits}{group}"


def _check(mode: str, technique: str) -> None:
    if mode == "train":
        raise UnsupportedError(f"{technique} is for inference: the int8/int4 weights have no gradient (train the "
                               f"float model, quantize it to serve)")


def weight_only(model: nn.Module, technique: str, mode: str) -> AbstractContextManager[None]:
    """A context in which the targeted layers are :class:`WeightOnlyLinear` of the same shapes on the meta device
    (put back after).

    Raises:
        ConfigError: a malformed technique. UnsupportedError: training, or no layer the kernels take.
    """
    bits, group = weight_only_spec(technique)
    _check(mode, technique)
    return _swapped(model, weight_only_targets(model, bits, group), bits, group)


@contextmanager
def _swapped(model: nn.Module, targets: list[str], bits: int, group: int) -> Iterator[None]:
    from nnmem.frontends.pytorch.step import swapped_modules

    with swapped_modules(model, targets, lambda m: WeightOnlyLinear.shaped_like(m, bits, group)):  # type: ignore[arg-type]
        yield


def apply_weight_only(model: nn.Module, technique: str) -> nn.Module:
    """Quantize ``model``'s targeted linear layers for real, in place; returns the model."""
    bits, group = weight_only_spec(technique)
    for path in weight_only_targets(model, bits, group):
        linear = model.get_submodule(path)
        model.set_submodule(path, WeightOnlyLinear.from_linear(linear, bits, group))  # type: ignore[arg-type]
    return model
