"""A plan for a budget on a Keras model: the rematerialization scopes and, when asked, the mixed-precision dtype
policies, alone and combined, each traced on this process's backend, as a Pareto table of extra FLOPs against
peak, the cheapest first.

Each candidate is the model built under its techniques (:func:`~nnmem.whatif.keras_policy.built_under`: a MODEL
spec's factory called inside the policy and the scope, a model object cloned inside them) and estimated like any
Keras step; its cost is the FLOPs it adds to the step as the backend counts them (``Report.meta["flops"]``). On
TensorFlow, whose op order and so peak vary between processes, a candidate fits when its range's high end does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from nnmem.errors import ConfigError, ModelLoadError, TraceError, UnsupportedError
from nnmem.report.model import Report
from nnmem.whatif.plan import _MICRO_BATCHES, MemoryPlan, PlanRow, _kinds, _pareto, _useful

__all__ = ["DEFAULT_KERAS_KINDS", "KERAS_KINDS", "keras_plan"]

KERAS_KINDS = ("policy", "remat", "accumulate")
"""The technique kinds a Keras plan combines: a mixed-precision dtype policy, a ``keras.RematScope``, gradient
accumulation (the optimizer's ``gradient_accumulation_steps``, the batch in micro-batches)."""

DEFAULT_KERAS_KINDS = ("remat", "accumulate")
"""The kinds a Keras plan combines unless asked: a dtype policy changes the numbers the model computes, so, as
for PyTorch's mixed precision, a plan picks one only when ``techniques`` names it."""

_POLICIES = ("policy:mixed_bfloat16", "policy:mixed_float16")
_REMATS = ("remat:activations", "remat:full")


def _bound(report: Report) -> int:
    """The peak a plan must hold to the budget: the range's high end where the step has one (TensorFlow)."""
    return report.peak_range[1] if report.peak_range is not None else report.peak_bytes


def _micro(combo: tuple[str, ...]) -> int:
    """Micro-batches per optimizer step of a combination (its "accumulate:K"; 1 without)."""
    return next((int(t.partition(":")[2]) for t in combo if t.startswith("accumulate:")), 1)


@contextmanager
def _built_under(techniques: tuple[str, ...]) -> Iterator[None]:
    from nnmem.whatif.keras_policy import built_under

    with ExitStack() as stack:
        for technique in techniques:
            if not technique.startswith("accumulate:"):  # the training loop's, not the model's
                stack.enter_context(built_under(technique))
        yield


def _apply(model: Any, techniques: tuple[str, ...]) -> Any:
    """A model object rebuilt under every technique (each clone keeps the ones before it)."""
    from nnmem.whatif.keras_policy import apply_technique

    for technique in techniques:
        if not technique.startswith("accumulate:"):  # the training loop's, not the model's
            model = apply_technique(model, technique)
    return model


def keras_plan(model: Any, inputs: Any = None, *, budget_bytes: int, batch: int | None, optimizer: Any,
               loss_fn: Any, target: Any, input_shape: Any, techniques: Any, verify: bool,
               progress: Callable[[str], None] | None) -> MemoryPlan:
    """:func:`nnmem.plan` for a Keras model or MODEL spec (training; module docstring)."""
    from nnmem import estimate
    from nnmem.units import format_bytes
    from nnmem.whatif.keras_policy import compiled_as_it_was, first_rows

    allowed = _kinds(techniques, KERAS_KINDS, DEFAULT_KERAS_KINDS,
                     " on a Keras model (checkpoint, inplace, optimizer-in-backward and fused are PyTorch's)")
    say = progress or (lambda message: None)
    step: dict[str, Any] = {"inputs": inputs, "mode": "train", "optimizer": optimizer, "loss_fn": loss_fn,
                            "target": target, "input_shape": input_shape, "batch": batch}
    spec = isinstance(model, str)

    def trace(combo: tuple[str, ...]) -> Report:
        k = _micro(combo)
        micro = dict(step)
        if k > 1:  # one micro-batch, the optimizer accumulating over k of them
            micro.update(inputs=first_rows(inputs, base_batch // k), target=first_rows(target, base_batch // k),
                         batch=None if inputs is not None else base_batch // k, accumulate=k)
        if spec:
            with _built_under(combo):
                return estimate(model, **micro)
        with compiled_as_it_was(model):
            return estimate(_apply(model, combo), **micro)

    say("tracing the step as it is")
    base_batch = 1  # the batch the micro-batches split, known once the baseline is traced
    plain = trace(())
    base_batch = plain.batch or batch or 1
    base_flops = int(plain.meta.get("flops", 0))
    baseline = PlanRow((), plain, 0, base_flops, 1, _bound(plain) <= budget_bytes)
    policies = _POLICIES if "policy" in allowed else ()
    remats = _REMATS if "remat" in allowed else ()
    built = [(p,) for p in policies] + [(r,) for r in remats] + [(p, r) for p in policies for r in remats]
    splits = [(f"accumulate:{k}",) for k in _MICRO_BATCHES if base_batch % k == 0] if "accumulate" in allowed else []
    combos = [*built, *splits, *((*b, *a) for a in splits for b in built)]
    rows: list[PlanRow] = [baseline]
    extra_of: dict[tuple[str, ...], int] = {(): 0}  # FLOPs each built model adds to the step
    notes: list[str] = []
    refused: set[str] = set()
    for combo in combos:
        if refused & set(combo):  # the backend refused one of its techniques alone
            continue
        say(f"tracing {' + '.join(combo)}")
        try:
            report = trace(combo)
        except (TraceError, UnsupportedError, ModelLoadError, ValueError) as err:
            reason = str(err).splitlines()[0]
            notes.append(f"not applied: {' + '.join(combo)}: the backend refuses it on this model: {reason}")
            if len(combo) == 1:
                refused.add(combo[0])
            continue
        k = _micro(combo)
        if k == 1:
            extra = extra_of[combo] = max(0, int(report.meta.get("flops", 0)) - base_flops)
        else:  # the same samples through the same model, in k calls: the built model's extra FLOPs
            extra = extra_of.get(tuple(t for t in combo if not t.startswith("accumulate:")), 0)
        rows.append(PlanRow(combo, report, extra, base_flops, k, _bound(report) <= budget_bytes))
    if "policy" not in allowed:
        notes.append("dtype policies change the numbers the model computes: a plan picks one only when asked "
                     "(--techniques policy,remat)")
    if plain.peak_range is not None and plain.meta.get("keras_backend") == "tensorflow":
        notes.append("TensorFlow's op order, and so its peak, varies between processes: a plan fits when its "
                     "range's high end does")
    rows = sorted(_useful(rows), key=lambda r: r.cost)
    fitting = [r for r in rows if r.fits]
    if not fitting:
        smallest = min(rows, key=lambda r: _bound(r.report))
        raise ConfigError(f"no plan fits {format_bytes(budget_bytes)}; the smallest peak found is "
                          f"{format_bytes(_bound(smallest.report))}: {smallest.label()}; try a smaller --batch or a "
                          f"larger budget")
    front = _pareto(fitting)
    chosen = front[0]
    if _micro(chosen.techniques) > 1 and plain.meta.get("keras_backend") == "tensorflow":
        notes.append("on TensorFlow the range is not modelled across an accumulation cycle: a plain run of the "
                     "chosen plan can peak a few % above its high end (--verify measures it)")
    if _micro(chosen.techniques) > 1 and any(row.kind == "BatchNormalization" for row in plain.layers):
        notes.append("the chosen plan splits the batch: BatchNormalization statistics are then computed per "
                     "micro-batch (leave accumulate out with --techniques to keep them)")
    measured = None
    if verify:
        say(f"measuring {chosen.label()} for real")
        measured = _measure(model, inputs, target, loss_fn, optimizer, plain.batch or batch or 1, chosen)
    name = model if spec else getattr(model, "name", type(model).__name__)
    return MemoryPlan(name, plain.batch or batch or 1, budget_bytes, plain.level, baseline, tuple(rows),
                      tuple(front), chosen, measured, tuple(notes), "keras")


def _measure(model: Any, inputs: Any, target: Any, loss_fn: Any, optimizer: Any, batch: int,
             chosen: PlanRow) -> Report:
    """The chosen plan's step measured for real: the model built under its techniques, in a child process
    (on TensorFlow in 3 fresh processes, the highest one: its peak varies between them)."""
    import keras

    from nnmem import measure
    from nnmem.frontends.keras.frontend import from_factory
    from nnmem.loader import resolve_factory
    from nnmem.whatif.keras_policy import compiled_as_it_was, first_rows

    if isinstance(model, str):
        with _built_under(chosen.techniques):
            built, x, y, loss = from_factory(resolve_factory(model), batch)
        inputs = x if inputs is None else inputs
        target = y if target is None else target
        loss_fn = loss if loss_fn is None else loss_fn
    else:
        built = _apply(model, chosen.techniques)
    k = _micro(chosen.techniques)  # one micro-batch, the optimizer accumulating over k of them
    runs = 3 if keras.backend.backend() == "tensorflow" else 1
    with compiled_as_it_was(built):
        reports = [measure(built, first_rows(inputs, batch // k), target=first_rows(target, batch // k),
                           loss_fn=loss_fn, optimizer=optimizer, mode="train", accumulate=k) for _ in range(runs)]
    return max(reports, key=lambda r: r.peak_bytes)
