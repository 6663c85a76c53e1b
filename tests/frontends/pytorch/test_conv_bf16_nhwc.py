"""bfloat16 channels-last forward convolutions on oneDNN's ``brg_conv_fwd:avx512_core_bf16``
(workspace/conv_bf16_brgemm.py): the scratch of ATen's channels-last copies, the reordered weights and the brgemm
kernel's scratchpad, against the profiler's measurement of the same op on seeded 2-D and 3-D shapes."""

from __future__ import annotations

import random
from collections.abc import Callable

import calibrate_workspace as calibrate
import pytest
import torch
from torch import nn

from nnmem import cpu
from nnmem.frontends.pytorch.workspace.matmul import MODELLED_ISA, MODELLED_THREADS

HOST = cpu.describe()
BF16 = torch.bfloat16


def _conv(rng: random.Random) -> tuple[nn.Module, torch.Tensor, bool]:
    """A channels-last bfloat16 convolution, 2-D or 3-D (1-3 groups of 1-64 input and 2-65 output channels, kernel
    1-5, stride 1-3, dilation 1-3, padding, with or without bias), its input (channels-last, or contiguous under
    channels-last weights), and whether it runs under inference mode (else no_grad). Left out: layouts that read as
    both contiguous and channels-last (one input channel in all, a 1x1 weight under a contiguous input)."""
    three_d = rng.random() < 0.3
    g = rng.choice([1, 1, 1, 2, 3])
    c = g * rng.choice([1, 2, 3, 5, 7, 8, 22, 33, 64] if g > 1 else [2, 3, 5, 7, 8, 22, 33, 64])
    o = g * rng.choice([2, 4, 7, 11, 16, 18, 22, 32, 48, 65])
    k, s, d = rng.choice([1, 2, 3, 3, 5]), rng.choice([1, 1, 2, 3]), rng.choice([1, 1, 2, 3])
    n, size = rng.choice([1, 2, 3, 4]), rng.choice([4, 6, 9, 10] if three_d else [4, 6, 9, 10, 14, 20])
    size = max(size, d * (k - 1) + 1)  # the kernel fits the input
    pad = rng.choice([0, 0, d * (k // 2), 1])
    bias = rng.random() < 0.5
    layer, shape, fmt = (nn.Conv3d, (n, c, size, size, size), torch.channels_last_3d) if three_d else \
        (nn.Conv2d, (n, c, size, size), torch.channels_last)
    conv = layer(c, o, k, s, pad, d, g, bias=bias).to(BF16).to(memory_format=fmt)
    x = torch.randn(shape, dtype=BF16)
    return conv, x if rng.random() < 0.2 and k > 1 else x.contiguous(memory_format=fmt), rng.random() < 0.5


def test_bf16_nhwc_forward_scratch_matches_measurement(torch_threads: Callable[[int], None]) -> None:
    """Every seeded forward a rule claims (no note): its bytes equal the allocator's peak inside the op minus its
    output, at 1-4 threads; most of them are claimed (not claimed: one input channel a group, a relayout on
    ``exec_trans``, in 3-D; a grouped one with few channels, which another kernel takes)."""
    if not torch.backends.mkldnn.is_available() or HOST.isa != MODELLED_ISA:
        pytest.skip(f"these bfloat16 convolutions are modelled on ISA {MODELLED_ISA}; this CPU runs oneDNN at "
                    f"{HOST.isa}")
    rng, claimed, mismatches = random.Random(5), 0, []
    for _ in range(40):
        torch_threads(rng.choice(MODELLED_THREADS))
        conv, x, inference = _conv(rng)

        def step(conv: nn.Module = conv, x: torch.Tensor = x, inference: bool = inference) -> None:
            with torch.inference_mode() if inference else torch.no_grad():
                conv(x)

        rows = [r for r in calibrate.measure_ops(step, training=False) if "conv" in r.name and r.note is None]
        claimed += len(rows)
        mismatches += [f"{torch.get_num_threads()} threads {conv} {tuple(x.shape)}: measured {r.scratch:,} B, "
                       f"rule {r.predicted:,} B" for r in rows if r.predicted != r.scratch]
    assert not mismatches, "\n".join(mismatches)
    assert claimed >= 34
