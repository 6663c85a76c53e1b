"""The ``nnmem`` command: argument parsing → public API → renderers. The only module that prints.

Exit codes: 0 success; 2 a user mistake (bad argument, model that cannot be loaded or traced, a
measuring child that died), printed as one line ``nnmem: error: <message>``; 130 interrupted;
1 an internal error (a bug in nnmem; set ``NNMEM_DEBUG=1`` for the traceback).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.console import Console

import nnmem
from nnmem import optimizers
from nnmem._api import MODES
from nnmem.report.output import check_chart_support
from nnmem.report.plan_text import render_plan
from nnmem.report.text import (
    colored,
    render_budget,
    render_comparison,
    render_devices,
    render_examples,
    render_explanation,
    render_fits,
    render_report,
    render_summary,
)
from nnmem.report.whatif_text import render_accumulation, render_whatif

_ALL_OPTIMIZERS = optimizers.names()
_OPTIMIZER_HELP = ("Optimizer whose state a training step keeps. Default: sgd for PyTorch models, the compiled "
                   "one for Keras models (Keras-only: "
                   + ", ".join(k for k in optimizers.names("keras") if k not in optimizers.names("torch")) + ").")

__all__ = ["main", "cli", "NnmemGroup"]

DEFAULT_BATCH = 32
EXIT_USAGE = 2
EXIT_INTERNAL = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell convention


class PositiveIntType(click.ParamType):
    """A positive integer, e.g. a batch size: ``0``, ``-3``, ``2.5`` and ``abc`` are rejected."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        text = str(value).strip()
        if not (text.isdigit() and int(text) > 0):
            self.fail(f"expected a positive integer. Received: {value!r}", param, ctx)
        return int(text)


class ShapeType(click.ParamType):
    """An input shape without the batch, e.g. ``3,32,32`` → ``(3, 32, 32)``."""

    name = "shape"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        parts = [p.strip() for p in str(value).split(",")]
        if not all(p.isdigit() and int(p) > 0 for p in parts):
            self.fail(f"expected positive integers separated by commas, without the batch, e.g. 3,32,32. "
                      f"Received: {value!r}", param, ctx)
        return tuple(int(p) for p in parts)


class SizeType(click.ParamType):
    """A memory size such as ``16GiB`` or ``16 GB``, parsed by :func:`nnmem.parse_size` into bytes."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return nnmem.parse_size(str(value))
        except nnmem.ConfigError as err:
            self.fail(str(err), param, ctx)


def _step_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options shared by ``estimate`` and ``measure`` (applied bottom-up, listed top-down)."""
    options = [
        click.argument("model"),
        click.option("--batch", type=PositiveIntType(), default=DEFAULT_BATCH, show_default=True,
                     help="Batch size; the factory is called as factory(batch)."),
        click.option("--input-shape", "input_shape", type=ShapeType(), multiple=True, metavar="D1,D2,...",
                     help="Input shape without the batch, e.g. 3,32,32; repeat once per input. "
                          "Needed when the factory returns only a model."),
        click.option("--mode", type=click.Choice(MODES, case_sensitive=False), default="train", show_default=True,
                     help="Training step or inference."),
        click.option("--optimizer", type=click.Choice(_ALL_OPTIMIZERS, case_sensitive=False), default=None,
                     help=_OPTIMIZER_HELP),
        click.option("--device", default="cpu", show_default=True, help="Target device."),
        click.option("--budget", type=SizeType(), default=None, metavar="SIZE",
                     help="Memory budget, e.g. 16GiB or 16 GB: say whether the peak fits."),
        click.option("--accumulate", type=PositiveIntType(), default=1, show_default=True, metavar="K",
                     help="Gradient accumulation: one optimizer step over K micro-batches of --batch (Keras: the "
                          "optimizer's gradient_accumulation_steps)."),
        click.option("--checkpoint", default=None, metavar="PLAN",
                     help="Gradient checkpointing (PyTorch): blocks, every:K, sqrt or NAME[,NAME...]; see "
                          "`nnmem whatif`."),
        click.option("--precision", default=None, metavar="PRECISION",
                     help="Lower precision (PyTorch): bf16 or fp16 (torch.autocast, float32 master weights), "
                          "half:bf16 or half:fp16 (parameters and optimizer state in that dtype), fp32."),
        click.option("--zero-grad", "zero_grad", type=click.Choice(["none", "zeros"]), default="none",
                     show_default=True,
                     help="How the training step clears gradients (PyTorch): none = optimizer.zero_grad("
                          "set_to_none=True), freed; zeros = set_to_none=False, kept allocated and zeroed."),
        click.option("--json", "as_json", is_flag=True, help="Print only JSON."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _chart_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--html FILE`` and ``--png DIR``: the result's charts, besides what the command prints."""
    options = [
        click.option("--html", "html_path", type=click.Path(dir_okay=False, writable=True, path_type=Path),
                     default=None, metavar="FILE",
                     help="Also write the charts as one self-contained HTML file (opens offline; needs "
                          "nnmem[report])."),
        click.option("--png", "png_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                     metavar="DIR", help="Also draw the charts as PNG files in DIR (needs nnmem[report])."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _charts_wanted(html_path: Path | None, png_dir: Path | None) -> None:
    """Fail now, not after a long estimate, when a chart format asked for cannot be drawn or written."""
    check_chart_support(html=html_path is not None, png=png_dir is not None)
    if html_path is not None and not html_path.resolve().parent.is_dir():
        raise click.BadParameter(f"no folder {str(html_path.parent)!r} to write {html_path.name!r} in",
                                 param_hint="'--html'")


def _save_charts(result: Any, html_path: Path | None, png_dir: Path | None) -> None:
    """Write the charts asked for and say where, on stderr (stdout stays the report or the JSON)."""
    if html_path is not None:
        click.echo(f"nnmem: wrote {nnmem.write_html(result, html_path)}", err=True)
    if png_dir is not None:
        paths = nnmem.write_png(result, png_dir)
        click.echo(f"nnmem: wrote {', '.join(str(p) for p in paths)}", err=True)


def _step_kwargs(batch: int, input_shape: tuple[tuple[int, ...], ...], mode: str, optimizer: str | None,
                 device: str, accumulate: int = 1, checkpoint: str | None = None,
                 precision: str | None = None, zero_grad: str = "none") -> dict[str, Any]:
    return {"batch": batch, "input_shape": input_shape or None, "mode": mode.lower(),
            "optimizer": _opt(optimizer), "device": device, "accumulate": accumulate, "checkpoint": checkpoint,
            "precision": precision, "set_to_none": zero_grad != "zeros"}


def _opt(optimizer: str | None) -> str | None:
    return optimizer.lower() if optimizer else None


def _width() -> int:
    """Render at the terminal's width, 80 to 160 columns: below 118 columns the tables take their compact form
    (every command's output fits 80)."""
    return max(80, min(160, shutil.get_terminal_size((120, 24)).columns))


class NnmemGroup(click.Group):
    """A click group whose ``main`` turns every failure into one line on stderr and an exit code."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        code = _run(self, list(sys.argv[1:] if args is None else args), prog_name or "nnmem")
        if standalone_mode:
            sys.exit(code)
        return code


@click.group(cls=NnmemGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(nnmem.__version__, prog_name="nnmem")
@click.option("--no-color", "no_color", is_flag=True,
              help="Plain text on a terminal too (as when the output is piped, or with NO_COLOR set); accepted "
                   "anywhere on the line.")
@click.pass_context
def cli(ctx: click.Context, no_color: bool) -> None:
    """Estimate how much memory a neural network's training or inference step needs, and where it goes.

    All sizes are printed in IEC units (1 KiB = 1024 B).
    """
    color = not no_color and not os.environ.get("NO_COLOR") and sys.stdout.isatty()
    ctx.with_resource(colored(color))


@cli.command()
@_step_options
@click.option("--depth", type=PositiveIntType(), default=None, metavar="N",
              help="Fold the per-layer table to this module depth (default: the deepest that keeps it short).")
@click.option("--top", type=PositiveIntType(), default=None, metavar="N",
              help="List only the N layers holding the most at the peak; the rest in one row.")
@_chart_options
def estimate(model: str, batch: int, input_shape: tuple[tuple[int, ...], ...], mode: str, optimizer: str | None,
             device: str, budget: int | None, accumulate: int, checkpoint: str | None, precision: str | None,
             zero_grad: str, as_json: bool, depth: int | None, top: int | None, html_path: Path | None,
             png_dir: Path | None) -> None:
    """Estimate the peak memory of one step of MODEL, without running it.

    MODEL is a built-in example (see `nnmem examples`), path/to/file.py:factory or package.module:factory.
    The factory is called as factory(batch) (default batch 32) and returns a model or
    (model, inputs[, target[, loss_fn]]).
    """
    _charts_wanted(html_path, png_dir)
    with _progress(as_json, total=1) as progress:
        if progress:
            progress(f"tracing {model} at batch {batch:,}")
        report = nnmem.estimate(model, **_step_kwargs(batch, input_shape, mode, optimizer, device, accumulate,
                                                      checkpoint, precision, zero_grad))
    if as_json:
        click.echo(report.to_json(budget_bytes=budget))
    else:
        click.echo(render_report(report, width=_width(), depth=depth, top=top), nl=False)
        if budget is not None:
            click.echo(render_budget(report.peak_bytes, budget))
    _save_charts(report, html_path, png_dir)


@cli.command()
@_step_options
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="SECONDS", help="Kill the measuring child process after this many seconds.")
@click.option("--runs", type=click.IntRange(1, 50), default=1, show_default=True,
              help="Fresh processes to measure in; reports the median run and every run's peak.")
@_chart_options
def measure(model: str, batch: int, input_shape: tuple[tuple[int, ...], ...], mode: str, optimizer: str | None,
            device: str, budget: int | None, accumulate: int, checkpoint: str | None, precision: str | None,
            zero_grad: str, as_json: bool, timeout_s: float | None, runs: int, html_path: Path | None,
            png_dir: Path | None) -> None:
    """Estimate MODEL's step, run it for real in a child process, and compare the two.

    MODEL is a built-in example (see `nnmem examples`), path/to/file.py:factory or package.module:factory.
    Default batch 32. --budget is checked against the measured peak. --runs N measures in N fresh processes
    (TensorFlow's peak differs between processes) and compares with the median run.
    """
    _charts_wanted(html_path, png_dir)
    kwargs = _step_kwargs(batch, input_shape, mode, optimizer, device, accumulate, checkpoint, precision, zero_grad)
    with _progress(as_json, total=1 + runs) as progress:
        if progress:
            progress(f"tracing {model} at batch {batch:,}")
        estimated = nnmem.estimate(model, **kwargs)
        measured = nnmem.measure(model, **kwargs, timeout_s=timeout_s, runs=runs, progress=progress)
    comparison = nnmem.compare(estimated, measured)
    if as_json:
        click.echo(json.dumps(comparison.to_dict(budget_bytes=budget), indent=2))
    else:
        click.echo(render_summary(estimated, width=_width()))
        click.echo(render_summary(measured, width=_width()))
        click.echo(render_comparison(comparison, width=_width()), nl=False)
        if budget is not None:
            click.echo(f"measured peak {render_budget(measured.peak_bytes, budget)}")
    _save_charts(comparison, html_path, png_dir)


@cli.command()
def examples() -> None:
    """List the built-in example models, usable as MODEL."""
    from nnmem import zoo

    click.echo(render_examples([(name, zoo.describe(name)) for name in zoo.names()], width=_width()), nl=False)


@contextmanager
def _progress(as_json: bool = False, total: int | None = None) -> Iterator[Callable[[str], None] | None]:
    """A progress bar on stderr naming the step under way (each trace of a batch search, each technique, each
    measuring process), with the steps done (of ``total`` where known) and the time taken, on an interactive
    terminal; silent with --json or when stderr is a file or a pipe. A step is done when the next one starts."""
    if as_json or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    count = MofNCompleteColumn() if total else TextColumn("{task.completed} done")
    with Progress(SpinnerColumn(), TextColumn("nnmem: {task.description}"), BarColumn(), count, TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("starting", total=total)
        started = False

        def say(message: str) -> None:
            nonlocal started
            bar.update(task, description=message, advance=1 if started else 0)
            started = True

        yield say


def _budget_label(budget: int | None, device: str, usable: int | None = None) -> str:
    """The --budget, or the device with the bytes its framework may use there (``usable``: the search's own,
    e.g. TensorFlow's GPU memory limit; default the catalog's usable memory)."""
    if budget is not None:
        return nnmem.format_bytes(budget)
    dev = nnmem.get_device(device)
    return f"{dev.name} (usable {nnmem.format_bytes(dev.usable_bytes if usable is None else usable)})"


def _fit_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.argument("model"),
        click.option("--budget", type=SizeType(), default=None, metavar="SIZE",
                     help="Memory budget, e.g. 16GiB or 16 GB."),
        click.option("--device", default="cpu", show_default=True,
                     help="A catalog device (see `nnmem devices`) whose usable memory is the budget."),
        click.option("--input-shape", "input_shape", type=ShapeType(), multiple=True, metavar="D1,D2,...",
                     help="Input shape without the batch; repeat once per input."),
        click.option("--optimizer", type=click.Choice(_ALL_OPTIMIZERS, case_sensitive=False), default=None,
                     help=_OPTIMIZER_HELP),
        click.option("--json", "as_json", is_flag=True, help="Print only JSON."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _need_budget(budget: int | None, device: str) -> None:
    if budget is None and device.lower() == "cpu":
        raise click.UsageError("expected --budget SIZE (e.g. --budget 16GiB) or --device NAME from `nnmem devices`")
    if budget is not None and device.lower() != "cpu":
        raise click.UsageError("expected either --budget or --device, not both")


@cli.command()
@_fit_options
@click.option("--mode", type=click.Choice((*MODES, "both"), case_sensitive=False), default="both", show_default=True,
              help="Which step to fit.")
@click.option("--effective-batch", "effective", type=PositiveIntType(), default=None, metavar="B",
              help="Training batch per optimizer step: the fewest gradient-accumulation micro-batches it fits in.")
@_chart_options
def fit(model: str, budget: int | None, device: str, input_shape: tuple[tuple[int, ...], ...], optimizer: str | None,
        as_json: bool, mode: str, effective: int | None, html_path: Path | None, png_dir: Path | None) -> None:
    """The largest batch of MODEL that fits a budget, for training and for inference side by side.

    Exact for the estimate: the step's peak at the batch is within the budget, at the next batch it is not.
    With --effective-batch B: the fewest micro-batches a training batch of B fits in (gradient accumulation).
    """
    _need_budget(budget, device)
    if effective is not None and (html_path is not None or png_dir is not None):
        raise click.UsageError("--html and --png draw the batch curve of a plain fit, not --effective-batch's split")
    _charts_wanted(html_path, png_dir)
    if effective is not None:
        with _progress(as_json) as progress:
            split = nnmem.micro_batches(model, batch=effective, budget=budget, device=device,
                                        optimizer=_opt(optimizer), input_shape=input_shape or None, progress=progress)
        click.echo(json.dumps(split.to_dict(), indent=2) if as_json
                   else render_accumulation(split, budget_label=_budget_label(budget, device)))
        return
    modes = MODES if mode.lower() == "both" else (mode.lower(),)
    with _progress(as_json) as progress:
        fits = nnmem.fit(model, budget=budget, device=device, modes=modes, optimizer=_opt(optimizer),
                         input_shape=input_shape or None, progress=progress)
    if as_json:
        click.echo(json.dumps(fits.to_dict(), indent=2))
    else:
        click.echo(render_fits(list(fits.results), budget_label=_budget_label(budget, device, fits.budget_bytes),
                               level=fits.level, width=_width(), notes=fits.notes), nl=False)
    _save_charts(fits, html_path, png_dir)


@cli.command()
@_fit_options
@click.option("--batch", type=PositiveIntType(), default=None,
              help="Read the figures where the peak is decided at this batch "
                   "[default: at the largest batch that fits, or at large batches].")
@_chart_options
def explain(model: str, budget: int | None, device: str, input_shape: tuple[tuple[int, ...], ...],
            optimizer: str | None, as_json: bool, batch: int | None, html_path: Path | None,
            png_dir: Path | None) -> None:
    """Why training fits a smaller batch than inference: what grows per sample in each, with MODEL's figures.

    With --budget or --device it also finds the largest batch of each.
    """
    if budget is not None and device.lower() != "cpu":
        raise click.UsageError("expected either --budget or --device, not both")
    _charts_wanted(html_path, png_dir)
    with _progress(as_json) as progress:
        exp = nnmem.explain(model, budget=budget, device=device, optimizer=_opt(optimizer),
                            input_shape=input_shape or None, batch=batch, progress=progress)
    if as_json:
        click.echo(json.dumps(exp.to_dict(), indent=2))
    else:
        click.echo(render_explanation(exp, model=model, width=_width()), nl=False)
    _save_charts(exp, html_path, png_dir)


@cli.command()
@click.argument("model")
@click.option("--batch", type=PositiveIntType(), default=DEFAULT_BATCH, show_default=True,
              help="Batch size; the factory is called as factory(batch).")
@click.option("--input-shape", "input_shape", type=ShapeType(), multiple=True, metavar="D1,D2,...",
              help="Input shape without the batch; repeat once per input.")
@click.option("--mode", type=click.Choice(MODES, case_sensitive=False), default="train", show_default=True,
              help="Training step or inference.")
@click.option("--optimizer", type=click.Choice(_ALL_OPTIMIZERS, case_sensitive=False), default=None,
              help=_OPTIMIZER_HELP)
@click.option("--checkpoint", "plans", multiple=True, metavar="PLAN",
              help="A gradient-checkpointing plan to compare: blocks, every:K, sqrt or NAME[,NAME...] (module "
                   "names); repeat for more. Default: every plan that applies to the model.")
@click.option("--technique", "extra", multiple=True, metavar="TECHNIQUE",
              help="Another technique to compare: inplace (activation and dropout modules in place), "
                   "accumulate:K (the batch in K micro-batches), optimizer-in-backward, optimizer:foreach|fused, "
                   "prune:AMOUNT (torch.nn.utils.prune on each linear/conv weight), prune-channels:AMOUNT "
                   "(channels removed), autocast:bf16|fp16 (mixed precision), half:bf16|fp16 (half-precision "
                   "parameters), quantize:int8 (dynamic int8 linear layers, inference), save-on-cpu (saved tensors "
                   "in host memory; with --device a GPU), weight-only:int8|int4[:G] (int8/int4 linear weights, "
                   "inference), policy:NAME (a Keras dtype policy); repeat for more.")
@click.option("--budget", type=SizeType(), default=None, metavar="SIZE",
              help="Also find the largest training and inference batch with each technique, e.g. 16GiB.")
@click.option("--device", default="cpu", show_default=True,
              help="Estimate every row for this device: cpu, cuda or a GPU from `nnmem devices` (its rows at the "
                   "caching allocator's reserved level).")
@click.option("--json", "as_json", is_flag=True, help="Print only JSON.")
@_chart_options
def whatif(model: str, batch: int, input_shape: tuple[tuple[int, ...], ...], mode: str, optimizer: str | None,
           plans: tuple[str, ...], extra: tuple[str, ...], budget: int | None, device: str, as_json: bool,
           html_path: Path | None, png_dir: Path | None) -> None:
    """What each memory-saving technique buys on MODEL: the step traced with it applied, next to the baseline.

    Each row is a trace of the transformed step (PyTorch models; gradient checkpointing, in-place
    activations, gradient accumulation and the optimizer step inside backward so far), with the bytes saved
    at the peak and the FLOPs the technique adds. Without --checkpoint or --technique, every technique that
    applies is compared.
    """
    asked = [f"checkpoint:{p}" for p in plans] + list(extra)
    _charts_wanted(html_path, png_dir)
    with _progress(as_json) as progress:
        result = nnmem.what_if(model, batch=batch, input_shape=input_shape or None, mode=mode.lower(),
                              optimizer=_opt(optimizer), techniques=asked or None,
                              budget=budget, device=device, progress=progress)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        click.echo(render_whatif(result, width=_width()), nl=False)
    _save_charts(result, html_path, png_dir)


@cli.command(name="plan")
@click.argument("model")
@click.option("--budget", type=SizeType(), required=True, metavar="SIZE",
              help="The memory the training step must fit, e.g. 8GiB.")
@click.option("--batch", type=PositiveIntType(), default=DEFAULT_BATCH, show_default=True,
              help="Batch size per optimizer step; the factory is called as factory(batch).")
@click.option("--input-shape", "input_shape", type=ShapeType(), multiple=True, metavar="D1,D2,...",
              help="Input shape without the batch; repeat once per input.")
@click.option("--optimizer", type=click.Choice(_ALL_OPTIMIZERS, case_sensitive=False), default=None,
              help=_OPTIMIZER_HELP)
@click.option("--techniques", default=None, metavar="KIND[,KIND...]",
              help="The kinds a plan may combine: checkpoint, inplace, accumulate, optimizer-in-backward, "
                   "fused (torch.optim's fused step); on a Keras model policy, remat, accumulate [default: all but "
                   "policy].")
@click.option("--verify", is_flag=True, help="Apply the chosen plan for real and measure the step (child process).")
@click.option("--json", "as_json", is_flag=True, help="Print only JSON.")
def plan_command(model: str, budget: int, batch: int, input_shape: tuple[tuple[int, ...], ...],
                 optimizer: str | None, techniques: str | None, verify: bool, as_json: bool) -> None:
    """The cheapest combination of techniques whose training step on MODEL fits --budget, and the others.

    Combines in-place activations, the optimizer inside backward, gradient accumulation and the optimal
    gradient-checkpointing plan (an exact search over the model's blocks); every peak is a trace of the
    step with the techniques applied. On a Keras model (KERAS_BACKEND picks the backend): keras.RematScope
    and, with --techniques policy,remat, mixed-precision dtype policies, alone and combined.
    """
    with _progress(as_json) as progress:
        result = nnmem.plan(model, budget=budget, batch=batch, input_shape=input_shape or None,
                            optimizer=_opt(optimizer), techniques=techniques, verify=verify, progress=progress)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        click.echo(render_plan(result, width=_width()), nl=False)
    if result.measured is not None and result.measured.peak_bytes > budget:
        raise nnmem.BudgetError(f"the chosen plan measured {result.measured.peak_bytes:,} B, over the budget of "
                                f"{budget:,} B")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print only JSON.")
def devices(as_json: bool) -> None:
    """List the device catalog: memory, what is not available to tensors, and the source of each figure."""
    catalog = nnmem.list_devices()
    if as_json:
        click.echo(json.dumps([d.to_dict() for d in catalog], indent=2))
        return
    click.echo(render_devices(catalog, width=_width()), nl=False)


def _one_line(message: str) -> str:
    return " ".join(line.strip() for line in message.splitlines() if line.strip()) or "(no message)"


def _error(message: str, code: int) -> int:
    click.echo(_one_line(message), err=True)
    return code


def _usage_message(err: click.UsageError) -> str:
    command = err.ctx.command_path if err.ctx is not None else "nnmem"
    return f"nnmem: error: {err.format_message()} (see '{command} --help')"


def _quiet_framework_logs() -> None:
    # PyTorch's fake-tensor mode logs a traceback at ERROR level before re-raising a shape error
    # (torch/_subclasses/fake_tensor.py, "failed while attempting to run meta for ..."); nnmem turns
    # that error into a TraceError, so the log would only put a traceback in front of the message.
    logging.getLogger("torch._subclasses.fake_tensor").disabled = True


def _run(group: click.Group, args: list[str], prog_name: str) -> int:
    """Run ``group`` on the command line ``args`` and return the exit code; print errors as one line."""
    _quiet_framework_logs()
    if "--no-color" in args[1:]:  # a group option, accepted after the command too: `nnmem estimate mlp --no-color`
        cut = args.index("--") if "--" in args else len(args)
        if "--no-color" in args[:cut]:
            args = ["--no-color", *[a for a in args[:cut] if a != "--no-color"], *args[cut:]]
    try:
        with group.make_context(prog_name, args) as ctx:
            group.invoke(ctx)
        return 0
    except click.exceptions.NoArgsIsHelpError as err:
        click.echo(err.ctx.get_help() if err.ctx is not None else "")
        return 0
    except click.exceptions.Exit as err:  # --help, --version
        return err.exit_code
    except click.UsageError as err:  # BadParameter, NoSuchOption, MissingParameter, ...
        return _error(_usage_message(err), EXIT_USAGE)
    except click.ClickException as err:
        return _error(f"nnmem: error: {err.format_message()}", EXIT_USAGE)
    except nnmem.NnmemError as err:
        return _error(f"nnmem: error: {err}", EXIT_USAGE)
    except (KeyboardInterrupt, click.Abort):
        return _error("nnmem: interrupted", EXIT_INTERRUPTED)
    except BrokenPipeError:  # e.g. `nnmem estimate mlp | head`: the reader left, nothing to report
        _silence_stdout()
        return EXIT_INTERNAL
    except Exception as err:
        if os.environ.get("NNMEM_DEBUG", "") not in ("", "0"):
            raise
        return _error(f"nnmem: internal error: {type(err).__name__}: {err} (please report)", EXIT_INTERNAL)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``nnmem`` script and of ``python -m nnmem``; exits with the command's code."""
    cli.main(args=argv, prog_name="nnmem")
