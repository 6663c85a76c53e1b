"""oneDNN's backward-weights scratchpad (per-thread partial sums of the weights' and bias' gradients), each
estimate against ``nnmem.measure`` of the same training step.

Small convolution stacks whose step peaks inside a convolution's backward, one per float32 nchw kernel
oneDNN runs for the weights' gradient (``jit_1x1``, ``jit`` on AVX-512 and on AVX2, a strided 1x1 gathered
at unit stride, depthwise ``jit_uni_dw``, a 1-D convolution). The scratchpad exists only on more than one
thread; on one, both sides agree without it. Tensor level within 0.5 %, allocator within 0.5 % (the
scratchpad is 1-30 KB of peaks of 9-200 KB). Run it under caps too (``ONEDNN_MAX_CPU_ISA=AVX2
ATEN_CPU_CAPABILITY=avx2``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import nnmem

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs a build with oneDNN")


def _norm_stack(c: int, norm: nn.Module) -> nn.Module:
    """The randomized suite's norm family: a 3x3 convolution, a norm, an activation, a 1x1 to 4 channels."""
    return nn.Sequential(nn.Conv2d(c, c, 3, padding=1), norm, nn.ReLU(), nn.Conv2d(c, 4, 1))


CASES: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...], str]] = {
    # label: (model, input shape, optimizer)
    "1x1-after-groupnorm": (lambda: _norm_stack(8, nn.GroupNorm(1, 8)), (4, 8, 6, 6), "adam"),
    "1x1-after-rmsnorm": (lambda: _norm_stack(8, nn.RMSNorm((8,))), (7, 8, 8, 8), "momentum"),
    "3x3-16-channels": (lambda: nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.Tanh(), nn.Conv2d(16, 4, 1)),
                        (2, 16, 6, 6), "sgd"),
    "3x3-12-channels-avx2-kernel": (lambda: nn.Sequential(nn.Conv2d(12, 12, 3, padding=1), nn.Conv2d(12, 4, 1)),
                                    (5, 12, 5, 5), "adam"),
    "3x3-first-3-channels": (lambda: nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 3, 1)),
                             (6, 3, 10, 10), "sgd"),
    "1x1-stride-2-first": (lambda: nn.Sequential(nn.Conv2d(8, 24, 1, stride=2), nn.ReLU(), nn.Conv2d(24, 4, 1)),
                           (6, 8, 12, 12), "sgd"),
    "depthwise-3x3": (lambda: nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.Flatten(),
                                            nn.Linear(16 * 3 * 3, 2)), (2, 16, 3, 3), "sgd"),
    "1d": (lambda: nn.Sequential(nn.Conv1d(8, 12, 3, padding=1), nn.ReLU(), nn.Conv1d(12, 4, 1)),
           (5, 8, 30), "adam"),
}


@pytest.mark.parametrize("label", list(CASES))
def test_conv_backward_step_matches_measure(label: str) -> None:
    make, shape, optimizer = CASES[label]
    torch.manual_seed(0)
    model, x = make(), torch.randn(*shape)
    est = nnmem.estimate(model, (x,), mode="train", optimizer=optimizer)
    notes = [n for n in est.notes if "not modelled" in n]
    if notes:
        pytest.skip("; ".join(notes))
    real = nnmem.measure(model, (x,), mode="train", optimizer=optimizer)
    for level in ("tensor", "allocator"):
        e, m = est.peaks[level], real.peaks[level]
        assert abs(e - m) <= 0.005 * m, f"{label} {level}: estimated {e:,} B, measured {m:,} B ({(e - m) / m:+.2%})"
