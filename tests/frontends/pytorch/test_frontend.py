"""PyTorch frontend: the seed's arithmetic, optimizer state, no real allocation, and estimate vs measure."""

from __future__ import annotations

import resource
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import nnmem  # noqa: E402


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))


PARAM_BYTES = 41_802 * 4


@pytest.mark.parametrize(("optimizer", "state_factor"), [("sgd", 0), ("momentum", 1), ("adam", 2), ("adamw", 2)])
def test_mlp_categories(optimizer: str, state_factor: int) -> None:
    x = torch.randn(32, 256)
    report = nnmem.estimate(_mlp(), (x,), optimizer=optimizer)
    measured = nnmem.measure(_mlp(), (x,), optimizer=optimizer)
    assert report.parameter_count == 41_802
    # the breakdown is taken at the peak: parameters and inputs are always live
    assert report.breakdown["parameters"] == PARAM_BYTES
    assert report.breakdown["inputs"] == x.numel() * 4
    # optimizer state: 0, 1x or 2x the parameters (+ Adam's per-parameter step counters, 4 B each)
    state = sum(b for c, b in report.breakdown.items() if c == "optimizer state")
    assert PARAM_BYTES * state_factor <= state <= PARAM_BYTES * state_factor + 6 * 4
    assert sum(report.breakdown.values()) == report.peak_bytes
    assert report.peaks["tensor"] == measured.peaks["tensor"]
    assert abs(report.peaks["allocator"] - measured.peaks["allocator"]) <= 0.01 * measured.peaks["allocator"]


def test_gradients_do_not_grow_with_batch_but_activations_do() -> None:
    sizes = {}
    for batch in (8, 512):
        x = torch.randn(batch, 256)
        est = nnmem.estimate(_mlp(), (x,), optimizer="sgd")
        meas = nnmem.measure(_mlp(), (x,), optimizer="sgd")
        assert est.peaks["tensor"] == meas.peaks["tensor"]
        sizes[batch] = est
    assert sizes[512].peak_bytes > sizes[8].peak_bytes
    assert sizes[8].breakdown.get("gradients", 0) <= PARAM_BYTES
    assert sizes[512].breakdown.get("gradients", 0) <= PARAM_BYTES
    saved = {b: sum(row.saved_bytes for row in r.layers) for b, r in sizes.items()}
    assert saved[512] == saved[8] * 64  # saved activations are per sample


def test_infer_has_no_gradients_or_optimizer_state() -> None:
    report = nnmem.estimate(_mlp(), (torch.randn(32, 256),), mode="infer")
    assert "gradients" not in report.breakdown and "optimizer state" not in report.breakdown
    measured = nnmem.measure(_mlp(), (torch.randn(32, 256),), mode="infer")
    assert report.peaks["tensor"] == measured.peaks["tensor"]


def test_user_model_is_left_intact() -> None:
    model = _mlp()
    before = [p.detach().clone() for p in model.parameters()]
    nnmem.estimate(model, (torch.randn(4, 256),), optimizer="adam")
    after = list(model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(after, before))
    assert all(p.grad is None for p in after)
    assert not any(isinstance(p, torch._subclasses.fake_tensor.FakeTensor) for p in after)


def test_estimate_never_allocates_model_sized_memory(tmp_path: Path) -> None:
    # 1.6e9 parameters: 6.4 GB of float32, far more than the memory this test may take
    (tmp_path / "big.py").write_text(textwrap.dedent("""
        import torch
        def factory(batch):
            model = torch.nn.Sequential(torch.nn.Linear(40000, 40000), torch.nn.ReLU(), torch.nn.Linear(40000, 10))
            return model, (torch.zeros(batch, 40000),)
    """))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    report = nnmem.estimate(f"{tmp_path / 'big.py'}:factory", batch=4, optimizer="adam")
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert report.breakdown["parameters"] >= 40000 * 40000 * 4
    assert report.peak_bytes > 4 * 40000 * 40000 * 4  # params + grads + 2 Adam moments
    assert grown_kib < 300 * 1024


def test_bad_inputs_raise_trace_error() -> None:
    with pytest.raises(nnmem.TraceError, match="rejected inputs"):
        nnmem.estimate(_mlp(), (torch.randn(4, 100),))


def test_unknown_optimizer_and_mode() -> None:
    with pytest.raises(nnmem.ConfigError, match="unknown optimizer"):
        nnmem.estimate(_mlp(), (torch.randn(4, 256),), optimizer="lbfgs2")
    with pytest.raises(nnmem.ConfigError, match="unknown mode"):
        nnmem.estimate(_mlp(), (torch.randn(4, 256),), mode="eval")
    with pytest.raises(nnmem.ConfigError, match="positive integer"):
        nnmem.estimate("mlp", batch=0)


def test_optimizer_class_is_accepted() -> None:
    x = torch.randn(16, 256)
    report = nnmem.estimate(_mlp(), (x,), optimizer=torch.optim.RMSprop)
    measured = nnmem.measure(_mlp(), (x,), optimizer=torch.optim.RMSprop)
    assert report.optimizer == "RMSprop"
    assert report.peaks["tensor"] == measured.peaks["tensor"]


def test_measure_child_crash_is_reported(tmp_path: Path) -> None:
    (tmp_path / "crash.py").write_text(textwrap.dedent("""
        import os, signal, torch
        class Boom(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(4, 4)
            def forward(self, x):
                os.kill(os.getpid(), signal.SIGKILL)
        def factory(batch):
            return Boom(), (torch.zeros(batch, 4),)
    """))
    with pytest.raises(nnmem.MeasureError, match="SIGKILL"):
        nnmem.measure(f"{tmp_path / 'crash.py'}:factory", batch=2)


def test_a_kernel_path_no_rule_models_on_this_cpu_is_named_in_the_report() -> None:
    from nnmem import cpu

    # a grouped transposed bfloat16 one: no rule sizes it, through oneDNN or (below avx512_core_bf16) ATen's
    # slow_transpose2d run group by group
    model = torch.nn.ConvTranspose2d(4, 8, 3, groups=2).to(torch.bfloat16)
    report = nnmem.estimate(model, (torch.zeros(2, 4, 16, 16, dtype=torch.bfloat16),), mode="infer")
    assert any("not modelled" in n and "bfloat16" in n for n in report.notes), report.notes
    assert report.meta["cpu.isa"] == cpu.describe().isa


@pytest.mark.accuracy
def test_a_channels_last_convolution_is_modelled_and_matches_its_measurement() -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(32, 64, 1))
    x = torch.randn(8, 3, 32, 32).to(memory_format=torch.channels_last)
    estimate = nnmem.estimate(model, (x,), mode="infer")
    measured = nnmem.measure(model, (x,), mode="infer")
    assert not any("not modelled" in n for n in estimate.notes)
    e, m = estimate.peaks["allocator"], measured.peaks["allocator"]
    assert abs(e - m) <= 0.02 * m, f"estimated {e:,} B, measured {m:,} B ({(e - m) / m:+.2%})"
