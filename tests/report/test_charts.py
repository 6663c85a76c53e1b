"""The charts' data, their HTML and PNG renderings, the command line's --html/--png, and notebook display.

The figures drawn are the results' own (a traced step, a search, a what-if); these tests check that each chart
carries them faithfully: a timeline's stacks add up to the step's live bytes op by op, a per-layer bar is the
layer's row, a batch line passes through the traced largest batch, a what-if bar is that row's peak.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import nnmem
from nnmem.cli import cli
from nnmem.report.charts import (
    MAX_TIMELINE_POINTS,
    batch_chart,
    charts_for,
    layer_chart,
    timeline_chart,
    unit_for,
    whatif_chart,
)
from nnmem.report.model import TimelinePoint

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def mlp() -> nnmem.Report:
    return nnmem.estimate("mlp", batch=32, optimizer="adam")


@pytest.fixture(scope="module")
def gpt() -> nnmem.Report:
    return nnmem.estimate("gpt", batch=8, optimizer="adam")


def test_timeline_stacks_add_up_to_the_live_bytes_of_each_op(gpt: nnmem.Report) -> None:
    chart = timeline_chart(gpt)
    assert chart is not None and chart.x == tuple(p.index for p in gpt.timeline)
    totals = [sum(values[i] for _, values in chart.stacks) for i in range(len(chart.x))]
    assert totals == [p.allocator_bytes for p in gpt.timeline]
    index, peak, label = chart.peak
    assert peak == gpt.peaks["allocator"] == max(totals)
    assert gpt.timeline[index].op in label
    assert [phase for phase, _, _ in chart.phases] == ["forward", "backward", "optimizer"]
    assert chart.phases[0][1] == 0 and chart.phases[-1][2] == gpt.timeline[-1].index


def test_long_timeline_is_thinned_but_keeps_its_peak(mlp: nnmem.Report) -> None:
    n = 3 * MAX_TIMELINE_POINTS + 7
    points = tuple(TimelinePoint(i, "op", "forward", "", 1000 + (i % 97), 1000 + (i % 97)) for i in range(n))
    series = {"activations": tuple(p.tensor_bytes for p in points)}
    peak_at = 4321
    points = points[:peak_at] + (TimelinePoint(peak_at, "big", "forward", "fc", 9999, 9999),) + points[peak_at + 1:]
    series = {"activations": tuple(p.tensor_bytes for p in points)}
    chart = timeline_chart(dataclasses.replace(mlp, timeline=points, timeline_categories=series))
    assert chart is not None and len(chart.x) <= MAX_TIMELINE_POINTS + 1
    assert peak_at in chart.x and chart.peak[:2] == (peak_at, 9999) and "of" in chart.note


def test_layer_bars_are_the_layers_rows(mlp: nnmem.Report) -> None:
    chart = layer_chart(mlp)
    assert chart is not None
    bars = dict(zip(chart.labels, zip(*(values for _, values, _ in chart.series))))
    names = [name for name, _, _ in chart.series]
    fc1 = next(r for r in mlp.layers if r.path == "fc1")
    assert dict(zip(names, bars["fc1 Linear"])) == {
        "parameters": fc1.parameter_bytes, "gradients": fc1.parameter_bytes,
        "optimizer state": fc1.held["optimizer state"], "saved activations": fc1.saved_bytes}
    # Adam: two moments of each parameter, and a float32 step count per parameter (weight and bias)
    assert fc1.held["optimizer state"] == 2 * fc1.parameter_bytes + 2 * 4


def test_layer_bars_of_a_deep_model_fit_one_chart(gpt: nnmem.Report) -> None:
    chart = layer_chart(gpt, most=8)
    assert chart is not None and len(chart.labels) == 8 and chart.labels[-1].endswith("other layers")
    totals = [sum(values[i] for _, values, _ in chart.series) for i in range(8)]
    assert totals[:-1] == sorted(totals[:-1], reverse=True)


def test_batch_line_passes_through_the_traced_largest_batch() -> None:
    fits = nnmem.fit("mlp", budget="64MiB", optimizer="adam")
    chart = batch_chart(fits)
    assert chart.budget == 64 << 20
    for (mode, fit), (name, xs, ys, _), (_, batch, peak, _) in zip(fits.results, chart.lines, chart.points):
        assert name == mode and (batch, peak) == (fit.batch, fit.peak_bytes)
        line = dict(zip(xs, ys))
        assert line[fit.batch] <= chart.budget < line[fit.batch + 1]


def test_whatif_bars_are_each_rows_peak() -> None:
    result = nnmem.what_if("gpt", batch=4, optimizer="adam", techniques=["checkpoint:blocks", "accumulate:2"])
    chart = whatif_chart(result)
    rows = (result.baseline, *result.rows)
    assert chart.labels == tuple(r.technique for r in rows)
    totals = [sum(values[i] for _, values, _ in chart.series) for i in range(len(rows))]
    assert totals == [r.peak_bytes for r in rows]
    assert chart.text[1].startswith("saves")


def test_unit_keeps_four_digits() -> None:
    assert unit_for(512) == ("B", 1) and unit_for(2048) == ("KiB", 1024) and unit_for(3 << 30)[0] == "GiB"


def test_html_is_self_contained(gpt: nnmem.Report) -> None:
    pytest.importorskip("plotly")
    from nnmem.report.html import to_html

    page = to_html(gpt)
    assert page.startswith("<!DOCTYPE html>") and page.count('class="plotly-graph-div"') == 3
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=[\"']?(https?:)?//", page)
    assert "plotly.js v" in page  # the library itself, inlined
    assert len(page) > 1_000_000


def test_png_charts(tmp_path: Path, gpt: nnmem.Report) -> None:
    pytest.importorskip("matplotlib")
    paths = nnmem.write_png(gpt, tmp_path / "charts")
    assert [p.name for p in paths] == ["timeline.png", "breakdown.png", "layers.png"]
    for path in paths:
        assert path.read_bytes()[:8] == _PNG_MAGIC and path.stat().st_size > 10_000


def test_cli_writes_charts_beside_the_json(tmp_path: Path) -> None:
    pytest.importorskip("plotly")
    pytest.importorskip("matplotlib")
    html, png = tmp_path / "r.html", tmp_path / "png"
    result = CliRunner().invoke(cli, ["estimate", "mlp", "--json", "--html", str(html), "--png", str(png)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["model"] == "mlp"  # stdout stays JSON; "wrote ..." goes to stderr
    assert "wrote" in result.stderr and html.stat().st_size > 1_000_000
    assert sorted(p.name for p in png.iterdir()) == ["breakdown.png", "layers.png", "timeline.png"]


@pytest.mark.parametrize(("args", "message"), [
    (["estimate", "mlp", "--html", "/no/such/folder/r.html"], "no folder"),
    (["fit", "mlp", "--budget", "1GiB", "--effective-batch", "64", "--html", "r.html"], "--effective-batch"),
])
def test_cli_chart_mistakes_are_one_line(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_missing_chart_library_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "plotly", None)  # import plotly now raises ImportError
    result = CliRunner().invoke(cli, ["estimate", "mlp", "--html", str(tmp_path / "r.html")])
    assert result.exit_code == 2 and "pip install 'nnmem[report]'" in result.stderr
    assert nnmem.estimate("mlp", batch=4)._repr_html_() is None  # a notebook falls back to the plain repr


def test_notebook_display(mlp: nnmem.Report) -> None:
    pytest.importorskip("plotly")
    text = repr(mlp)
    assert text.startswith("Report(estimate: mlp (torch), train, batch 32") and len(text) < 160
    fragment = mlp._repr_html_()
    assert fragment is not None and fragment.count('class="plotly-graph-div"') == 3
    assert "<html" not in fragment


def test_every_result_has_charts(mlp: nnmem.Report) -> None:
    measured = dataclasses.replace(mlp, source="measure")
    assert [c.name for c in charts_for(nnmem.compare(mlp, measured)).charts] == ["compare", "timeline", "layers"]
    explanation = nnmem.explain("mlp", budget="64MiB")
    assert [c.name for c in charts_for(explanation).charts] == ["explain", "batch"]
    assert "per sample" in repr(explanation)
    with pytest.raises(TypeError, match="no charts"):
        charts_for(object())


def test_timeline_marks_a_reported_peak_its_stacks_do_not_reach() -> None:
    report = nnmem.estimate("mlp", batch=32, device="A100-80GB")  # the caching allocator's reserved level
    chart = timeline_chart(report)
    assert chart is not None and chart.reported is not None
    assert chart.reported[0] == report.peak_bytes > chart.peak[1]
    assert "reserved level" in chart.reported[1]
    assert timeline_chart(nnmem.estimate("mlp", batch=32)).reported is None  # type: ignore[union-attr]


def test_whatif_captions_leave_out_flops_where_none_were_counted() -> None:
    result = nnmem.what_if("gpt", batch=2, optimizer="adam", techniques=["accumulate:2"])
    uncounted = dataclasses.replace(result, baseline=dataclasses.replace(result.baseline, flops=0),
                                    rows=tuple(dataclasses.replace(r, flops=0) for r in result.rows))
    assert "FLOPs" in whatif_chart(result).text[1] and "FLOPs" not in whatif_chart(uncounted).text[1]
