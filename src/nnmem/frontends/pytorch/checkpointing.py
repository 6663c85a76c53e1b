"""Gradient checkpointing of a PyTorch model: which modules to recompute (a plan), and applying it for real.

A plan names modules whose forward runs under ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``:
backward recomputes their inner activations instead of keeping them, at the cost of one more forward of each.
Plans are drawn on the model's *chain*, the ``nn.ModuleList`` or ``nn.Sequential`` with the most children that
hold parameters (a transformer's blocks, a CNN's stages, an MLP's layers):

- ``blocks``: every child of the chain that holds parameters, each on its own;
- ``every:K``: every K-th of them (the first, the K+1-th, ...);
- ``sqrt``: Chen et al. 2016 — an ``nn.Sequential`` chain of n children cut into segments of ceil(sqrt(n)),
  each but the last recomputed as one (``torch.utils.checkpoint.checkpoint_sequential``'s rule); only the
  segments' inputs stay saved;
- ``NAME[,NAME...]``: the modules so named (``model.named_modules()``);
- ``selective:PLAN``: any of the above with a selective policy (``torch.utils.checkpoint.
  create_selective_checkpoint_contexts``): the outputs of matmuls, convolutions and attention are saved, the
  pointwise ops and norms between them recomputed — less saved than none, more than full recomputation, and
  almost no recomputed FLOPs.

Applying a plan replaces the chosen modules' ``forward`` on the instances (the parameters, their names and the
``state_dict`` stay as they are; the patched model pickles). The estimate of the transformed step comes from
tracing it, like any other step.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from nnmem.errors import ConfigError, UnsupportedError

__all__ = ["CheckpointPlan", "apply_checkpointing", "chain_of", "checkpoint_plan", "checkpointed", "step_flops",
           "PLAN_KINDS"]

PLAN_KINDS = ("blocks", "every:K", "sqrt", "NAME[,NAME...]", "selective:PLAN")


@dataclass(frozen=True)
class CheckpointPlan:
    """Which modules a step recomputes in backward.

    Attributes:
        label: the plan as asked for ("blocks", "every:2", "sqrt", or the names).
        modules: qualified names of the modules checkpointed one by one.
        segments: (name of an ``nn.Sequential``, segment length) checkpointed segment by segment.
        selective: save matmul, convolution and attention outputs inside the regions, recompute the rest.
    """

    label: str
    modules: tuple[str, ...] = ()
    segments: tuple[tuple[str, int], ...] = ()
    selective: bool = False

    def describe(self) -> str:
        """One line: what is recomputed."""
        if self.selective:
            return "the ops between the matmuls, convolutions and attention of " + dataclasses.replace(
                self, selective=False).describe()
        if self.segments:
            name, length = self.segments[0]
            return f"{name or 'the model'} in segments of {length}"
        if len(self.modules) <= 3:
            return ", ".join(self.modules)
        return f"{len(self.modules)} modules ({self.modules[0]} … {self.modules[-1]})"

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "modules": list(self.modules),
                "segments": [{"module": n, "length": k} for n, k in self.segments], "selective": self.selective}


def _holds_parameters(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def chain_of(model: nn.Module) -> tuple[str, list[str]]:
    """The model's chain: (qualified name of the container, qualified names of its children).

    Raises:
        UnsupportedError: no ``nn.ModuleList`` or ``nn.Sequential`` has two children holding parameters.
    """
    best: tuple[int, int, str, list[str]] | None = None
    for name, module in model.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        children = [(f"{name}.{child}" if name else child, m) for child, m in module.named_children()]
        holding = [c for c, m in children if _holds_parameters(m)]
        if len(holding) < 2:
            continue
        size = sum(p.numel() for p in module.parameters())
        key = (len(holding), size)
        if best is None or key > best[:2]:
            best = (len(holding), size, name, [c for c, _ in children])
    if best is None:
        raise UnsupportedError(f"{type(model).__name__} has no nn.ModuleList or nn.Sequential with two or more "
                               f"layers holding parameters to checkpoint; name the modules instead "
                               f"(a plan of NAME[,NAME...])")
    return best[2], best[3]


def checkpoint_plan(model: nn.Module, plan: str) -> CheckpointPlan:
    """The plan ``plan`` names (module docstring) on ``model``.

    Raises:
        ConfigError: a malformed plan, or a module name the model does not have.
        UnsupportedError: the model has no chain for ``blocks``/``every:K``, or no ``nn.Sequential`` chain
            for ``sqrt``.
    """
    text = plan.strip()
    if text.startswith("selective:"):
        inner = checkpoint_plan(model, text.split(":", 1)[1])
        return dataclasses.replace(inner, label=text, selective=True)
    if not text:
        raise ConfigError(f"expected a checkpoint plan, one of {', '.join(PLAN_KINDS)}. Received: {plan!r}")
    if text in ("blocks", "sqrt") or text.startswith("every:"):
        name, children = chain_of(model)
        modules = dict(model.named_modules())
        holding = [c for c in children if _holds_parameters(modules[c])]
        if text == "blocks":
            return CheckpointPlan(text, tuple(holding))
        if text == "sqrt":
            if not isinstance(modules[name], nn.Sequential):
                raise UnsupportedError(f"the sqrt plan cuts an nn.Sequential into segments; the chain of "
                                       f"{type(model).__name__} ({name or 'the model'}) is a "
                                       f"{type(modules[name]).__name__}: use 'blocks' or 'every:K'")
            return CheckpointPlan(text, segments=((name, math.ceil(math.sqrt(len(children)))),))
        try:
            k = int(text.split(":", 1)[1])
        except ValueError:
            k = 0
        if k <= 0:
            raise ConfigError(f"expected every:K with K a positive integer, e.g. every:2. Received: {plan!r}")
        return CheckpointPlan(text, tuple(holding[::k]))
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    known = {n for n, _ in model.named_modules() if n}
    for n in names:
        if n not in known:
            close = difflib.get_close_matches(n, sorted(known), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; plans: {', '.join(PLAN_KINDS)}"
            raise ConfigError(f"{type(model).__name__} has no module named {n!r}{hint}")
    return CheckpointPlan(text, names)


class _CheckpointedForward:
    """A module's forward run under ``checkpoint`` (a picklable callable, set as the instance's ``forward``)."""

    def __init__(self, module: nn.Module, selective: bool = False) -> None:
        self.module, self.selective = module, selective

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        inner = functools.partial(type(self.module).forward, self.module)
        return checkpoint(inner, *args, use_reentrant=False, **_context(self.selective), **kwargs)


def _save_matmuls(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    """The selective policy: keep what is costly to recompute (matmuls, convolutions, attention)."""
    from torch.utils.checkpoint import CheckpointPolicy

    name = op.overloadpacket.__name__ if hasattr(op, "overloadpacket") else str(op)
    costly = name in _COSTLY or name.startswith("_scaled_dot_product")
    return CheckpointPolicy.MUST_SAVE if costly else CheckpointPolicy.PREFER_RECOMPUTE


_COSTLY = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "convolution", "_convolution",
                     "mkldnn_convolution", "_slow_conv2d_forward", "cudnn_convolution"})


def _context(selective: bool) -> dict[str, Any]:
    if not selective:
        return {}
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return {"context_fn": functools.partial(create_selective_checkpoint_contexts, _save_matmuls)}


def _run_segment(modules: list[nn.Module], x: Any) -> Any:
    for module in modules:
        x = module(x)
    return x


class _SegmentedForward:
    """An ``nn.Sequential``'s forward with each segment but the last under ``checkpoint``."""

    def __init__(self, sequential: nn.Sequential, length: int, selective: bool = False) -> None:
        self.sequential, self.length, self.selective = sequential, length, selective

    def __call__(self, x: Any) -> Any:
        modules = list(self.sequential)
        for start in range(0, len(modules), self.length):
            segment = modules[start:start + self.length]
            if start + self.length >= len(modules) or not torch.is_grad_enabled():
                x = _run_segment(segment, x)
            else:
                x = checkpoint(functools.partial(_run_segment, segment), x, use_reentrant=False,
                               **_context(self.selective))
        return x


def _plan(model: nn.Module, plan: CheckpointPlan | str) -> CheckpointPlan:
    return checkpoint_plan(model, plan) if isinstance(plan, str) else plan


def apply_checkpointing(model: nn.Module, plan: CheckpointPlan | str) -> nn.Module:
    """Apply ``plan`` to ``model`` for real (in place) and return it.

    Example:
        >>> model = nnmem.apply_checkpointing(model, "blocks")  # doctest: +SKIP
    """
    plan = _plan(model, plan)
    modules = dict(model.named_modules())
    for name in plan.modules:
        modules[name].forward = _CheckpointedForward(modules[name], plan.selective)
    for name, length in plan.segments:
        sequential = modules[name]
        sequential.forward = _SegmentedForward(sequential, length, plan.selective)  # type: ignore[method-assign]
    return model


def _fake_mode_active() -> bool:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return any(isinstance(mode, FakeTensorMode) for mode in _get_current_dispatch_mode_stack())


@contextmanager
def traced_rng_states() -> Iterator[None]:
    """Make a fake trace see the CPU generator states checkpointing keeps.

    ``checkpoint(..., preserve_rng_state=True)`` (the default) takes ``torch.get_rng_state()`` (a 5,056-byte
    tensor for the CPU generator) in each checkpointed forward and keeps it until that region's backward, and
    ``torch.random.fork_rng`` takes another while the region is recomputed. Those are real tensors a fake
    trace does not see: under a fake mode ``get_rng_state`` here returns a fake tensor of the same size, so
    the trace allocates and frees it where the real step does, and ``set_rng_state`` ignores it.
    """
    from torch._subclasses.fake_tensor import FakeTensor

    get, put = torch.get_rng_state, torch.set_rng_state

    def get_state() -> torch.Tensor:
        state = get()
        return torch.empty(state.shape, dtype=state.dtype) if _fake_mode_active() else state

    def set_state(new_state: torch.Tensor) -> None:
        if not isinstance(new_state, FakeTensor):
            put(new_state)

    torch.get_rng_state, torch.set_rng_state = get_state, set_state  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.get_rng_state, torch.set_rng_state = get, put  # type: ignore[assignment]


@contextmanager
def checkpointed(model: nn.Module, plan: CheckpointPlan | str) -> Iterator[CheckpointPlan]:
    """``plan`` applied to ``model`` inside the block, the model as it was after it (a fake trace sees the
    generator states the regions keep: :func:`traced_rng_states`, in every trace)."""
    plan = _plan(model, plan)
    modules = dict(model.named_modules())
    touched = [modules[n] for n in (*plan.modules, *(n for n, _ in plan.segments))]
    saved = [m.__dict__.get("forward") for m in touched]
    apply_checkpointing(model, plan)
    try:
        yield plan
    finally:
        for module, forward in zip(touched, saved):
            if forward is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = forward


def step_flops(trace: Callable[[], object]) -> int:
    """FLOPs of a step, counted with ``torch.utils.flop_counter.FlopCounterMode`` while ``trace`` traces it.

    The counter keeps the tensors it sees alive (checkpointing's recomputed activations among them), so a
    step's memory is traced without it and its FLOPs in a trace of their own.
    """
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        trace()
    return int(counter.get_total_flops())
