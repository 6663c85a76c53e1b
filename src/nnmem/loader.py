"""Resolve MODEL specs: a built-in example name, ``path/to/file.py:factory`` or ``package.module:factory``.

A factory is called as ``factory(batch)`` and returns a model, or ``(model, inputs[, target[, loss_fn]])``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nnmem.errors import ModelLoadError, NnmemError

__all__ = ["Built", "resolve_factory", "build"]


@dataclass(frozen=True, slots=True)
class Built:
    """What a factory returned, normalised."""

    model: Any
    inputs: tuple[Any, ...] | None
    target: Any = None
    loss_fn: Callable[..., Any] | None = None


def resolve_factory(spec: str) -> Callable[..., Any]:
    """Find the factory a MODEL spec names.

    Raises:
        ModelLoadError: no such built-in, file, module or attribute.
    """
    if ":" not in spec:
        from nnmem import zoo

        if spec in zoo.BUILTIN:
            return zoo.resolve(spec)
        if spec.endswith(".py"):
            raise ModelLoadError(f"expected MODEL as 'file.py:factory'; {spec!r} names no factory. Add ':name'")
        raise ModelLoadError(
            f"unknown MODEL {spec!r}: expected a built-in example ({', '.join(zoo.names())}), "
            "'path/to/file.py:factory' or 'package.module:factory'"
        )
    where, _, attr = spec.rpartition(":")
    module = _load_file(where) if where.endswith(".py") else _import(where)
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        found = "not found" if factory is None else f"a {type(factory).__name__}, not callable"
        raise ModelLoadError(f"expected a callable factory {attr!r} in {where}: {found}")
    return factory


_LOADED: dict[str, tuple[int, Any]] = {}  # resolved path → (mtime_ns when imported, module)


def _load_file(path_text: str) -> Any:
    """Import a model file once per version of it: asking which framework a spec uses and then building
    it must not run the user's module twice."""
    path = Path(path_text)
    if not path.is_file():
        raise ModelLoadError(f"model file not found: {path_text}")
    key, mtime = str(path.resolve()), path.stat().st_mtime_ns
    cached = _LOADED.get(key)
    if cached is not None and cached[0] == mtime:
        return cached[1]
    module = _import_file(path, path_text)
    _LOADED[key] = (mtime, module)
    return module


def _import_file(path: Path, path_text: str) -> Any:
    name = f"_nnmem_user_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ModelLoadError(f"cannot import {path_text} as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except NnmemError:
        raise
    except Exception as err:
        raise ModelLoadError(f"importing {path_text} failed: {type(err).__name__}: {err}") from err
    import cloudpickle

    # The module's name exists in this process only: a measuring child gets its factories by value.
    cloudpickle.register_pickle_by_value(module)
    return module


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        raise ModelLoadError(f"cannot import module {name!r}: {err}") from err
    except Exception as err:
        raise ModelLoadError(f"importing {name} failed: {type(err).__name__}: {err}") from err


def build(factory: Callable[..., Any], batch: int, spec: str = "") -> Built:
    """Call ``factory(batch)`` and normalise what it returns.

    Raises:
        ModelLoadError: the factory raised, or returned something other than a model or a tuple.
    """
    try:
        result = factory(batch)
    except NnmemError:
        raise
    except Exception as err:
        raise ModelLoadError(f"the factory {spec or factory!r} raised {type(err).__name__}: {err}") from err
    if isinstance(result, tuple):
        if not 1 <= len(result) <= 4:
            raise ModelLoadError(
                f"expected the factory to return a model or (model, inputs[, target[, loss_fn]]); "
                f"it returned a tuple of {len(result)}"
            )
        model, inputs, target, loss_fn = (*result, None, None, None)[:4]
        if inputs is not None and not isinstance(inputs, (tuple, list)):
            inputs = (inputs,)
        return Built(model, tuple(inputs) if inputs is not None else None, target, loss_fn)
    return Built(result, None)
