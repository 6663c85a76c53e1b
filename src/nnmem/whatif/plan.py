"""A plan for a budget: the combinations of memory-saving techniques whose traced training step fits, as a Pareto
table of peak against extra compute, the cheapest first, optionally verified by a real run.

Each candidate combines torch.optim's fused optimizer step (where the optimizer has one), in-place activations
(where the model has safe candidates), one step variant (as it is, the optimizer inside backward, or the batch
in K micro-batches) and, where that does not fit, the optimal
gradient-checkpointing plan of the model's chain under the budget
(:mod:`nnmem.frontends.pytorch.checkpoint_search`: an exact search, then a trace of the plan). Every peak in
the table is a trace of the transformed step. Cost is the recomputed FLOPs (``FlopCounterMode``), then the
number of micro-batches (the same FLOPs in smaller, slower kernels), then the peak.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext, suppress
from dataclasses import dataclass, field
from typing import Any

from nnmem.errors import ConfigError, UnsupportedError
from nnmem.report.model import Report

__all__ = ["KINDS", "MemoryPlan", "PlanRow", "optimal_checkpointing", "plan"]

_MICRO_BATCHES = (2, 4, 8, 16)
KINDS = ("checkpoint", "inplace", "accumulate", "optimizer-in-backward", "fused")
_INPLACE_FACTORY = """import nnmem
from nnmem.loader import resolve_factory


def make(batch):
    built = resolve_factory({spec!r})(batch)
    nnmem.apply_technique(built[0] if isinstance(built, tuple) else built, "inplace")
    return built
"""


@dataclass(frozen=True)
class PlanRow:
    """One combination of techniques, traced.

    Attributes:
        techniques: what is applied, e.g. ("inplace", "accumulate:2", "checkpoint:blocks.0,blocks.1").
        report: the traced step (per micro-batch with accumulation).
        extra_flops: FLOPs recomputed per optimizer step. baseline_flops: the step's FLOPs as it is.
        micro_batches: micro-batches per optimizer step (1: none).
        fits: the traced peak is within the budget.
    """

    techniques: tuple[str, ...]
    report: Report
    extra_flops: int
    baseline_flops: int
    micro_batches: int
    fits: bool

    @property
    def peak_bytes(self) -> int:
        return self.report.peak_bytes

    @property
    def extra_compute(self) -> float:
        return self.extra_flops / self.baseline_flops if self.baseline_flops else 0.0

    @property
    def cost(self) -> tuple[int, int, int]:
        return (self.extra_flops, self.micro_batches, self.peak_bytes)

    def label(self, *, short: bool = False) -> str:
        """The techniques joined by " + "; ``short``: a long checkpoint list as its count and ends."""
        if not self.techniques:
            return "as it is"
        parts = []
        for technique in self.techniques:
            names = technique.partition(":")[2].split(",")
            if short and technique.startswith("checkpoint:") and len(names) > 3:
                technique = f"checkpoint: {len(names)} modules ({names[0]} … {names[-1]})"
            parts.append(technique)
        return " + ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"techniques": list(self.techniques), "peak_bytes": self.peak_bytes, "peaks": dict(self.report.peaks),
                "extra_flops": self.extra_flops, "extra_compute": self.extra_compute,
                "micro_batches": self.micro_batches, "fits": self.fits}


@dataclass(frozen=True)
class MemoryPlan:
    """The candidates for a budget and the chosen one.

    Attributes:
        front: the fitting candidates no other fitting one beats on both cost and peak, cheapest first.
        chosen: the cheapest fitting candidate (``front[0]``).
        rows: every candidate traced, cheapest first (fitting or not).
        measured: with ``verify``: the chosen plan's step measured for real (a child process).
        notes: what was not tried and why.
    """

    model: str
    batch: int
    budget_bytes: int
    level: str
    baseline: PlanRow
    rows: tuple[PlanRow, ...]
    front: tuple[PlanRow, ...]
    chosen: PlanRow
    measured: Report | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    optimizer_class: str = "SGD"

    def code(self, row: PlanRow | None = None) -> str:
        """Python that applies ``row`` (default: the chosen plan) to the user's ``model`` and training loop."""
        row = row or self.chosen
        kinds = {t.partition(":")[0]: t.partition(":")[2] for t in row.techniques}
        lines = ["import nnmem"] if {"inplace", "checkpoint"} & set(kinds) else []
        if "optimizer" in kinds:
            built = f"torch.optim.{self.optimizer_class}(params, lr=..., {kinds['optimizer']}=True)"
            lines.append(f"make_optimizer = lambda params: {built}  # one kernel per parameter group"
                         if "optimizer-in-backward" in kinds else
                         f"optimizer = {built.replace('(params', '(model.parameters()')}  # one kernel per "
                         f"parameter group")
        if "inplace" in kinds:
            lines.append('nnmem.apply_technique(model, "inplace")  # activations and dropout in place')
        if "checkpoint" in kinds:
            lines.append(f"nnmem.apply_checkpointing(model, {kinds['checkpoint']!r})  # recomputed in backward")
        if "optimizer-in-backward" in kinds:
            lines += ["# one optimizer per parameter, stepped as soon as its gradient is ready",
                      "optimizers = {p: make_optimizer([p]) for p in model.parameters()}",
                      "def _step(p):",
                      "    optimizers[p].step()",
                      "    optimizers[p].zero_grad(set_to_none=True)",
                      "for p in model.parameters():",
                      "    p.register_post_accumulate_grad_hook(_step)",
                      "# the loop: loss.backward() only; no optimizer.step()"]
        keras_loop: list[str] = []
        if "accumulate" in kinds and self.optimizer_class == "keras":
            k = int(kinds["accumulate"])
            keras_loop = [f"# {k} micro-batches of {self.batch // k} per optimizer step: the optimizer sums the "
                          f"gradients of {k} train_on_batch calls",
                          "opt = model.optimizer",
                          f'opt = type(opt).from_config({{**opt.get_config(), "gradient_accumulation_steps": {k}}})',
                          "model.compile(optimizer=opt, loss=model.loss)",
                          f"model.fit(x, y, batch_size={self.batch // k})"]
        elif "accumulate" in kinds:
            k = int(kinds["accumulate"])
            lines += [f"# {k} micro-batches of {self.batch // k} per optimizer step (a loader of batch "
                      f"{self.batch // k})",
                      "for i, (x, y) in enumerate(loader):",
                      f"    (loss_fn(model(x), y) / {k}).backward()",
                      f"    if (i + 1) % {k} == 0:",
                      "        optimizer.step()",
                      "        optimizer.zero_grad(set_to_none=True)"]
        if "policy" in kinds:
            lines.append(f"keras.config.set_dtype_policy({kinds['policy']!r})  # before the model is built")
        if "remat" in kinds:
            scope = (f"mode={kinds['remat']!r}" if kinds["remat"] in ("full", "activations") else
                     f"mode='list_of_layers', layer_names={kinds['remat'].split(',')!r}")
            lines.append(f"with keras.RematScope({scope}):  # layers built here are recomputed in backward")
            lines.append("    model = build_model()")
        lines += keras_loop  # once the model is built
        if {"policy", "remat"} & set(kinds):
            lines.insert(0, "import keras")
        return "\n".join(lines) if lines else "# nothing to change: the step fits as it is"

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "batch": self.batch, "budget_bytes": self.budget_bytes, "level": self.level,
                "baseline": self.baseline.to_dict(), "chosen": self.chosen.to_dict(), "code": self.code(),
                "front": [r.to_dict() for r in self.front], "candidates": [r.to_dict() for r in self.rows],
                "measured_peak_bytes": self.measured.peak_bytes if self.measured is not None else None,
                "measured_fits": (self.measured.peak_bytes <= self.budget_bytes) if self.measured is not None
                else None, "notes": list(self.notes)}


def _beats(a: PlanRow, b: PlanRow) -> bool:
    """``a`` is no worse than ``b`` in recomputed FLOPs, micro-batches and peak, and better in one."""
    return a.cost != b.cost and all(x <= y for x, y in zip(a.cost, b.cost))


def _pareto(rows: list[PlanRow]) -> list[PlanRow]:
    """The rows no other row beats (:func:`_beats`), cheapest first."""
    return sorted((r for r in rows if not any(_beats(o, r) for o in rows)), key=lambda r: r.cost)


def _useful(rows: list[PlanRow]) -> list[PlanRow]:
    """The rows without a technique that changes nothing: a row goes where a row with fewer of its techniques
    has the same cost and peak (e.g. in-place activations on a model whose peak they do not touch)."""
    return [r for r in rows
            if not any(set(o.techniques) < set(r.techniques) and all(x <= y for x, y in zip(o.cost, r.cost))
                       for o in rows)]


def plan(model: Any, inputs: Any = None, *, budget: Any, batch: int | None = None, mode: str = "train",
         optimizer: Any = None, loss_fn: Callable[..., Any] | None = None, target: Any = None,
         input_shape: Any = None, techniques: Any = None, verify: bool = False,
         progress: Callable[[str], None] | None = None) -> MemoryPlan:
    """The cheapest combination of techniques whose training step fits ``budget``, and the others that fit.

    Args:
        model: a ``torch.nn.Module`` with ``inputs``, a Keras model, or a MODEL spec (a PyTorch one built at
            ``batch`` on the meta device). A Keras model's plan combines dtype policies and rematerialization
            scopes on this process's backend (:mod:`nnmem.whatif.keras_plan`).
        budget: bytes or a size text ("8GiB"): the peak at the report's level must be within it.
        techniques: the kinds a plan may combine (:data:`KINDS`: "checkpoint", "inplace", "accumulate",
            "optimizer-in-backward", "fused": torch.optim's fused step; on a Keras model
            :data:`~nnmem.whatif.keras_plan.KERAS_KINDS`: "policy", "remat"); None: all (on a Keras model
            "remat": a dtype policy changes the numbers computed, so a plan takes one only when named). Leave
            out "accumulate" where micro-batches change the result (BatchNorm statistics per micro-batch) or the
            throughput matters more than FLOPs.
        verify: apply the chosen plan for real and measure the step in a child process (``measured``).

    Raises:
        ConfigError: no combination fits (the message names the smallest peak reached and how), or an
            unknown technique kind.
        UnsupportedError: inference (no technique here changes it but in-place: use ``what_if``).

    Example:
        >>> p = nnmem.plan("gpt", budget="40MiB", batch=32)  # doctest: +SKIP
        >>> p.chosen.techniques, p.chosen.peak_bytes  # doctest: +SKIP
    """
    from nnmem.frontends.base import framework_of
    from nnmem.units import format_bytes, parse_size

    if mode == "train" and framework_of(model) == "keras":
        from nnmem.whatif.keras_plan import keras_plan

        return keras_plan(model, inputs, budget_bytes=parse_size(budget), batch=batch, optimizer=optimizer,
                          loss_fn=loss_fn, target=target, input_shape=input_shape, techniques=techniques,
                          verify=verify, progress=progress)
    import torch

    from nnmem import estimate
    from nnmem.frontends.pytorch.checkpoint_search import calibrate, optimal_checkpoint
    from nnmem.frontends.pytorch.checkpointing import CheckpointPlan, step_flops
    from nnmem.whatif.compare import _build, _first, _optimizer_variant
    from nnmem.whatif.graph_milp import solve_front
    if mode != "train":
        raise UnsupportedError("a plan covers training steps (checkpointing, accumulation and the optimizer in "
                               "backward change training only); for inference see `nnmem whatif --mode infer`")
    budget_bytes = parse_size(budget)
    allowed = _kinds(techniques)
    torch_model, inputs, target, loss_fn = _build(model, inputs, batch, target, loss_fn, input_shape)
    name = model if isinstance(model, str) else type(torch_model).__name__
    common: dict[str, Any] = {"optimizer": optimizer, "loss_fn": loss_fn}
    say = progress or (lambda message: None)

    def trace(variant: dict[str, Any], checkpoint: CheckpointPlan | None) -> Report:
        k = variant.get("accumulate", 1)
        full = batch if inputs is None else None
        micro_inputs = inputs if k == 1 or inputs is None else _first(inputs, base_batch // k)
        micro_target = target if k == 1 else _first(target, base_batch // k)
        return estimate(torch_model, micro_inputs, target=micro_target, mode="train",
                        batch=None if micro_inputs is not None else (full // k if full else None),
                        checkpoint=",".join(checkpoint.modules) if checkpoint and checkpoint.modules else None,
                        **{**common, **variant})

    say("tracing the step as it is")
    plain = trace({}, None)
    base_batch = plain.batch or batch or 1
    baseline_flops = step_flops(lambda: trace({}, None))
    baseline = PlanRow((), plain, 0, baseline_flops, 1, plain.peak_bytes <= budget_bytes)

    inplace_names: list[str] = []
    if "inplace" in allowed:
        from nnmem.frontends.pytorch.inplace import inplace_candidates

        with suppress(UnsupportedError):  # raised where nothing can switch in place
            inplace_names = inplace_candidates(torch_model)
    fused_name = None
    if "fused" in allowed:
        with suppress(UnsupportedError, ConfigError):  # an optimizer class, or one without a fused step
            fused_name = _optimizer_variant(optimizer, "optimizer:fused", "train")
    variants: list[tuple[str | None, dict[str, Any]]] = [(None, {})]
    if "optimizer-in-backward" in allowed:
        variants.append(("optimizer-in-backward", {"optimizer_in_backward": True}))
    if "accumulate" in allowed:
        variants += [(f"accumulate:{k}", {"accumulate": k}) for k in _MICRO_BATCHES if base_batch % k == 0]
    notes: list[str] = []
    rows: list[PlanRow] = [baseline]
    chain_error: str | None = None if "checkpoint" in allowed else "not asked for"
    combos = [(fused, inplace) for fused in ([False, True] if fused_name else [False])
              for inplace in ([False, True] if inplace_names else [False])]
    inplace_useless = False
    for fused, inplace in combos:
        if inplace and inplace_useless:
            continue
        for label, variant in variants:
            techniques = (("optimizer:fused",) if fused else ()) + (("inplace",) if inplace else ()) + (
                (label,) if label else ())
            variant = {**variant, "optimizer": fused_name} if fused else variant
            with _inplace(torch_model, inplace_names if inplace else []):
                micro = variant.get("accumulate", 1)
                if techniques:
                    say(f"tracing {' + '.join(techniques)}")
                    report = trace(variant, None)
                    rows.append(PlanRow(techniques, report, 0, baseline_flops, micro,
                                        report.peak_bytes <= budget_bytes))
                    if techniques == ("inplace",) and report.peak_bytes == plain.peak_bytes:
                        notes.append("in-place activations change nothing at this step's peak: not combined")
                        inplace_useless = True
                        break
                    if report.peak_bytes <= budget_bytes:
                        continue
                elif plain.peak_bytes <= budget_bytes:
                    continue
                if chain_error is not None:
                    continue
                say(f"searching the optimal checkpoint plan{' with ' + ' + '.join(techniques) if techniques else ''}")
                traced, counted = _bound(trace, variant)
                try:
                    cal = calibrate(torch_model, traced, counted)
                except UnsupportedError as err:
                    chain_error = str(err)
                    notes.append(f"checkpointing not searched: {err}")
                    continue
                best = optimal_checkpoint(cal, budget_bytes, traced)
                cheapest = best.plan.modules if best is not None else ()
                if best is not None and cheapest:
                    rows.append(PlanRow((*techniques, f"checkpoint:{','.join(cheapest)}"), best.report,
                                        best.extra_flops, baseline_flops, micro, True))
                # the other end of the front, the least memory (where nothing fits: how close it gets)
                lowest = min(best.front if best is not None else solve_front(cal.model), key=lambda c: c.peak)
                names = tuple(cal.blocks[j] for j in lowest.blocks)
                if names and names != cheapest:
                    report = trace(variant, CheckpointPlan("optimal", names))
                    rows.append(PlanRow((*techniques, f"checkpoint:{','.join(names)}"), report, lowest.flops,
                                        baseline_flops, micro, report.peak_bytes <= budget_bytes))
    rows = sorted(_useful(rows), key=lambda r: r.cost)
    fitting = [r for r in rows if r.fits]
    if not fitting:
        smallest = min(rows, key=lambda r: r.peak_bytes)
        raise ConfigError(f"no plan fits {format_bytes(budget_bytes)}; the smallest peak found is "
                          f"{format_bytes(smallest.peak_bytes)}: {smallest.label()}"
                          + "".join(f" ({n})" for n in notes if n.startswith("checkpointing"))
                          + "; try a smaller --batch or a larger budget")
    front = _pareto(fitting)
    chosen = front[0]
    if any(t.startswith("accumulate:") for t in chosen.techniques) and any(
            isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in torch_model.modules()):
        notes.append("the chosen plan splits the batch: BatchNorm statistics are then computed per micro-batch "
                     "(leave accumulate out with techniques / --techniques to keep them)")
    measured = None
    if verify:
        say(f"measuring {chosen.label()} for real")
        measured = _measure(model, torch_model, inputs, target, loss_fn, optimizer, base_batch, chosen,
                            inplace_names)
    return MemoryPlan(name, base_batch, budget_bytes, plain.level, baseline, tuple(rows), tuple(front), chosen,
                      measured, tuple(notes), _optimizer_class(fused_name))


def _optimizer_class(name: str | None) -> str:
    """torch.optim's class an optimizer name stands for ("adam:fused": "Adam")."""
    from nnmem import optimizers

    return optimizers.get((name or "sgd").partition(":")[0], "torch").build("torch").class_name


def _kinds(techniques: Any, kinds: tuple[str, ...] = KINDS, default: tuple[str, ...] | None = None,
           where: str = "") -> frozenset[str]:
    """The technique kinds a plan may use (``default``, else all of ``kinds``, for None); a comma-separated text
    or a list. ``where``: what the error adds after the kinds (e.g. " on a Keras model").

    Raises:
        ConfigError: a kind that is not one of ``kinds``.
    """
    if techniques is None:
        return frozenset(kinds if default is None else default)
    asked = [t.strip() for t in (techniques.split(",") if isinstance(techniques, str) else techniques) if t.strip()]
    unknown = [t for t in asked if t not in kinds]
    if unknown or not asked:
        raise ConfigError(f"expected techniques among {', '.join(kinds)}{where}. Received: {techniques!r}")
    return frozenset(asked)


def _bound(trace: Callable[[dict[str, Any], Any], Report], variant: dict[str, Any]) -> tuple[
        Callable[[Any], Report], Callable[[Any], dict[str, dict[Any, int]]]]:
    """The step of one variant traced with a checkpoint plan, and its FLOPs per module."""

    def traced(plan: Any) -> Report:
        return trace(variant, plan)

    def counted(plan: Any) -> dict[str, dict[Any, int]]:
        reports: list[Report] = []
        counts = _flop_counts(lambda: reports.append(trace(variant, plan)))
        # per optimizer step: a trace with accumulation runs fewer micro-batches than K (they repeat)
        k, runs = variant.get("accumulate", 1), _forward_runs(reports[0])
        if k == runs:
            return counts
        return {m: {op: v * k // runs for op, v in by_op.items()} for m, by_op in counts.items()}

    return traced, counted


def _forward_runs(report: Report) -> int:
    """How many forwards (micro-batches) a traced step ran."""
    phases = [p.phase for p in report.timeline]
    return max(1, sum(1 for i, ph in enumerate(phases) if ph == "forward" and (i == 0 or phases[i - 1] != "forward")))


def _inplace(model: Any, names: list[str]) -> AbstractContextManager[Any]:
    if not names:
        return nullcontext()
    from nnmem.frontends.pytorch.inplace import in_place

    return in_place(model, names)


def _flop_counts(run: Callable[[], object]) -> dict[str, dict[Any, int]]:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        run()
    return dict(counter.get_flop_counts())


def _measure(model: Any, torch_model: Any, inputs: Any, target: Any, loss_fn: Any, optimizer: Any, batch: int,
             row: PlanRow, inplace_names: list[str]) -> Report:
    """The chosen plan's step measured for real in a child process."""
    from nnmem import measure
    from nnmem.whatif.compare import _first

    kwargs: dict[str, Any] = {"optimizer": optimizer, "mode": "train"}
    inplace = False
    for technique in row.techniques:
        kind, _, argument = technique.partition(":")
        if kind == "checkpoint":
            kwargs["checkpoint"] = argument
        elif kind == "accumulate":
            kwargs["accumulate"] = int(argument)
        elif kind == "optimizer-in-backward":
            kwargs["optimizer_in_backward"] = True
        elif kind == "inplace":
            inplace = True
        elif kind == "optimizer":
            from nnmem.whatif.compare import _optimizer_variant

            kwargs["optimizer"] = _optimizer_variant(optimizer, technique, "train")
    k = kwargs.get("accumulate", 1)
    if isinstance(model, str) and not inplace:
        return measure(model, batch=batch // k, **kwargs)
    if isinstance(model, str):  # the spec's factory, wrapped to apply in-place in the measuring process
        with tempfile.TemporaryDirectory(prefix="nnmem-plan-") as folder:
            path = os.path.join(folder, "inplace_factory.py")
            with open(path, "w") as f:
                f.write(_INPLACE_FACTORY.format(spec=model))
            return measure(f"{path}:make", batch=batch // k, **kwargs)
    with _inplace(torch_model, inplace_names if inplace else []):
        return measure(torch_model, _first(inputs, batch // k), target=_first(target, batch // k),
                       loss_fn=loss_fn, **kwargs)



def optimal_checkpointing(model: Any, inputs: Any = None, *, budget: Any, batch: int | None = None,
                          optimizer: Any = None, loss_fn: Callable[..., Any] | None = None, target: Any = None,
                          input_shape: Any = None) -> Any:
    """The gradient-checkpointing plan of ``model``'s blocks (its chain's, else its root's children) that
    recomputes the fewest FLOPs with a training peak within ``budget`` (an
    :class:`~nnmem.frontends.pytorch.checkpoint_search.OptimalCheckpoint`: ``plan`` for
    :func:`nnmem.apply_checkpointing`, ``peak_bytes`` from a trace of the step with it, ``extra_flops``,
    ``front``: every Pareto-optimal plan). Exact, on a memory model drawn from three traces: dynamic programming
    over a chain (:mod:`nnmem.whatif.chain_dp`), a MILP where the blocks are not held as a chain's are
    (:mod:`nnmem.whatif.graph_milp`, HiGHS).

    Raises:
        ConfigError: no plan of the chain's blocks fits the budget (the message gives the lowest peak).
        UnsupportedError: the model has no chain of blocks, or it is not a PyTorch model.

    Example:
        >>> best = nnmem.optimal_checkpointing("gpt", budget="40MiB", batch=32)  # doctest: +SKIP
        >>> nnmem.apply_checkpointing(model, best.plan)  # doctest: +SKIP
    """
    from nnmem import estimate
    from nnmem.frontends.pytorch.checkpoint_search import calibrate, optimal_checkpoint
    from nnmem.units import format_bytes, parse_size
    from nnmem.whatif.compare import _build
    from nnmem.whatif.graph_milp import solve_front

    budget_bytes = parse_size(budget)
    torch_model, inputs, target, loss_fn = _build(model, inputs, batch, target, loss_fn, input_shape)
    step = {"optimizer": optimizer, "loss_fn": loss_fn, "target": target, "mode": "train",
            "batch": batch if inputs is None else None}

    def trace(p: Any) -> Report:
        return estimate(torch_model, inputs, checkpoint=",".join(p.modules) if p and p.modules else None, **step)

    cal = calibrate(torch_model, trace, lambda p: _flop_counts(lambda: trace(p)))
    best = optimal_checkpoint(cal, budget_bytes, trace)
    if best is None:
        lowest = min(solve_front(cal.model), key=lambda c: c.peak)
        raise ConfigError(f"no checkpoint plan of {type(torch_model).__name__}'s {len(cal.blocks)} blocks fits "
                          f"{format_bytes(budget_bytes)}; the lowest peak is about {format_bytes(lowest.peak)} "
                          f"(checkpointing {len(lowest.blocks)} of them): combine techniques with nnmem.plan")
    return best
