"""The optimizer registry: its names, its errors, and its state figures against what the frameworks allocate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from nnmem import optimizers
from nnmem.errors import ConfigError
from nnmem.frontends.pytorch.step import make_optimizer

TORCH_NAMES = ("sgd", "momentum", "adam", "adamw", "rmsprop", "adagrad")
KERAS_ONLY = ("adadelta", "adamax", "nadam", "lion", "ftrl", "adafactor")


def test_names_per_framework() -> None:
    assert optimizers.names("torch") == TORCH_NAMES
    assert optimizers.names("keras") == TORCH_NAMES + KERAS_ONLY
    assert optimizers.names() == TORCH_NAMES + KERAS_ONLY
    assert all(optimizers.get(n).frameworks == ("keras",) for n in KERAS_ONLY)


def test_registry_imports_no_framework() -> None:
    code = ("import sys, nnmem.optimizers; "
            "print([m for m in ('torch', 'keras', 'tensorflow', 'jax') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_unknown_name_lists_the_valid_names_on_one_line() -> None:
    with pytest.raises(ConfigError) as err:
        optimizers.get("lamb")
    assert str(err.value) == ("unknown optimizer 'lamb': expected one of sgd, momentum, adam, adamw, rmsprop, "
                              "adagrad (Keras also: adadelta, adamax, nadam, lion, ftrl, adafactor) or an optimizer "
                              "class")
    with pytest.raises(ConfigError, match=r"^unknown optimizer 'lion': expected one of sgd, momentum, adam, adamw, "
                                          r"rmsprop, adagrad or a torch.optim.Optimizer subclass \('lion' is "
                                          r"Keras-only\)$"):
        optimizers.get("lion", "torch")
    with pytest.raises(ConfigError, match="unknown framework 'jax': expected one of torch, keras"):
        optimizers.names("jax")
    assert optimizers.get("AdamW").name == "adamw"


def test_torch_builds_are_the_ones_nnmem_always_used() -> None:
    built = {n: (b.class_name, dict(b.kwargs)) for n in TORCH_NAMES if (b := optimizers.get(n).torch)}
    assert built == {"sgd": ("SGD", {"lr": 1e-3}), "momentum": ("SGD", {"lr": 1e-3, "momentum": 0.9}),
                     "adam": ("Adam", {"lr": 1e-3}), "adamw": ("AdamW", {"lr": 1e-3}),
                     "rmsprop": ("RMSprop", {"lr": 1e-3}), "adagrad": ("Adagrad", {"lr": 1e-3})}
    opt = make_optimizer("momentum", [torch.nn.Parameter(torch.zeros(2))])
    assert type(opt) is torch.optim.SGD and opt.defaults["momentum"] == 0.9 and opt.defaults["lr"] == 1e-3
    user = make_optimizer(torch.optim.RMSprop, [torch.nn.Parameter(torch.zeros(2))])
    assert type(user) is torch.optim.RMSprop and user.defaults["lr"] == optimizers.TORCH_LR


def _stepped(name: str) -> tuple[torch.optim.Optimizer, list[torch.nn.Parameter]]:
    """The real optimizer after one real step on a conv + linear model and a bfloat16 parameter."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 5))
    low = torch.nn.Parameter(torch.randn(7, 3, dtype=torch.bfloat16))
    params = [*model.parameters(), low]
    opt = make_optimizer(name, params)
    model(torch.randn(2, 3, 8, 8)).square().mean().backward()
    low.grad = torch.ones_like(low)
    opt.step()
    return opt, params


@pytest.mark.parametrize("name", TORCH_NAMES)
def test_torch_state_matches_what_torch_allocates(name: str) -> None:
    opt, params = _stepped(name)
    state = optimizers.get(name).build("torch").state
    tensors = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    assert sum(t.numel() * t.element_size() for t in tensors) == state.nbytes(
        [(tuple(p.shape), p.element_size()) for p in params])
    per_parameter = [c for c in state.counters if c.per is optimizers.Per.PARAMETER]
    for p in params:
        kept = opt.state.get(p, {})
        assert set(kept) == {s.name for s in state.slots} | {c.name for c in per_parameter}
        for slot in state.slots:
            assert kept[slot.name].shape == p.shape and kept[slot.name].dtype == p.dtype
        for counter in per_parameter:
            assert kept[counter.name].dtype == torch.float32 and kept[counter.name].numel() == 1
            assert kept[counter.name].device.type == ("cpu" if counter.host else p.device.type)
    assert len(state.slots) == state.slots_per_parameter


def test_torch_default_implementation_follows_torch() -> None:
    from torch.optim.optimizer import _default_to_fused_or_foreach
    from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices

    _, params = _stepped("sgd")
    fused, foreach = _default_to_fused_or_foreach(list(params), differentiable=False, use_fused=False)
    assert (fused, foreach) == (False, False)
    assert optimizers.get("adam").torch_implementation("cpu") is optimizers.Implementation.FOR_LOOP
    private = torch._C._get_privateuse1_backend_name()
    for device in _get_foreach_kernels_supported_devices():
        if device != private:
            assert optimizers.torch_default_implementation(device) is optimizers.Implementation.FOREACH
    with pytest.raises(ConfigError, match="'lion' is Keras-only"):
        optimizers.get("lion").torch_implementation("cuda")


_KERAS_SCRIPT = textwrap.dedent("""
    import json
    import keras, numpy as np
    from nnmem import optimizers
    from nnmem.frontends.keras.common import make_optimizer, optimizer_label

    SHAPES = {shapes!r}
    out = {{}}
    for name in optimizers.names("keras"):
        variables = [keras.Variable(np.ones(s, d), dtype=d, name=f"v{{i}}") for i, (s, d) in enumerate(SHAPES)]
        opt = make_optimizer(name)
        opt.build(variables)
        opt.apply_gradients([(keras.ops.ones_like(v), v) for v in variables])
        nbytes = sum(int(np.prod(v.shape)) * np.dtype(keras.backend.standardize_dtype(v.dtype)).itemsize
                     for v in opt.variables)
        model = keras.Sequential([keras.layers.Dense(1)])
        model.compile(optimizer=opt, loss="mse")
        out[name] = [nbytes, len(opt.variables), optimizer_label(model)]
    print(json.dumps(out))
""")
# A rank-4 kernel, a float16 bias first (Nadam's u_product takes the first variable's dtype), a rank-2 kernel.
_KERAS_SHAPES = [((4,), "float16"), ((3, 3, 2, 4), "float32"), ((6, 5), "float32")]
_ITEMSIZE = {"float16": 2, "float32": 4}


@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_keras_state_matches_what_keras_allocates(backend: str) -> None:
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, "-c", _KERAS_SCRIPT.format(shapes=_KERAS_SHAPES)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    params = [(shape, _ITEMSIZE[dtype]) for shape, dtype in _KERAS_SHAPES]
    for name in optimizers.names("keras"):
        state = optimizers.get(name).build("keras").state
        count = len(params) * len(state.slots) + sum(
            len(params) if c.per is optimizers.Per.PARAMETER else 1 for c in state.counters)
        assert measured[name] == [state.nbytes(params, backend=backend), count, name], name
