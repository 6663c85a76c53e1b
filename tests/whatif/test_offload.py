"""``save-on-cpu``: saved tensors kept in host memory (``torch.autograd.graph.save_on_cpu``), a GPU what-if.

The estimate traces the step with hooks that keep nothing on the device; the same hooks run for real on the CPU,
with NumPy buffers as the host memory (PyTorch's allocator does not see them), are measured against it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn

import nnmem
from nnmem.cli import cli
from nnmem.errors import UnsupportedError
from nnmem.frontends.pytorch.offload import MODELLED_NOTE, host_offload, offloaded, traced_offload

FACTORY = textwrap.dedent("""
    import torch
    from torch import nn
    from nnmem.frontends.pytorch.offload import host_offload, wrap_forward

    def build(batch):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 10))
        return model, (torch.randn(batch, 256),), torch.randint(0, 10, (batch,)), nn.CrossEntropyLoss()

    def offloaded_to_numpy(batch):
        built = build(batch)
        wrap_forward(built[0], host_offload)
        return built
""")


@pytest.fixture
def factory(tmp_path: Path) -> str:
    path = tmp_path / "offload_model.py"
    path.write_text(FACTORY)
    return str(path)


@pytest.mark.parametrize("batch", [1024, 4099])
def test_traced_hooks_match_the_hooks_run_for_real(factory: str, batch: int) -> None:
    """What the GPU estimate traces (nothing kept on the device, a copy back in backward), against the same step
    run with the host copies in NumPy: equal at both levels, and below the step without the hooks."""
    namespace: dict[str, object] = {}
    exec(compile(FACTORY, factory, "exec"), namespace)  # noqa: S102 - the factory text above
    model, inputs, target, loss_fn = namespace["build"](batch)  # type: ignore[operator]
    plain = nnmem.estimate(model, inputs, target=target, loss_fn=loss_fn, optimizer="adam")
    with offloaded(model, traced_offload):
        estimated = nnmem.estimate(model, inputs, target=target, loss_fn=loss_fn, optimizer="adam")
    assert "forward" not in model.__dict__  # put back
    measured = nnmem.measure(f"{factory}:offloaded_to_numpy", batch=batch, optimizer="adam", timeout_s=300)
    assert estimated.peaks["tensor"] == measured.peaks["tensor"]
    assert abs(estimated.peaks["allocator"] - measured.peaks["allocator"]) <= 64, (estimated.peaks, measured.peaks)
    if batch > 4096:  # activations above Adam's state: the peak is in backward, where the saved tensors were
        assert estimated.peak_bytes < plain.peak_bytes


def test_host_hooks_keep_the_gradients_of_the_plain_step() -> None:
    """The NumPy stand-in gives back the tensors autograd saved: the same gradients as without hooks."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).to(torch.bfloat16)
    x = torch.randn(5, 8, dtype=torch.bfloat16)
    model(x).float().sum().backward()
    plain = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
    model.zero_grad()
    with offloaded(model, host_offload):
        model(x).float().sum().backward()
    assert all(torch.equal(a, p.grad) for a, p in zip(plain, model.parameters()))


def test_gpu_row_moves_saved_activations_off_the_device() -> None:
    result = nnmem.what_if("gpt", batch=32, device="A100-80GB", techniques=["save-on-cpu"])
    row = result.rows[0]
    assert result.level == "reserved"
    assert result.moved(row)["saved activations"] < 0
    assert result.saved(row) > 0
    assert MODELLED_NOTE in row.report.notes
    assert MODELLED_NOTE not in result.baseline.report.notes


def test_refused_on_a_cpu_and_in_inference() -> None:
    with pytest.raises(UnsupportedError, match="on a CPU device"):
        nnmem.what_if("mlp", batch=8, techniques=["save-on-cpu"])
    with pytest.raises(UnsupportedError, match="inference saves nothing"):
        nnmem.what_if("mlp", batch=8, mode="infer", device="A100-80GB", techniques=["save-on-cpu"])
    skipped = dict(nnmem.what_if("mlp", batch=8).skipped)  # every technique: this one left out, with the reason
    assert "on a CPU device" in skipped["save-on-cpu"]


def test_applied_for_real_trains_with_the_same_parameters() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    keys = list(model.state_dict())
    nnmem.apply_technique(model, "save-on-cpu")
    model(torch.randn(3, 8)).sum().backward()
    assert list(model.state_dict()) == keys
    assert all(p.grad is not None for p in model.parameters())


def test_cli_prints_the_gpu_row_and_refuses_the_cpu() -> None:
    runner = CliRunner()
    done = runner.invoke(cli, ["whatif", "mlp", "--device", "A100-80GB", "--technique", "save-on-cpu"])
    assert done.exit_code == 0, done.output
    assert "save-on-cpu" in done.output and "modelled, not measured" in done.output
    refused = runner.invoke(cli, ["whatif", "mlp", "--technique", "save-on-cpu"])
    assert refused.exit_code == 2
    assert "on a CPU device they are one memory" in refused.output
