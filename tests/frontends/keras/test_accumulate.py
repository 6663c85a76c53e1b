"""Keras gradient accumulation (the optimizer's ``gradient_accumulation_steps``), on whichever backend this process
runs: the estimate is the cycle's update step, the measurement the highest step of each cycle, and what-if and plan
offer it without changing the caller's model."""

from __future__ import annotations

import os

import pytest

if os.environ.get("KERAS_BACKEND") not in ("torch", "jax", "tensorflow"):
    pytest.skip("needs KERAS_BACKEND", allow_module_level=True)

import keras

import nnmem
from nnmem.frontends.keras.common import accumulation_steps, cycle_peaks
from nnmem.zoo.keras_models import FACTORIES

BACKEND = keras.backend.backend()


def test_a_cycle_is_as_high_as_its_highest_step() -> None:
    assert cycle_peaks([5, 9, 4, 8, 7, 6], 2) == [9, 8, 7]
    assert cycle_peaks([5, 9, 4, 8, 7], 2) == [9, 8]  # an unfinished cycle is left out
    assert cycle_peaks([5, 9, 4], 1) == [5, 9, 4]


@pytest.mark.accuracy
def test_the_estimate_holds_the_update_step_the_real_cycle_peaks_at() -> None:
    """keras_two_branch_cnn, 2 micro-batches of 4: the measured step is each cycle's highest (the update step,
    which sums the accumulators into new gradients before Adam's update); the accumulators add the trainable
    variables' bytes to the resident state."""
    plain = nnmem.estimate("keras_two_branch_cnn", batch=4, mode="train", optimizer="adam")
    report = nnmem.estimate("keras_two_branch_cnn", batch=4, mode="train", optimizer="adam", accumulate=2)
    assert report.meta["accumulate"] == 2
    trainable = int(report.meta["trainable_bytes"])  # type: ignore[call-overload]
    state = report.breakdown.get("optimizer state", 0) - plain.breakdown.get("optimizer state", 0)
    assert state >= trainable  # one accumulator per trainable variable, live through every step
    if BACKEND == "jax" and "Eigen" in str(report.meta.get("unmodelled", "")):  # no AVX-512: packing not sized
        pytest.skip(str(report.meta["unmodelled"]))
    measured = nnmem.measure("keras_two_branch_cnn", batch=4, mode="train", optimizer="adam", accumulate=2,
                             timeout_s=240)  # TensorFlow: one plain process (the bound checked is the low end)
    if BACKEND == "tensorflow":  # plain train_on_batch: no run below the bytes requested; the cycle's layouts
        # are not replayed, and the report says the high end may be passed
        low, _ = report.peak_range
        assert low <= measured.peak_bytes, (low, measured.peak_bytes)
        assert any("not modelled across an accumulation cycle" in n for n in report.notes)
    elif BACKEND == "torch":
        assert abs(report.peak_bytes - measured.peak_bytes) <= 64, (report.peak_bytes, measured.peak_bytes)
    else:  # the malloc truth of JAX (the zoo's accuracy target is 5 %)
        assert abs(report.peak_bytes - measured.peak_bytes) <= 0.05 * measured.peak_bytes


def test_what_if_splits_the_batch_and_leaves_the_callers_model_as_it_was() -> None:
    model, x, y, loss = FACTORIES["keras_mlp"](8)
    optimizer = keras.optimizers.Adam()
    model.compile(optimizer=optimizer, loss=loss)
    result = nnmem.what_if(model, x, target=y, techniques=["accumulate:2"])
    row = result.rows[0]
    assert row.report.batch == 4 and row.report.meta["accumulate"] == 2
    assert "gradient_accumulation_steps=2" in row.description
    assert model.optimizer is optimizer and accumulation_steps(model) == 1
    # an MLP's activations are small beside its weights: the accumulators cost more than the half batch saves
    assert row.report.peak_bytes > result.baseline.report.peak_bytes
    with pytest.raises(nnmem.UnsupportedError, match="does not divide by 3"):
        nnmem.what_if(model, x, target=y, techniques=["accumulate:3"])
    with pytest.raises(nnmem.UnsupportedError, match="inference has no gradients"):
        nnmem.what_if(model, x, mode="infer", techniques=["accumulate:2"])


@pytest.mark.accuracy
@pytest.mark.skipif(BACKEND != "torch", reason="exact on torch; JAX's steps take one of two peaks (its range), and "
                    "TensorFlow's plan holds its range's high end (benchmarks/whatif_keras.py measures both)")
def test_a_plan_under_the_baseline_splits_the_batch_and_its_real_run_fits() -> None:
    """keras_two_branch_cnn at batch 16 and 60 % of its peak: no rematerialization scope gets there, 2 micro-batches
    of 8 do; the chosen plan, run for real with the accumulating optimizer, fits and equals its trace."""
    plain = nnmem.estimate("keras_two_branch_cnn", mode="train", optimizer="adam", batch=16)
    budget = plain.peak_bytes * 60 // 100
    result = nnmem.plan("keras_two_branch_cnn", budget=budget, batch=16, optimizer="adam", verify=True)
    assert result.chosen.techniques == ("accumulate:2",)
    assert '"gradient_accumulation_steps": 2' in result.code() and "batch_size=8" in result.code()
    assert any("BatchNormalization statistics" in n for n in result.notes)
    assert result.measured is not None and result.measured.peak_bytes <= budget
    assert result.measured.peak_bytes == result.chosen.peak_bytes


def test_what_keras_cannot_take_is_one_line_and_exit_2() -> None:
    """The CLI's errors around accumulation on a Keras model: a K the batch does not divide, a PyTorch checkpoint
    plan; and the API refuses to build a model "under" accumulation, which is the training loop's."""
    from click.testing import CliRunner

    from nnmem.cli import cli

    for args, says in ((["whatif", "keras_mlp", "--batch", "8", "--technique", "accumulate:3"], "does not divide by 3"),
                       (["estimate", "keras_mlp", "--checkpoint", "blocks"], "keras.RematScope"),
                       (["estimate", "keras_mlp", "--mode", "infer", "--accumulate", "2"], "infer")):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, (args, result.output)
        assert len(result.stderr.splitlines()) == 1 and says in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.output
    model, *_ = FACTORIES["keras_mlp"](4)
    with pytest.raises(nnmem.UnsupportedError, match="changes the training loop, not the model"):
        nnmem.apply_technique(model, "accumulate:2")
