"""Fake kernels that keep the layout the CPU kernel gives (workspace rules read the layout: a channels-last
convolution runs oneDNN's nhwc kernels, an nchw one blocked reorders). The reflection and replication paddings'
meta kernels return contiguous outputs where the CPU keeps a channels-last input's layout."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import nnmem

_CL = {4: torch.channels_last, 5: torch.channels_last_3d}


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular", "constant"])
@pytest.mark.parametrize("dims", [4, 5])
@pytest.mark.parametrize("inference", [True, False])
def test_padding_keeps_the_cpu_kernels_layout_under_fake_tensors(mode: str, dims: int, inference: bool) -> None:
    """Forward (``aten.pad`` whole under inference mode, the padding kernel otherwise) and, with autograd, the
    input's gradient: the fake output's strides equal the real one's."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from nnmem.frontends.pytorch.real_values import RealValues

    shape = (2, 3, 5, 6, 7)[:dims]
    pad = (1, 2) * (dims - 2)
    x = torch.randn(shape).to(memory_format=_CL[dims])

    def run(t: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
        with torch.inference_mode(inference):
            t = t.detach().requires_grad_(not inference)
            y = F.pad(t, pad, mode=mode)
            if inference:
                return y.stride(), None
            (grad,) = torch.autograd.grad(y, t, torch.ones_like(y))
            return y.stride(), grad.stride()

    real = run(x)
    with FakeTensorMode(allow_non_fake_inputs=True), RealValues():
        fake = run(torch.empty_strided(x.shape, x.stride()))
    assert fake == real


def test_a_reflect_padded_channels_last_3d_convolution_estimates_its_measurement() -> None:
    """The randomized suite's case 156 shape: channels-last 3-D grouped convolutions after a replicate padding,
    whose estimate was 26 % high when the fake padding returned an ncdhw tensor."""
    model = torch.nn.Sequential(torch.nn.Conv3d(8, 12, 3, stride=3, padding=1, padding_mode="replicate", groups=4),
                                torch.nn.ELU()).to(memory_format=torch.channels_last_3d)
    x = torch.randn(3, 8, 10, 10, 10).to(memory_format=torch.channels_last_3d)
    estimate = nnmem.estimate(model, (x,), mode="infer")
    if any("not modelled" in n for n in estimate.notes):
        pytest.skip(f"this CPU's kernel path is noted: {estimate.notes}")
    measured = nnmem.measure(model, (x,), mode="infer")
    assert estimate.peaks["allocator"] == measured.peaks["allocator"]
