"""Fixtures of the torch backend's tests (imports stay inside them: this folder also loads on other backends)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.fixture
def zoo_step() -> Callable[..., Any]:
    """``zoo_step(name, mode, batch=4, optimizer="adam")``: a Keras zoo model's prepared step."""

    def make(name: str, mode: str, batch: int = 4, optimizer: str = "adam") -> Any:
        from nnmem.frontends.keras.common import prepare
        from nnmem.zoo.keras_models import FACTORIES

        model, x, y, loss = FACTORIES[name](batch)
        return prepare(model, x, y, mode=mode, optimizer=optimizer if mode == "train" else None, loss=loss)

    return make
