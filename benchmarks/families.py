"""Small random models, one builder per op family, for the randomized accuracy suite (generalization.py).

Each builder takes a ``random.Random`` (every choice of the configuration is drawn from it) and a batch size,
and returns a :class:`Built`: a plain ``torch.nn`` model (or a HuggingFace model from a small config, random
weights, no download), its inputs and a one-line description of the draw. Models are kept small so that one
step measures in a second or two. ``FAMILIES`` is the one registry of family names.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cloudpickle
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.conv import _ConvNd

__all__ = ["FAMILIES", "Built", "Family"]


@dataclass(frozen=True, slots=True)
class Built:
    """A drawn model with its inputs; ``config`` describes the draw in one line."""

    model: nn.Module
    inputs: tuple[Any, ...]
    config: str


Builder = Callable[[random.Random, int], Built]


@dataclass(frozen=True, slots=True)
class Family:
    """An op family: its builder, its share of the draw (relative weight) and the batch sizes it draws from."""

    build: Builder
    weight: float = 1.0
    batches: tuple[int, ...] = (1, 2, 3, 4, 5, 7, 8)


_ACTS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU, "tanh": nn.Tanh, "leaky_relu": nn.LeakyReLU,
    "sigmoid": nn.Sigmoid, "hardswish": nn.Hardswish, "elu": nn.ELU}


def _act(rng: random.Random) -> tuple[str, nn.Module]:
    name = rng.choice(sorted(_ACTS))
    return name, _ACTS[name]()


def _out_len(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _channels_last(model: nn.Module, x: torch.Tensor) -> tuple[nn.Module, torch.Tensor]:
    fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
    return model.to(memory_format=fmt), x.contiguous(memory_format=fmt)  # type: ignore[call-overload]


# --- convolution -------------------------------------------------------------------------------------------

_CONV: dict[int, Any] = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
_CONVT: dict[int, Any] = {1: nn.ConvTranspose1d, 2: nn.ConvTranspose2d, 3: nn.ConvTranspose3d}
_SIZES = {1: (24, 160), 2: (8, 28), 3: (4, 10)}
_WIDTH = {1: 48, 2: 32, 3: 12}


def _conv_layer(rng: random.Random, dim: int, c: int, size: int) -> tuple[_ConvNd, int, str]:
    """One drawn convolution on ``c`` channels of spatial ``size``: the layer, its output size, a description."""
    k, s, d = rng.choice([1, 2, 3, 3, 5]), rng.choice([1, 1, 2, 3]), rng.choice([1, 1, 1, 2, 3])
    while d * (k - 1) + 1 > size:  # keep the output non-empty
        k, d = max(1, k - 2), max(1, d - 1)
    depthwise = c > 1 and rng.random() < 0.25
    groups = c if depthwise else rng.choice([g for g in (1, 1, 2, 4) if c % g == 0])
    width = _WIDTH[dim]
    out = c * rng.choice([1, 2]) if depthwise else groups * rng.randint(max(1, 2 // groups), max(1, width // groups))
    pads: list[int | str] = [0, k // 2, "same"] if s == 1 else [0, k // 2]
    pad = rng.choice(pads)
    p = (d * (k - 1)) // 2 if pad == "same" else int(pad)
    mode = rng.choice(["zeros", "zeros", "reflect", "replicate", "circular"]) if 0 < p < size else "zeros"
    layer = _CONV[dim](c, out, k, stride=s, padding=pad, dilation=d, groups=groups, bias=rng.random() < 0.8,
                       padding_mode=mode)
    new = size if pad == "same" else _out_len(size, k, s, p, d)
    return layer, new, f"{c}->{out} k{k} s{s} d{d} g{groups}{' dw' if depthwise else ''} p{pad} {mode}"


def _conv(dim: int) -> Builder:
    def build(rng: random.Random, batch: int) -> Built:
        size0 = size = rng.randint(*_SIZES[dim])
        c0 = c = rng.randint(1, _WIDTH[dim])
        layers: list[nn.Module] = []
        parts = []
        for _ in range(rng.randint(1, 3)):
            layer, size, text = _conv_layer(rng, dim, c, size)
            name, act = _act(rng)
            layers += [layer, act]
            parts.append(f"{text} {name}")
            c = layer.out_channels
            if size < 4:
                break
        model: nn.Module = nn.Sequential(*layers)
        x = torch.randn(batch, c0, *([size0] * dim))
        cl = dim > 1 and rng.random() < 0.3
        if cl:
            model, x = _channels_last(model, x)
        return Built(model, (x,), f"in {size0}^{dim}{' channels_last' if cl else ''}: " + " | ".join(parts))

    return build


def _conv_transpose(rng: random.Random, batch: int) -> Built:
    dim = rng.choice([1, 2, 2, 3])
    size = rng.randint(_SIZES[dim][0] // 2, _SIZES[dim][1] // 2)
    c, out = rng.randint(1, _WIDTH[dim]), rng.randint(1, _WIDTH[dim])
    groups = rng.choice([g for g in (1, 1, 2, 4) if c % g == 0 and out % g == 0])
    k, s, d = rng.choice([1, 2, 3, 4, 5]), rng.choice([1, 2, 2, 3]), rng.choice([1, 1, 2])
    p = rng.randint(0, (d * (k - 1)) // 2)
    op = rng.randint(0, max(s, d) - 1)
    layer = _CONVT[dim](c, out, k, stride=s, padding=p, output_padding=op, groups=groups, dilation=d,
                        bias=rng.random() < 0.8)
    head = _CONV[dim](out, rng.randint(1, 8), 3, padding=1)
    model: nn.Module = nn.Sequential(layer, nn.ReLU(), head)
    x = torch.randn(batch, c, *([size] * dim))
    cl = dim > 1 and rng.random() < 0.3
    if cl:
        model, x = _channels_last(model, x)
    return Built(model, (x,), f"convT{dim}d in {size}^{dim}{' channels_last' if cl else ''}: {c}->{out} k{k} s{s} "
                              f"d{d} p{p} op{op} g{groups}")


# --- pooling and upsampling --------------------------------------------------------------------------------

def _pool(rng: random.Random, batch: int) -> Built:
    dim = rng.choice([1, 2, 2, 3])
    size, c = rng.randint(*_SIZES[dim]), rng.randint(1, _WIDTH[dim])
    kind = rng.choice(["max", "avg", "adaptive_max", "adaptive_avg", "lp"] if dim < 3 else
                      ["max", "avg", "adaptive_max", "adaptive_avg"])
    k = rng.choice([2, 3]) if size >= 3 else 1
    s = rng.choice([None, 1, 2])
    ceil = rng.random() < 0.3
    nd = ["1d", "2d", "3d"][dim - 1]
    pool: nn.Module
    if kind == "max":
        dilation = rng.choice([1, 1, 2]) if size > 2 * k else 1
        pool = getattr(nn, f"MaxPool{nd}")(k, s, padding=rng.randint(0, k // 2), dilation=dilation,
                                           ceil_mode=ceil)
    elif kind == "avg":
        pool = getattr(nn, f"AvgPool{nd}")(k, s, padding=rng.randint(0, k // 2), ceil_mode=ceil,
                                           count_include_pad=rng.random() < 0.5)
    elif kind == "lp":
        pool = getattr(nn, f"LPPool{nd}")(rng.choice([1, 2, 3]), k, s, ceil_mode=ceil)
    else:
        pool = getattr(nn, f"{'AdaptiveMaxPool' if kind == 'adaptive_max' else 'AdaptiveAvgPool'}{nd}")(
            rng.randint(1, max(1, size // 2)))
    model: nn.Module = nn.Sequential(_CONV[dim](c, c + 2, 3, padding=1), nn.ReLU(), pool, nn.Flatten(),
                                     nn.LazyLinear(rng.randint(2, 17)))
    x = torch.randn(batch, c, *([size] * dim))
    model(x)  # materialise the lazy head
    cl = dim > 1 and rng.random() < 0.3
    if cl:
        model, x = _channels_last(model, x)
    return Built(model, (x,), f"{pool!r} in {c}x{size}^{dim}{' channels_last' if cl else ''}")


def _upsample(rng: random.Random, batch: int) -> Built:
    dim = rng.choice([1, 2, 2, 3])
    size, c = rng.randint(_SIZES[dim][0] // 2, _SIZES[dim][1] // 2), rng.randint(1, _WIDTH[dim])
    mode = rng.choice(["nearest", "nearest-exact", ["linear", "bilinear", "trilinear"][dim - 1]]
                      + (["bicubic"] if dim == 2 else []))
    scale = rng.choice([2, 2, 3, 1.5])
    align = None if mode.startswith("nearest") else rng.random() < 0.5
    up: nn.Module = nn.Upsample(scale_factor=scale, mode=mode, align_corners=align)
    if dim == 2 and rng.random() < 0.2:
        up = nn.PixelShuffle(2)
        c = 4 * max(1, c // 4)
    model: nn.Module = nn.Sequential(_CONV[dim](c, c, 3, padding=1), up, _CONV[dim](_up_channels(up, c), 4, 3))
    x = torch.randn(batch, c, *([size] * dim))
    cl = dim > 1 and rng.random() < 0.3
    if cl:
        model, x = _channels_last(model, x)
    return Built(model, (x,), f"{up!r} in {c}x{size}^{dim}{' channels_last' if cl else ''}")


def _up_channels(up: nn.Module, c: int) -> int:
    return c // 4 if isinstance(up, nn.PixelShuffle) else c


# --- recurrent ---------------------------------------------------------------------------------------------

class Recurrent(nn.Module):
    """A recurrent module, optionally over a packed batch, under a linear head."""

    def __init__(self, rnn: nn.RNNBase, head: int, lengths: list[int] | None) -> None:
        super().__init__()
        self.rnn, self.lengths = rnn, lengths
        out = rnn.proj_size or rnn.hidden_size
        self.head = nn.Linear(out * (2 if rnn.bidirectional else 1), head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.lengths is None:
            return self.head(self.rnn(x)[0])
        packed = nn.utils.rnn.pack_padded_sequence(x, torch.tensor(self.lengths), batch_first=self.rnn.batch_first,
                                                   enforce_sorted=False)
        out, _ = nn.utils.rnn.pad_packed_sequence(self.rnn(packed)[0], batch_first=self.rnn.batch_first)
        return self.head(out)


def _recurrent(kind: str) -> Builder:
    def build(rng: random.Random, batch: int) -> Built:
        layers = rng.choice([1, 1, 2, 2, 3, 4])
        hidden, features, steps = rng.randint(3, 80), rng.randint(1, 48), rng.randint(2, 40)
        kw: dict[str, Any] = {"num_layers": layers, "bidirectional": rng.random() < 0.4,
                              "batch_first": rng.random() < 0.5, "bias": rng.random() < 0.85,
                              "dropout": rng.choice([0.0, 0.0, 0.2]) if layers > 1 else 0.0}
        if kind == "rnn":
            kw["nonlinearity"] = rng.choice(["tanh", "relu"])
        if kind == "lstm" and rng.random() < 0.3 and hidden > 1:
            kw["proj_size"] = rng.randint(1, hidden - 1)
        rnn = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}[kind](features, hidden, **kw)
        packed = rng.random() < 0.3
        lengths = [steps] + [rng.randint(1, steps) for _ in range(batch - 1)] if packed else None
        model = Recurrent(rnn, rng.randint(2, 20), lengths)
        x = torch.randn(batch, steps, features) if kw["batch_first"] else torch.randn(steps, batch, features)
        text = " ".join(f"{k}={v}" for k, v in kw.items())
        return Built(model, (x,), f"{kind} in={features} hidden={hidden} T={steps} {text}"
                                  f"{f' packed{lengths}' if packed else ''}")

    return build


# --- attention ---------------------------------------------------------------------------------------------

class SelfAttention(nn.Module):
    """nn.MultiheadAttention on one sequence (self) or two (cross), with the drawn masks."""

    def __init__(self, mha: nn.MultiheadAttention, cross: bool, need_weights: bool, causal: bool) -> None:
        super().__init__()
        self.mha, self.cross, self.need_weights, self.causal = mha, cross, need_weights, causal

    def forward(self, x: torch.Tensor, memory: torch.Tensor, padding: torch.Tensor | None = None) -> torch.Tensor:
        kv = memory if self.cross else x
        steps = x.shape[1 if self.mha.batch_first else 0]
        mask = nn.Transformer.generate_square_subsequent_mask(steps, dtype=x.dtype) if self.causal else None
        return self.mha(x, kv, kv, key_padding_mask=padding, attn_mask=mask, need_weights=self.need_weights)[0]


def _mha(rng: random.Random, batch: int) -> Built:
    heads = rng.choice([1, 2, 3, 4, 8])
    embed = heads * rng.randint(2, 16)
    cross = rng.random() < 0.3
    kw: dict[str, Any] = {"dropout": rng.choice([0.0, 0.0, 0.1]), "bias": rng.random() < 0.85,
                          "add_bias_kv": rng.random() < 0.15, "add_zero_attn": rng.random() < 0.15,
                          "batch_first": rng.random() < 0.6}
    if cross and rng.random() < 0.5:  # the memory is both key and value, so one width for both
        kw["kdim"] = kw["vdim"] = rng.randint(3, 40)
    mha = nn.MultiheadAttention(embed, heads, **kw)
    steps, src = rng.randint(2, 48), rng.randint(2, 48)
    causal = not cross and rng.random() < 0.3
    need = rng.random() < 0.4
    model = SelfAttention(mha, cross, need, causal)

    def seq(n: int, e: int) -> torch.Tensor:
        return torch.randn(batch, n, e) if kw["batch_first"] else torch.randn(n, batch, e)

    x, memory = seq(steps, embed), seq(src if cross else 1, kw.get("kdim", embed))
    inputs: tuple[Any, ...] = (x, memory)
    if rng.random() < 0.3:
        n = src if cross else steps
        inputs += (torch.rand(batch, n) < 0.2,)
    return Built(model, inputs, f"mha E={embed} H={heads} L={steps} cross={cross}{f' S={src}' if cross else ''} "
                                f"causal={causal} need_weights={need} key_padding={len(inputs) == 3} "
                                + " ".join(f"{k}={v}" for k, v in kw.items()))


class Encoder(nn.Module):
    """A TransformerEncoder or TransformerDecoder stack with the drawn masks."""

    def __init__(self, stack: nn.Module, causal: bool, decoder: bool) -> None:
        super().__init__()
        self.stack, self.causal, self.decoder = stack, causal, decoder

    def forward(self, x: torch.Tensor, memory: torch.Tensor, padding: torch.Tensor | None = None) -> torch.Tensor:
        first: Any = self.stack.layers[0]  # type: ignore[index]
        steps = x.shape[1 if first.self_attn.batch_first else 0]
        mask = nn.Transformer.generate_square_subsequent_mask(steps, dtype=x.dtype) if self.causal else None
        if self.decoder:
            return self.stack(x, memory, tgt_mask=mask, tgt_is_causal=self.causal, memory_key_padding_mask=padding)
        return self.stack(x, mask=mask, is_causal=self.causal, src_key_padding_mask=padding)


def _transformer(decoder: bool) -> Builder:
    def build(rng: random.Random, batch: int) -> Built:
        heads = rng.choice([1, 2, 4])
        d = heads * rng.randint(4, 16)
        kw: dict[str, Any] = {"dim_feedforward": rng.randint(8, 128), "dropout": rng.choice([0.0, 0.1]),
                              "activation": rng.choice(["relu", "gelu"]), "batch_first": rng.random() < 0.6,
                              "norm_first": rng.random() < 0.5, "bias": rng.random() < 0.85}
        layers = rng.choice([1, 1, 2])
        if decoder:
            stack: nn.Module = nn.TransformerDecoder(nn.TransformerDecoderLayer(d, heads, **kw), layers)
        else:
            stack = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, heads, **kw), layers,
                                          enable_nested_tensor=rng.random() < 0.5)
        steps, src = rng.randint(2, 40), rng.randint(2, 40)
        causal = rng.random() < 0.4
        model = Encoder(stack, causal, decoder)

        def seq(n: int) -> torch.Tensor:
            return torch.randn(batch, n, d) if kw["batch_first"] else torch.randn(n, batch, d)

        inputs: tuple[Any, ...] = (seq(steps), seq(src if decoder else 1))
        if rng.random() < 0.3:
            n = src if decoder else steps
            pad = torch.zeros(batch, n, dtype=torch.bool)
            for row in range(batch):
                pad[row, rng.randint(1, n):] = True
            inputs += (pad,)
        return Built(model, inputs, f"{'decoder' if decoder else 'encoder'} x{layers} d={d} H={heads} L={steps}"
                                    f"{f' S={src}' if decoder else ''} causal={causal} padding={len(inputs) == 3} "
                                    + " ".join(f"{k}={v}" for k, v in kw.items()))

    return build


class Sdpa(nn.Module):
    """Projections into F.scaled_dot_product_attention and out of it."""

    def __init__(self, dim: int, heads: int, kv_heads: int, dropout: float, causal: bool) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.dropout, self.causal = heads, kv_heads, dropout, causal
        self.head_dim = dim // heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, n, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal,
                                           dropout_p=self.dropout if self.training else 0.0,
                                           enable_gqa=self.kv_heads != self.heads)
        return self.out(y.transpose(1, 2).reshape(b, n, -1))


def _sdpa(rng: random.Random, batch: int) -> Built:
    heads = rng.choice([1, 2, 4, 6, 8])
    kv_heads = rng.choice([h for h in range(1, heads + 1) if heads % h == 0])
    dim, steps = heads * rng.choice([4, 8, 12, 16, 32]), rng.randint(2, 96)
    causal = rng.random() < 0.3
    mask_kind = "none" if causal else rng.choice(["none", "bool", "float"])
    model = Sdpa(dim, heads, kv_heads, rng.choice([0.0, 0.0, 0.1]), causal)
    inputs: tuple[Any, ...] = (torch.randn(batch, steps, dim),)
    if mask_kind != "none":
        shape = rng.choice([(batch, 1, steps, steps), (1, 1, steps, steps), (steps, steps)])
        keep = torch.rand(shape) < 0.8
        keep[..., 0] = True
        inputs += (keep if mask_kind == "bool" else torch.zeros(shape).masked_fill(~keep, float("-inf")),)
    return Built(model, inputs, f"sdpa D={dim} H={heads} KV={kv_heads} L={steps} causal={causal} mask={mask_kind}"
                                f"{tuple(inputs[1].shape) if len(inputs) > 1 else ''} dropout={model.dropout}")


# --- embeddings, norms, MLPs -------------------------------------------------------------------------------

def _embedding(rng: random.Random, batch: int) -> Built:
    num, dim, steps = rng.randint(10, 2000), rng.randint(1, 96), rng.randint(1, 64)
    kw: dict[str, Any] = {"padding_idx": rng.choice([None, 0]), "scale_grad_by_freq": rng.random() < 0.2}
    if rng.random() < 0.1:
        kw["max_norm"] = 1.0
    model = nn.Sequential(nn.Embedding(num, dim, **kw), nn.Linear(dim, rng.randint(2, 40)))
    return Built(model, (torch.randint(0, num, (batch, steps)),),
                 f"embedding {num}x{dim} L={steps} " + " ".join(f"{k}={v}" for k, v in kw.items()))


class Bag(nn.Module):
    def __init__(self, bag: nn.EmbeddingBag, head: int) -> None:
        super().__init__()
        self.bag, self.head = bag, nn.Linear(bag.embedding_dim, head)

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor | None = None,
                weights: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.bag(ids, offsets, per_sample_weights=weights))


def _embedding_bag(rng: random.Random, batch: int) -> Built:
    num, dim, steps = rng.randint(10, 2000), rng.randint(1, 96), rng.randint(1, 32)
    mode = rng.choice(["sum", "mean", "max"])
    flat = rng.random() < 0.5
    last = flat and rng.random() < 0.3
    bag = nn.EmbeddingBag(num, dim, mode=mode, padding_idx=rng.choice([None, 0]), include_last_offset=last)
    model = Bag(bag, rng.randint(2, 40))
    if flat:
        cuts = sorted(rng.randint(0, batch * steps) for _ in range(batch - 1))
        inputs: tuple[Any, ...] = (torch.randint(0, num, (batch * steps,)),
                                   torch.tensor([0, *cuts] + ([batch * steps] if last else [])))
    else:
        inputs = (torch.randint(0, num, (batch, steps)), None)
    weighted = mode == "sum" and rng.random() < 0.4
    if weighted:
        inputs += (torch.rand(inputs[0].shape),)
    return Built(model, inputs, f"embedding_bag {num}x{dim} mode={mode} L={steps} offsets={flat} "
                                f"last_offset={last} per_sample_weights={weighted} padding_idx={bag.padding_idx}")


def _norm(rng: random.Random, batch: int) -> Built:
    kind = rng.choice(["batch", "layer", "group", "rms", "instance"])
    c, size = rng.choice([3, 6, 8, 12, 16, 24, 30]), rng.randint(4, 24)
    dim = rng.choice([1, 2, 3]) if kind in ("batch", "instance") else 2
    affine = rng.random() < 0.8
    x = torch.randn(batch, c, *([size] * dim)) if dim < 3 else torch.randn(batch, c, *([max(2, size // 3)] * 3))
    if kind == "batch":
        norm: nn.Module = getattr(nn, f"BatchNorm{dim}d")(c, affine=affine, momentum=rng.choice([0.1, None]),
                                                           track_running_stats=rng.random() < 0.85)
    elif kind == "instance":
        norm = getattr(nn, f"InstanceNorm{dim}d")(c, affine=affine, track_running_stats=rng.random() < 0.3)
    elif kind == "group":
        norm = nn.GroupNorm(rng.choice([g for g in (1, 2, 3, 4, 6) if c % g == 0]), c, affine=affine)
    else:
        last = x.shape[-2:] if rng.random() < 0.3 else x.shape[-1:]
        norm = (nn.LayerNorm(last, elementwise_affine=affine, bias=rng.random() < 0.8) if kind == "layer"
                else nn.RMSNorm(last, elementwise_affine=affine))
    conv = _CONV[dim](c, c, 3, padding=1)
    model = nn.Sequential(conv, norm, _act(rng)[1], _CONV[dim](c, 4, 1))
    return Built(model, (x,), f"{norm!r} in {tuple(x.shape[1:])}")


def _mlp(rng: random.Random, batch: int) -> Built:
    widths = [rng.choice([1, 3, 7, 17, 37, 64, 101, 255, 333, 513, 1023]) for _ in range(rng.randint(2, 5))]
    layers: list[nn.Module] = []
    names = []
    for a, b in zip(widths, widths[1:]):
        name, act = _act(rng)
        layers += [nn.Linear(a, b, bias=rng.random() < 0.85), act]
        if rng.random() < 0.2:
            layers.append(nn.Dropout(rng.choice([0.1, 0.5])))
            name += "+dropout"
        names.append(name)
    steps = rng.choice([0, 0, rng.randint(2, 20)])
    x = torch.randn(batch, steps, widths[0]) if steps else torch.randn(batch, widths[0])
    return Built(nn.Sequential(*layers[:-1]), (x,), f"mlp {'-'.join(map(str, widths))} {' '.join(names)}"
                                                    f"{f' T={steps}' if steps else ''}")


# --- HuggingFace models from small configs (random weights) ------------------------------------------------

class Kwargs(nn.Module):
    """Calls a HuggingFace model with keyword inputs (nnmem calls ``model(*inputs)``)."""

    def __init__(self, inner: nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.inner, self.names = inner, names

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.inner(**dict(zip(self.names, inputs)))


def _ids(rng: random.Random, batch: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, rng.randint(4, 48)))


def _attn(rng: random.Random) -> str:
    return rng.choice(["sdpa", "eager"])


def _decoder_lm(kind: str) -> Builder:
    def build(rng: random.Random, batch: int) -> Built:
        import transformers

        heads = rng.choice([2, 4])
        kv = rng.choice([h for h in (1, 2, 4) if heads % h == 0])
        kw: dict[str, Any] = {"hidden_size": heads * rng.choice([8, 16]), "num_attention_heads": heads,
                              "num_key_value_heads": kv, "intermediate_size": rng.choice([48, 96]),
                              "num_hidden_layers": rng.choice([1, 2]), "vocab_size": 512,
                              "max_position_embeddings": 128}
        if kind == "mixtral":
            kw |= {"num_local_experts": rng.choice([2, 4]), "num_experts_per_tok": rng.choice([1, 2])}
        attn = _attn(rng)
        config = getattr(transformers, {"llama": "LlamaConfig", "qwen2": "Qwen2Config",
                                        "mixtral": "MixtralConfig"}[kind])(**kw, attn_implementation=attn)
        cls = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mixtral": "MixtralForCausalLM"}[kind]
        ids = _ids(rng, batch, 512)
        return Built(getattr(transformers, cls)(config), (ids,),
                     f"{cls} L={ids.shape[1]} attn={attn} " + " ".join(f"{k}={v}" for k, v in kw.items()))

    return build


def _gpt2(rng: random.Random, batch: int) -> Built:
    import transformers

    heads, attn = rng.choice([2, 4]), _attn(rng)
    kw: dict[str, Any] = {"n_layer": rng.choice([1, 2]), "n_embd": heads * rng.choice([8, 16]), "n_head": heads,
                          "vocab_size": 512, "n_positions": 64, "bos_token_id": 0, "eos_token_id": 0,
                          "attn_implementation": attn}
    ids = _ids(rng, batch, 512)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**kw))
    return Built(model, (ids,), f"GPT2LMHeadModel L={ids.shape[1]} "
                                + " ".join(f"{k}={v}" for k, v in kw.items()))


def _bert(rng: random.Random, batch: int) -> Built:
    import transformers

    heads, attn = rng.choice([2, 4]), _attn(rng)
    kw: dict[str, Any] = {"num_hidden_layers": rng.choice([1, 2]), "hidden_size": heads * rng.choice([8, 16]),
          "num_attention_heads": heads, "intermediate_size": rng.choice([48, 96]), "vocab_size": 512,
                          "attn_implementation": attn}
    ids = _ids(rng, batch, 512)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(**kw))
    inputs: tuple[Any, ...] = (ids,)
    if rng.random() < 0.4:
        mask = torch.ones_like(ids)
        mask[:, rng.randint(1, ids.shape[1]):] = 0
        inputs += (mask,)
    return Built(Kwargs(model, ("input_ids", "attention_mask")), inputs,
                 f"BertForSequenceClassification L={ids.shape[1]} attention_mask={len(inputs) == 2} "
                 + " ".join(f"{k}={v}" for k, v in kw.items()))


_TOKENS = {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": 2}
"""Special tokens inside the small vocabulary (the defaults index a real tokenizer's)."""


def _bart(rng: random.Random, batch: int) -> Built:
    import transformers

    heads = rng.choice([2, 4])
    kw: dict[str, Any] = {"d_model": heads * rng.choice([8, 16]), "encoder_layers": rng.choice([1, 2]),
          "decoder_layers": rng.choice([1, 2]), "encoder_attention_heads": heads, "decoder_attention_heads": heads,
          "encoder_ffn_dim": rng.choice([48, 96]), "decoder_ffn_dim": rng.choice([48, 96]), "vocab_size": 512,
          "max_position_embeddings": 64, **_TOKENS}
    ids = _ids(rng, batch, 512)
    model = transformers.BartForConditionalGeneration(transformers.BartConfig(**kw))
    return Built(model, (ids,), f"BartForConditionalGeneration L={ids.shape[1]} "
                                + " ".join(f"{k}={v}" for k, v in kw.items()))


def _whisper(rng: random.Random, batch: int) -> Built:
    import transformers

    heads, frames = rng.choice([2, 4]), rng.choice([16, 24, 32])
    kw: dict[str, Any] = {"d_model": heads * rng.choice([8, 16]), "encoder_layers": rng.choice([1, 2]),
          "decoder_layers": rng.choice([1, 2]), "encoder_attention_heads": heads, "decoder_attention_heads": heads,
          "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "vocab_size": 512, "num_mel_bins": rng.choice([8, 16]),
          "max_source_positions": frames, "max_target_positions": 64, **_TOKENS}
    model = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(**kw))
    features = torch.randn(batch, kw["num_mel_bins"], 2 * frames)
    dec = _ids(rng, batch, 512)[:, :rng.randint(2, 16)]
    return Built(Kwargs(model, ("input_features", "decoder_input_ids")), (features, dec),
                 f"WhisperForConditionalGeneration T={2 * frames} dec={dec.shape[1]} "
                 + " ".join(f"{k}={v}" for k, v in kw.items()))


def _wav2vec2(rng: random.Random, batch: int) -> Built:
    import transformers

    heads = rng.choice([2, 4])
    kw: dict[str, Any] = {"hidden_size": heads * 8, "num_hidden_layers": rng.choice([1, 2]),
                          "num_attention_heads": heads, "intermediate_size": 64, "conv_dim": (16, 16, 16),
                          "conv_stride": (5, 2, 2), "conv_kernel": (10, 3, 3), "num_conv_pos_embeddings": 8,
                          "num_conv_pos_embedding_groups": 4, "vocab_size": 32,
                          "feat_extract_norm": rng.choice(["group", "layer"]),
                          "do_stable_layer_norm": rng.random() < 0.5}
    model = transformers.Wav2Vec2ForCTC(transformers.Wav2Vec2Config(**kw))
    samples = rng.randint(400, 2400)
    return Built(model, (torch.randn(batch, samples),), f"Wav2Vec2ForCTC samples={samples} "
                                                        + " ".join(f"{k}={v}" for k, v in kw.items()))


def _convnext(rng: random.Random, batch: int) -> Built:
    import transformers

    kw: dict[str, Any] = {"hidden_sizes": [8, 16, 24, 32][:rng.choice([2, 3, 4])], "image_size": 32, "num_labels": 10}
    kw["depths"] = [rng.choice([1, 2]) for _ in kw["hidden_sizes"]]
    kw["num_stages"] = len(kw["hidden_sizes"])
    model = transformers.ConvNextForImageClassification(transformers.ConvNextConfig(**kw))
    size = rng.choice([32, 48, 64])
    return Built(model, (torch.randn(batch, 3, size, size),), f"ConvNextForImageClassification {size}px "
                                                              + " ".join(f"{k}={v}" for k, v in kw.items()))


_HF_BATCHES, _HF_WEIGHT = (1, 2, 3), 0.25  # fewer and smaller: a HuggingFace step measures slowest
FAMILIES: dict[str, Family] = {
    "conv1d": Family(_conv(1)), "conv2d": Family(_conv(2), 1.5), "conv3d": Family(_conv(3)),
    "conv_transpose": Family(_conv_transpose), "pool": Family(_pool), "upsample": Family(_upsample),
    "rnn": Family(_recurrent("rnn")), "lstm": Family(_recurrent("lstm"), 1.5), "gru": Family(_recurrent("gru")),
    "mha": Family(_mha), "transformer_encoder": Family(_transformer(False)),
    "transformer_decoder": Family(_transformer(True)), "sdpa": Family(_sdpa),
    "embedding": Family(_embedding, 0.7), "embedding_bag": Family(_embedding_bag, 0.7), "norm": Family(_norm),
    "mlp": Family(_mlp),
    **{f"hf_{k}": Family(_decoder_lm(k), _HF_WEIGHT, _HF_BATCHES) for k in ("llama", "qwen2", "mixtral")},
    **{f"hf_{f.__name__[1:]}": Family(f, _HF_WEIGHT, _HF_BATCHES)
       for f in (_gpt2, _bert, _bart, _whisper, _wav2vec2, _convnext)},
}
"""Every family the suite draws from, by name (the ``--families`` choices)."""

# The measuring child has no benchmarks/ on its path: it gets this module's classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
