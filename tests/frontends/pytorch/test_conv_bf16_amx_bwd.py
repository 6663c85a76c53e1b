"""bfloat16 ``convolution_backward`` on oneDNN's AMX kernels (workspace/conv_bf16_amx_bwd.py, claimed by
``amx_backward_claims``): the rule's bytes against the profiler's measurement of the same op on seeded dense 1-D
and 2-D NCHW shapes at 1 to 4 threads, with and without the input's gradient, and the note kept on the shapes
the port does not follow."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import calibrate_workspace as calibrate
import pytest
import torch
from torch import nn

from nnmem import cpu
from nnmem.frontends.pytorch.workspace.conv_bf16_amx_bwd import amx_backward_claims
from nnmem.frontends.pytorch.workspace.conv_select import conv_call
from nnmem.frontends.pytorch.workspace.matmul import AMX_ISA

HOST = cpu.describe()
BF16 = torch.bfloat16


def _require_amx() -> None:
    if not torch.backends.mkldnn.is_available() or HOST.isa != AMX_ISA:
        pytest.skip(f"the AMX bfloat16 convolution backward rule is measured on ISA {AMX_ISA}; this CPU runs "
                    f"oneDNN at {HOST.isa}")


def _draw(rng: random.Random) -> tuple[nn.Module, torch.Tensor]:
    """A dense 1-D or 2-D bfloat16 convolution (channels 1-64, kernel 1-5, stride 1-3, padding 0-2, with or
    without bias, batch 1-8) and its NCHW input, whose gradient is asked for on most draws."""
    dim = rng.choice([1, 2, 2])
    c, o = rng.randint(1, 64), rng.randint(1, 64)
    k, s, p = rng.randint(1, 5), rng.randint(1, 3), rng.randint(0, 2)
    n, size = rng.randint(1, 8), rng.randint(max(k, 4), 40 if dim == 1 else 20)
    module = nn.Conv1d if dim == 1 else nn.Conv2d
    conv = module(c, o, k, s, p, bias=rng.random() < 0.5).to(BF16)
    x = torch.randn(n, c, *([size] * dim), dtype=BF16, requires_grad=rng.random() < 0.6)
    return conv, x


@pytest.mark.parametrize(("seed", "dense_grad"), [(3, False), (11, True)])
def test_amx_bf16_backward_scratch_matches_measurement(seed: int, dense_grad: bool,
                                                       torch_threads: Callable[[int], None]) -> None:
    """Every seeded backward the rule claims: no note, and its bytes equal the allocator's peak inside the op
    minus its outputs, at 1 to 4 threads, on an expanded grad_output (``sum().backward()``, copied contiguous by
    ATen) or a dense one; every other keeps its note; enough draws are claimed."""
    _require_amx()
    rng, claimed, failures = random.Random(seed), 0, []
    for _ in range(60):
        torch_threads(rng.choice((1, 2, 3, 4)))
        conv, x = _draw(rng)
        call = conv_call(x, conv.weight, conv.stride, conv.padding, conv.dilation)  # type: ignore[arg-type]
        assert call is not None
        claims = amx_backward_claims(dataclasses.replace(call, backward=True, grad_input=x.requires_grad), HOST)

        def step(conv: nn.Module = conv, x: torch.Tensor = x) -> None:
            y = conv(x)
            if dense_grad:
                y.backward(torch.ones_like(y))
            else:
                y.sum().backward()

        rows = [r for r in calibrate.measure_ops(step, training=True) if "convolution_backward" in r.name]
        assert len(rows) == 1, [r.name for r in rows]
        row = rows[0]
        what = f"{torch.get_num_threads()} threads {conv} {tuple(x.shape)} input gradient {x.requires_grad}"
        if not claims:
            if row.note is None:
                failures.append(f"{what}: not claimed by the AMX rule, yet no note")
            continue
        claimed += 1
        if row.note is not None or row.predicted != row.scratch:
            failures.append(f"{what}: measured {row.scratch:,} B, rule {row.predicted:,} B, note {row.note!r}")
    assert not failures, "\n".join(failures)
    assert claimed >= 25, f"only {claimed} of 60 draws claimed"
