"""`nnmem plan`: the cheapest combination of techniques within a budget, measured for real with verify."""

from __future__ import annotations

import json

from click.testing import CliRunner

import nnmem
from nnmem.cli import cli


def test_gpt_at_60_percent_of_its_peak_gets_a_plan_whose_real_run_fits() -> None:
    baseline = nnmem.estimate("gpt", batch=32).peak_bytes
    budget = int(0.6 * baseline)
    plan = nnmem.plan("gpt", budget=budget, batch=32, verify=True)
    assert plan.baseline.peak_bytes == baseline and not plan.baseline.fits
    assert plan.chosen is plan.front[0] and plan.chosen.fits and plan.chosen.peak_bytes <= budget
    assert plan.measured is not None and plan.measured.peak_bytes <= budget
    assert abs(plan.chosen.peak_bytes - plan.measured.peak_bytes) <= 0.02 * plan.measured.peak_bytes
    # the front: no fitting row is beaten on recomputed FLOPs, micro-batches and peak at once
    for row in plan.front:
        assert not any(o is not row and all(x <= y for x, y in zip(o.cost, row.cost)) and o.cost != row.cost
                       for o in plan.rows if o.fits)
    assert any(t.startswith("checkpoint:") for row in plan.front for t in row.techniques)
    assert plan.code().strip()


def test_without_micro_batches_the_plan_checkpoints_and_its_real_run_fits() -> None:
    budget = int(0.6 * nnmem.estimate("gpt", batch=32).peak_bytes)
    plan = nnmem.plan("gpt", budget=budget, batch=32, techniques="checkpoint,inplace,optimizer-in-backward",
                      verify=True)
    assert all(r.micro_batches == 1 for r in plan.rows)
    assert any(t.startswith("checkpoint:") for t in plan.chosen.techniques) and plan.chosen.extra_flops > 0
    assert plan.measured is not None and plan.measured.peak_bytes <= budget
    assert "apply_checkpointing" in plan.code()


def test_plan_json_and_a_budget_nothing_reaches() -> None:
    runner = CliRunner()
    # a few kinds keep the search short (every combination is searched in the 60 % test below)
    result = runner.invoke(cli, ["plan", "gpt", "--batch", "8", "--budget", "12MiB", "--techniques",
                                 "accumulate,inplace", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["chosen"]["fits"] and data["chosen"]["peak_bytes"] <= 12 * 2**20
    assert data["baseline"]["peak_bytes"] > 12 * 2**20
    result = runner.invoke(cli, ["plan", "gpt", "--batch", "8", "--budget", "1MiB", "--techniques", "inplace"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("nnmem: error: no plan fits 1.00 MiB; the smallest peak found is ")
    assert len(result.stderr.splitlines()) == 1
    result = runner.invoke(cli, ["plan", "gpt", "--budget", "1GiB", "--techniques", "fast"])
    assert result.exit_code == 2 and "expected techniques among checkpoint, inplace" in result.stderr


def test_plan_is_for_training() -> None:
    try:
        nnmem.plan("gpt", budget="1GiB", batch=8, mode="infer")
    except nnmem.UnsupportedError as err:
        assert "training" in str(err)
    else:
        raise AssertionError("expected UnsupportedError")


def test_whatif_gives_accumulation_and_in_backward_rows_a_largest_batch() -> None:
    w = nnmem.what_if("gpt", batch=8, techniques=["accumulate:2", "optimizer-in-backward"], budget="64MiB")
    accumulated, in_backward = w.rows
    assert accumulated.train_batch is not None and accumulated.train_batch % 2 == 0
    assert accumulated.train_batch > w.baseline.train_batch  # half the activations per micro-batch
    micro = accumulated.train_batch // 2
    assert nnmem.estimate("gpt", batch=micro, accumulate=2).peak_bytes <= 64 * 2**20
    assert nnmem.estimate("gpt", batch=micro + 1, accumulate=2).peak_bytes > 64 * 2**20
    assert in_backward.train_batch is not None and in_backward.train_batch >= w.baseline.train_batch
    assert accumulated.infer_batch == in_backward.infer_batch == w.baseline.infer_batch


def test_the_fused_optimizer_step_is_a_candidate_and_its_real_run_fits() -> None:
    """mlp with Adam peaks in the optimizer step: torch.optim's fused Adam alone takes it under 800,000 B."""
    plan = nnmem.plan("mlp", budget=800_000, batch=8, optimizer="adam", verify=True)
    assert not plan.baseline.fits
    assert "optimizer:fused" in plan.chosen.techniques and plan.chosen.micro_batches == 1
    assert plan.measured is not None and plan.measured.peak_bytes <= 800_000
    assert abs(plan.chosen.peak_bytes - plan.measured.peak_bytes) <= 64
    assert "fused=True" in plan.code()
