"""The Keras zoo: small models of every kind the Keras frontend must take, on any backend.

Each factory ``name(batch) -> (model, x, y, loss)`` returns an uncompiled Keras model, numpy inputs
and targets of that batch, and the Keras loss to compile with. They are sized so that a real train
step takes well under a second on 2 CPU cores. Keras is imported by the caller's backend choice
(``KERAS_BACKEND``); nothing here depends on which backend runs.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from keras import layers

__all__ = ["FACTORIES", "DESCRIPTIONS"]

Built = tuple[Any, Any, Any, Any]


def _data(batch: int, shape: tuple[int, ...], classes: int, seed: int = 0, vocab: int = 0) -> tuple[Any, Any]:
    rng = np.random.default_rng(seed)
    if vocab:
        x = rng.integers(0, vocab, size=(batch, *shape)).astype("int32")
    else:
        x = rng.standard_normal((batch, *shape)).astype("float32")
    y = rng.integers(0, classes, size=(batch,)).astype("int32")
    return x, y


_LOSS = "sparse_categorical_crossentropy"


def keras_mlp(batch: int) -> Built:
    """Input 256 → Dense 128 → Dense 64 → Dense 10: the classic 41,802-parameter example."""
    model = keras.Sequential([
        keras.Input((256,)),
        layers.Dense(128, activation="relu"),
        layers.Dense(64, activation="relu"),
        layers.Dense(10, activation="softmax"),
    ], name="keras_mlp")
    x, y = _data(batch, (256,), 10)
    return model, x, y, _LOSS


def keras_two_branch_cnn(batch: int) -> Built:
    """Functional CNN: two conv branches concatenated, BatchNorm, pooling, global average, Dense."""
    inputs = keras.Input((32, 32, 3))
    a = layers.Conv2D(16, 3, padding="same", activation="relu", name="branch_a")(inputs)
    b = layers.Conv2D(16, 5, padding="same", activation="relu", name="branch_b")(inputs)
    h = layers.Concatenate()([a, b])
    h = layers.BatchNormalization()(h)
    h = layers.MaxPooling2D()(h)
    h = layers.Conv2D(32, 3, padding="same", activation="relu")(h)
    h = layers.GlobalAveragePooling2D()(h)
    outputs = layers.Dense(10, activation="softmax")(h)
    x, y = _data(batch, (32, 32, 3), 10)
    return keras.Model(inputs, outputs, name="keras_two_branch_cnn"), x, y, _LOSS


def keras_lstm(batch: int) -> Built:
    """Embedding → LSTM 128 over 32 tokens → Dense 10."""
    model = keras.Sequential([
        keras.Input((32,), dtype="int32"),
        layers.Embedding(1000, 64),
        layers.LSTM(128),
        layers.Dense(10, activation="softmax"),
    ], name="keras_lstm")
    x, y = _data(batch, (32,), 10, vocab=1000)
    return model, x, y, _LOSS


def keras_transformer_block(batch: int) -> Built:
    """Embedding, MultiHeadAttention (4 heads) with residual and LayerNorm, GELU feed-forward, pooling."""
    inputs = keras.Input((64,), dtype="int32")
    h = layers.Embedding(1000, 64)(inputs)
    att = layers.MultiHeadAttention(num_heads=4, key_dim=16)(h, h)
    h = layers.LayerNormalization()(layers.Add()([h, att]))
    ff = layers.Dense(256, activation="gelu")(h)
    ff = layers.Dense(64)(ff)
    h = layers.LayerNormalization()(layers.Add()([h, ff]))
    h = layers.GlobalAveragePooling1D()(h)
    outputs = layers.Dense(10, activation="softmax")(h)
    x, y = _data(batch, (64,), 10, vocab=1000)
    return keras.Model(inputs, outputs, name="keras_transformer_block"), x, y, _LOSS


def keras_separable_cnn(batch: int) -> Built:
    """SeparableConv2D stack (depthwise + pointwise) with pooling on 32×32×3."""
    model = keras.Sequential([
        keras.Input((32, 32, 3)),
        layers.SeparableConv2D(32, 3, padding="same", activation="relu"),
        layers.SeparableConv2D(32, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(),
        layers.SeparableConv2D(64, 3, padding="same", activation="relu"),
        layers.GlobalAveragePooling2D(),
        layers.Dense(10, activation="softmax"),
    ], name="keras_separable_cnn")
    x, y = _data(batch, (32, 32, 3), 10)
    return model, x, y, _LOSS


def keras_conv1d_gru(batch: int) -> Built:
    """Conv1D feature extractor over 400 steps of 8 channels, max pooling, GRU 64, Dense 5."""
    model = keras.Sequential([
        keras.Input((400, 8)),
        layers.Conv1D(32, 5, activation="relu"),
        layers.MaxPooling1D(4),
        layers.GRU(64),
        layers.Dense(5, activation="softmax"),
    ], name="keras_conv1d_gru")
    x, y = _data(batch, (400, 8), 5)
    return model, x, y, _LOSS


def keras_mixed_float16(batch: int) -> Built:
    """A CNN under the ``mixed_float16`` policy: float32 variables, float16 compute, loss scaling."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = keras.Sequential([
            keras.Input((32, 32, 3)),
            layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(64, 3, padding="same", activation="relu"),
            layers.GlobalAveragePooling2D(),
            layers.Dense(10),
            layers.Activation("softmax", dtype="float32"),
        ], name="keras_mixed_float16")
    finally:
        keras.config.set_dtype_policy(previous)
    x, y = _data(batch, (32, 32, 3), 10)
    return model, x, y, _LOSS


def keras_partly_frozen(batch: int) -> Built:
    """A CNN whose first two conv blocks are frozen (no gradients, no optimizer state for them)."""
    model = keras.Sequential([
        keras.Input((32, 32, 3)),
        layers.Conv2D(32, 3, padding="same", activation="relu", name="frozen_conv1"),
        layers.BatchNormalization(name="frozen_bn1"),
        layers.Conv2D(32, 3, padding="same", activation="relu", name="frozen_conv2"),
        layers.MaxPooling2D(),
        layers.Conv2D(64, 3, padding="same", activation="relu"),
        layers.GlobalAveragePooling2D(),
        layers.Dense(256, activation="relu"),
        layers.Dense(10, activation="softmax"),
    ], name="keras_partly_frozen")
    for layer in model.layers:
        if layer.name.startswith("frozen_"):
            layer.trainable = False
    x, y = _data(batch, (32, 32, 3), 10)
    return model, x, y, _LOSS


@keras.saving.register_keras_serializable(package="nnmem")
class ResidualMLP(keras.Model):
    """A subclassed model: two residual Dense blocks with LayerNorm and dropout."""

    def __init__(self, width: int = 128, classes: int = 10, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.width, self.classes = width, classes
        self.stem = layers.Dense(width, activation="relu")
        self.denses = [layers.Dense(width, activation="relu") for _ in range(2)]
        self.norms = [layers.LayerNormalization() for _ in range(2)]
        self.drop = layers.Dropout(0.1)
        self.head = layers.Dense(classes, activation="softmax")

    def call(self, x: Any, training: bool = False) -> Any:
        h = self.stem(x)
        for dense, norm in zip(self.denses, self.norms):
            h = norm(h + dense(h))
        return self.head(self.drop(h, training=training))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "width": self.width, "classes": self.classes}


def keras_subclassed(batch: int) -> Built:
    """A subclassed keras.Model (residual MLP on 64 features) built from an input shape."""
    model = ResidualMLP(name="keras_subclassed")
    model(keras.KerasTensor((None, 64)))  # a symbolic call builds the layers (their variables only)
    x, y = _data(batch, (64,), 10)
    return model, x, y, _LOSS


FACTORIES = {
    "keras_mlp": keras_mlp,
    "keras_two_branch_cnn": keras_two_branch_cnn,
    "keras_lstm": keras_lstm,
    "keras_transformer_block": keras_transformer_block,
    "keras_separable_cnn": keras_separable_cnn,
    "keras_conv1d_gru": keras_conv1d_gru,
    "keras_mixed_float16": keras_mixed_float16,
    "keras_partly_frozen": keras_partly_frozen,
    "keras_subclassed": keras_subclassed,
}
DESCRIPTIONS = {name: (f.__doc__ or "").strip().splitlines()[0] for name, f in FACTORIES.items()}
