"""The bfloat16 flash attention backward's oneDNN gemm scratchpads (workspace/attention.py) against the profiler's
measurement of the same op, on seeded shapes (sequence lengths across the kernel's block sizes, head sizes from
8 to 256, causal or not) at the thread counts the matmul scratchpad is modelled at."""

from __future__ import annotations

import random
from collections.abc import Callable

import calibrate_workspace as calibrate
import pytest
import torch
import torch.nn.functional as F

from nnmem import cpu
from nnmem.frontends.pytorch.workspace import note_for
from nnmem.frontends.pytorch.workspace.attention import flash_backward_gemm_scratch
from nnmem.frontends.pytorch.workspace.matmul import AMX_ISA, MODELLED_ISA, MODELLED_THREADS

HOST = cpu.describe()
BF16 = torch.bfloat16
_BACKWARD = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"


def _case(rng: random.Random) -> tuple[tuple[int, ...], bool]:
    """(batch, heads, query rows, key rows, head size) and causal (half the draws; then often square)."""
    lq = rng.choice([1, 7, 32, 33, 64, 100, 191, 192, 256, 500, 768, rng.randint(1, 900)])
    lk = rng.choice([lq, 1, 17, 64, 100, 512, 513, 700, rng.randint(1, 900)])
    causal = rng.random() < 0.5
    lk = lq if causal and rng.random() < 0.5 else lk
    shape = (rng.randint(1, 3), rng.randint(1, 4), lq, lk, rng.choice([8, 16, 48, 64, 80, 128, 256]))
    return shape, causal


@pytest.mark.parametrize("threads", MODELLED_THREADS)
def test_bf16_flash_backward_scratch_matches_measurement(threads: int, torch_threads: Callable[[int], None]) -> None:
    """Each seeded backward: the rule's bytes (its buffers and the largest gemm scratchpad) equal the allocator's
    peak inside the op minus its outputs, with no note; most cases send gemms to oneDNN. On AMX the largest
    scratchpad may be a tail block's (the blockings are not monotone): causal and ragged shapes find it."""
    if not torch.backends.mkldnn.is_available() or HOST.isa not in (MODELLED_ISA, AMX_ISA):
        pytest.skip(f"the bf16 oneDNN scratchpads are modelled on ISA {MODELLED_ISA} and {AMX_ISA}; this CPU runs "
                    f"{HOST.isa}")
    rng, mismatches, through_onednn = random.Random(100 + threads), [], 0
    torch_threads(threads)
    for _ in range(8):
        (b, h, lq, lk, e), causal = _case(rng)
        q, k, v = (torch.randn(b, h, n, e, dtype=BF16, requires_grad=True) for n in (lq, lk, lk))

        def step(q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v, causal: bool = causal) -> None:
            (F.scaled_dot_product_attention(q, k, v, is_causal=causal).float() ** 2).sum().backward()

        (row,) = [r for r in calibrate.measure_ops(step, training=True) if r.name == _BACKWARD]
        through_onednn += bool(flash_backward_gemm_scratch(q, k, None, HOST, causal))
        if row.predicted != row.scratch or row.note is not None:
            mismatches.append(f"{(b, h, lq, lk, e, causal)}: measured {row.scratch:,} B, rule {row.predicted:,} B, "
                              f"note {row.note}")
    assert not mismatches, "\n".join(mismatches)
    assert through_onednn >= 4


def test_flash_backward_keeps_its_note_where_not_modelled(torch_threads: Callable[[int], None]) -> None:
    """float16 (oneDNN's fp16 gemm on a CPU with it), another ISA or an unmodelled thread count: a note, no bytes."""
    backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    q = torch.zeros(1, 2, 64, 64, dtype=BF16)
    lse = torch.zeros(1, 2, 64)
    args = (q, q, q, q, q, lse, 0.0, False)
    fp16_amx = cpu.CpuInfo(model="test", arch="x86_64", flags=(), isa="avx512_core_amx_fp16")
    assert flash_backward_gemm_scratch(q, q, None, fp16_amx) is None
    if torch.backends.mkldnn.is_available():
        assert note_for(backward, args, {}, fp16_amx) is not None
        modelled = cpu.CpuInfo(model="test", arch="x86_64", flags=(), isa=MODELLED_ISA)
        torch_threads(max(MODELLED_THREADS) + 1)
        assert note_for(backward, args, {}, modelled) is not None
        torch_threads(MODELLED_THREADS[0])
        assert note_for(backward, args, {}, modelled) is None
