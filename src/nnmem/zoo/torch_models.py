"""The built-in PyTorch example models, in plain ``torch.nn``.

Every factory is ``name(batch) -> (model, inputs, target, loss_fn)``. nnmem calls it under
``with torch.device("meta"):`` to estimate (nothing is allocated) and without it to measure, so every
tensor here is created on the default device, and nothing depends on tensor values. Each factory seeds
torch's generator, so two calls build the same model and data.

Example:
    >>> model, inputs, target, loss_fn = mlp(32)  # doctest: +SKIP
    >>> loss_fn(model(*inputs), target).backward()  # doctest: +SKIP
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "audio_cnn", "densenet", "gpt", "gpt2_small", "gru_classifier", "lstm_lm", "mlp", "mobilenet", "resnet",
    "transformer_encoder", "unet", "vgg", "vit",
]

Example = tuple[nn.Module, tuple[torch.Tensor, ...], torch.Tensor, Any]


def token_loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over every position of a (batch, seq, vocab) output against (batch, seq) tokens."""
    return F.cross_entropy(out.flatten(0, 1), target.flatten())


def _images(batch: int, classes: int = 10, size: int = 32) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    return (torch.randn(batch, 3, size, size),), torch.randint(0, classes, (batch,))


# ---- MLP -------------------------------------------------------------------------------------------------
def mlp(batch: int) -> Example:
    """The classic example: (batch, 256) -> 128 -> 64 -> 10, 41,802 parameters (DESIGN.md)."""
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict([
        ("fc1", nn.Linear(256, 128)), ("relu1", nn.ReLU()),
        ("fc2", nn.Linear(128, 64)), ("relu2", nn.ReLU()),
        ("fc3", nn.Linear(64, 10)),
    ]))
    return model, (torch.randn(batch, 256),), torch.randint(0, 10, (batch,)), nn.CrossEntropyLoss()


# ---- CNNs ------------------------------------------------------------------------------------------------
def _conv_bn(cin: int, cout: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


def vgg(batch: int) -> Example:
    """VGG-style: conv-BN-ReLU(inplace) pairs, max pooling, a dropout classifier (~0.7 M parameters)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    cin = 3
    for cout, convs in ((32, 2), (64, 2), (128, 1)):
        for _ in range(convs):
            layers += _conv_bn(cin, cout)
            cin = cout
        layers.append(nn.MaxPool2d(2))
    model = nn.Sequential(
        nn.Sequential(*layers), nn.Flatten(),
        nn.Linear(128 * 4 * 4, 256), nn.ReLU(inplace=True), nn.Dropout(0.5), nn.Linear(256, 10),
    )
    inputs, target = _images(batch)
    return model, inputs, target, nn.CrossEntropyLoss()


class BasicBlock(nn.Module):
    """Two 3x3 convs with a skip connection; a strided 1x1 conv downsamples the skip when shapes change."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.down(x))


def resnet(batch: int) -> Example:
    """A small CIFAR ResNet: stem, three stages of two basic blocks (16/32/64 channels) (~0.2 M parameters)."""
    torch.manual_seed(0)
    blocks: list[nn.Module] = []
    cin = 16
    for cout, stride in ((16, 1), (32, 2), (64, 2)):
        blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
        cin = cout
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
        *blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    )
    inputs, target = _images(batch)
    return model, inputs, target, nn.CrossEntropyLoss()


class DenseLayer(nn.Module):
    """BN-ReLU-conv3x3 producing ``growth`` channels, concatenated to its input."""

    def __init__(self, cin: int, growth: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(cin)
        self.conv = nn.Conv2d(cin, growth, 3, 1, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.conv(F.relu(self.bn(x)))], dim=1)


def densenet(batch: int, growth: int = 12, layers: int = 4) -> Example:
    """DenseNet: three dense blocks of ``layers`` layers, 1x1-conv + average-pool transitions (~0.1 M)."""
    torch.manual_seed(0)
    channels = 2 * growth
    modules: list[nn.Module] = [nn.Conv2d(3, channels, 3, 1, 1, bias=False)]
    for block in range(3):
        for _ in range(layers):
            modules.append(DenseLayer(channels, growth))
            channels += growth
        if block < 2:
            out = channels // 2
            modules += [nn.BatchNorm2d(channels), nn.ReLU(), nn.Conv2d(channels, out, 1, bias=False),
                        nn.AvgPool2d(2)]
            channels = out
    modules += [nn.BatchNorm2d(channels), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                nn.Linear(channels, 10)]
    inputs, target = _images(batch)
    return nn.Sequential(*modules), inputs, target, nn.CrossEntropyLoss()


def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(*_conv_bn(cin, cout), *_conv_bn(cout, cout))


class UNet(nn.Module):
    """Encoder-decoder with skip concatenation; ConvTranspose2d upsamples (per-pixel class logits)."""

    def __init__(self, classes: int = 4, base: int = 16) -> None:
        super().__init__()
        self.enc1 = _double_conv(3, base)
        self.enc2 = _double_conv(base, 2 * base)
        self.mid = _double_conv(2 * base, 4 * base)
        self.pool = nn.MaxPool2d(2)
        self.up2 = nn.ConvTranspose2d(4 * base, 2 * base, 2, stride=2)
        self.dec2 = _double_conv(4 * base, 2 * base)
        self.up1 = nn.ConvTranspose2d(2 * base, base, 2, stride=2)
        self.dec1 = _double_conv(2 * base, base)
        self.head = nn.Conv2d(base, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        m = self.mid(self.pool(e2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], dim=1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], dim=1))
        return self.head(d1)


def unet(batch: int, size: int = 64, classes: int = 4) -> Example:
    """U-Net on (batch, 3, 64, 64) with a per-pixel cross-entropy loss (~0.1 M parameters)."""
    torch.manual_seed(0)
    inputs = (torch.randn(batch, 3, size, size),)
    target = torch.randint(0, classes, (batch, size, size))
    return UNet(classes), inputs, target, nn.CrossEntropyLoss()


def _separable(cin: int, cout: int, stride: int) -> nn.Sequential:
    """Depthwise 3x3 (groups = channels) then pointwise 1x1, each with BatchNorm and ReLU6."""
    return nn.Sequential(
        nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin), nn.ReLU6(inplace=True),
        nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU6(inplace=True),
    )


def mobilenet(batch: int) -> Example:
    """MobileNet-style on 32x32x3: a strided stem and depthwise separable blocks to 256 channels (~0.2 M)."""
    torch.manual_seed(0)
    plan = ((32, 64, 1), (64, 128, 2), (128, 128, 1), (128, 256, 2), (256, 256, 1))
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU6(inplace=True),
        *(_separable(cin, cout, stride) for cin, cout, stride in plan),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10),
    )
    inputs, target = _images(batch)
    return model, inputs, target, nn.CrossEntropyLoss()


def audio_cnn(batch: int, samples: int = 16000, classes: int = 12) -> Example:
    """M5-style 1-D CNN on a raw (batch, 1, 16000) waveform: Conv1d-BatchNorm1d-ReLU-MaxPool1d (~0.03 M)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Conv1d(1, 32, 80, stride=4), nn.BatchNorm1d(32), nn.ReLU(), nn.MaxPool1d(4)]
    for cin, cout in ((32, 32), (32, 64), (64, 64)):
        layers += [nn.Conv1d(cin, cout, 3), nn.BatchNorm1d(cout), nn.ReLU(), nn.MaxPool1d(4)]
    layers += [nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(64, classes)]
    inputs = (torch.randn(batch, 1, samples),)
    return nn.Sequential(*layers), inputs, torch.randint(0, classes, (batch,)), nn.CrossEntropyLoss()


# ---- recurrent -----------------------------------------------------------------------------------------
class LSTMLanguageModel(nn.Module):
    """Embedding, a stacked ``nn.LSTM`` (batch_first) and a linear head over the vocabulary."""

    def __init__(self, vocab: int, embed: int, hidden: int, num_layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, num_layers=num_layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out)


def lstm_lm(batch: int, seq: int = 32, vocab: int = 1000) -> Example:
    """LSTM language model: 2 layers of 256 over 128-wide embeddings, seq 32, vocab 1000 (~1.3 M)."""
    torch.manual_seed(0)
    tokens = torch.randint(0, vocab, (batch, seq))
    target = torch.randint(0, vocab, (batch, seq))
    return LSTMLanguageModel(vocab, 128, 256, 2), (tokens,), target, token_loss


class GRUClassifier(nn.Module):
    """A 2-layer ``nn.GRU`` over feature frames; the last step's hidden state feeds a linear head."""

    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.gru = nn.GRU(features, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x)
        return self.head(out[:, -1])


def gru_classifier(batch: int, seq: int = 50, features: int = 40, classes: int = 10) -> Example:
    """GRU classifier over (batch, 50, 40) feature frames, hidden 128 (~0.2 M parameters)."""
    torch.manual_seed(0)
    inputs = (torch.randn(batch, seq, features),)
    return GRUClassifier(features, 128, classes), inputs, torch.randint(0, classes, (batch,)), nn.CrossEntropyLoss()


# ---- attention -----------------------------------------------------------------------------------------
class EncoderClassifier(nn.Module):
    """Token + learned position embeddings, ``nn.TransformerEncoder`` (batch_first), mean pool, head."""

    def __init__(self, vocab: int, seq: int, d_model: int, heads: int, layers: int, classes: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(1, seq, d_model))
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=2 * d_model, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens) + self.pos).mean(dim=1))


def transformer_encoder(batch: int, seq: int = 64, vocab: int = 1000, classes: int = 4) -> Example:
    """Text classifier: 2 encoder layers, d 128, 4 heads, seq 64, vocab 1000 (~0.4 M parameters)."""
    torch.manual_seed(0)
    tokens = torch.randint(0, vocab, (batch, seq))
    model = EncoderClassifier(vocab, seq, 128, 4, 2, classes)
    return model, (tokens,), torch.randint(0, classes, (batch,)), nn.CrossEntropyLoss()


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention through ``F.scaled_dot_product_attention(is_causal=True)``."""

    def __init__(self, d_model: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.drop(self.proj(y.transpose(1, 2).reshape(b, t, d)))


class GPTBlock(nn.Module):
    """Pre-LayerNorm decoder block: causal attention and a GELU MLP, each in a residual branch."""

    def __init__(self, d_model: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model),
                                 nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """GPT-style decoder; the LM head shares the token embedding's weight (tied embeddings)."""

    def __init__(self, vocab: int, seq: int, d_model: int, heads: int, layers: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(GPTBlock(d_model, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.drop(self.tok(tokens) + self.pos(positions))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def _gpt_example(batch: int, vocab: int, seq: int, d_model: int, heads: int, layers: int) -> Example:
    torch.manual_seed(0)
    tokens = torch.randint(0, vocab, (batch, seq))
    target = torch.randint(0, vocab, (batch, seq))
    return GPT(vocab, seq, d_model, heads, layers), (tokens,), target, token_loss


def gpt(batch: int) -> Example:
    """A small GPT: 2 layers, d 128, 4 heads, seq 64, vocab 1000, tied head (~0.5 M parameters)."""
    return _gpt_example(batch, vocab=1000, seq=64, d_model=128, heads=4, layers=2)


def gpt2_small(batch: int) -> Example:
    """GPT-2 small's shape: 12 layers, d 768, 12 heads, seq 1024, vocab 50257, tied head (124 M parameters).

    Meant for estimates (speed benchmark); a real train step needs several GiB.
    """
    return _gpt_example(batch, vocab=50257, seq=1024, d_model=768, heads=12, layers=12)


class ViTBlock(nn.Module):
    """Pre-LayerNorm transformer block with ``nn.MultiheadAttention`` and a GELU MLP."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 2 * d_model), nn.GELU(), nn.Linear(2 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    """Vision Transformer: a strided conv embeds patches, a cls token is prepended, blocks, head on cls."""

    def __init__(self, size: int, patch: int, d_model: int, heads: int, layers: int, classes: int) -> None:
        super().__init__()
        tokens = (size // patch) ** 2 + 1
        self.patch = nn.Conv2d(3, d_model, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, d_model))
        self.pos = nn.Parameter(torch.zeros(1, tokens, d_model))
        self.blocks = nn.Sequential(*(ViTBlock(d_model, heads) for _ in range(layers)))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.ln(self.blocks(x))[:, 0])


def vit(batch: int) -> Example:
    """ViT on 32x32x3: 4x4 patches (65 tokens), d 128, 4 heads, 2 blocks (~0.3 M parameters)."""
    torch.manual_seed(0)
    inputs, target = _images(batch)
    return ViT(32, 4, 128, 4, 2, 10), inputs, target, nn.CrossEntropyLoss()
