"""Batch size: the fitted curve, max_batch checked against real measurements, train vs infer."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import nnmem  # noqa: E402
from nnmem.report.text import render_explanation  # noqa: E402


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))


def _measured(model: nn.Module, batch: int, mode: str, optimizer: str) -> int:
    return nnmem.measure(model, (torch.randn(batch, 256),), mode=mode, optimizer=optimizer).peaks["allocator"]


@pytest.mark.parametrize("mode", ["train", "infer"])
@pytest.mark.parametrize("budget_mib", [2, 5, 11])
def test_max_batch_is_exact_against_measurement(mode: str, budget_mib: int) -> None:
    budget = budget_mib * 2**20
    fit = nnmem.max_batch(_mlp(), (torch.randn(8, 256),), budget=f"{budget_mib}MiB", mode=mode, optimizer="adam")
    assert fit.traces <= 3
    assert fit.batch > 0
    assert _measured(_mlp(), fit.batch, mode, "adam") <= budget < _measured(_mlp(), fit.batch + 1, mode, "adam")
    assert fit.peak_bytes <= budget < fit.next_peak_bytes
    assert fit.headroom_bytes == budget - fit.peak_bytes


def test_budget_below_the_parameters_fits_nothing() -> None:
    fit = nnmem.max_batch(_mlp(), (torch.randn(8, 256),), budget="100KiB", mode="infer")
    assert fit.batch == 0


def test_curve_matches_measurement_at_other_batches() -> None:
    curve = nnmem.batch_curve(_mlp(), (torch.randn(8, 256),), mode="train", optimizer="momentum")
    for batch in (1, 37, 300):
        assert curve.peak(batch) == _measured(_mlp(), batch, "train", "momentum")


def test_explain_training_versus_inference() -> None:
    exp = nnmem.explain(_mlp(), (torch.randn(8, 256),), budget="8MiB", optimizer="adam")
    # gradients have the size of the parameters, whatever the batch
    assert exp.gradient_bytes == 41_802 * 4
    assert "gradients" not in exp.train.per_sample_by_category
    # the training peak at large batches is in fc1's backward: fc3's and fc2's gradients exist, fc1's not yet
    assert exp.train.fixed_by_category["gradients"] == ((64 * 10 + 10) + (128 * 64 + 64)) * 4
    # what training keeps per sample beyond inference is saved activations
    assert exp.train.per_sample_by_category["saved activations"] > 0
    assert exp.train.fit is not None and exp.infer.fit is not None
    assert exp.infer.fit.batch > exp.train.fit.batch
    assert exp.batch_ratio == exp.infer.fit.batch / exp.train.fit.batch
    # saved per sample per layer, from two traces: ReLU outputs (128 and 64 floats) and the logits
    assert dict(exp.saved_per_sample) == {"1": 512, "3": 256, "4": 40}


def test_explain_figures_add_up_to_the_peak_at_the_answer() -> None:
    """Fixed bytes plus the batch times the bytes per sample is the peak at the largest batch, each split into
    categories that sum to it; the peak there is measured."""
    exp = nnmem.explain(_mlp(), (torch.randn(8, 256),), budget="8MiB", optimizer="adam")
    for figures, mode in ((exp.train, "train"), (exp.infer, "infer")):
        fit = figures.fit
        assert fit is not None and figures.at_batch == fit.batch
        assert sum(figures.fixed_by_category.values()) == figures.fixed_bytes
        assert sum(figures.per_sample_by_category.values()) == figures.per_sample_bytes
        told = figures.fixed_bytes + fit.batch * figures.per_sample_bytes
        measured = _measured(_mlp(), fit.batch, mode, "adam")
        assert abs(told - measured) <= fit.batch / 2, (mode, told, measured)


def test_bad_budget() -> None:
    with pytest.raises(nnmem.ConfigError, match="memory size"):
        nnmem.max_batch(_mlp(), (torch.randn(8, 256),), budget="16 gigs")
    with pytest.raises(nnmem.ConfigError, match="budget"):
        nnmem.max_batch(_mlp(), (torch.randn(8, 256),))


def test_explain_says_which_gradients_are_live_at_the_peak() -> None:
    exp = nnmem.explain(_mlp(), (torch.randn(8, 256),), budget="8MiB", optimizer="adam")
    assert exp.train.peak_phase == "backward"
    text = render_explanation(exp, model="mlp")
    live = exp.train.fixed_by_category["gradients"]
    assert f"{live / exp.gradient_bytes:.0%}) are live" in text


def test_large_budget_is_searched_without_a_cap() -> None:
    """16 GiB holds millions of this MLP's samples: the answer comes from the curve, verified by a trace."""
    fit = nnmem.max_batch(_mlp(), (torch.randn(8, 256),), budget="16GiB", mode="infer")
    assert fit.batch > 1 << 20 and not fit.at_limit and fit.traces == 3
    assert fit.peak_bytes <= 16 * 2**30 < fit.next_peak_bytes
