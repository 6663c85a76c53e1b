"""The built-in example models: they build on the meta device and for real, and the registry behaves."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from nnmem import zoo
from nnmem.errors import ModelLoadError
from nnmem.loader import resolve_factory

SMALL = [name for name in zoo.names() if name != "gpt2_small" and name not in zoo.KERAS]


def test_importing_the_zoo_does_not_import_torch() -> None:
    code = "import sys, nnmem.zoo; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_registry_is_consistent() -> None:
    assert zoo.names()[0] == "mlp"
    assert set(zoo.names()) == set(zoo.BUILTIN)
    assert set(zoo.ACCURACY_ZOO) == set(zoo.names()) - {"gpt2_small"} - set(zoo.KERAS)
    for name in zoo.names():
        module = "nnmem.zoo.keras_models:" if name in zoo.KERAS else "nnmem.zoo.torch_models:"
        assert zoo.BUILTIN[name].startswith(module)
        assert zoo.describe(name) and "\n" not in zoo.describe(name)
        if name not in zoo.KERAS:  # importing Keras fixes its backend; the Keras zoo is tested in tests/frontends/keras
            assert callable(zoo.resolve(name))
    assert zoo.DEFAULT_BATCH > 0


def test_unknown_name_is_a_model_load_error_listing_the_builtins() -> None:
    with pytest.raises(KeyError):
        zoo.resolve("no_such_model")
    with pytest.raises(ModelLoadError, match="mlp"):
        resolve_factory("no_such_model")
    assert resolve_factory("resnet") is zoo.resolve("resnet")


def test_mlp_is_the_classic_example() -> None:
    model, inputs, target, loss_fn = zoo.resolve("mlp")(4)
    assert [name for name, _ in model.named_children()] == ["fc1", "relu1", "fc2", "relu2", "fc3"]
    assert sum(p.numel() for p in model.parameters()) == 41_802
    assert inputs[0].shape == (4, 256) and target.shape == (4,)
    assert loss_fn(model(*inputs), target).dim() == 0


@pytest.mark.parametrize("name", [n for n in zoo.names() if n not in zoo.KERAS])
def test_factory_builds_on_meta(name: str) -> None:
    with torch.device("meta"):
        model, inputs, target, loss_fn = zoo.resolve(name)(2)
        assert all(p.is_meta for p in model.parameters())
        assert all(t.is_meta for t in inputs) and target.is_meta
        if name != "gpt2_small":
            out = model(*inputs)
            assert loss_fn(out, target).dim() == 0
    assert inputs[0].shape[0] == 2


@pytest.mark.parametrize("name", SMALL)
def test_factory_builds_for_real_and_trains(name: str) -> None:
    model, inputs, target, loss_fn = zoo.resolve(name)(2)
    count = sum(p.numel() for p in model.parameters())
    assert 10_000 <= count <= 5_000_000
    loss = loss_fn(model(*inputs), target)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    model.eval()
    with torch.inference_mode():
        assert model(*inputs).shape[0] == 2


@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_factories_are_deterministic(name: str) -> None:
    a, xa, ta, _ = zoo.resolve(name)(2)
    b, xb, tb, _ = zoo.resolve(name)(2)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert torch.equal(xa[0], xb[0]) and torch.equal(ta, tb)


def test_gpt_ties_the_head_to_the_embedding() -> None:
    with torch.device("meta"):
        model, *_ = zoo.resolve("gpt2_small")(1)
    assert model.head.weight is model.tok.weight
    assert sum(p.numel() for p in model.parameters()) == 124_439_808
