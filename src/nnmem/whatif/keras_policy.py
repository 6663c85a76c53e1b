"""Keras techniques for what-if: the model built again under a dtype policy or a rematerialization scope and
traced like any step.

``policy:mixed_bfloat16`` / ``policy:mixed_float16`` keep float32 variables (and optimizer state) and compute in
the lower dtype; under ``mixed_float16`` ``compile`` also wraps the optimizer in a ``LossScaleOptimizer`` (a loss
scale and a step counter more, and the gradients unscaled in a copy). ``policy:bfloat16`` / ``policy:float16``
put the variables in the lower dtype too. ``remat:full`` / ``remat:activations`` / ``remat:NAME[,NAME...]``
build the layers under ``keras.RematScope`` (every layer's call, only activations, or the named layers
recomputed in backward: ``torch.utils.checkpoint``, ``jax.checkpoint`` or ``tf.recompute_grad`` underneath).
A MODEL spec's factory is called under the policy or scope, as a user's code would build it; a model object is
cloned layer by layer (``keras.models.clone_model``) under it, its weights copied. Each row is then estimated
on this process's backend like any Keras step.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from nnmem.errors import ConfigError, ModelLoadError, TraceError, UnsupportedError

__all__ = ["DEFAULT_KERAS_TECHNIQUES", "KERAS_TECHNIQUES", "apply_technique", "compiled_as_it_was", "dtype_policy",
           "first_rows", "keras_what_if"]

POLICIES = ("mixed_bfloat16", "mixed_float16", "bfloat16", "float16")
QUANTIZE = ("int8",)  # Model.quantize modes estimated (int4's unpacking is not yet checked; float8 is for training)
KERAS_TECHNIQUES = (*(f"policy:{p}" for p in POLICIES), "remat:full", "remat:activations", "remat:NAME[,NAME...]",
                    *(f"quantize:{q}" for q in QUANTIZE), "accumulate:K")
DEFAULT_KERAS_TECHNIQUES = ("policy:mixed_bfloat16", "policy:mixed_float16", "remat:full", "remat:activations",
                            "quantize:int8", "accumulate:2")


def policy_of(technique: str) -> str:
    """The policy name of "policy:NAME", or "" for a "remat:...", "quantize:..." or "accumulate:K" technique.

    Raises:
        ConfigError: not a dtype policy nnmem applies, or a remat technique without its mode or layers.
        UnsupportedError: a PyTorch technique.
    """
    kind, _, name = technique.partition(":")
    if kind == "accumulate":
        return ""
    if kind == "quantize":
        if name in ("int4", "float8", "gptq"):
            raise UnsupportedError(f"Model.quantize('{name}') is not estimated yet; quantize:int8 is")
        if name not in QUANTIZE:
            raise ConfigError(f"expected quantize:{'|'.join(QUANTIZE)} for a Keras model (Model.quantize). "
                              f"Received: {technique!r}")
        return ""
    if kind == "remat":
        if not name:
            raise ConfigError(f"expected remat:full, remat:activations or remat:NAME[,NAME...] (layer names). "
                              f"Received: {technique!r}")
        return ""
    if kind != "policy":
        raise UnsupportedError(f"{technique!r} is applied to PyTorch models so far; Keras models take "
                               f"{', '.join(KERAS_TECHNIQUES)}")
    if name not in POLICIES:
        raise ConfigError(f"expected policy:NAME with NAME one of {', '.join(POLICIES)}. Received: {technique!r}")
    return name


def remat_scope(technique: str) -> Any:
    """The ``keras.RematScope`` of "remat:full", "remat:activations" or "remat:NAME[,NAME...]"."""
    import keras

    mode = technique.partition(":")[2]
    if mode in ("full", "activations"):
        return keras.RematScope(mode=mode)
    return keras.RematScope(mode="list_of_layers", layer_names=[n for n in mode.split(",") if n])


def built_under(technique: str) -> Any:
    """The context a technique's model is built in: its dtype policy or its rematerialization scope.

    Raises:
        UnsupportedError: "accumulate:K", which changes the training loop, not the model.
    """
    _not_accumulation(technique)
    name = policy_of(technique)
    return dtype_policy(name) if name else remat_scope(technique)


def _not_accumulation(technique: str) -> None:
    if technique.startswith("accumulate:"):
        raise UnsupportedError(f"{technique} changes the training loop, not the model: pass accumulate="
                               f"{technique.partition(':')[2]} to nnmem.estimate / nnmem.measure (the optimizer's "
                               f"gradient_accumulation_steps)")


def describe(technique: str) -> str:
    """What a Keras technique changes, in words."""
    name = policy_of(technique)
    if technique.startswith("accumulate:"):
        k = technique.partition(":")[2]
        return (f"the batch in {k} micro-batches, one train_on_batch each; the optimizer accumulates the gradients "
                f"(gradient_accumulation_steps={k}) and updates on the last")
    if technique.startswith("quantize:"):
        mode = technique.partition(":")[2]
        return (f"Model.quantize('{mode}'): Dense / EinsumDense / Embedding kernels in {mode} with float32 scales, "
                f"inputs quantized per call")
    if not name:
        what = technique.partition(":")[2]
        which = {"full": "every layer's call", "activations": "the layers' activations"}.get(what, f"layers {what}")
        return f"keras.RematScope: {which} recomputed in backward instead of kept"
    if name.startswith("mixed_"):
        return f"Keras dtype policy {name}: float32 variables and optimizer state, compute in {name.split('_')[1]}"
    return f"Keras dtype policy {name}: variables and compute in {name}"


@contextmanager
def dtype_policy(name: str) -> Iterator[None]:
    """Keras's global dtype policy is ``name`` inside the block (layers built there take it)."""
    import keras

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def apply_technique(model: Any, technique: str) -> Any:
    """A copy of the Keras ``model`` built under the technique's dtype policy or rematerialization scope (every
    layer but the inputs), its weights copied; compiled like the original when it was (``compile`` adds loss
    scaling under mixed_float16)."""
    import keras

    _not_accumulation(technique)
    name = policy_of(technique)
    if technique.startswith("quantize:"):
        return _quantized_copy(model, technique.partition(":")[2])

    def clone(layer: Any) -> Any:
        if isinstance(layer, keras.layers.InputLayer):
            return layer
        return layer.__class__.from_config({**layer.get_config(), **({"dtype": name} if name else {})})

    with built_under(technique):
        try:
            copy = keras.models.clone_model(model, clone_function=clone)
        except (ValueError, TypeError, NotImplementedError) as err:
            raise UnsupportedError(f"{model.name} cannot be rebuilt under {technique} (keras.models.clone_model: "
                                   f"{str(err).splitlines()[0]}): build it under the policy or scope "
                                   f"yourself") from err
        copy.set_weights(model.get_weights())
        if model.compiled:
            opt = model.optimizer
            inner = getattr(opt, "inner_optimizer", opt)  # a LossScaleOptimizer: compile wraps again if needed
            copy.compile(optimizer=type(inner).from_config(inner.get_config()), loss=model.loss)
    return copy


def _quantized_copy(model: Any, mode: str) -> Any:
    """A copy of ``model`` (its config and weights) quantized with ``Model.quantize(mode)``; the original is left
    as it was."""
    import keras

    try:
        copy = keras.models.clone_model(model)
        copy.set_weights(model.get_weights())
        with warnings.catch_warnings():  # "Layer Conv2D does not have a `quantize` method": it stays as it is
            warnings.simplefilter("ignore", UserWarning)
            copy.quantize(mode)
    except (ValueError, TypeError, NotImplementedError) as err:
        raise UnsupportedError(f"{model.name} cannot be quantized to {mode} (Model.quantize: "
                               f"{str(err).splitlines()[0]})") from err
    return copy


def first_rows(value: Any, n: int) -> Any:
    """``value`` (an array or a structure of arrays; None stays None) with every array cut to its first ``n`` rows:
    one micro-batch of the step's data."""
    import keras

    if value is None:
        return None
    return keras.tree.map_structure(lambda a: a[:n] if getattr(a, "shape", None) is not None and len(a.shape) else a,
                                    value)


@contextmanager
def compiled_as_it_was(model: Any) -> Iterator[None]:
    """A Keras model object is compiled again with its optimizer and loss after the block, which compiles it with
    an accumulating optimizer (one the model was not compiled with is left without the accumulation); a MODEL
    spec is built afresh for each step and needs nothing."""
    from nnmem.frontends.keras.common import accumulating, accumulation_steps

    if isinstance(model, str):
        yield
        return
    compiled = getattr(model, "compiled", False)
    optimizer, loss = (model.optimizer, model.loss) if compiled else (None, None)
    try:
        yield
    finally:
        if compiled and model.optimizer is not optimizer:
            model.compile(optimizer=optimizer, loss=loss)
        elif not compiled and getattr(model, "compiled", False) and accumulation_steps(model) > 1:
            model.compile(optimizer=accumulating(model.optimizer, 1), loss=model.loss)


def keras_what_if(model: Any, inputs: Any = None, *, mode: str, optimizer: Any, loss_fn: Any, target: Any,
                  batch: int | None, input_shape: Any, techniques: Iterable[str] | None, budget: Any,
                  progress: Callable[[str], None] | None) -> Any:
    """:func:`nnmem.what_if` for a Keras model or MODEL spec: the baseline and each dtype policy or
    rematerialization scope, each traced on this process's backend, with its FLOPs as the backend counts them
    (``Report.meta["flops_counter"]``: FlopCounterMode on torch, XLA's cost analysis on JAX, TensorFlow's profiler
    on its graph)."""
    from nnmem import _fit, estimate
    from nnmem.units import parse_size
    from nnmem.whatif.compare import TechniqueRow, WhatIf

    asked = tuple(techniques) if techniques is not None else None
    budget_bytes = parse_size(budget) if budget is not None else None
    step: dict[str, Any] = {"inputs": inputs, "mode": mode, "optimizer": optimizer, "loss_fn": loss_fn,
                            "target": target, "input_shape": input_shape}
    say = progress or (lambda message: None)

    def row(technique: str, description: str, subject: Any, data: dict[str, Any] | None = None) -> TechniqueRow:
        request = {**step, **(data or {})}  # data: a built spec's own inputs, target and loss
        say(f"tracing {technique}")
        report = estimate(subject, batch=batch, **request)
        train = infer = None
        if budget_bytes is not None:
            fit = {k: v for k, v in request.items() if k != "mode"}
            train = _fit.max_batch(subject, budget=budget_bytes, mode="train", progress=progress, **fit).batch
            infer = _fit.max_batch(subject, budget=budget_bytes, mode="infer", progress=progress,
                                   **{**fit, "optimizer": None}).batch
        return TechniqueRow(technique, description, report, int(report.meta.get("flops", 0)), train, infer)

    def quantized_row(technique: str) -> TechniqueRow:
        if mode != "infer":
            raise UnsupportedError(f"{technique} is for inference: Keras's quantized kernels are not trained")
        if not isinstance(model, str):
            return row(technique, describe(technique), apply_technique(model, technique))
        from nnmem.frontends.keras.frontend import from_factory
        from nnmem.loader import resolve_factory

        built, x, y, loss = from_factory(resolve_factory(model), batch or 1)  # a spec: built, then quantized
        data = {"inputs": x if inputs is None else inputs, "target": y if target is None else target,
                "loss_fn": loss if loss_fn is None else loss_fn}
        return row(technique, describe(technique), apply_technique(built, technique), data)

    def accumulated_row(technique: str) -> TechniqueRow:
        from nnmem.whatif.compare import _micro_batches

        k = _micro_batches(technique, mode, baseline.report.batch)
        micro = int(baseline.report.batch or 0) // k
        data = {"inputs": first_rows(inputs, micro), "target": first_rows(target, micro), "accumulate": k}
        say(f"tracing {technique}")
        with compiled_as_it_was(model):  # the accumulating optimizer is compiled into the caller's model
            report = estimate(model, batch=micro if inputs is None else None, **{**step, **data})
            train = None
            if budget_bytes is not None:  # the largest micro-batch, k of them per optimizer step
                fit = {key: v for key, v in {**step, **data}.items() if key != "mode"}
                train = k * _fit.max_batch(model, budget=budget_bytes, mode="train", progress=progress,
                                           **fit).batch
        # the same samples pass forward and backward; the accumulators' sums are all it adds
        return TechniqueRow(technique, describe(technique), report, baseline.flops, train, baseline.infer_batch)

    chosen = [(technique, policy_of(technique)) for technique in asked or DEFAULT_KERAS_TECHNIQUES]
    chosen.sort(key=lambda c: c[0].startswith("accumulate:"))  # last: they compile the model object again
    baseline = row("baseline", "the step as it is", model)
    rows, skipped = [], []
    for technique, name in chosen:
        if technique.startswith("accumulate:"):
            try:
                rows.append(accumulated_row(technique))
            except (TraceError, UnsupportedError) as err:
                if asked is not None:
                    raise
                skipped.append((technique, str(err)))
            continue
        if technique.startswith("quantize:"):
            try:
                rows.append(quantized_row(technique))
            except (TraceError, UnsupportedError, ValueError) as err:
                if asked is not None:
                    raise UnsupportedError(str(err)) from err
                skipped.append((technique, str(err)))
            continue
        if not name and mode != "train":
            if asked is not None:
                raise UnsupportedError(f"{technique}: rematerialization changes training only")
            skipped.append((technique, "rematerialization changes training only"))
            continue
        try:
            if isinstance(model, str):
                with built_under(technique):
                    rows.append(row(technique, describe(technique), model))
            else:
                rows.append(row(technique, describe(technique), apply_technique(model, technique)))
        except (TraceError, UnsupportedError, ModelLoadError, ValueError) as err:
            # e.g. XLA on a CPU has no float16 dot with float32 sums; Keras's full remat on TensorFlow needs eager
            # mode, and a subclassed model's factory fails inside the scope there
            reason = f"the backend refuses it on this model: {str(err).splitlines()[0]}"
            if asked is not None:
                raise UnsupportedError(f"{technique}: {reason}") from err
            skipped.append((technique, reason))
    label = model if isinstance(model, str) else getattr(model, "name", type(model).__name__)
    return WhatIf(label, mode, baseline.report.batch, baseline.report.level, baseline, tuple(rows), budget_bytes,
                  tuple(skipped))
