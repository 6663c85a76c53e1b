"""Real values in a fake trace, for the ops whose output depends on data.

Fake tensors have shapes but no values, so ``.item()``, ``nonzero``, boolean masks and ``unique`` cannot run
on them, and libraries take their tracing path on a FakeTensor (transformers ``is_tracing``). Small inputs and
buffers stay plain tensors: ops on plain tensors alone run for real, so code takes the path it takes in the
real step; a fake tensor computed from plain ones keeps its real value beside it. A value from the weights or
a random draw has none: a scalar read is taken as 0 (False), a data-dependent size at its largest, noted in
``guesses``; the indices of a ``topk`` over such values (a mixture of experts' routing) follow ``ROUTINGS``.
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
from nnmem.frontends.pytorch.fake_kernels import FAKE_KERNELS, VALUE_ARGS
from nnmem.units import format_bytes

__all__ = ["COMPUTE_LIMIT", "ROUTINGS", "RealValues", "guess_note", "routing_note"]

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


_TOPK = torch.ops.aten.topk.default
# How the indices of a topk over unknown scores are chosen: "balanced" spreads the picks of successive rows
# over all candidates (row r takes r*k .. r*k+k-1, modulo n: every expert gets the same load), "packed"
# gives every row candidate 0 (one expert takes every token, the largest load it can get), the last
# candidate one row, and spreads the other picks over the rest.
ROUTINGS = ("balanced", "packed")


class RealValues(TorchDispatchMode):
    """A dispatch mode, entered inside FakeTensorMode, that gives fake tensors their real values.

    Args:
        routing: one of ``ROUTINGS``, for the indices of a ``topk`` over values with no real counterpart.

    Attributes:
        guesses: ops whose data-dependent result had no real value, with how often each was guessed.
        routed: whether a ``topk`` over unknown values had its indices chosen by ``routing``.
    """

    def __init__(self, routing: str = ROUTINGS[0]) -> None:
        super().__init__()
        self._real: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._stale: WeakIdKeyDictionary = WeakIdKeyDictionary()  # fake storages written by unknown values
        self._routing = routing
        self.guesses: Counter[str] = Counter()
        self.routed = False

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
        index = VALUE_ARGS.get(func)
        if index is not None and index < len(args) and (value := self._value(args[index])) is not None:
            args = (*args[:index], value, *args[index + 1:])  # the kernel reads these values
        out = kernel(*args, **kwargs) if kernel is not None else None
        if out is not None:
            return out
        real = self._real_args(func, args, kwargs)
        leaves = tree_flatten((args, kwargs))[0]
        if real is not None and not any(isinstance(a, FakeTensor) for a in leaves) \
                and any(isinstance(a, torch.Tensor) for a in leaves):
            with _disable_current_modes():  # plain tensors in, plain tensors out: the user's small values
                return func(*args, **kwargs)
        try:
            out = func(*args, **kwargs)
        except (DataDependentOutputException, DynamicOutputShapeException):
            return self._data_dependent(func, args, kwargs, real)
        if real is not None and sum(t.numel() for t in _fakes(out)) <= COMPUTE_LIMIT:
            with _disable_current_modes():
                result = func(*real[0], **real[1])
            if not any(isinstance(a, FakeTensor) for a in tree_flatten((args, kwargs))[0]):
                return result  # stays a plain tensor: code that takes a fast path on real values takes it here
            self.bind(out, result)
        elif func is _TOPK and out[1].numel() <= COMPUTE_LIMIT:
            self.routed = True
            dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
            candidates = args[0].shape[dim] if args[0].dim() else 1
            with _disable_current_modes():
                self.bind(out[1], _route(tuple(out[1].shape), dim, candidates, self._routing == "packed"))
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


def _route(shape: tuple[int, ...], dim: int, candidates: int, packed: bool) -> torch.Tensor:
    """topk indices of ``shape`` along ``dim`` out of ``candidates``, as ``ROUTINGS`` describes."""
    if not shape:
        return torch.zeros((), dtype=torch.long)
    dim %= len(shape)
    k = shape[dim]
    rows = 1
    for i, size in enumerate(shape):
        rows *= size if i != dim else 1
    row = torch.arange(rows).unsqueeze(1)
    if packed:  # candidate 0 in every row (its load is every row); the last candidate in one row only;
        # the other picks spread over the rest (an expert loop's backward, last expert first, frees least)
        middle = max(candidates - 2, 1)
        rest = (row * (k - 1) + torch.arange(k - 1)) % middle + 1
        picks = torch.cat([torch.zeros(rows, 1, dtype=torch.long), rest], dim=1)
        if k > 1 and candidates > 2:
            picks[0, -1] = candidates - 1
    else:
        picks = (row * k + torch.arange(k)) % max(candidates, 1)
    moved = [size for i, size in enumerate(shape) if i != dim] + [k]
    return picks.reshape(moved).movedim(-1, dim).contiguous()


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


def routing_note(balanced: dict[str, int], packed: dict[str, int]) -> str:
    """The report's note on a step whose routing (``topk`` over values from the weights) was chosen."""
    def figures(peaks: dict[str, int]) -> str:
        return ", ".join(f"{level} {format_bytes(nbytes, 3)}" for level, nbytes in peaks.items())

    return ("expert routing depends on the weights, so it was bounded: with every expert equally loaded the "
            f"step peaks at {figures(balanced)}; with one expert taking every token at {figures(packed)}; "
            "the report gives the larger")
