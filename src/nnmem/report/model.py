"""The Report: what an estimate or a measurement says about one step. Pure data, JSON-ready."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from nnmem.simulate import Simulation, category_series, layer_high_water, simulate
from nnmem.trace import Category, Level, Phase, Trace

__all__ = ["LayerRow", "TimelinePoint", "Report", "report_from_trace"]


@dataclass(frozen=True, slots=True)
class LayerRow:
    """Memory facts for one layer.

    Attributes:
        path: dotted path of the layer ("" for the model itself).
        kind: the layer's class name.
        parameters: parameter elements the layer owns directly.
        parameter_bytes: bytes of those parameters.
        output_bytes: bytes of the layer's forward outputs.
        saved_bytes: bytes the layer's forward leaves saved for backward (train only).
        peak_bytes: bytes attributed to the layer that are live at the peak.
        parameter_shapes: shape of each parameter the layer owns (weight, bias, ...).
        held: per category, the most bytes the layer holds at once during the step (its gradients once
            backward made them, its optimizer state, ...); categories it never holds are left out.
    """

    path: str
    kind: str
    parameters: int
    parameter_bytes: int
    output_bytes: int
    saved_bytes: int
    peak_bytes: int
    parameter_shapes: tuple[tuple[int, ...], ...] = ()
    held: dict[str, int] = field(default_factory=dict)

    @property
    def arithmetic(self) -> str:
        """The parameter count as a sum of shape products, e.g. ``"128·256 + 128 = 32,896"``."""
        if not self.parameter_shapes:
            return ""
        terms = ["·".join(str(d) for d in shape) or "1" for shape in self.parameter_shapes]
        return f"{' + '.join(terms)} = {self.parameters:,}"


@dataclass(frozen=True, slots=True)
class TimelinePoint:
    """Live bytes right after one op.

    Attributes:
        index: op index in the step.
        op: the framework's op name.
        phase: "forward", "backward" or "optimizer".
        layer: the layer the op ran for.
        tensor_bytes: live tensor storages, in bytes.
        allocator_bytes: the same plus the op's kernel workspace, in bytes.
    """

    index: int
    op: str
    phase: str
    layer: str
    tensor_bytes: int
    allocator_bytes: int


@dataclass(frozen=True, slots=True)
class Report:
    """Memory of one step, estimated or measured.

    Attributes:
        source: "estimate" or "measure".
        framework: e.g. "torch".
        model: the model's name (class name or CLI spec).
        mode: "train" or "infer".
        optimizer: optimizer name ("" for inference).
        device: the target device name.
        level: the level that ``peak_bytes`` reports (the one that decides an OOM on ``device``).
        peak_bytes: the peak at ``level``, in bytes.
        peaks: the peak at every level known, in bytes ("tensor", "allocator", ...).
        breakdown: bytes per category at the peak of ``level``; sums to ``peak_bytes``.
        layers: per-layer rows, in model order.
        timeline: live bytes after each op.
        batch: the batch size, when known.
        notes: caveats the reader must see (unsupported parts, fallbacks).
        peak_range: (lowest, highest) peak at ``level`` the step can reach where its op order varies between
            processes (TensorFlow's default executor), in bytes; None where the estimate has one order.
        timeline_categories: per category, the live bytes right after each op (the tensor level of
            ``timeline`` split by what the bytes are for; the same length as ``timeline``).

    Example:
        >>> report = nnmem.estimate(model, (x,), optimizer="adam")  # doctest: +SKIP
        >>> report.peak_bytes, report.breakdown["optimizer state"]  # doctest: +SKIP
    """

    source: str
    framework: str
    model: str
    mode: str
    optimizer: str
    device: str
    level: str
    peak_bytes: int
    peaks: dict[str, int]
    breakdown: dict[str, int]
    layers: tuple[LayerRow, ...] = ()
    timeline: tuple[TimelinePoint, ...] = ()
    batch: int | None = None
    notes: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)
    peak_range: tuple[int, int] | None = None
    timeline_categories: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def __repr__(self) -> str:
        batch = f", batch {self.batch}" if self.batch is not None else ""
        return (f"Report({self.source}: {self.model} ({self.framework}), {self.mode}{batch}, peak "
                f"{self.peak_bytes:,} B at the {self.level} level)")

    def _repr_html_(self) -> str | None:
        """The charts, in a notebook (None without Plotly: the plain repr)."""
        from nnmem.report.output import repr_html

        return repr_html(self)

    @property
    def parameter_count(self) -> int:
        """Parameter elements of the model."""
        return sum(row.parameters for row in self.layers)

    @property
    def parameter_bytes(self) -> int:
        """Bytes of the model's parameters (each counted once, where its owning layer holds it)."""
        return sum(row.parameter_bytes for row in self.layers)

    def to_dict(self, *, budget_bytes: int | None = None) -> dict[str, Any]:
        """A JSON-ready dict; ``Report.from_dict`` reads it back. It carries the model's ``parameters`` and
        ``parameter_bytes`` at the top level and, with ``budget_bytes``, whether ``peak_bytes`` fits it."""
        data = asdict(self)
        if self.peak_range is None:  # one op order: no range (reports without one read back the same)
            del data["peak_range"]
        data.update(parameters=self.parameter_count, parameter_bytes=self.parameter_bytes)
        if budget_bytes is not None:
            data.update(budget_bytes=budget_bytes, fits=self.peak_bytes <= budget_bytes)
        return data

    def to_json(self, *, indent: int | None = 2, budget_bytes: int | None = None) -> str:
        """The report as JSON text (see :meth:`to_dict`)."""
        return json.dumps(self.to_dict(budget_bytes=budget_bytes), indent=indent)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        """Rebuild a report from ``to_dict()`` output."""
        values = {k: v for k, v in data.items() if k not in _DERIVED}
        values["layers"] = tuple(
            LayerRow(**{**row, "parameter_shapes": tuple(tuple(s) for s in row.get("parameter_shapes", ()))})
            for row in values.get("layers", ())
        )
        values["timeline"] = tuple(TimelinePoint(**p) for p in values.get("timeline", ()))
        values["timeline_categories"] = {k: tuple(v) for k, v in values.get("timeline_categories", {}).items()}
        values["notes"] = tuple(values.get("notes", ()))
        if values.get("peak_range") is not None:
            values["peak_range"] = tuple(values["peak_range"])
        return cls(**values)


# Keys ``to_dict`` adds to the fields: derived from them, not read back.
_DERIVED = frozenset({"parameters", "parameter_bytes", "budget_bytes", "fits"})


def report_from_trace(
    trace: Trace,
    *,
    source: str,
    model: str,
    device: str,
    level: str = Level.ALLOCATOR.value,
    overrides: dict[str, int] | None = None,
    notes: tuple[str, ...] = (),
) -> Report:
    """Simulate a trace and package the result as a Report.

    Args:
        trace: the traced step.
        source: "estimate" or "measure".
        model: display name of the model.
        device: target device name.
        level: the level ``peak_bytes`` reports.
        overrides: measured peaks per level that replace simulated ones (a measurement's allocator
            peak comes from the profiler, not from the trace); the difference to the tensor-level
            breakdown is reported as kernel workspace.
        notes: caveats for the reader.
    """
    sim = simulate(trace)
    peaks = dict(sim.peaks)
    peaks.update(overrides or {})
    breakdown = _breakdown(sim, peaks, level, overridden=level in (overrides or {}))
    rows = _layer_rows(trace, sim, level if level in sim.layer_bytes else Level.TENSOR.value)
    timeline = tuple(
        TimelinePoint(op.index, op.name, op.phase.value, op.layer, t, a)
        for op, t, a in zip(trace.ops, sim.tensor_live, sim.allocator_live)
    )
    return Report(
        source=source,
        framework=trace.framework,
        model=model,
        mode=trace.mode,
        optimizer=str(trace.meta.get("optimizer", "")),
        device=device,
        level=level,
        peak_bytes=peaks[level],
        peaks=peaks,
        breakdown=breakdown,
        layers=rows,
        timeline=timeline,
        batch=trace.meta.get("batch") if isinstance(trace.meta.get("batch"), int) else None,  # type: ignore[arg-type]
        notes=notes,
        meta={k: v for k, v in trace.meta.items() if isinstance(v, (str, int, float, bool))},
        peak_range=_peak_range(trace, source, level),
        timeline_categories=category_series(trace),
    )


def _peak_range(trace: Trace, source: str, level: str) -> tuple[int, int] | None:
    """The estimate's range of the allocator peak over op orders (``peak_low`` / ``peak_high`` in the trace's
    meta, set by a frontend whose op order varies), or None."""
    low, high = trace.meta.get("peak_low"), trace.meta.get("peak_high")
    if source != "estimate" or level != Level.ALLOCATOR.value or not isinstance(low, int) or \
            not isinstance(high, int):
        return None
    return low, high


def _breakdown(sim: Simulation, peaks: dict[str, int], level: str, *, overridden: bool) -> dict[str, int]:
    """Bytes per category at the peak of ``level``, summing to ``peaks[level]``."""
    if not overridden and level in sim.breakdown:
        return dict(sim.breakdown[level])
    base = dict(sim.breakdown[Level.TENSOR.value])
    top = peaks[level]
    if level == Level.RESERVED.value:  # segments held beyond what was handed out: rounding and cache
        base[Category.ALLOCATOR_CACHE.value] = top - peaks[Level.ALLOCATOR.value]
        top = peaks[Level.ALLOCATOR.value]
    extra = top - sum(v for k, v in base.items() if k != Category.ALLOCATOR_CACHE.value)
    if extra:
        key = Category.WORKSPACE.value
        base[key] = base.get(key, 0) + extra
    return base


def _layer_rows(trace: Trace, sim: Simulation, level: str) -> tuple[LayerRow, ...]:
    saved: dict[str, int] = {}
    if trace.mode == "train":
        forward_end = max((op.index for op in trace.ops if op.phase is Phase.FORWARD), default=-1)
        for block in trace.blocks:
            alive_after_forward = block.free_op < 0 or block.free_op > forward_end
            if block.phase is Phase.FORWARD and alive_after_forward:
                saved[block.layer] = saved.get(block.layer, 0) + block.nbytes
    at_peak = sim.layer_bytes.get(level, {})
    held = layer_high_water(trace)
    return tuple(
        LayerRow(
            path=info.path,
            kind=info.kind,
            parameters=info.parameters,
            parameter_bytes=info.parameter_bytes,
            output_bytes=info.output_bytes,
            saved_bytes=saved.get(info.path, 0),
            peak_bytes=at_peak.get(info.path, 0),
            parameter_shapes=info.parameter_shapes,
            held=held.get(info.path, {}),
        )
        for info in trace.layers
    )
