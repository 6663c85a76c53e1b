"""bfloat16 forward convolutions on oneDNN's ``brg_conv_fwd:avx512_core_amx`` (workspace/conv_bf16_amx.py, claimed by
conv_select.py ``bf16_amx_forward``): the rule's bytes against the profiler's measurement of the same op on seeded
shapes, and the note kept on the shapes the port does not follow."""

from __future__ import annotations

import random
from collections.abc import Callable

import calibrate_workspace as calibrate
import pytest
import torch
from torch import nn

from nnmem import cpu
from nnmem.frontends.pytorch.workspace.conv_select import bf16_amx_forward, conv_call
from nnmem.frontends.pytorch.workspace.matmul import AMX_ISA

HOST = cpu.describe()
BF16 = torch.bfloat16


def _require_amx() -> None:
    if not torch.backends.mkldnn.is_available() or HOST.isa != AMX_ISA:
        pytest.skip(f"the AMX bfloat16 convolution rule is measured on ISA {AMX_ISA}; this CPU runs oneDNN at "
                    f"{HOST.isa}")


def _conv(rng: random.Random) -> tuple[nn.Conv2d, torch.Tensor]:
    """A dense 2-D bfloat16 convolution (input channels 2-100, kernel 1-7, stride 1-3, padding 0-2, with or
    without bias, batch 1-8) and its NCHW input."""
    c, o = rng.randint(2, 100), rng.choice([8, 16, 24, 32, 48, 64, 65, 100])
    k, s, pad = rng.randint(1, 7), rng.randint(1, 3), rng.randint(0, 2)
    n, size = rng.randint(1, 8), max(k, rng.choice([5, 7, 8, 12, 14, 16, 20, 28, 32, 56]))
    conv = nn.Conv2d(c, o, k, s, pad, bias=rng.random() < 0.5).to(BF16)
    return conv, torch.randn(n, c, size, size, dtype=BF16)


def test_amx_bf16_forward_scratch_matches_measurement(torch_threads: Callable[[int], None]) -> None:
    """Every seeded forward the rule claims: no note, and its bytes equal the allocator's peak inside the op
    minus its output, at 1 and 2 threads; every other keeps its note; most draws are claimed."""
    _require_amx()
    rng, claimed, failures = random.Random(11), 0, []
    for _ in range(60):
        torch_threads(rng.choice((1, 2)))
        conv, x = _conv(rng)
        call = conv_call(x, conv.weight, conv.stride, conv.padding, conv.dilation)
        assert call is not None
        claims = bf16_amx_forward(call, HOST) is not None

        def step(conv: nn.Module = conv, x: torch.Tensor = x) -> None:
            with torch.inference_mode():
                conv(x)

        rows = [r for r in calibrate.measure_ops(step, training=False) if "conv" in r.name]
        assert len(rows) == 1, [r.name for r in rows]
        row, what = rows[0], f"{torch.get_num_threads()} threads {conv} {tuple(x.shape)}"
        if not claims:
            if row.note is None:
                failures.append(f"{what}: not claimed by the AMX rule, yet no note")
            continue
        claimed += 1
        if row.note is not None or row.predicted != row.scratch:
            failures.append(f"{what}: measured {row.scratch:,} B, rule {row.predicted:,} B, note {row.note!r}")
    assert not failures, "\n".join(failures)
    assert claimed >= 20, f"only {claimed} of 60 draws claimed"
