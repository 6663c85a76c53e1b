"""The step nnmem estimates and measures, written once for fake and for real tensors.

Train: ``opt.zero_grad(set_to_none=True); out = model(*inputs); loss = loss_fn(out, target);
loss.backward(); opt.step()`` in steady state. Infer: ``model.eval()`` and ``torch.inference_mode()``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_map

from nnmem import optimizers
from nnmem.errors import ConfigError, TraceError, first_line
from nnmem.frontends.pytorch.fake_kernels import packed_sequences
from nnmem.frontends.pytorch.real_values import COMPUTE_LIMIT, ROUTINGS, RealValues, guess_note, routing_note
from nnmem.frontends.pytorch.tracker import OpRules, StepTracker
from nnmem.simulate import simulate
from nnmem.trace import Category, LayerInfo, Level, Phase, Trace

__all__ = [
    "default_loss", "fake_copy", "layer_infos", "make_optimizer", "optimizer_name",
    "prepare_step", "run_step", "trace_fake_step", "trace_prepared",
]


def optimizer_name(optimizer: Any) -> str:
    """A display name for an optimizer argument ("adam", or the class name)."""
    return optimizer if isinstance(optimizer, str) else getattr(optimizer, "__name__", str(optimizer))


def make_optimizer(optimizer: Any, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """Build the optimizer a name (class and arguments from ``nnmem.optimizers``; "adam:fused" also picks the
    step's implementation) or a class stands for.

    A class gets ``lr=nnmem.optimizers.TORCH_LR`` when it takes one, its own defaults otherwise.
    """
    if isinstance(optimizer, str):
        name, implementation = optimizers.split_implementation(optimizer)
        build = optimizers.get(name, "torch").build("torch")
        cls = getattr(torch.optim, build.class_name)
        chosen: dict[str, bool] = {}
        if implementation is not None:
            chosen = {"fused": True} if implementation is optimizers.Implementation.FUSED else {
                "foreach": implementation is optimizers.Implementation.FOREACH}
        return cls(params, **build.kwargs, **chosen)
    if isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer):
        try:
            return optimizer(params, lr=optimizers.TORCH_LR)  # type: ignore[call-arg]
        except TypeError:
            return optimizer(params)  # type: ignore[call-arg]
    raise ConfigError(
        f"expected an optimizer name ({', '.join(optimizers.names('torch'))}) or a torch.optim.Optimizer subclass. "
        f"Received: {optimizer!r}"
    )


def default_loss(out: Any, target: Any = None) -> torch.Tensor:
    """Mean of the output (of its first floating-point tensor when the output is a structure)."""
    from torch.utils._pytree import tree_flatten

    if isinstance(out, torch.Tensor):
        return out.float().mean() if not out.is_floating_point() else out.mean()
    for leaf in tree_flatten(out)[0]:
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
            return leaf.mean()
    raise TraceError(f"the model returned no floating-point tensor to take a loss of: {type(out).__name__}")


def layer_infos(model: torch.nn.Module) -> tuple[LayerInfo, ...]:
    """Per-layer static facts: parameters a layer owns directly (tied weights counted once)."""
    seen: set[int] = set()
    infos = []
    for path, module in model.named_modules():
        count = nbytes = 0
        shapes = []
        for p in module.parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            count += p.numel()
            nbytes += p.numel() * p.element_size()
            shapes.append(tuple(p.shape))
        if count or not any(True for _ in module.children()):
            infos.append(LayerInfo(path, type(module).__name__, count, nbytes, 0, tuple(shapes)))
    return tuple(infos)


def _call(model: torch.nn.Module, inputs: tuple[Any, ...]) -> Any:
    try:
        return model(*inputs)
    except (RuntimeError, ValueError, TypeError, IndexError, AssertionError) as err:
        shapes = ", ".join(
            f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}" if isinstance(t, torch.Tensor)
            else type(t).__name__ for t in inputs
        )
        first = first_line(err)
        raise TraceError(f"the model rejected inputs [{shapes}]: {first}") from err


def run_step(model: torch.nn.Module, inputs: tuple[Any, ...], *, mode: str, opt: Any,
             loss_fn: Callable[..., Any] | None, target: Any, tracker: StepTracker | None = None,
             micro_steps: int = 1, set_to_none: bool = True) -> None:
    """Run one train or infer step exactly as the contract in DESIGN.md says.

    Args:
        micro_steps: training with gradient accumulation: forward and backward this many times on ``inputs``
            (one micro-batch; the loss divided by ``micro_steps``), the gradients summed, then one optimizer
            step. The peak of a third and later micro-step is the second's, so 2 stands for any count above 1.
        set_to_none: ``opt.zero_grad(set_to_none=...)`` first: False zeroes the gradients in place (they stay
            allocated through forward, and backward accumulates into them).
    """
    begin = tracker.begin if tracker is not None else (lambda phase: None)
    if mode == "infer":
        begin(Phase.FORWARD)
        with torch.inference_mode():
            out = _call(model, inputs)
        del out
        return
    assert opt is not None
    in_backward = hasattr(opt, "hooks")  # the optimizer steps inside backward (optimizer_in_backward)
    begin(Phase.FORWARD)
    opt.zero_grad(set_to_none=set_to_none)
    for _ in range(micro_steps):  # as a user's loop: the last output and loss live through the next forward
        begin(Phase.FORWARD)
        out = _call(model, inputs)
        try:
            loss = (loss_fn or default_loss)(out, target)
        except (RuntimeError, ValueError, TypeError, IndexError) as err:
            raise TraceError(f"the loss function failed on the model's output: {err}") from err
        if micro_steps > 1:
            loss = loss / micro_steps
        begin(Phase.BACKWARD)
        with opt.hooks() if in_backward else nullcontext():
            loss.backward()
    if not in_backward:
        begin(Phase.OPTIMIZER)
        opt.step()
    del loss, out


@contextmanager
def _swapped(model: torch.nn.Module, replace: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[None]:
    """Temporarily replace every parameter and buffer (tied ones stay tied).

    Tensors a module keeps as plain attributes get their values back afterwards, and attributes the step added
    go: a forward pre-hook that sets one (``torch.nn.utils.prune`` recomputes ``weight`` from ``weight_orig``
    and the mask) must not leave a fake tensor in the user's model.
    """
    attributes = [(module, {k: v for k, v in vars(module).items() if isinstance(v, torch.Tensor)})
                  for module in model.modules()]
    copies: dict[int, Any] = {}
    for owner, attr, tensor in tensor_attributes(model):  # held by the module alone: freed when it is replaced
        object.__setattr__(owner, attr, copies.setdefault(id(tensor), replace(tensor)))
    copies.clear()
    saved = swap_parameters(model, replace)
    try:
        yield
    finally:
        for table, name, value in saved:
            table[name] = value
        for module, kept in attributes:
            for k in [k for k, v in vars(module).items() if isinstance(v, torch.Tensor) and k not in kept]:
                delattr(module, k)
            for k, v in kept.items():
                object.__setattr__(module, k, v)


def swap_parameters(model: torch.nn.Module, replace: Callable[[torch.Tensor], torch.Tensor],
                    which: Callable[[torch.Tensor], bool] = lambda t: True) -> list[tuple[dict[str, Any], str, Any]]:
    """Replace each parameter and buffer ``which`` accepts by ``replace`` of it (a parameter stays a parameter,
    tied ones stay tied); returns (table, name, original) to put back."""
    saved: list[tuple[dict[str, Any], str, Any]] = []
    memo: dict[int, Any] = {}
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, value in table.items():
                if value is None or not which(value):
                    continue
                if id(value) not in memo:
                    new = replace(value)
                    if isinstance(value, torch.nn.Parameter):
                        new = torch.nn.Parameter(new, requires_grad=value.requires_grad)
                    memo[id(value)] = new
                saved.append((table, name, value))
                table[name] = memo[id(value)]
    return saved


@contextmanager
def swapped_modules(model: torch.nn.Module, paths: list[str],
                    make: Callable[[torch.nn.Module], torch.nn.Module]) -> Iterator[None]:
    """The submodules at ``paths`` replaced by ``make(submodule)`` for the duration, put back after."""
    saved = [(path, model.get_submodule(path)) for path in paths]
    try:
        for path, module in saved:
            model.set_submodule(path, make(module))
        yield
    finally:
        for path, module in saved:
            model.set_submodule(path, module)


def tensor_attributes(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.Tensor]]:
    """(module, name, tensor) of the tensors modules hold as plain attributes (not parameters or buffers, nor a
    view of one): state that lives between steps, e.g. the ``weight`` that ``torch.nn.utils.prune`` recomputes
    from ``weight_orig`` and the mask in every forward and keeps until the next one."""
    owned = {t.untyped_storage()._cdata for t in (*model.parameters(), *model.buffers())}
    out = []
    for module in model.modules():
        for name, value in vars(module).items():
            if (isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter)
                    and value._base is None and value.untyped_storage()._cdata not in owned):
                out.append((module, name, value))
    return out


def fake_copy(value: Any) -> Any:
    """An empty tensor like ``value`` on the CPU (fake when a FakeTensorMode is active)."""
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="cpu")
    if isinstance(value, (tuple, list)):
        return type(value)(fake_copy(v) for v in value)
    if isinstance(value, dict):
        return {k: fake_copy(v) for k, v in value.items()}
    return value


def prepare_step(model: torch.nn.Module, mode: str, optimizer: Any, in_backward: bool = False) -> Any:
    """Put the model in train or eval mode and build the optimizer (None for inference; with ``in_backward``
    one per parameter, stepped inside backward: :class:`.optimizer_in_backward.PerParameter`)."""
    model.train(mode == "train")
    if mode != "train":
        return None
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ConfigError("mode='train' needs trainable parameters, but every parameter has requires_grad=False")
    if in_backward:
        from nnmem.frontends.pytorch.optimizer_in_backward import PerParameter

        return PerParameter(params, lambda group: make_optimizer(optimizer, group))
    return make_optimizer(optimizer, params)


def trace_prepared(model: torch.nn.Module, inputs: tuple[Any, ...], *, mode: str,
                   opt: Any, loss_fn: Callable[..., Any] | None, target: Any,
                   rules: OpRules | None = None, meta: dict[str, object] | None = None,
                   micro_steps: int = 1, set_to_none: bool = True) -> Trace:
    """Trace one step of a model whose optimizer is already in steady state (``micro_steps``: see
    :func:`run_step`)."""
    tracker = StepTracker(model, rules)
    tracker.training = mode == "train"
    owner = _owners(model)
    _register_resident(tracker, model, inputs, target, opt, owner)
    from nnmem.cpu import describe
    from nnmem.frontends.pytorch.quantized import fbgemm_blocking, register_packed

    stand_ins = register_packed(tracker, model, fbgemm_blocking(getattr(rules, "cpu", None) or describe()))
    with tracker, tracker.layer_hooks():
        run_step(model, inputs, mode=mode, opt=opt, loss_fn=loss_fn, target=target, tracker=tracker,
                 micro_steps=micro_steps, set_to_none=set_to_none)
    if opt is not None:
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    tracker.set_category(p.grad, Category.GRADIENTS, owner.get(id(p), ""))
        for p, state in opt.state.items():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    tracker.set_category(value, Category.OPTIMIZER_STATE, owner.get(id(p), ""))
    del stand_ins  # the packed weights stay resident to the end of the step
    return tracker.finish(mode, layer_infos(model), dict(meta or {}))


def trace_fake_step(model: torch.nn.Module, inputs: tuple[Any, ...], *, mode: str, optimizer: Any,
                    loss_fn: Callable[..., Any] | None, target: Any,
                    rules: OpRules | None = None, meta: dict[str, object] | None = None,
                    micro_steps: int = 1, in_backward: bool = False, set_to_none: bool = True) -> Trace:
    """Trace one step under FakeTensorMode: nothing model-sized is allocated.

    Parameters, buffers, inputs and optimizer state are replaced by fake tensors for the trace (the
    model's own tensors are put back afterwards). Steady state is reached by giving every trainable
    parameter a gradient and stepping the optimizer once, which creates its state as a real previous
    step would. Inputs and buffers keep their real values for data-dependent ops (:mod:`.real_values`);
    a step whose ``topk`` routes over values from the weights (a mixture of experts) is traced with
    balanced and with packed routing, and the trace with the higher peak is returned (a note gives both
    where they differ).
    """
    trace, values = _trace_fake(model, inputs, mode=mode, optimizer=optimizer, loss_fn=loss_fn, target=target,
                                rules=rules, meta=meta, routing=ROUTINGS[0], micro_steps=micro_steps,
                                in_backward=in_backward, set_to_none=set_to_none)
    notes = [guess_note(values.guesses)] if values.guesses else []
    if values.routed:
        other, _ = _trace_fake(model, inputs, mode=mode, optimizer=optimizer, loss_fn=loss_fn, target=target,
                               rules=rules, meta=meta, routing=ROUTINGS[1], micro_steps=micro_steps,
                               in_backward=in_backward, set_to_none=set_to_none)
        peaks = [simulate(t).peaks for t in (trace, other)]
        if peaks[0] != peaks[1]:
            notes.append(routing_note(peaks[0], peaks[1]))
        if peaks[1][Level.TENSOR.value] > peaks[0][Level.TENSOR.value]:
            trace = other
    if notes:
        trace.meta["data_dependent"] = "\n".join(notes)
    return trace


def _trace_fake(model: torch.nn.Module, inputs: tuple[Any, ...], *, mode: str, optimizer: Any,
                loss_fn: Callable[..., Any] | None, target: Any, rules: OpRules | None,
                meta: dict[str, object] | None, routing: str, micro_steps: int = 1,
                in_backward: bool = False, set_to_none: bool = True) -> tuple[Trace, RealValues]:
    from torch._subclasses.fake_tensor import FakeTensorMode

    state = [*model.buffers(), *(t for _, _, t in tensor_attributes(model))]
    small = {id(b): b.detach().clone() for b in state if not b.is_meta and b.numel() <= COMPUTE_LIMIT}
    inputs, target = tree_map(_real_or_fake, (tuple(inputs), target))
    values = RealValues(routing)
    swap = _swapped(model, lambda t: small.pop(id(t)) if id(t) in small else fake_copy(t))
    from nnmem.frontends.pytorch.checkpointing import traced_rng_states

    # traced_rng_states: checkpoint regions (nnmem's plans, or the model's own torch.utils.checkpoint calls, as
    # in HuggingFace models with gradient checkpointing on) keep generator states the trace must see
    with FakeTensorMode(allow_non_fake_inputs=True), swap, values, packed_sequences(), traced_rng_states():
        inputs, target = tree_map(lambda t: t.fake() if isinstance(t, _Pending) else t, (inputs, target))
        opt = prepare_step(model, mode, optimizer, in_backward)
        if opt is not None:
            for group in opt.param_groups:
                for p in group["params"]:
                    p.grad = torch.zeros_like(p)
            opt.step()
            if in_backward:  # its previous step freed every gradient inside backward
                opt.zero_grad(set_to_none=True)
        trace = trace_prepared(model, inputs, mode=mode, opt=opt, loss_fn=loss_fn, target=target,
                               rules=rules, meta=dict(meta or {}), micro_steps=micro_steps,
                               set_to_none=set_to_none)
    return trace, values


@dataclass(frozen=True, slots=True)
class _Pending:
    """An input too large (or on the meta device) to keep its real value: it becomes a fake tensor."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool

    def fake(self) -> torch.Tensor:
        """The fake tensor (made inside FakeTensorMode)."""
        return torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device="cpu",
                                   requires_grad=self.requires_grad)


def _real_or_fake(value: Any) -> Any:
    """A copy of a small real input (its values drive data-dependent ops), or a note to make it fake."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.is_meta or value.numel() > COMPUTE_LIMIT:
        return _Pending(tuple(value.shape), value.stride(), value.dtype, value.requires_grad)
    return value.detach().clone().requires_grad_(value.requires_grad)


def _owners(model: torch.nn.Module) -> dict[int, str]:
    """id of each parameter and buffer → path of the first module that owns it."""
    owner: dict[int, str] = {}
    for path, module in model.named_modules():
        for p in module.parameters(recurse=False):
            owner.setdefault(id(p), path)
        for b in module.buffers(recurse=False):
            owner.setdefault(id(b), path)
    return owner


def _register_resident(tracker: StepTracker, model: torch.nn.Module, inputs: tuple[Any, ...], target: Any,
                       opt: Any, owner: dict[int, str]) -> None:
    for p in model.parameters():
        tracker.add_resident(p, Category.PARAMETERS, owner.get(id(p), ""))
        if p.grad is not None:
            tracker.add_resident(p.grad, Category.GRADIENTS, owner.get(id(p), ""))
    for b in model.buffers():
        tracker.add_resident(b, Category.BUFFERS, owner.get(id(b), ""))
    names = {id(m): path for path, m in model.named_modules()}
    for module, _, value in tensor_attributes(model):
        tracker.add_resident(value, Category.BUFFERS, names.get(id(module), ""))
    if opt is not None:
        for param, state in opt.state.items():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    tracker.add_resident(value, Category.OPTIMIZER_STATE, owner.get(id(param), ""))
    from torch.utils._pytree import tree_flatten

    for leaf in tree_flatten((inputs, target))[0]:
        if isinstance(leaf, torch.Tensor):
            tracker.add_resident(leaf, Category.INPUTS)
