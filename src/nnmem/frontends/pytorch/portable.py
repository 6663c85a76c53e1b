"""Send a step to the measuring child when plain pickling refuses part of it.

A parametrized module (``torch.nn.utils.parametrize``, e.g. the weight norm of Wav2Vec2's positional
convolution) refuses ``__getstate__``; it is sent as its plain class and state and parametrized again on
arrival, with the same parametrization modules and original tensors (torch's own ``_inject_new_class`` and
``_inject_property``, the steps ``register_parametrization`` takes).
"""

from __future__ import annotations

import io
from typing import Any

import cloudpickle
import torch
from torch.nn.utils import parametrize

__all__ = ["dumps"]


class _Pickler(cloudpickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.nn.Module) and parametrize.is_parametrized(obj):
            base = type(obj).__mro__[1]
            names = list(obj.parametrizations.keys())  # type: ignore[union-attr,operator]
            return _new, (base,), (dict(obj.__dict__), names), None, None, _restore
        return super().reducer_override(obj)


def _new(base: type[torch.nn.Module]) -> torch.nn.Module:
    return base.__new__(base)


def _restore(module: torch.nn.Module, state: tuple[dict[str, Any], list[str]]) -> None:
    values, names = state
    module.__dict__.update(values)
    parametrize._inject_new_class(module)
    for name in names:
        parametrize._inject_property(module, name)


def dumps(value: Any) -> bytes:
    """``cloudpickle.dumps``, with parametrized modules sent as their plain class and state."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=cloudpickle.DEFAULT_PROTOCOL).dump(value)
    return buffer.getvalue()
