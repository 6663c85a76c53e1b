"""resolve(): the one dispatcher picks a frontend from the model's class or the MODEL spec, or says why not."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import nnmem
from nnmem.frontends.base import StepRequest, framework_of, resolve


def test_a_torch_module_and_a_builtin_spec_go_to_pytorch() -> None:
    assert framework_of(torch.nn.Linear(2, 2)) == "pytorch"
    assert framework_of("mlp") == "pytorch"
    assert resolve("mlp").name == "pytorch"


def test_keras_specs_are_recognised_without_importing_keras() -> None:
    code = ("import sys; from nnmem.frontends.base import framework_of; "
            "print(framework_of('keras_mlp'), framework_of('model.keras'), 'keras' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["keras", "keras", "False"]


def test_a_factory_file_importing_keras_goes_to_keras(tmp_path: Path) -> None:
    path = tmp_path / "kmodel.py"
    path.write_text(textwrap.dedent("""
        import keras

        def factory(batch):
            return keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    """))
    torch_path = tmp_path / "tmodel.py"
    torch_path.write_text("import torch\n\ndef factory(batch):\n    return torch.nn.Linear(4, 2)\n")
    assert framework_of(f"{path}:factory") == "keras"
    assert framework_of(f"{torch_path}:factory") == "pytorch"


def test_an_unknown_object_is_a_config_error_naming_what_was_expected() -> None:
    with pytest.raises(nnmem.ConfigError, match="expected a torch.nn.Module, a Keras model or a MODEL spec"):
        resolve(object())
    with pytest.raises(nnmem.ConfigError, match="Received: dict"):
        nnmem.estimate({"not": "a model"})


def test_a_missing_framework_names_the_extra_to_install() -> None:
    # A process where importing keras fails as if it were not installed.
    code = textwrap.dedent("""
        import sys
        sys.modules["keras"] = None
        import nnmem
        try:
            nnmem.estimate("keras_mlp")
        except nnmem.MissingFrameworkError as err:
            print("missing:", err)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("missing:") and "pip install 'nnmem[keras]'" in out


def test_requests_are_immutable() -> None:
    request = StepRequest(model="mlp", batch=2)
    changed = request.with_(batch=4)
    assert (request.batch, changed.batch) == (2, 4)
    with pytest.raises(AttributeError):
        request.batch = 8  # type: ignore[misc]
