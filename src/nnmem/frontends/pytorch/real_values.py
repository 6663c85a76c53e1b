"""Real values carried alongside a fake trace, for the ops whose output depends on data.

Fake tensors have shapes but no values, so ``.item()``, ``nonzero``, boolean-mask indexing and ``unique``
cannot run on them. The inputs and buffers a user gives are real, so each fake copy keeps its real tensor;
an op whose tensor arguments all have real values (and is not a random draw) is run on them too, when its
outputs are small, and a data-dependent op then takes its outputs' shapes from the real result. A value
that comes from the weights or a random draw has no real counterpart: a scalar read is taken as 0 (False)
and a data-dependent size at its maximum (every mask element set); the trace says so in ``guesses``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakIdKeyDictionary

from nnmem.errors import TraceError
from nnmem.frontends.pytorch.fake_kernels import FAKE_KERNELS

__all__ = ["RealValues", "guess_note"]

# Largest output (elements) whose real value is computed alongside the fake one: masks, ids, lengths and
# positions are this small for any batch that fits a machine; activations are not computed.
COMPUTE_LIMIT = 1 << 20
# Largest stand-in (elements) built to size a data-dependent op that has no real value.
FILL_LIMIT = 1 << 26

_SCALARS = frozenset({torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default})
# Outputs whose contents are whatever the memory held: they get no real value.
_UNINITIALIZED = frozenset({torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default,
                            torch.ops.aten.empty_like.default, torch.ops.aten.new_empty.default,
                            torch.ops.aten.new_empty_strided.default})
_UNIQUE = frozenset({torch.ops.aten._unique2.default, torch.ops.aten.unique_dim.default,
                     torch.ops.aten.unique_consecutive.default, torch.ops.aten._unique.default})


class RealValues(TorchDispatchMode):
    """A dispatch mode, entered inside FakeTensorMode, that gives fake tensors their real values.

    Attributes:
        guesses: ops whose data-dependent result had no real value, with how often each was guessed.
    """

    def __init__(self) -> None:
        super().__init__()
        self._real: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._stale: WeakIdKeyDictionary = WeakIdKeyDictionary()  # fake storages written by unknown values
        self.guesses: Counter[str] = Counter()

    def bind(self, fake: Any, real: Any, *, copy: bool = False) -> None:
        """Record ``real`` as the value of ``fake`` (matching structures of tensors; meta tensors skipped).

        ``copy`` binds a copy, for the user's own tensors (inputs, buffers), which ops run on the real values
        must not change; a tensor over ``COMPUTE_LIMIT`` elements is then left without a value.
        """
        fakes, reals = tree_flatten(fake)[0], tree_flatten(real)[0]
        for f, r in zip(fakes, reals):
            if not (isinstance(f, torch.Tensor) and isinstance(r, torch.Tensor)) or r.is_meta:
                continue
            if copy and r.numel() > COMPUTE_LIMIT:
                continue
            with _disable_current_modes():
                self._real[f] = r.detach().clone() if copy else r.detach()

    def _value(self, t: Any) -> Any:
        """The real value of an argument: itself for a non-tensor or real tensor, None when unknown."""
        if not isinstance(t, FakeTensor):
            return t
        if t.untyped_storage() in self._stale:
            return None
        return self._real.get(t)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        kernel = FAKE_KERNELS.get(func)
        out = kernel(*args, **kwargs) if kernel is not None else None
        if out is not None:
            return out
        real = self._real_args(func, args, kwargs)
        try:
            out = func(*args, **kwargs)
        except (DataDependentOutputException, DynamicOutputShapeException):
            return self._data_dependent(func, args, kwargs, real)
        if real is not None and sum(t.numel() for t in _fakes(out)) <= COMPUTE_LIMIT:
            with _disable_current_modes():
                self.bind(out, func(*real[0], **real[1]))
        else:
            for i, t in enumerate(_mutated(func, args, kwargs)):
                self._stale[t.untyped_storage()] = i
        return out

    def _real_args(self, func: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        """The arguments with real values in place of fake tensors, or None if any is unknown or random."""
        if torch.Tag.nondeterministic_seeded in func.tags or func in _UNINITIALIZED:
            return None
        values = tree_map(self._value, (args, kwargs))
        if any(v is None and isinstance(a, torch.Tensor)
               for v, a in zip(tree_flatten(values)[0], tree_flatten((args, kwargs))[0])):
            return None
        return values

    def _data_dependent(self, func: Any, args: Any, kwargs: Any, real: tuple[Any, Any] | None) -> Any:
        if real is None and func in _SCALARS:
            self.guesses[str(func)] += 1
            return False if args[0].dtype == torch.bool else 0
        with _disable_current_modes():
            if real is None:  # the largest result; a guess unless an empty stand-in gives the same shapes
                real = tree_map(lambda a: self._value_or_stand_in(a, func, full=True), (args, kwargs))
                empty = tree_map(lambda a: self._value_or_stand_in(a, func, full=False), (args, kwargs))
                if _shapes(func(*empty[0], **empty[1])) != _shapes(result := func(*real[0], **real[1])):
                    self.guesses[str(func)] += 1
            else:
                result = func(*real[0], **real[1])
        if func in _SCALARS:
            return result
        out = tree_map(_fake_like, result)
        self.bind(out, result)
        return out

    def _value_or_stand_in(self, t: Any, func: Any, *, full: bool) -> Any:
        value = self._value(t)
        return _stand_in(t, func, full=full) if value is None else value


def _stand_in(fake: torch.Tensor, func: Any, *, full: bool) -> torch.Tensor:
    """A real tensor that gives a data-dependent op its largest output (``full``: every element set, distinct
    values for unique) or its smallest (all zero)."""
    if fake.numel() > FILL_LIMIT:
        raise TraceError(f"{func} needs the values of a {tuple(fake.shape)} tensor computed from the weights; "
                         f"nnmem sizes such ops from a stand-in of at most {FILL_LIMIT} elements")
    if not full:
        return torch.zeros(fake.shape, dtype=fake.dtype)
    if func in _UNIQUE:
        return torch.arange(fake.numel()).reshape(fake.shape).to(fake.dtype)
    return torch.ones(fake.shape, dtype=fake.dtype)


def _shapes(value: Any) -> list[Any]:
    """The shapes of the tensors in a result, and its other values."""
    return [tuple(t.shape) if isinstance(t, torch.Tensor) else t for t in tree_flatten(value)[0]]


def _fake_like(value: Any) -> Any:
    """A fake tensor (the active FakeTensorMode makes it) shaped like a real one."""
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="cpu")
    return value


def _fakes(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def _mutated(func: Any, args: Any, kwargs: Any) -> list[torch.Tensor]:
    """The tensor arguments the op writes to."""
    written: list[torch.Tensor] = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        written += [t for t in tree_flatten(value)[0] if isinstance(t, FakeTensor)]
    return written


def guess_note(guesses: Counter[str]) -> str:
    """The report's note on data-dependent results that had no real value."""
    ops = ", ".join(f"{op} ×{n}" for op, n in sorted(guesses.items()))
    return ("some results depended on values computed from the weights or drawn at random "
            f"({ops}): a scalar read was taken as 0 (False) and a data-dependent size at its largest, "
            "so memory that depends on them is an upper bound")
