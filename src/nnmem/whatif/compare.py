"""What each memory-saving technique buys on the user's own model: the baseline step and the step with each
technique applied, both traced, side by side with the extra compute.

Each row is a real trace of the transformed step (the technique applied to the model, then estimated like any
step), never a rule of thumb. The extra compute is counted with ``torch.utils.flop_counter.FlopCounterMode``
over a fake trace of the same step: the recomputed forwards of checkpointing show up as more FLOPs in the step.
Techniques so far, on PyTorch models: gradient checkpointing (:mod:`nnmem.frontends.pytorch.checkpointing`),
in-place activations (:mod:`nnmem.frontends.pytorch.inplace`), gradient accumulation (``estimate(...,
accumulate=K)`` on a micro-batch), the optimizer step inside backward
(:mod:`nnmem.frontends.pytorch.optimizer_in_backward`) and unstructured pruning
(:mod:`nnmem.frontends.pytorch.pruning`: it costs memory), autocast and half-precision parameters
(:mod:`nnmem.frontends.pytorch.precision`), saved tensors offloaded to host memory on a GPU
(:mod:`nnmem.frontends.pytorch.offload`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from nnmem.errors import ConfigError, UnsupportedError
from nnmem.report.model import Report

__all__ = ["TechniqueRow", "WhatIf", "what_if", "TECHNIQUES", "apply_checkpointing", "apply_technique",
           "checkpoint_plan"]

TECHNIQUES = ("checkpoint:blocks", "checkpoint:sqrt", "checkpoint:every:K", "checkpoint:NAME[,NAME...]",
              "checkpoint:selective:PLAN", "inplace", "accumulate:K", "optimizer-in-backward", "prune:AMOUNT",
              "prune-channels:AMOUNT", "autocast:bf16", "autocast:fp16", "half:bf16", "half:fp16", "quantize:int8",
              "optimizer:for-loop", "optimizer:foreach", "optimizer:fused", "zero-grad:zeros", "qlora:R",
              "save-on-cpu", "weight-only:int8", "weight-only:int4[:G]", "policy:NAME (Keras)",
              "remat:full|activations|NAMES (Keras)")
DEFAULT_TECHNIQUES = ("checkpoint:blocks", "checkpoint:every:2", "checkpoint:sqrt", "checkpoint:selective:blocks",
                      "inplace", "accumulate:2", "accumulate:4", "optimizer-in-backward", "prune:0.5",
                      "prune-channels:0.5",
                      "autocast:bf16", "half:bf16", "quantize:int8", "optimizer:foreach", "optimizer:fused",
                      "zero-grad:zeros", "save-on-cpu", "weight-only:int8", "weight-only:int4")


@dataclass(frozen=True)
class TechniqueRow:
    """One step traced: the baseline (``technique`` "baseline") or the step with a technique applied.

    Attributes:
        technique: the technique as asked for, e.g. "checkpoint:blocks".
        description: what it changed, in words.
        report: the traced step's estimate.
        flops: floating-point operations of the step (FlopCounterMode on the trace).
        train_batch: with a budget, the largest training batch that fits with the technique.
        infer_batch: with a budget, the largest inference batch (the baseline's where the technique changes
            training only).
    """

    technique: str
    description: str
    report: Report
    flops: int
    train_batch: int | None = None
    infer_batch: int | None = None

    @property
    def peak_bytes(self) -> int:
        return self.report.peak_bytes


@dataclass(frozen=True)
class WhatIf:
    """The baseline step next to each technique's.

    Attributes:
        skipped: (technique, why) for the techniques that do not apply to this model.
    """

    model: str
    mode: str
    batch: int | None
    level: str
    baseline: TechniqueRow
    rows: tuple[TechniqueRow, ...]
    budget_bytes: int | None = None
    skipped: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def __repr__(self) -> str:
        best = max(self.rows, key=self.saved, default=None)
        most = f", most saved by {best.technique}: {self.saved(best):,} B" if best is not None else ""
        return f"WhatIf({self.model}, {self.mode}: baseline {self.baseline.peak_bytes:,} B{most})"

    def _repr_html_(self) -> str | None:
        """The comparison chart, in a notebook (None without Plotly: the plain repr)."""
        from nnmem.report.output import repr_html

        return repr_html(self)

    def saved(self, row: TechniqueRow) -> int:
        """Bytes ``row`` saves at the peak against the baseline (negative: it costs memory)."""
        return self.baseline.peak_bytes - row.peak_bytes

    def extra_compute(self, row: TechniqueRow) -> float:
        """Added FLOPs as a fraction of the baseline step's."""
        return (row.flops - self.baseline.flops) / self.baseline.flops if self.baseline.flops else 0.0

    def moved(self, row: TechniqueRow) -> dict[str, int]:
        """Categories whose bytes at the peak changed, largest change first (row minus baseline)."""
        base, new = self.baseline.report.breakdown, row.report.breakdown
        delta = {c: new.get(c, 0) - base.get(c, 0) for c in {*base, *new}}
        return dict(sorted(((c, d) for c, d in delta.items() if d), key=lambda item: -abs(item[1])))

    def to_dict(self) -> dict[str, Any]:
        def row_dict(row: TechniqueRow) -> dict[str, Any]:
            out = {"technique": row.technique, "description": row.description, "peak_bytes": row.peak_bytes,
                   "peaks": dict(row.report.peaks), "breakdown": dict(row.report.breakdown), "flops": row.flops,
                   "saved_bytes": self.saved(row), "extra_compute": self.extra_compute(row),
                   "moved": self.moved(row), "notes": list(row.report.notes)}
            if self.budget_bytes is not None:
                out["largest_train_batch"] = row.train_batch
                out["largest_infer_batch"] = row.infer_batch
            return out

        return {"model": self.model, "mode": self.mode, "batch": self.batch, "level": self.level,
                "budget_bytes": self.budget_bytes,
                "baseline": row_dict(self.baseline), "techniques": [row_dict(r) for r in self.rows],
                "skipped": [{"technique": t, "reason": r} for t, r in self.skipped]}


def _traced(estimate: Callable[[], Report]) -> tuple[Report, int]:
    """The step's estimate, and its FLOPs from a trace of their own (:func:`step_flops`)."""
    from nnmem.frontends.pytorch.checkpointing import step_flops

    return estimate(), step_flops(estimate)


def _build(model: Any, inputs: Any, batch: int | None, target: Any, loss_fn: Any,
           input_shape: Any) -> tuple[Any, Any, Any, Any]:
    """The torch model and its inputs: a MODEL spec's factory is called at ``batch`` under the meta device;
    inputs it does not return are meta tensors of ``input_shape``."""
    from nnmem.frontends.base import framework_of

    if framework_of(model) != "pytorch":
        raise UnsupportedError("what-if techniques are applied to PyTorch models so far; Keras models are not yet "
                               "supported")
    if isinstance(model, str):
        from nnmem.frontends.pytorch.frontend import build_torch
        from nnmem.loader import resolve_factory

        built, _ = build_torch(resolve_factory(model), batch or 1, model, meta=True)
        model, inputs = built.model, built.inputs if inputs is None else inputs
        target = built.target if target is None else target
        loss_fn = built.loss_fn if loss_fn is None else loss_fn
    if inputs is None and input_shape:
        from nnmem._api import step_request
        from nnmem.frontends.pytorch.frontend import shaped_inputs

        shapes = step_request(model, input_shape=input_shape).input_shape
        inputs = shaped_inputs(batch or 1, shapes, device="meta")  # type: ignore[arg-type]
    return model, inputs, target, loss_fn


def _applied(model: Any, technique: str, mode: str, device: str = "cpu") -> tuple[str, AbstractContextManager[Any]]:
    """(what ``technique`` changes, in words; a context in which the model has it applied).

    Raises:
        ConfigError: an unknown technique or a malformed plan. UnsupportedError: it does not apply to the model
            or the mode.
    """
    kind, _, argument = technique.partition(":")
    if kind == "checkpoint":
        from nnmem.frontends.pytorch.checkpointing import checkpoint_plan, checkpointed

        plan = checkpoint_plan(model, argument)
        if mode == "infer":
            raise UnsupportedError("checkpointing changes training only: inference keeps no activations for "
                                   "backward")
        return f"recompute {plan.describe()}", checkpointed(model, plan)
    if kind == "inplace" and not argument:
        from nnmem.frontends.pytorch.inplace import in_place, inplace_candidates

        names = inplace_candidates(model)
        return f"{len(names)} activation/dropout modules in place", in_place(model, names)
    if kind == "prune":
        from nnmem.frontends.pytorch.pruning import prune_amount, prune_targets, pruned

        amount = prune_amount(argument)
        return (f"{amount:.0%} of the weights of {len(prune_targets(model))} linear/convolution layers zeroed "
                f"by torch.nn.utils.prune (weight_orig + mask + the weight recomputed each forward)",
                pruned(model, amount))
    if kind == "prune-channels":
        from nnmem.frontends.pytorch.channel_pruning import channel_pairs, channels_pruned
        from nnmem.frontends.pytorch.pruning import prune_amount

        amount = prune_amount(argument, kind)
        return (f"{amount:.0%} of the output channels of {len(channel_pairs(model))} layers removed with the "
                f"next layer's inputs (smaller weights, gradients, optimizer state and activations)",
                channels_pruned(model, amount))
    if kind == "qlora":
        from nnmem.frontends.pytorch.qlora import qlora, qlora_rank, qlora_targets

        context = qlora(model, technique, mode)
        return (f"{len(qlora_targets(model))} linear layers frozen in 4-bit NF4 (double-quantized scales) with "
                f"rank-{qlora_rank(technique)} float32 adapters trained, everything else frozen (bitsandbytes + "
                f"peft; modelled, not measured)", context)
    if technique == "save-on-cpu":
        from nnmem.frontends.pytorch.offload import offload_check, offloaded, traced_offload

        offload_check(mode, device)
        return ("every tensor autograd saves kept in host memory (torch.autograd.graph.save_on_cpu), copied back "
                "to the device when backward needs it; two host-device copies of each (modelled, not measured)",
                offloaded(model, traced_offload))
    if kind == "weight-only":
        from nnmem.frontends.pytorch.weight_only import weight_only, weight_only_spec, weight_only_targets

        bits, group = weight_only_spec(technique)
        if device.lower() != "cpu":
            raise UnsupportedError(f"{technique} is modelled on ATen's CPU weight-only kernels; their GPU "
                                   f"counterparts pack the weight differently and are not modelled")
        context = weight_only(model, technique, mode)
        grouped = f", a scale and zero point per {group} inputs" if bits == 4 else ", a scale per output channel"
        return (f"{len(weight_only_targets(model, bits, group))} linear layers' weights in int{bits}{grouped}, "
                f"float activations (ATen's weight-only kernels, as torchao's CPU layouts)", context)
    if kind == "quantize":
        from nnmem.cpu import describe
        from nnmem.frontends.pytorch.quantized import quantization_targets, quantized

        _quantize_argument(technique)
        if device.lower() != "cpu":
            raise UnsupportedError("quantize:int8 is dynamic quantization with FBGEMM's CPU kernels "
                                   "(torch.ao.quantization.quantize_dynamic); it does not run on a GPU")
        context = quantized(model, mode, describe())
        return (f"{len(quantization_targets(model))} linear layers' weights in int8, packed by FBGEMM "
                f"(torch.ao.quantization.quantize_dynamic; inputs quantized per call)", context)
    raise ConfigError(f"unknown technique {technique!r}; expected one of {', '.join(TECHNIQUES)}")


def _quantize_argument(technique: str) -> None:
    """Check "quantize:int8" (the one weight type dynamic quantization packs on the CPU).

    Raises:
        ConfigError: another argument.
    """
    if technique != "quantize:int8":
        raise ConfigError(f"expected quantize:int8 (dynamic int8 quantization of the linear layers). "
                          f"Received: {technique!r}")


def _micro_batches(technique: str, mode: str, batch: int | None) -> int:
    """K of "accumulate:K", checked against the mode and the step's batch.

    Raises:
        ConfigError: K is not an integer of 2 or more. UnsupportedError: inference, an unknown batch, or a
            batch K does not divide.
    """
    try:
        k = int(technique.split(":", 1)[1])
    except ValueError:
        k = 0
    if k < 2:
        raise ConfigError(f"expected accumulate:K with K an integer of 2 or more, e.g. accumulate:4. "
                          f"Received: {technique!r}")
    if mode != "train":
        raise UnsupportedError("gradient accumulation changes training only: inference has no gradients")
    if not batch or batch % k:
        raise UnsupportedError(f"accumulate:{k} splits the batch into {k} equal micro-batches; batch {batch} "
                               f"does not divide by {k}")
    return k


def _optimizer_variant(optimizer: Any, technique: str, mode: str) -> str:
    """The optimizer name with the implementation "optimizer:IMPL" asks for, e.g. "adam:fused".

    Raises:
        UnsupportedError: inference, or an optimizer given as a class. ConfigError: an implementation the
            optimizer does not offer.
    """
    from nnmem import optimizers
    from nnmem.frontends.pytorch.frontend import DEFAULT_OPTIMIZER

    if mode != "train":
        raise UnsupportedError("the optimizer's implementation changes training only")
    if optimizer is not None and not isinstance(optimizer, str):
        raise UnsupportedError("the optimizer is a class: name it (e.g. optimizer='adam') to compare its "
                               "implementations")
    base, impl = (optimizer or DEFAULT_OPTIMIZER).partition(":")[0], technique.partition(":")[2]
    known = [i.value for i in optimizers.Implementation]
    if impl not in known:
        raise ConfigError(f"expected optimizer:{'|'.join(known)}. Received: {technique!r}")
    offered = optimizers.get(base, "torch").build("torch").implementations
    if optimizers.Implementation(impl) not in offered:
        raise UnsupportedError(f"torch.optim's {base} has no {impl} step")
    return f"{base}:{impl}"


def _first(value: Any, n: int) -> Any:
    """``value`` with every tensor cut to its first ``n`` rows (a micro-batch of the step's inputs)."""
    if isinstance(value, (tuple, list)):
        return type(value)(_first(v, n) for v in value)
    if isinstance(value, dict):
        return {k: _first(v, n) for k, v in value.items()}
    if hasattr(value, "shape") and len(value.shape) > 0 and hasattr(value, "narrow"):
        return value.narrow(0, 0, n)
    return value


def what_if(model: Any, inputs: Any = None, *, mode: str = "train", optimizer: Any = None,
            loss_fn: Callable[..., Any] | None = None, target: Any = None, batch: int | None = None,
            input_shape: Any = None, techniques: Iterable[str] | None = None, budget: Any = None,
            device: str = "cpu", progress: Callable[[str], None] | None = None) -> WhatIf:
    """The step's peak with each technique applied next to the baseline's, each from a trace.

    Args:
        model: a ``torch.nn.Module`` with ``inputs``, or a MODEL spec (built at ``batch`` on the meta device).
        techniques: e.g. ``["checkpoint:blocks", "checkpoint:every:2", "inplace", "accumulate:4"]``
            (:data:`TECHNIQUES`); None: every one that applies to the model. ``accumulate:K`` is the same
            batch in K micro-batches (one optimizer step, gradients summed): the same FLOPs, K smaller steps.
            ``optimizer-in-backward`` updates each parameter inside backward and frees its gradient there.
        budget: bytes or a size text: also find the largest training and inference batch with each technique.
        device: "cpu", "cuda" or a GPU from ``nnmem devices``: every row is estimated for it (a GPU's rows at the
            reserved level of nnmem's caching-allocator model). ``save-on-cpu`` applies to a GPU only.

    Raises:
        ConfigError: an unknown technique or a malformed plan; UnsupportedError: a Keras model, or a
            technique asked for by name that does not apply.
    """
    from nnmem import _fit, estimate
    from nnmem.frontends.base import framework_of
    from nnmem.units import parse_size

    if framework_of(model) == "keras":
        from nnmem.whatif.keras_policy import keras_what_if

        if device.lower() != "cpu":
            raise UnsupportedError(f"Keras what-ifs are estimated for the CPU only; device {device!r} is not "
                                   f"supported for a Keras model yet")

        return keras_what_if(model, inputs, mode=mode, optimizer=optimizer, loss_fn=loss_fn, target=target,
                             batch=batch, input_shape=input_shape, techniques=techniques, budget=budget,
                             progress=progress)
    asked = tuple(techniques) if techniques is not None else None
    budget_bytes = parse_size(budget) if budget is not None else None
    torch_model, inputs, target, loss_fn = _build(model, inputs, batch, target, loss_fn, input_shape)
    name = model if isinstance(model, str) else type(torch_model).__name__
    kwargs: dict[str, Any] = {"optimizer": optimizer, "loss_fn": loss_fn, "target": target}
    step = {**kwargs, "mode": mode, "batch": None if inputs is not None else batch, "device": device}

    def largest(for_mode: str, **step_kwargs: Any) -> int:
        return _fit.max_batch(torch_model, inputs, budget=budget_bytes, progress=progress, mode=for_mode,
                              device=device, **{**kwargs, "optimizer": optimizer if for_mode == "train" else None},
                              **step_kwargs).batch

    def row(technique: str, description: str, changes_inference: bool = True, trains: bool = True) -> TechniqueRow:
        if progress:
            progress(f"tracing {technique}")
        report, flops = _traced(lambda: estimate(torch_model, inputs, **step))
        train_batch = infer_batch = None
        if budget_bytes is not None:
            train_batch = largest("train") if trains else None
            infer_batch = largest("infer") if changes_inference else baseline.infer_batch
        return TechniqueRow(technique, description, report, flops, train_batch, infer_batch)

    def accumulated(technique: str) -> TechniqueRow:
        k = _micro_batches(technique, mode, baseline.report.batch)
        micro = baseline.report.batch // k  # type: ignore[operator]
        if progress:
            progress(f"tracing {technique}")
        report = estimate(torch_model, _first(inputs, micro), accumulate=k,
                          **{**step, "target": _first(target, micro), "batch": None if inputs is not None else micro})
        train_batch = None
        if budget_bytes is not None:  # the largest micro-batch, k of them per optimizer step
            train_batch = k * largest("train", accumulate=k)
        return TechniqueRow(technique, f"{k} micro-batches of {micro}, gradients summed between them",
                            report, baseline.flops, train_batch, baseline.infer_batch)

    def training_option(technique: str, description: str, why: str, **option: Any) -> TechniqueRow:
        """A row for a step option that changes training only (``estimate(..., **option)``)."""
        if mode != "train":
            raise UnsupportedError(why)
        if progress:
            progress(f"tracing {technique}")
        report = estimate(torch_model, inputs, **option, **step)
        train_batch = largest("train", **option) if budget_bytes is not None else None
        return TechniqueRow(technique, description, report, baseline.flops, train_batch, baseline.infer_batch)

    def in_backward(technique: str) -> TechniqueRow:
        return training_option(technique, "each parameter updated, and its gradient freed, inside backward",
                               "the optimizer step changes training only", optimizer_in_backward=True)

    def implementation(technique: str) -> TechniqueRow:
        name = _optimizer_variant(optimizer, technique, mode)
        if progress:
            progress(f"tracing {technique}")
        report = estimate(torch_model, inputs, **{**step, "optimizer": name})
        train_batch = None
        if budget_bytes is not None:
            train_batch = _fit.max_batch(torch_model, inputs, budget=budget_bytes, progress=progress, mode="train",
                                         device=device, **{**kwargs, "optimizer": name}).batch
        return TechniqueRow(technique, f"torch.optim's {name.split(':')[1]} step ({name})", report, baseline.flops,
                            train_batch, baseline.infer_batch)

    def lowered(technique: str) -> TechniqueRow:
        from nnmem.frontends.pytorch.precision import describe_precision

        description = describe_precision(technique)
        if progress:
            progress(f"tracing {technique}")
        report = estimate(torch_model, inputs, precision=technique, **step)
        train_batch = infer_batch = None
        if budget_bytes is not None:
            train_batch = largest("train", precision=technique)
            infer_batch = largest("infer", precision=technique)
        return TechniqueRow(technique, description, report, baseline.flops, train_batch, infer_batch)

    def zeroed(technique: str) -> TechniqueRow:
        if technique != "zero-grad:zeros":
            raise ConfigError(f"expected zero-grad:zeros (optimizer.zero_grad(set_to_none=False)). "
                              f"Received: {technique!r}")
        return training_option(technique, "optimizer.zero_grad(set_to_none=False): the gradients stay allocated "
                               "(zeroed) from one step to the next, through forward",
                               "zero_grad changes training only: inference has no gradients", set_to_none=False)

    step_changes = {"accumulate": accumulated, "optimizer-in-backward": in_backward, "optimizer": implementation,
                    "autocast": lowered, "half": lowered, "zero-grad": zeroed}
    baseline = row("baseline", "the step as it is")
    rows, skipped = [], []
    for technique in asked or DEFAULT_TECHNIQUES:
        change = step_changes.get(technique.partition(":")[0])
        if change is not None:
            try:
                rows.append(change(technique))
            except UnsupportedError as err:
                if asked is not None:
                    raise
                skipped.append((technique, str(err)))
            continue
        try:
            description, context = _applied(torch_model, technique, mode, device)
        except UnsupportedError as err:
            if asked is not None:
                raise
            skipped.append((technique, str(err)))
            continue
        with context:
            try:
                rows.append(row(technique, description,
                                changes_inference=not technique.startswith(("checkpoint", "qlora")),
                                trains=not technique.startswith(("quantize", "weight-only"))))
            except (RuntimeError, UnsupportedError) as err:  # e.g. an in-place op on a tensor backward needs
                reason = (str(err) if isinstance(err, UnsupportedError)
                          else f"PyTorch refuses it on this model: {str(err).splitlines()[0]}")
                if asked is not None:
                    raise UnsupportedError(reason if isinstance(err, UnsupportedError)
                                           else f"{technique}: {reason}") from err
                skipped.append((technique, reason))
    return WhatIf(name, mode, baseline.report.batch, baseline.report.level, baseline, tuple(rows), budget_bytes,
                  tuple(skipped))


def checkpoint_plan(model: Any, plan: str) -> Any:
    """The checkpoint plan ``plan`` names on a PyTorch ``model``: "blocks", "every:K", "sqrt" or "NAME[,NAME...]"
    (a :class:`~nnmem.frontends.pytorch.checkpointing.CheckpointPlan`; see that module).

    Example:
        >>> nnmem.checkpoint_plan(model, "every:2").modules  # doctest: +SKIP
        ('blocks.0', 'blocks.2')
    """
    from nnmem.frontends.pytorch.checkpointing import checkpoint_plan as plan_of

    return plan_of(model, plan)


def apply_checkpointing(model: Any, plan: Any) -> Any:
    """Apply a checkpoint plan (a plan or its text) to a PyTorch ``model`` for real, in place; returns the model.

    The chosen modules' forwards run under ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``; the
    parameters and the ``state_dict`` keep their names.

    Example:
        >>> model = nnmem.apply_checkpointing(model, "blocks")  # doctest: +SKIP
    """
    from nnmem.frontends.pytorch.checkpointing import apply_checkpointing as apply

    return apply(model, plan)


def apply_technique(model: Any, technique: str) -> Any:
    """Apply a what-if technique (:data:`TECHNIQUES`: "checkpoint:PLAN", "inplace", "prune:AMOUNT",
    "prune-channels:AMOUNT", "autocast:DTYPE" or "half:DTYPE") to a PyTorch ``model`` for real, in place;
    returns the model. What ``what_if`` predicts for it is what this model then uses. A Keras model takes
    "policy:NAME" (a dtype policy: mixed_bfloat16, mixed_float16, bfloat16, float16) or "remat:MODE"
    (``keras.RematScope``: full, activations or layer names) and gets back a new model built under it, weights
    copied.

    Example:
        >>> model = nnmem.apply_technique(model, "inplace")  # doctest: +SKIP
    """
    from nnmem.frontends.base import framework_of

    kind, _, argument = technique.partition(":")
    keras_model = framework_of(model) == "keras"
    if kind in ("policy", "remat") or keras_model:
        from nnmem.whatif.keras_policy import apply_technique as apply_keras

        if not keras_model:
            raise UnsupportedError(f"{technique!r} is a Keras technique; for a PyTorch model use autocast:DTYPE, "
                                   f"half:DTYPE (precision) or checkpoint:PLAN (recomputation)")
        return apply_keras(model, technique)
    if kind == "checkpoint":
        return apply_checkpointing(model, argument)
    if kind == "inplace" and not argument:
        from nnmem.frontends.pytorch.inplace import apply_inplace

        return apply_inplace(model)
    if kind == "prune":
        from nnmem.frontends.pytorch.pruning import apply_pruning, prune_amount

        return apply_pruning(model, prune_amount(argument))
    if kind == "prune-channels":
        from nnmem.frontends.pytorch.channel_pruning import apply_channel_pruning
        from nnmem.frontends.pytorch.pruning import prune_amount

        return apply_channel_pruning(model, prune_amount(argument, kind))
    if kind in ("autocast", "half"):
        from nnmem.frontends.pytorch.precision import apply_precision, precision_dtype

        return apply_precision(model, kind, precision_dtype(kind, argument))
    if kind == "quantize":
        from nnmem.frontends.pytorch.quantized import apply_quantization

        _quantize_argument(technique)
        return apply_quantization(model)
    if technique == "save-on-cpu":
        from nnmem.frontends.pytorch.offload import apply_offload

        return apply_offload(model)
    if kind == "weight-only":
        from nnmem.frontends.pytorch.weight_only import apply_weight_only

        return apply_weight_only(model, technique)
    if kind == "qlora":
        raise UnsupportedError(f"{technique!r} is modelled, not applied: bitsandbytes' 4-bit kernels need a GPU "
                               f"(apply it with peft and bitsandbytes there)")
    step_options = {"accumulate": "accumulate=K on one micro-batch", "zero-grad": "set_to_none=False",
                    "optimizer-in-backward": "optimizer_in_backward=True",
                    "optimizer": f"the optimizer named with its implementation, e.g. "
                                 f"optimizer='adam:{argument or 'fused'}'"}
    if kind in step_options:
        raise ConfigError(f"{technique!r} changes the step, not the model: estimate or measure it with "
                          f"{step_options[kind]}")
    raise ConfigError(f"unknown technique {technique!r}; expected one of {', '.join(TECHNIQUES)}")
