"""Names the Keras frontend accepts, importable without Keras (argument checks, CLI choices)."""

from __future__ import annotations

__all__ = ["KERAS_OPTIMIZERS"]

KERAS_OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "rmsprop", "adagrad", "adadelta", "adamax", "nadam",
                    "lion", "ftrl", "adafactor")
