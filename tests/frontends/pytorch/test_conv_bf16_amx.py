"""bfloat16 forward convolutions on oneDNN's ``brg_conv_fwd`` / ``brgconv_1x1:avx512_core_amx``
(workspace/conv_bf16_amx.py and conv_bf16_amx_1x1.py, claimed by conv_select.py ``bf16_amx_forward``): the rule's
bytes against the profiler's measurement of the same op on seeded shapes (1-D, 2-D NCHW and channels-last, 1x1,
dilated, grouped, 3-D; 1 to 4 threads), and the note kept on the shapes the port does not follow."""

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


def _conv2d(rng: random.Random) -> tuple[nn.Module, torch.Tensor]:
    """A dense 2-D bfloat16 convolution (input channels 2-100, kernel 1-7, stride 1-3, padding 0-2, with or
    without bias, batch 1-8) and its NCHW input."""
    c, o = rng.randint(2, 100), rng.choice([8, 16, 24, 32, 48, 64, 65, 100])
    k, s, pad = rng.randint(1, 7), rng.randint(1, 3), rng.randint(0, 2)
    n, size = rng.randint(1, 8), max(k, rng.choice([5, 7, 8, 12, 14, 16, 20, 28, 32, 56]))
    conv = nn.Conv2d(c, o, k, s, pad, bias=rng.random() < 0.5).to(BF16)
    return conv, torch.randn(n, c, size, size, dtype=BF16)


def _conv1d(rng: random.Random) -> tuple[nn.Module, torch.Tensor]:
    """A dense 1-D one as the randomized suite draws them: length 24-160, channels 1-48, kernel 1, 3 or 5,
    stride 1-3, padding 0 or half the kernel, dilation 1-3 on some."""
    c, o, size = rng.randint(1, 48), rng.randint(1, 48), rng.randint(24, 160)
    k, s, d = rng.choice([1, 3, 3, 5]), rng.choice([1, 1, 2, 3]), rng.choice([1, 1, 1, 2, 3])
    conv = nn.Conv1d(c, o, k, s, rng.choice([0, k // 2]), d, bias=rng.random() < 0.8).to(BF16)
    return conv, torch.randn(rng.randint(1, 8), c, size, dtype=BF16)


def _conv1x1(rng: random.Random) -> tuple[nn.Module, torch.Tensor]:
    """An unpadded 1x1 one, 1-D or 2-D, stride 1-3."""
    if rng.random() < 0.5:
        c, o = rng.randint(1, 48), rng.randint(1, 48)
        conv: nn.Module = nn.Conv1d(c, o, 1, rng.choice([1, 1, 2, 3]), bias=rng.random() < 0.8).to(BF16)
        return conv, torch.randn(rng.randint(1, 8), c, rng.randint(24, 160), dtype=BF16)
    c, o, size = rng.randint(1, 100), rng.randint(1, 100), rng.randint(4, 28)
    conv = nn.Conv2d(c, o, 1, rng.choice([1, 1, 2, 3]), bias=rng.random() < 0.8).to(BF16)
    return conv, torch.randn(rng.randint(1, 8), c, size, size, dtype=BF16)


def _conv3d(rng: random.Random) -> tuple[nn.Module, torch.Tensor]:
    """A 3-D one as the randomized suite draws them (size 4-10, channels 1-12 per group, 1 or 2 groups, kernel 1,
    3 or 5, stride 1-3, dilation 1-3, padding 0 or half the kernel), NCDHW."""
    groups, size = rng.choice([1, 1, 2]), rng.randint(4, 10)
    c, o = groups * rng.randint(1, 12), groups * rng.randint(1, 12)
    k, s, d = rng.choice([1, 3, 3, 5]), rng.choice([1, 1, 2, 3]), rng.choice([1, 1, 1, 2, 3])
    while d * (k - 1) + 1 > size:
        k, d = max(1, k - 2), max(1, d - 1)
    conv = nn.Conv3d(c, o, k, s, rng.choice([0, k // 2]), d, groups, bias=rng.random() < 0.8).to(BF16)
    return conv, torch.randn(rng.randint(1, 8), c, *([size] * 3), dtype=BF16)


def _conv2d_suite(rng: random.Random) -> tuple[nn.Module, torch.Tensor]:
    """A dense 2-D one as the randomized suite draws them (size 8-28, channels 1-32, kernel 1, 3 or 5, dilation
    1-3), on channels-last activations (the module too, or the input alone) or NCHW."""
    c, o, size = rng.randint(1, 32), rng.randint(1, 32), rng.randint(8, 28)
    k, s, d = rng.choice([1, 3, 3, 5]), rng.choice([1, 1, 2, 3]), rng.choice([1, 1, 2, 3])
    while d * (k - 1) + 1 > size:
        k, d = max(1, k - 2), max(1, d - 1)
    conv: nn.Module = nn.Conv2d(c, o, k, s, rng.choice([0, k // 2]), d, bias=rng.random() < 0.8).to(BF16)
    x = torch.randn(rng.randint(1, 8), c, size, size, dtype=BF16)
    layout = rng.choice(["nchw", "module", "input"])
    if layout != "nchw":
        x = x.contiguous(memory_format=torch.channels_last)
    if layout == "module":
        conv = conv.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    return conv, x


def _grouped(rng: random.Random) -> tuple[nn.Module, torch.Tensor]:
    """A grouped one (2 or 4 groups, or a depthwise multiplier of 2), 1-D or 2-D as the suite draws them, NCHW
    or channels-last."""
    groups, dim = rng.choice([2, 4, 0]), rng.choice([1, 2])
    c = rng.randint(1, 12) * (groups or 1)
    if groups == 0:  # one input channel per group, two outputs
        groups, o = c, 2 * c
    else:
        o = groups * rng.randint(1, 32 // groups)
    k, s, d = rng.choice([1, 3, 3, 5]), rng.choice([1, 1, 2, 3]), rng.choice([1, 1, 2, 3])
    size = rng.randint(24, 160) if dim == 1 else rng.randint(8, 28)
    while d * (k - 1) + 1 > size:
        k, d = max(1, k - 2), max(1, d - 1)
    module = nn.Conv1d if dim == 1 else nn.Conv2d
    conv: nn.Module = module(c, o, k, s, rng.choice([0, k // 2]), d, groups, bias=rng.random() < 0.8).to(BF16)
    x = torch.randn(rng.randint(1, 8), c, *([size] * dim), dtype=BF16)
    if dim == 2 and rng.random() < 0.3:
        conv, x = conv.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    return conv, x


FAMILIES = {"2d": (_conv2d, 60, 20), "1d": (_conv1d, 60, 30), "1x1": (_conv1x1, 60, 30),
            "suite_2d": (_conv2d_suite, 80, 30), "grouped": (_grouped, 80, 20),
            "3d": (_conv3d, 60, 30)}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_amx_bf16_forward_scratch_matches_measurement(family: str, torch_threads: Callable[[int], None]) -> None:
    """Every seeded forward the rule claims: no note, and its bytes equal the allocator's peak inside the op
    minus its output, at 1 to 4 threads; every other keeps its note; most draws are claimed."""
    _require_amx()
    draw, count, least = FAMILIES[family]
    rng, claimed, failures = random.Random(11), 0, []
    for _ in range(count):
        torch_threads(rng.choice((1, 2, 3, 4)))
        conv, x = draw(rng)
        call = conv_call(x, conv.weight, conv.stride, conv.padding, conv.dilation,  # type: ignore[arg-type]
                         groups=conv.groups)  # type: ignore[arg-type]
        assert call is not None
        claims = bf16_amx_forward(call, HOST) is not None

        def step(conv: nn.Module = conv, x: torch.Tensor = x) -> None:
            with torch.inference_mode():
                conv(x)

        rows = [r for r in calibrate.measure_ops(step, training=False) if "conv" in r.name]
        assert len(rows) == 1, [r.name for r in rows]
        row, what = rows[0], f"{torch.get_num_threads()} threads {conv} {tuple(x.shape)} {call.x_layout}"
        if not claims:
            if row.note is None:
                failures.append(f"{what}: not claimed by the AMX rule, yet no note")
            continue
        claimed += 1
        if row.note is not None or row.predicted != row.scratch:
            failures.append(f"{what}: measured {row.scratch:,} B, rule {row.predicted:,} B, note {row.note!r}")
    assert not failures, "\n".join(failures)
    assert claimed >= least, f"only {claimed} of {count} draws claimed"
