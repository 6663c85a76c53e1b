"""Float32 transposed convolutions (workspace/conv_transpose.py): oneDNN's deconvolution at unit stride (blocked)
and strided (nhwc ``brgconv_strided``), its backward (the transposed convolution's forward and backward weights),
ATen's ``slow_conv_transpose2d``; the rules' bytes against the profiler's measurement of the same op on seeded
shapes, and the note kept where no rule sizes the kernel."""

from __future__ import annotations

import random
from collections.abc import Callable

import calibrate_workspace as calibrate
import pytest
import torch
from torch import nn

from nnmem import cpu

HOST = cpu.describe()


def _draw(rng: random.Random) -> tuple[nn.Module, torch.Tensor, bool]:
    """A 1-D or 2-D transposed convolution (channels 1-48, kernel 1-4, stride 1-3, padding and output padding
    sometimes, bias or not, batch 1-8), its input and whether the step trains (then the input's gradient is
    asked for in most draws)."""
    c, o = rng.choice([1, 3, 4, 8, 16, 17, 32, 48]), rng.choice([1, 2, 4, 8, 16, 24, 32, 33])
    k, s = rng.randint(1, 4), rng.randint(1, 3)
    pad = rng.randint(0, k - 1) if rng.random() < 0.4 else 0
    out_pad = rng.randint(0, s - 1) if rng.random() < 0.3 else 0
    n, size, bias = rng.randint(1, 8), rng.choice([4, 5, 7, 8, 12, 16]), rng.random() < 0.5
    train = rng.random() < 0.6
    if rng.random() < 0.3:
        conv, x = nn.ConvTranspose1d(c, o, k, s, pad, out_pad, bias=bias), torch.randn(n, c, 3 * size)
    else:
        conv, x = nn.ConvTranspose2d(c, o, k, s, pad, out_pad, bias=bias), torch.randn(n, c, size, size)
    return conv, x.requires_grad_(train and rng.random() < 0.7), train


def test_transposed_scratch_matches_measurement(torch_threads: Callable[[int], None]) -> None:
    """Every seeded forward and backward op the rules claim (no note) equals the allocator's peak inside the op
    minus its outputs, at 1-4 threads; every other carries a note; on AVX-512 most are claimed."""
    if not torch.backends.mkldnn.is_available():
        pytest.skip("ATen runs these convolutions through oneDNN only in a build with mkldnn")
    rng, claimed, failures = random.Random(7), 0, []
    for _ in range(50):
        torch_threads(rng.choice((1, 2, 3, 4)))
        conv, x, train = _draw(rng)

        def step(conv: nn.Module = conv, x: torch.Tensor = x, train: bool = train) -> None:
            if train:
                conv(x).sum().backward()
            else:
                with torch.inference_mode():
                    conv(x)

        rows = [r for r in calibrate.measure_ops(step, training=train) if "conv" in r.name]
        assert len(rows) == 1 + train, [r.name for r in rows]
        for row in rows:
            what = f"{row.name} {torch.get_num_threads()} threads {conv} {tuple(x.shape)}"
            if row.note is None:
                claimed += 1
                if row.predicted != row.scratch:
                    failures.append(f"{what}: measured {row.scratch:,} B, rule {row.predicted:,} B")
    assert not failures, "\n".join(failures)
    assert claimed >= (50 if HOST.onednn_block == 16 else 1), claimed
