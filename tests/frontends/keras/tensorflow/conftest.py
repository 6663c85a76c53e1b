"""Fixtures of the TensorFlow backend's tests (imports stay inside them: this folder also loads on other backends)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.fixture
def zoo_step() -> Callable[[str, str, int], Any]:
    """``zoo_step(name, mode, batch)``: a Keras zoo model's prepared step, with Adam for a train step."""

    def make(name: str, mode: str, batch: int) -> Any:
        from nnmem.frontends.keras.common import prepare
        from nnmem.zoo.keras_models import FACTORIES

        model, x, y, loss = FACTORIES[name](batch)
        if mode == "train":
            return prepare(model, x, y, mode="train", optimizer="adam", loss=loss)
        return prepare(model, x, None, mode="infer")

    return make
