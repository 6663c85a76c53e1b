"""Dense strided float32 nc(d)hw convolutions' input gradient on oneDNN's ``brgconv_strided:avx2`` (below AVX-512):
the blocking (workspace/conv_strided_bwd_avx2.py: the input-channel block the weights are padded to, the width
block of an uneven width's output buffer, the kernel-height block of the batch) and the scratchpad
(workspace/conv_brgemm_bwd.py), against oneDNN's verbose layout and the profiler's measurement of the same op on
seeded 1-D, 2-D and 3-D shapes at 1-4 threads. On a CPU above AVX2 the draws run in a child process capped at AVX2
(test_conv_avx2's ``_on_avx2``)."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch
from test_conv_avx2 import CAP, HOST, _on_avx2, tally
from torch import nn

from nnmem.frontends.pytorch.workspace.conv_strided_bwd_avx2 import avx2_blocking

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs a build with oneDNN")

_CHANNELS = [1, 3, 8, 12, 17, 24, 32, 40, 64, 100, 128, 200, 384]


def _draw(rng: random.Random, dim: int) -> tuple[nn.Module, torch.Tensor]:
    """A dense strided undilated float32 convolution of rank ``dim`` (stride 2-4, kernel 1-9, 1-5 in 3-D, any
    padding below the kernel, 1-384 input channels, widths often not a multiple of the stride) and an input asking
    for its gradient; half the time its weights are frozen, so that the input gradient alone runs."""
    c, o = rng.choice(_CHANNELS), rng.choice([4, 16, 33, 47, 64, 128])
    k, s = rng.randint(1, 5 if dim == 3 else 9), rng.randint(2, 4)
    size = max(k, rng.randint(3, {1: 160, 2: 24, 3: 8}[dim]))
    conv = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[dim - 1](c, o, k, s, rng.randint(0, k - 1), bias=rng.random() < 0.5)
    conv.requires_grad_(rng.random() < 0.5)
    return conv, torch.randn(rng.randint(1, 4), c, *([size] * dim)).requires_grad_(True)


def strided_mismatches(seed: int, draws: int, dim: int) -> dict[str, object]:
    """:func:`test_conv_avx2.tally` of the input-gradient ops (``convolution_backward``) over ``draws`` seeded
    training steps at 1-4 threads."""
    rng = random.Random(seed)

    def steps() -> Iterator[tuple[nn.Module, torch.Tensor, bool]]:
        for _ in range(draws):
            torch.set_num_threads(rng.randint(1, 4))
            yield (*_draw(rng, dim), True)

    return tally(steps(), ops="convolution_backward")


@pytest.mark.parametrize(("dim", "seed", "draws", "least"), [(1, 3, 40, 36), (2, 5, 40, 34), (3, 2, 12, 6)])
def test_strided_input_gradients_on_avx2_match_their_measurement(dim: int, seed: int, draws: int,
                                                                 least: int) -> None:
    """Every claimed input gradient equals the allocator's peak inside it minus its outputs, and nearly all are
    claimed (noted before on AVX2: the scratchpad was sized for AVX-512's blocking only); 3-D ones whose weights'
    gradient gemm does not size keep that note."""
    result = _on_avx2(seed, draws, dim, strided_mismatches)
    assert result["isa"] == "avx2", result["isa"]
    failures = result["failures"]
    assert isinstance(failures, list) and not failures, "\n".join(failures)
    claimed = result["claimed"]
    assert isinstance(claimed, int) and claimed >= least, (claimed, result["seen"])


# (rank, ic, oc, kernel, stride, padding, size, batch, threads): 1-D as the Wav2Vec2 / Whisper feature
# extractors' strided layers (shortened), channel counts each block of 8 to 32 pads differently
_LAYOUT_SHAPES = [(1, 512, 512, 3, 2, 0, 399, 1, 3), (1, 384, 384, 3, 2, 1, 300, 1, 4),
                  (1, 100, 30, 4, 3, 1, 101, 2, 2), (1, 40, 47, 5, 3, 2, 50, 2, 1), (2, 17, 16, 1, 3, 0, 7, 4, 2),
                  (2, 200, 64, 3, 2, 1, 15, 2, 4), (2, 40, 33, 5, 3, 2, 20, 1, 3), (3, 24, 16, 3, 2, 1, 7, 2, 2),
                  (2, 64, 128, 3, 2, 1, 29, 2, 1)]
_VERBOSE = """
import json, sys, torch
from torch import nn
for dim, c, o, k, s, p, size, mb, nt in json.loads(sys.argv[1]):
    torch.set_num_threads(nt)
    conv = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[dim - 1](c, o, k, s, p, bias=False).requires_grad_(False)
    print("SHAPE", flush=True)
    conv(torch.randn(mb, c, *([size] * dim), requires_grad=True)).sum().backward()
"""


def test_avx2_blocking_picks_onednns_input_channel_block() -> None:
    """The input-channel block the port picks is the one oneDNN's verbose shows on ``brgconv_strided:avx2``'s
    weights (``Bcda{ic_block}b`` / ``Bcdea{ic_block}b``)."""
    if HOST.onednn_block not in (8, 16):
        pytest.skip(f"oneDNN runs at {HOST.isa} here, below AVX2")
    done = subprocess.run([sys.executable, "-c", _VERBOSE, json.dumps(_LAYOUT_SHAPES)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **CAP, "ONEDNN_VERBOSE": "1"}, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    blocks: list[int | None] = []
    for line in done.stdout.splitlines():
        if line.startswith("SHAPE"):
            blocks.append(None)
        elif "brgconv_strided:avx2" in line and "backward_data" in line:
            found = re.search(r"wei:f32:\w*:blocked:[A-Za-z]+?(\d+)b", line)
            assert found is not None, line
            blocks[-1] = int(found.group(1))
    assert len(blocks) == len(_LAYOUT_SHAPES), done.stdout[-2000:]
    for (dim, c, o, k, s, p, size, mb, nt), seen in zip(_LAYOUT_SHAPES, blocks):
        lead = (1,) if dim == 1 else ()
        b = avx2_blocking((mb, c, *lead, *(size,) * dim), (o, c, *lead, *(k,) * dim), (*lead, *(s,) * dim),
                          (*(0,) * len(lead), *(p,) * dim), nt)
        assert b is not None and b.ic_block == seen, ((dim, c, o, k, s, p, size, mb, nt), seen, b and b.ic_block)
