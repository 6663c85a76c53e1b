"""Keras conveniences: ``summary`` (``model.summary()`` with memory columns) and the ``MemoryCheck`` callback.

Both run on the process's Keras backend (torch, jax or tensorflow) and use :func:`nnmem.estimate`, so
nothing batch-sized is allocated to produce them.

Example:
    >>> import nnmem.keras  # doctest: +SKIP
    >>> nnmem.keras.summary(model, batch_size=32)  # doctest: +SKIP
    >>> check = nnmem.keras.MemoryCheck(budget="16GiB", batch_size=32)  # doctest: +SKIP
    >>> model.fit(x, y, batch_size=32, callbacks=[check])  # doctest: +SKIP
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np

from nnmem._api import estimate
from nnmem.errors import BudgetError, ConfigError
from nnmem.frontends.keras.data import batch_zeros, example_data
from nnmem.report.model import Report
from nnmem.units import format_bytes, parse_size

__all__ = ["KerasSummary", "SummaryRow", "summary", "MemoryCheck"]


@dataclass(frozen=True, slots=True)
class SummaryRow:
    """One layer of a :class:`KerasSummary`.

    Attributes:
        name: the layer's path; kind: its class name; output_shape: as Keras shows it (batch None).
        parameters: parameter elements the layer owns; arithmetic: how they add up (e.g. "256·128 + 128 = 32,896").
        parameter_bytes: bytes of those parameters; output_bytes: bytes of the layer's output at the batch size.
        saved_bytes: bytes the layer's forward pass leaves saved for backward in a training step.
    """

    name: str
    kind: str
    output_shape: str
    parameters: int
    arithmetic: str
    parameter_bytes: int
    output_bytes: int
    saved_bytes: int


@dataclass(frozen=True, slots=True)
class KerasSummary:
    """``model.summary()`` plus memory: per-layer rows and the train and infer peaks at one batch size."""

    model: str
    backend: str
    batch_size: int
    rows: tuple[SummaryRow, ...]
    train: Report | None
    infer: Report

    def text(self, width: int = 118) -> str:
        """The summary as a plain-text table."""
        head = ("Layer (type)", "Output shape", "Param #", "Param bytes", "Output bytes", "Saved for backward")
        cells = [(f"{r.name} ({r.kind})", r.output_shape, r.arithmetic or f"{r.parameters:,}",
                  format_bytes(r.parameter_bytes), format_bytes(r.output_bytes),
                  format_bytes(r.saved_bytes) if self.train is not None else "-") for r in self.rows]
        widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(head)]
        line = "  ".join(h.ljust(w) for h, w in zip(head, widths))
        rule = "─" * min(max(len(line), 60), width)
        out = [f'Model: "{self.model}" (Keras backend: {self.backend}, batch size {self.batch_size})', rule, line,
               rule]
        out += ["  ".join(c.ljust(w) for c, w in zip(cell, widths)) for cell in cells]
        total = sum(r.parameters for r in self.rows)
        out += [rule, f"Total params: {total:,} ({format_bytes(sum(r.parameter_bytes for r in self.rows))})"]
        if self.train is not None:
            out.append(f"Training step peak (optimizer {self.train.optimizer}): "
                       f"{format_bytes(self.train.peak_bytes)} — " + _top(self.train))
        out.append(f"Inference step peak: {format_bytes(self.infer.peak_bytes)} — " + _top(self.infer))
        if self.train is not None and self.infer.peak_bytes:
            out.append(f"Training needs {self.train.peak_bytes / self.infer.peak_bytes:.1f}x the memory of inference "
                       "at this batch size (saved activations, gradients and optimizer state).")
        out.append(f"{self.infer.level} level, estimated without running the model; IEC units (1 KiB = 1024 B)")
        return "\n".join(out) + "\n"

    def __str__(self) -> str:
        return self.text()


def _top(report: Report, n: int = 3) -> str:
    parts = sorted(((v, k) for k, v in report.breakdown.items() if v > 0), reverse=True)[:n]
    return ", ".join(f"{k} {format_bytes(v)}" for v, k in parts)


def _output_shape(layer: Any) -> str:
    try:
        out = layer.output
    except (AttributeError, ValueError):
        return "?"
    shapes = [tuple(t.shape) for t in keras.tree.flatten(out) if hasattr(t, "shape")]
    return ", ".join(str(s).replace("None", "None") for s in shapes) or "?"


def _data(model: Any, batch_size: int, mode: str, x: Any, y: Any) -> tuple[Any, Any]:
    if x is None:
        x, y2, _ = example_data(model, batch_size, mode, y)
        return x, y2
    return _rebatch(x, batch_size), _rebatch(y, batch_size)


def _rebatch(value: Any, batch: int) -> Any:
    if value is None:
        return None
    return keras.tree.map_structure(lambda a: batch_zeros((batch, *np.shape(a)[1:]), np.asarray(a).dtype), value)


def summary(model: Any, batch_size: int = 32, mode: str = "both", *, x: Any = None, y: Any = None,
            optimizer: Any = None, loss: Any = None, print_fn: Callable[[str], Any] | None = print) -> KerasSummary:
    """What ``model.summary()`` shows, plus per-layer memory and the step peaks at ``batch_size``.

    Args:
        model: a built Keras 3 model (compiled, or give ``optimizer`` and ``loss`` for the training column).
        batch_size: the batch the peaks and output bytes are for.
        mode: "both" (train and infer), "train" or "infer".
        x, y: example inputs/targets (any batch; only shapes and dtypes are used). Default: zeros of the
            model's declared input and output shapes.
        print_fn: where the table goes; None prints nothing.

    Returns:
        The summary (``str()`` gives the table); its ``train`` / ``infer`` Reports have the full breakdowns.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ConfigError(f"expected batch_size as a positive integer. Received: {batch_size!r}")
    if mode not in ("both", "train", "infer"):
        raise ConfigError(f"unknown mode {mode!r}: expected 'both', 'train' or 'infer'")
    train = None
    if mode in ("both", "train"):
        tx, ty = _data(model, batch_size, "train", x, y)
        train = estimate(model, tx, target=ty, mode="train", optimizer=optimizer, loss_fn=loss, batch=batch_size)
    ix, _ = _data(model, batch_size, "infer", x, None)
    infer = estimate(model, ix, mode="infer", batch=batch_size)
    saved = {r.path: r.saved_bytes for r in train.layers} if train is not None else {}
    rows = []
    layers = {str(getattr(layer, "path", None) or layer.name): layer
              for layer in model._flatten_layers(include_self=False)}
    for r in infer.layers:
        layer = layers.get(r.path)
        shape = _output_shape(layer) if layer is not None else "?"
        rows.append(SummaryRow(r.path, r.kind, shape, r.parameters, r.arithmetic, r.parameter_bytes,
                               _output_bytes(layer, batch_size, r.output_bytes), saved.get(r.path, 0)))
    result = KerasSummary(model.name, str(keras.backend.backend()), batch_size, tuple(rows), train, infer)
    if print_fn is not None:
        print_fn(result.text())
    return result


def _output_bytes(layer: Any, batch: int, traced: int) -> int:
    """Bytes of a layer's output at ``batch``: from its symbolic output shape, else from the trace."""
    try:
        outs = [t for t in keras.tree.flatten(layer.output) if hasattr(t, "shape")]
    except (AttributeError, ValueError):
        return traced
    total = 0
    for t in outs:
        dims = [batch if d is None else int(d) for d in t.shape]
        dtype = keras.backend.standardize_dtype(t.dtype)
        total += int(np.prod(dims, dtype=np.int64)) * (2 if dtype == "bfloat16" else np.dtype(dtype).itemsize)
    return total or traced


class MemoryCheck(keras.callbacks.Callback):
    """Check at the start of ``fit`` that one training step fits a memory budget; log estimate vs measured.

    At ``on_train_begin`` the step is estimated at ``batch_size`` (Keras does not tell callbacks the batch
    size, so give it, unless the model's input declares a fixed batch) on ``device``: "cpu" (the budget defaults
    to 16 GiB) or a catalog GPU (``device="T4"``: modelled, and the budget defaults to what this backend's
    allocator may use there, e.g. TensorFlow's memory limit). Then:
    - peak ≤ ``warn_at`` × budget: passes (one log line);
    - up to the budget: warns (a ``ResourceWarning`` and a log line);
    - over the budget: raises :class:`nnmem.BudgetError` before the first batch (``on_exceed="stop"``), or only
      warns (``on_exceed="warn"``).
    After the first batch it logs the measured peak next to the estimate where the backend exposes one:
    TensorFlow's BFC allocator peak (when ``TF_CPU_ALLOCATOR_USE_BFC=true`` was set before TensorFlow was
    imported) and, on the torch backend, the profiler's allocator events over that batch. The JAX CPU client
    exposes no peak; the log says so. With a GPU ``device`` nothing is measured (the run is not on that GPU).

    Attributes:
        estimate: the Report of the estimated step (after ``on_train_begin``).
        measured_peak: bytes measured over the first batch, or None.
        status: "fits", "warn" or "exceeds".
    """

    def __init__(self, budget: Any = None, *, batch_size: int | None = None, on_exceed: str = "stop",
                 warn_at: float = 0.9, x: Any = None, y: Any = None, verbose: int = 1,
                 print_fn: Callable[[str], Any] | None = None, device: str = "cpu") -> None:
        super().__init__()
        self.device = device
        self.budget = parse_size(budget) if budget is not None else _device_budget(device)
        if on_exceed not in ("stop", "warn"):
            raise ConfigError(f"expected on_exceed='stop' or 'warn'. Received: {on_exceed!r}")
        if not 0 < warn_at <= 1:
            raise ConfigError(f"expected warn_at in (0, 1]. Received: {warn_at!r}")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                       or batch_size <= 0):
            raise ConfigError(f"expected batch_size as a positive integer. Received: {batch_size!r}")
        self.batch_size, self.on_exceed, self.warn_at = batch_size, on_exceed, warn_at
        self._x, self._y, self.verbose, self._print = x, y, verbose, print_fn or print
        self.estimate: Report | None = None
        self.measured_peak: int | None = None
        self.status = ""
        self._probe: Any = None

    def _log(self, text: str) -> None:
        if self.verbose:
            self._print(f"nnmem MemoryCheck: {text}")

    def _batch(self) -> int:
        if self.batch_size is not None:
            return self.batch_size
        inputs = getattr(self.model, "inputs", None) or []
        fixed = [t.shape[0] for t in inputs if t.shape and t.shape[0] is not None]
        if fixed:
            return int(fixed[0])
        raise ConfigError("MemoryCheck needs batch_size= (Keras does not tell callbacks the batch size); "
                          "pass the batch_size you give fit()")

    def on_train_begin(self, logs: Any = None) -> None:
        batch = self._batch()
        x, y = _data(self.model, batch, "train", self._x, self._y)
        report = estimate(self.model, x, target=y, mode="train", batch=batch, device=self.device)
        self.estimate = report
        peak, budget = report.peak_bytes, self.budget
        share = f"{format_bytes(peak)} of {format_bytes(budget)} ({100 * peak / budget:.0f}%)"
        if peak > budget:
            self.status = "exceeds"
            message = (f"a training step at batch size {batch} needs an estimated {format_bytes(peak)}, over the "
                       f"budget of {format_bytes(budget)} by {format_bytes(peak - budget)}; largest parts: "
                       f"{_top(report)}. Lower the batch size (nnmem fit finds the largest that fits)")
            if self.on_exceed == "stop":
                raise BudgetError(message)
            warnings.warn(message, ResourceWarning, stacklevel=2)
            self._log(message)
        elif peak > self.warn_at * budget:
            self.status = "warn"
            message = f"a training step at batch size {batch} is close to the budget: {share}"
            warnings.warn(message, ResourceWarning, stacklevel=2)
            self._log(message)
        else:
            self.status = "fits"
            self._log(f"a training step at batch size {batch} fits: estimated {share}")

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if self.device.strip().lower() != "cpu":  # the estimate is for another device than this run's CPU
            return
        if batch == 0 and self.estimate is not None and self.measured_peak is None:
            self._probe = _PeakProbe.start(self.model)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self._probe is None:
            return
        probe, self._probe = self._probe, None
        self.measured_peak, how = probe.stop()
        assert self.estimate is not None
        if self.measured_peak is None:
            self._log(f"estimated {format_bytes(self.estimate.peak_bytes)}; measured: {how}")
            return
        error = (self.estimate.peak_bytes - self.measured_peak) / self.measured_peak
        self._log(f"first batch: estimated {format_bytes(self.estimate.peak_bytes)}, measured "
                  f"{format_bytes(self.measured_peak)} ({how}), error {100 * error:+.1f}% "
                  "(the first batch also builds what later steps reuse)")


def _device_budget(device: str) -> int:
    """16 GiB on the CPU; on a catalog GPU, what this backend's allocator may use there."""
    if device.strip().lower() == "cpu":
        return parse_size("16GiB")
    from nnmem.frontends.keras.gpu import keras_gpu

    gpu = keras_gpu(device, str(keras.backend.backend()))
    if gpu is None or gpu.limit is None:
        raise ConfigError(f"expected budget= for device {device!r}: its memory is unknown (name a catalog GPU, "
                          "see `nnmem devices`)")
    return gpu.limit


class _PeakProbe:
    """Reads the peak of one batch where the backend exposes it."""

    def __init__(self, kind: str, state: Any = None) -> None:
        self.kind, self.state = kind, state

    @classmethod
    def start(cls, model: Any) -> _PeakProbe:
        backend = str(keras.backend.backend())
        if backend == "tensorflow":
            if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").lower() != "true":
                return cls("none", "TensorFlow's CPU allocator keeps no statistics unless "
                                   "TF_CPU_ALLOCATOR_USE_BFC=true is set before TensorFlow is imported")
            import tensorflow as tf

            tf.config.experimental.reset_memory_stats("CPU:0")
            return cls("tf")
        if backend == "torch":
            from torch.profiler import ProfilerActivity, profile

            from nnmem.frontends.keras.torch.measure import live_variable_bytes

            prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            resident = live_variable_bytes(model)
            prof.__enter__()
            return cls("torch", (prof, resident))
        return cls("none", f"the {backend} CPU client exposes no allocator peak")

    def stop(self) -> tuple[int | None, str]:
        if self.kind == "tf":
            import tensorflow as tf

            return int(tf.config.experimental.get_memory_info("CPU:0")["peak"]), "TensorFlow BFC allocator peak"
        if self.kind == "torch":
            from nnmem.frontends.pytorch.measure import allocator_rise

            prof, resident = self.state
            prof.__exit__(None, None, None)
            return resident + allocator_rise(prof), "torch profiler allocator events + live variables"
        return None, str(self.state)
