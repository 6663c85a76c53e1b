"""The per-layer table shaped for a terminal: folding by module depth, the largest first, 80 columns."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import nnmem
from nnmem.cli import cli
from nnmem.report.layers import DEFAULT_MAX_ROWS, default_depth, depth_of, fold, largest
from nnmem.report.model import LayerRow
from nnmem.report.text import render_report
from nnmem.units import format_bytes

_SUMMED = ("parameters", "parameter_bytes", "output_bytes", "saved_bytes", "peak_bytes")


def _totals(rows: tuple[LayerRow, ...] | list[LayerRow]) -> tuple[int, ...]:
    return tuple(sum(getattr(r, attr) for r in rows) for attr in _SUMMED)


def test_folding_keeps_every_byte_and_the_model_order() -> None:
    rows = nnmem.estimate("gpt", batch=2).layers
    assert max(depth_of(r.path) for r in rows) == 4
    for depth in (1, 2, 3, 4):
        folded = fold(rows, depth)
        assert _totals(folded) == _totals(rows)
        assert all(depth_of(r.path) <= depth for r in folded)
    assert [r.path for r in fold(rows, 2)] == ["tok", "pos", "drop", "blocks.0", "blocks.1", "ln_f", "head"]
    block = fold(rows, 2)[3]
    assert block.kind == "9 layers" and block.parameters == sum(r.parameters for r in rows
                                                                 if r.path.startswith("blocks.0."))
    assert fold(rows, 4) == tuple(rows)


def test_default_depth_is_the_deepest_that_stays_short() -> None:
    rows = nnmem.estimate("gpt", batch=2).layers
    assert default_depth(rows) == 4  # 23 layers fit
    assert default_depth(rows, max_rows=10) == 2 and len(fold(rows, 2)) <= 10 < len(fold(rows, 3))


def test_largest_first_and_the_rest_in_one_row() -> None:
    rows = nnmem.estimate("gpt", batch=2).layers
    top = largest(rows, 3)
    assert len(top) == 4 and top[-1].path == f"({len(rows) - 3} more layers)"
    assert [r.peak_bytes for r in top[:3]] == sorted((r.peak_bytes for r in rows), reverse=True)[:3]
    assert _totals(top) == _totals(rows)


def test_a_12_layer_bert_fits_one_screen_at_80_columns() -> None:
    transformers = pytest.importorskip("transformers")
    import torch

    config = transformers.BertConfig()  # bert-base: 12 layers, hidden 768, random weights
    model = transformers.BertForSequenceClassification(config)
    report = nnmem.estimate(model, (torch.randint(0, config.vocab_size, (2, 128)),), mode="infer")
    text = render_report(report, width=80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    for block in range(12):  # every block on one line, named in full, with its unwrapped figures
        row = next(r for r in fold(report.layers, 4) if r.path == f"bert.encoder.layer.{block}")
        line = next(x for x in lines if x.split() and x.split()[0] == row.path)
        assert f"{row.parameters:,}" in line and line.rstrip().endswith(format_bytes(row.peak_bytes))
    table = lines[lines.index(next(x for x in lines if x.lstrip().startswith("layer"))):]
    assert len(table[:table.index("")]) <= DEFAULT_MAX_ROWS + 2
    assert "…" not in "".join(x for x in lines if "encoder.layer" in x)


def test_cli_depth_and_top() -> None:
    result = CliRunner().invoke(cli, ["estimate", "gpt", "--batch", "2", "--depth", "2", "--top", "3"])
    assert result.exit_code == 0, result.output
    assert "blocks.0" in result.output and "(4 more layers)" in result.output
    assert "folded to depth 2 of 4" in result.output
    bad = CliRunner().invoke(cli, ["estimate", "gpt", "--depth", "0"])
    assert bad.exit_code == 2 and "--depth" in bad.output
