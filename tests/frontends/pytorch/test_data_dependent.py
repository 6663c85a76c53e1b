"""Data-dependent ops in a fake trace: ``.item()``, ``nonzero``, boolean masks, ``unique``, and fake kernels
whose meta kernel refuses what the CPU runs (``aten._grouped_mm`` in float32)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import nnmem  # noqa: E402
from nnmem.frontends.pytorch.step import prepare_step, run_step, trace_prepared  # noqa: E402
from nnmem.report.model import report_from_trace  # noqa: E402


class InputDriven(torch.nn.Module):
    """Sizes that follow the values of the inputs: a length read with ``.item()``, the tokens a mask keeps,
    ``nonzero`` positions and the distinct ids."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(1000, 64)
        self.proj = torch.nn.Linear(64, 256)

    def forward(self, ids: Any, mask: Any) -> Any:
        length = int(mask.sum(dim=1).max().item())  # the longest row
        h = self.embed(ids[:, :length])
        kept = h[mask[:, :length]]  # boolean-mask indexing: (kept tokens, 32)
        where = mask.nonzero()
        distinct = torch.unique(ids[mask])
        return self.proj(kept).sum() + where.sum() * 0 + self.embed(distinct).sum()


class WeightDriven(torch.nn.Module):
    """Sizes that follow values computed from the weights: only an upper bound is known without them."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(32, 64)
        self.out = torch.nn.Linear(64, 8)

    def forward(self, x: Any) -> Any:
        h = self.proj(x)
        scale = h.abs().max().item()  # a scalar from the weights
        picked = h[h > 0]  # positive activations: how many depends on the weights
        return self.out(h / (1.0 + abs(scale))).sum() + picked.sum()


def _inputs() -> tuple[Any, Any]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 1000, (4, 48), generator=gen)
    mask = torch.zeros(4, 48, dtype=torch.bool)
    for row, n in enumerate((10, 30, 17, 5)):
        mask[row, :n] = True
    return ids, mask


def real_tensor_peak(model: Any, inputs: tuple[Any, ...], mode: str, optimizer: str = "adamw") -> int:
    """The tensor-level peak of the real step, traced in this process as ``nnmem.measure`` does in its child
    (the step leaves gradients on ``model``: give it a model that is not used again)."""
    opt = prepare_step(model, mode, optimizer)
    for _ in range(2):
        run_step(model, inputs, mode=mode, opt=opt, loss_fn=None, target=None)
    trace = trace_prepared(model, inputs, mode=mode, opt=opt, loss_fn=None, target=None)
    return report_from_trace(trace, source="measure", model="m", device="cpu").peaks["tensor"]


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_input_driven_sizes_are_exact(mode: str) -> None:
    model, inputs = InputDriven(), _inputs()
    est = nnmem.estimate(model, inputs, mode=mode, optimizer="adamw")
    assert est.peaks["tensor"] == real_tensor_peak(InputDriven(), inputs, mode)
    assert not est.notes


def test_input_driven_matches_measurement_at_both_levels() -> None:
    model, inputs = InputDriven(), _inputs()
    est = nnmem.estimate(model, inputs, optimizer="adamw")
    meas = nnmem.measure(model, inputs, optimizer="adamw")
    assert abs(est.peaks["tensor"] - meas.peaks["tensor"]) <= 0.005 * meas.peaks["tensor"]
    assert abs(est.peaks["allocator"] - meas.peaks["allocator"]) <= 0.02 * meas.peaks["allocator"]


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_weight_driven_sizes_are_bounded_and_noted(mode: str) -> None:
    model, x = WeightDriven(), torch.randn(16, 32)
    est = nnmem.estimate(model, (x,), mode=mode, optimizer="adamw")
    real = real_tensor_peak(WeightDriven(), (x,), mode)
    assert real <= est.peaks["tensor"] <= 1.5 * real
    note = next(n for n in est.notes if "upper bound" in n)
    assert ("_local_scalar_dense" in note or "aten.item" in note) and "aten.index" in note


def test_input_values_are_not_changed() -> None:
    """Ops run on the real values of inputs and buffers must leave the user's tensors as they were."""

    class Counts(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.register_buffer("calls", torch.zeros((), dtype=torch.long))

        def forward(self, x: Any, n: Any) -> Any:
            self.calls += 1
            n.add_(1)
            return self.lin(x).repeat(int(n.item()), 1)

    model, x, n = Counts(), torch.randn(2, 4), torch.tensor(2)
    est = nnmem.estimate(model, (x, n), mode="infer")
    assert int(model.calls) == 0 and int(n) == 2
    assert est.peaks["tensor"] > 0


def test_grouped_mm_in_float32_traces() -> None:
    """The CPU kernel of ``_grouped_mm`` takes float32; its meta kernel alone wants bf16."""

    class Grouped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 16, 32))

        def forward(self, x: Any) -> Any:
            offs = torch.tensor([8, 16, 24, 32], dtype=torch.int32)
            return torch._grouped_mm(x, self.w, offs=offs)

    x = torch.randn(32, 16)
    for mode in ("train", "infer"):
        est = nnmem.estimate(Grouped(), (x,), mode=mode, optimizer="adamw")
        assert est.peaks["tensor"] == real_tensor_peak(Grouped(), (x,), mode)


class SkipsEveryOtherStep(torch.nn.Module):
    """A layer that runs on odd calls only, like LayerDrop skipping it at random: on a step that skips it, its
    parameters get no gradient, so the storages live before the next step depend on the step before."""

    def __init__(self, alternate: bool) -> None:
        super().__init__()
        self.first = torch.nn.Linear(64, 64)
        self.second = torch.nn.Linear(64, 64)
        self.alternate = alternate
        self.calls = 0

    def forward(self, x: Any) -> Any:
        self.calls += 1
        h = self.first(x)
        if not self.alternate or self.calls % 2 == 1:
            h = self.second(h)
        return h


def test_a_layer_skipped_the_step_before_does_not_move_the_measured_peak() -> None:
    """The measurement runs 2 warm-up steps, the tracked step, a priming step and the profiled step: with the layer
    skipped on the priming step (the 4th call) and run on the profiled one (the 5th), the profiled step is the one
    where it always runs, and so is its peak; counting the live storages before the priming step instead added
    the skipped layer's gradients twice (Wav2Vec2's LayerDrop: +34,176 B, one encoder layer's gradients)."""
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(0))
    always = nnmem.measure(SkipsEveryOtherStep(alternate=False), (x,), optimizer="sgd")
    skipped = nnmem.measure(SkipsEveryOtherStep(alternate=True), (x,), optimizer="sgd")
    assert skipped.peaks["allocator"] == always.peaks["allocator"]
