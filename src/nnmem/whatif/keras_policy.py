"""Keras dtype policies as what-if techniques: the model built again under a policy and traced like any step.

``policy:mixed_bfloat16`` / ``policy:mixed_float16`` keep float32 variables (and optimizer state) and compute in
the lower dtype; under ``mixed_float16`` ``compile`` also wraps the optimizer in a ``LossScaleOptimizer`` (a loss
scale and a step counter more, and the gradients unscaled in a copy). ``policy:bfloat16`` / ``policy:float16``
put the variables in the lower dtype too. A MODEL spec's factory is called under the policy
(``keras.config.set_dtype_policy``), as a user's code would build it; a model object is cloned layer by layer
(``keras.models.clone_model``) under the policy, its weights copied. Each row is then estimated on this
process's backend like any Keras step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from nnmem.errors import ConfigError, TraceError, UnsupportedError

__all__ = ["DEFAULT_KERAS_TECHNIQUES", "KERAS_TECHNIQUES", "apply_policy", "dtype_policy", "keras_what_if"]

POLICIES = ("mixed_bfloat16", "mixed_float16", "bfloat16", "float16")
KERAS_TECHNIQUES = tuple(f"policy:{p}" for p in POLICIES)
DEFAULT_KERAS_TECHNIQUES = ("policy:mixed_bfloat16", "policy:mixed_float16")


def policy_of(technique: str) -> str:
    """The policy name of "policy:NAME".

    Raises:
        ConfigError: not a dtype policy nnmem applies. UnsupportedError: a PyTorch technique.
    """
    kind, _, name = technique.partition(":")
    if kind != "policy":
        raise UnsupportedError(f"{technique!r} is applied to PyTorch models so far; Keras models take "
                               f"{', '.join(KERAS_TECHNIQUES)}")
    if name not in POLICIES:
        raise ConfigError(f"expected policy:NAME with NAME one of {', '.join(POLICIES)}. Received: {technique!r}")
    return name


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


def apply_policy(model: Any, name: str) -> Any:
    """A copy of the Keras ``model`` built under the policy ``name`` (every layer but the inputs), its weights
    copied; compiled like the original when it was (``compile`` adds loss scaling under mixed_float16)."""
    import keras

    def clone(layer: Any) -> Any:
        if isinstance(layer, keras.layers.InputLayer):
            return layer
        return layer.__class__.from_config({**layer.get_config(), "dtype": name})

    with dtype_policy(name):
        try:
            copy = keras.models.clone_model(model, clone_function=clone)
        except (ValueError, TypeError, NotImplementedError) as err:
            raise UnsupportedError(f"{model.name} cannot be rebuilt under {name} (keras.models.clone_model: "
                                   f"{str(err).splitlines()[0]}): build it under the policy with "
                                   f"keras.config.set_dtype_policy({name!r})") from err
        copy.set_weights(model.get_weights())
        if model.compiled:
            opt = model.optimizer
            inner = getattr(opt, "inner_optimizer", opt)  # a LossScaleOptimizer: compile wraps again if needed
            copy.compile(optimizer=type(inner).from_config(inner.get_config()), loss=model.loss)
    return copy


def keras_what_if(model: Any, inputs: Any = None, *, mode: str, optimizer: Any, loss_fn: Any, target: Any,
                  batch: int | None, input_shape: Any, techniques: Iterable[str] | None, budget: Any,
                  progress: Callable[[str], None] | None) -> Any:
    """:func:`nnmem.what_if` for a Keras model or MODEL spec: the baseline and each dtype policy, each traced on
    this process's backend (FLOPs are not counted for Keras steps: a policy adds none)."""
    from nnmem import _fit, estimate
    from nnmem.units import parse_size
    from nnmem.whatif.compare import TechniqueRow, WhatIf

    asked = tuple(techniques) if techniques is not None else None
    budget_bytes = parse_size(budget) if budget is not None else None
    step: dict[str, Any] = {"inputs": inputs, "mode": mode, "optimizer": optimizer, "loss_fn": loss_fn,
                            "target": target, "input_shape": input_shape}
    say = progress or (lambda message: None)

    def row(technique: str, description: str, subject: Any) -> TechniqueRow:
        say(f"tracing {technique}")
        report = estimate(subject, batch=batch, **step)
        train = infer = None
        if budget_bytes is not None:
            fit = {k: v for k, v in step.items() if k != "mode"}
            train = _fit.max_batch(subject, budget=budget_bytes, mode="train", progress=progress, **fit).batch
            infer = _fit.max_batch(subject, budget=budget_bytes, mode="infer", progress=progress,
                                   **{**fit, "optimizer": None}).batch
        return TechniqueRow(technique, description, report, 0, train, infer)

    policies = [(technique, policy_of(technique)) for technique in asked or DEFAULT_KERAS_TECHNIQUES]
    baseline = row("baseline", "the step as it is", model)
    rows, skipped = [], []
    for technique, name in policies:
        described = (f"Keras dtype policy {name}: " + ("float32 variables and optimizer state, compute in "
                                                       f"{name.split('_')[1]}" if name.startswith("mixed_")
                                                       else f"variables and compute in {name}"))
        try:
            if isinstance(model, str):
                with dtype_policy(name):
                    rows.append(row(technique, described, model))
            else:
                rows.append(row(technique, described, apply_policy(model, name)))
        except (TraceError, UnsupportedError) as err:  # e.g. XLA on a CPU has no float16 dot with float32 sums
            reason = f"the backend refuses it on this model: {str(err).splitlines()[0]}"
            if asked is not None:
                raise UnsupportedError(f"{technique}: {reason}") from err
            skipped.append((technique, reason))
    label = model if isinstance(model, str) else getattr(model, "name", type(model).__name__)
    return WhatIf(label, mode, baseline.report.batch, baseline.report.level, baseline, tuple(rows), budget_bytes,
                  tuple(skipped))
