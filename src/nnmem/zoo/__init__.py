"""Built-in example models, named on the command line (``nnmem estimate resnet``).

Each entry points at a factory ``name(batch) -> (model, inputs, target, loss_fn)`` in
:mod:`nnmem.zoo.torch_models`. The factories are imported only when one is resolved, so importing
this package does not import torch.

Example:
    >>> from nnmem import zoo
    >>> zoo.names()[0]
    'mlp'
    >>> zoo.describe("mlp")  # doctest: +ELLIPSIS
    'MLP 256 -> 128 -> 64 -> 10 ...'
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from nnmem.errors import MissingFrameworkError

__all__ = ["ACCURACY_ZOO", "BUILTIN", "DEFAULT_BATCH", "KERAS", "describe", "names", "resolve"]

DEFAULT_BATCH = 8
"""Batch the examples are sized for (a real train step well under 0.5 s on 2 CPU cores)."""

_MODULE = "nnmem.zoo.torch_models"

# name -> (factory spec, one-line description); the order is the display order.
_ENTRIES: dict[str, tuple[str, str]] = {
    "mlp": ("mlp", "MLP 256 -> 128 -> 64 -> 10 with ReLU (the classic 41,802-parameter example)"),
    "vgg": ("vgg", "VGG-style CNN, 32x32x3 input: conv-BatchNorm-ReLU(inplace) blocks, max pooling, dropout"),
    "resnet": ("resnet", "ResNet with basic blocks, skip connections and 1x1 downsampling convs, 32x32x3"),
    "densenet": ("densenet", "DenseNet: dense blocks concatenating features (torch.cat), transition layers"),
    "unet": ("unet", "U-Net: encoder/decoder with skip concatenation, ConvTranspose2d, per-pixel loss"),
    "lstm_lm": ("lstm_lm", "LSTM language model: Embedding, 2-layer nn.LSTM (batch_first), vocabulary head"),
    "gru_classifier": ("gru_classifier", "GRU sequence classifier: nn.GRU over features, linear head"),
    "transformer_encoder": ("transformer_encoder",
                            "nn.TransformerEncoder (batch_first) text classifier with mean pooling"),
    "gpt": ("gpt", "GPT-style decoder: causal scaled_dot_product_attention, GELU MLP, tied embeddings"),
    "mobilenet": ("mobilenet", "MobileNet-style CNN: depthwise separable convs (groups=channels), ReLU6"),
    "vit": ("vit", "Vision Transformer: patch-embedding conv, cls token, nn.MultiheadAttention blocks"),
    "audio_cnn": ("audio_cnn", "1-D CNN on a 16,000-sample waveform: Conv1d, BatchNorm1d, pooling"),
    "gpt2_small": ("gpt2_small", "GPT-2 small shape (12 layers, d 768, 12 heads, seq 1024, vocab 50257); "
                                 "for estimates only"),
}

_KERAS_MODULE = "nnmem.zoo.keras_models"

# Keras models, run on the process's KERAS_BACKEND (see nnmem.zoo.keras_models).
_KERAS_ENTRIES: dict[str, str] = {
    "keras_mlp": "Keras Sequential MLP 256 -> 128 -> 64 -> 10 (the classic 41,802-parameter example)",
    "keras_two_branch_cnn": "Keras functional CNN: two conv branches concatenated, BatchNorm, pooling, 32x32x3",
    "keras_lstm": "Keras Embedding -> LSTM 128 over 32 tokens -> Dense",
    "keras_transformer_block": "Keras Transformer block: MultiHeadAttention (4 heads), LayerNorm, GELU MLP",
    "keras_separable_cnn": "Keras SeparableConv2D stack on 32x32x3",
    "keras_conv1d_gru": "Keras Conv1D over 400 steps, max pooling, GRU 64",
    "keras_mixed_float16": "Keras CNN under the mixed_float16 policy (float16 compute, loss scaling)",
    "keras_partly_frozen": "Keras CNN whose first conv block is frozen (trainable=False)",
    "keras_subclassed": "Keras subclassed model: residual Dense blocks with LayerNorm and dropout",
}

KERAS: dict[str, str] = {name: f"{_KERAS_MODULE}:{name}" for name in _KERAS_ENTRIES}
"""Built-in Keras example name -> ``"module:factory"`` spec."""

BUILTIN: dict[str, str] = {**{name: f"{_MODULE}:{func}" for name, (func, _) in _ENTRIES.items()}, **KERAS}
"""Built-in name -> ``"module:factory"`` spec."""

ACCURACY_ZOO: tuple[str, ...] = tuple(name for name in _ENTRIES if name != "gpt2_small")
"""The models ``benchmarks/accuracy.py`` measures (all small enough to run for real on a CPU)."""


def names() -> tuple[str, ...]:
    """Built-in example names, in display order (PyTorch, then Keras)."""
    return (*_ENTRIES, *_KERAS_ENTRIES)


def describe(name: str) -> str:
    """One-line description of a built-in example.

    Raises:
        KeyError: ``name`` is not a built-in (``nnmem.loader.resolve_factory`` gives the user-facing error).
    """
    return _KERAS_ENTRIES[name] if name in _KERAS_ENTRIES else _ENTRIES[name][1]


def resolve(name: str) -> Callable[..., Any]:
    """The factory of a built-in example (imports torch on first use).

    Raises:
        KeyError: ``name`` is not a built-in.
        MissingFrameworkError: PyTorch, which the built-in examples are written in, is not installed.
    """
    module, _, attr = BUILTIN[name].partition(":")
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as err:
        if name in KERAS and str(err.name).split(".")[0] in ("keras", "jax", "jaxlib", "tensorflow", "torch"):
            raise MissingFrameworkError(
                f"the built-in example {name!r} needs Keras and its backend ({err.name} is not installed): "
                "pip install 'nnmem[keras]'"
            ) from err
        if err.name == "torch" or str(err.name).startswith("torch."):
            raise MissingFrameworkError(
                f"the built-in example {name!r} needs PyTorch, which is not installed: pip install 'nnmem[torch]'"
            ) from err
        raise
    factory: Callable[..., Any] = getattr(loaded, attr)
    return factory
