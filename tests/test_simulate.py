"""Simulation invariants on hand-made traces (no framework)."""

from __future__ import annotations

from nnmem.report.model import Report, report_from_trace
from nnmem.simulate import category_series, layer_high_water, simulate
from nnmem.trace import Block, Category, LayerInfo, Op, Phase, Trace


def _trace() -> Trace:
    # resident: params 100 B, input 10 B. op0 allocates a (50 B, saved), op1 allocates b (30 B, freed after op1)
    # with 7 B of kernel workspace, op2 allocates grad 100 B and frees a.
    blocks = (
        Block(0, 100, Category.PARAMETERS, "fc", Phase.SETUP, -1, -1),
        Block(1, 10, Category.INPUTS, "", Phase.SETUP, -1, -1),
        Block(2, 50, Category.SAVED_ACTIVATIONS, "fc", Phase.FORWARD, 0, 2),
        Block(3, 30, Category.ACTIVATIONS, "act", Phase.FORWARD, 1, 1),
        Block(4, 100, Category.GRADIENTS, "fc", Phase.BACKWARD, 2, -1),
    )
    ops = (
        Op(0, "a", Phase.FORWARD, "fc", 50, 0),
        Op(1, "b", Phase.FORWARD, "act", 30, 30, workspace=7),
        Op(2, "c", Phase.BACKWARD, "fc", 100, 50),
    )
    layers = (LayerInfo("fc", "Linear", 25, 100, 50, ((5, 4), (5,))), LayerInfo("act", "ReLU", 0, 0, 30))
    return Trace("test", "train", blocks, ops, layers, {"optimizer": "sgd", "batch": 2})


def test_timeline_and_peaks() -> None:
    sim = simulate(_trace())
    assert sim.tensor_live == (160, 190, 260)
    assert sim.allocator_live == (160, 197, 260)
    assert sim.peaks == {"tensor": 260, "allocator": 260}
    assert sim.peak_ops == {"tensor": 2, "allocator": 2}


def test_breakdown_sums_to_peak_at_every_level() -> None:
    sim = simulate(_trace())
    for level, peak in sim.peaks.items():
        assert sum(sim.breakdown[level].values()) == peak
    # at op 2, the saved activation is freed after the op, so it still counts
    assert sim.breakdown["tensor"] == {"parameters": 100, "gradients": 100, "inputs": 10, "saved activations": 50}


def test_workspace_decides_allocator_peak() -> None:
    trace = _trace()
    ops = (*trace.ops[:1], Op(1, "b", Phase.FORWARD, "act", 30, 30, workspace=500), trace.ops[2])
    sim = simulate(Trace(trace.framework, trace.mode, trace.blocks, ops, trace.layers))
    assert sim.peaks["allocator"] == 190 + 500
    assert sim.peak_ops["allocator"] == 1
    assert sim.breakdown["allocator"]["kernel workspace"] == 500
    assert sum(sim.breakdown["allocator"].values()) == 690
    assert sim.peaks["tensor"] == 260


def test_empty_step_peaks_at_resident() -> None:
    trace = _trace()
    sim = simulate(Trace("test", "infer", trace.blocks[:2], (), ()))
    assert sim.peaks == {"tensor": 110, "allocator": 110}
    assert sim.peak_ops["tensor"] == -1


def test_report_round_trip_and_layers() -> None:
    report = report_from_trace(_trace(), source="estimate", model="toy", device="cpu")
    assert report.peak_bytes == 260 and report.level == "allocator"
    assert sum(report.breakdown.values()) == report.peak_bytes
    fc = report.layers[0]
    assert fc.saved_bytes == 50 and fc.peak_bytes == 250 and fc.arithmetic == "5·4 + 5 = 25"
    again = Report.from_dict(report.to_dict())
    assert again == report
    assert report.parameter_count == 25


def test_measured_override_puts_difference_in_workspace() -> None:
    report = report_from_trace(_trace(), source="measure", model="toy", device="cpu", overrides={"allocator": 300})
    assert report.peak_bytes == 300
    assert report.breakdown["kernel workspace"] == 40
    assert sum(report.breakdown.values()) == 300


def test_category_series_split_the_tensor_level() -> None:
    trace = _trace()
    series = category_series(trace)
    assert series == {"parameters": (100, 100, 100), "gradients": (0, 0, 100), "inputs": (10, 10, 10),
                      "saved activations": (50, 50, 50), "activations": (0, 30, 0)}
    assert tuple(map(sum, zip(*series.values()))) == simulate(trace).tensor_live


def test_layer_high_water_is_the_most_held_at_once() -> None:
    trace = _trace()
    # two activation blocks of "act" that overlap at op 1 only, and one freed before the next is made
    blocks = (*trace.blocks, Block(5, 40, Category.ACTIVATIONS, "act", Phase.FORWARD, 0, 1),
              Block(6, 25, Category.ACTIVATIONS, "act", Phase.BACKWARD, 2, 2))
    high = layer_high_water(Trace(trace.framework, trace.mode, blocks, trace.ops, trace.layers))
    assert high["act"] == {"activations": 70}
    assert high["fc"] == {"parameters": 100, "saved activations": 50, "gradients": 100}
    assert high[""] == {"inputs": 10}


def test_traced_model_categories_add_up_to_its_timeline() -> None:
    import nnmem

    report = nnmem.estimate("mlp", batch=8, optimizer="adam")
    columns = zip(*report.timeline_categories.values())
    assert [sum(c) for c in columns] == [p.tensor_bytes for p in report.timeline]
    fc1 = next(row for row in report.layers if row.path == "fc1")
    assert fc1.held["parameters"] == fc1.parameter_bytes
    assert fc1.held["gradients"] == fc1.parameter_bytes
