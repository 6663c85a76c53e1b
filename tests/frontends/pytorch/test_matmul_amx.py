"""The oneDNN scratchpad of bfloat16 and float16 matmuls on ISA avx512_core_amx (workspace/matmul_amx.py and the
f16 branch of workspace/matmul.py) against the profiler's measurement of the same op.

bf16 runs ``brg_matmul:avx512_core_amx`` (or ``avx512_core_bf16`` for the shapes AMX refuses), f16 runs
``brg_matmul:avx512_core_fp16`` (no AMX-FP16). The measured tests skip on a CPU whose oneDNN ISA is another;
the regression test with a synthetic CPU runs anywhere.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import calibrate_workspace as calibrate
import pytest
import torch

from nnmem import cpu
from nnmem.frontends.pytorch.workspace import note_for
from nnmem.frontends.pytorch.workspace.matmul import AMX_ISA, MODELLED_THREADS, matmul_scratch

HOST = cpu.describe()
AMX = cpu.CpuInfo(model="test", arch="x86_64", flags=(), isa=AMX_ISA)
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _require_amx(threads: int) -> None:
    if not torch.backends.mkldnn.is_available() or HOST.isa != AMX_ISA:
        pytest.skip(f"this test measures oneDNN's matmuls on ISA {AMX_ISA}; this CPU ({HOST.model}) runs {HOST.isa}")
    if threads not in MODELLED_THREADS:
        pytest.skip(f"the oneDNN matmul scratchpad is modelled at {MODELLED_THREADS} threads, not {threads}")


@pytest.mark.parametrize("dtype", sorted(_DTYPES))
@pytest.mark.parametrize("threads", MODELLED_THREADS)
def test_amx_matmul_scratch_matches_measurement(threads: int, dtype: str,
                                                torch_threads: Callable[[int], None]) -> None:
    """Every matmul op of 40 seeded steps: the rule's bytes equal the allocator's peak inside the op minus its
    outputs (one scratchpad block from ideep), and no note; at least 30 of them run through oneDNN."""
    _require_amx(threads)
    torch_threads(threads)
    # no dimension 1 for float16, whose vector products ATen sometimes keeps (noted, not modelled)
    through_onednn, mismatches = calibrate.matmul_draws(random.Random(2027 + threads), _DTYPES[dtype], 40,
                                                        2 if dtype == "fp16" else 1)
    assert not mismatches, "\n".join(mismatches)
    assert through_onednn >= 30


# (threads, dtype, m, k, n, src transposed) -> scratchpad bytes of torch.mm, measured on an Intel Xeon with AMX
# (Sapphire Rapids class: 48 KiB L1d, 2 MiB L2 per core), torch 2.13.0 / oneDNN 3.12.0. They cover the macro
# heuristic's small-dims branches and grid, the micro heuristic (transposed src, 1-row src, copied
# power-of-two-wide src), and f16 through avx512_core_fp16.
_MEASURED = {
    (1, "bf16", 255, 256, 777, False): 414_720,
    (1, "bf16", 128, 511, 777, False): 840_832,
    (1, "bf16", 16, 512, 3, False): 34_816,
    (2, "bf16", 33, 2048, 300, False): 1_399_904,
    (1, "bf16", 300, 2048, 130, True): 766_208,
    (2, "bf16", 1024, 4096, 64, False): 1_058_560,
    (2, "bf16", 64, 2048, 32, True): 933_632,
    (1, "bf16", 1, 4096, 16, False): 526_336,
    (1, "fp16", 32, 2048, 127, False): 412_800,
    (1, "fp16", 300, 7, 17, False): 25_048,
    (2, "fp16", 1000, 512, 65, False): 1_447_936,
    (2, "fp16", 300, 2048, 130, True): 1_127_936,
}


@pytest.mark.parametrize(("key", "measured"), list(_MEASURED.items()), ids=[str(k) for k in _MEASURED])
def test_amx_rule_reproduces_measured_sizes(key: tuple[int, str, int, int, int, bool], measured: int,
                                            torch_threads: Callable[[int], None]) -> None:
    """A synthetic avx512_core_amx CPU: the rule gives the bytes measured for these shapes (regression data)."""
    if not torch.backends.mkldnn.is_available():
        pytest.skip("ATen sends matmuls to oneDNN only in a build with mkldnn")
    threads, dtype, m, k, n, transposed = key
    torch_threads(threads)
    a = torch.zeros(k, m, dtype=_DTYPES[dtype]).t() if transposed else torch.zeros(m, k, dtype=_DTYPES[dtype])
    b = torch.zeros(k, n, dtype=_DTYPES[dtype])
    mm = torch.ops.aten.mm.default
    assert matmul_scratch(mm, (a, b), {}, AMX) == measured
    assert note_for(mm, (a, b), {}, AMX) is None


def test_amx_keeps_the_note_where_not_modelled(torch_threads: Callable[[int], None]) -> None:
    """A padded bf16 src (the AMX heuristics read its real leading dimension), an f16 vector product and an
    unmodelled thread count keep the note and get no bytes."""
    if not torch.backends.mkldnn.is_available():
        pytest.skip("ATen sends matmuls to oneDNN only in a build with mkldnn")
    mm = torch.ops.aten.mm.default
    padded, b = torch.zeros(64, 96, dtype=torch.bfloat16)[:, :64], torch.zeros(64, 64, dtype=torch.bfloat16)
    torch_threads(MODELLED_THREADS[0])
    assert matmul_scratch(mm, (padded, b), {}, AMX) is None
    assert note_for(mm, (padded, b), {}, AMX) is not None
    row, col = torch.zeros(1, 256, dtype=torch.float16), torch.zeros(256, 64, dtype=torch.float16)
    assert note_for(mm, (row, col), {}, AMX) is not None  # an f16 vector product
    torch_threads(max(MODELLED_THREADS) + 1)
    assert note_for(mm, (b, b), {}, AMX) is not None


def _strided_batch_case(rng: random.Random) -> tuple[str, Callable[[], object]]:
    """A bf16 product whose src batch is not dense: a batch-first linear's transposed input (``aten.linear``'s
    ``bmm`` path under inference mode) or a multi-head attention head slice handed to ``bmm``."""
    rows, batch, k, n = rng.randint(1, 40), rng.randint(1, 8), rng.choice([6, 16, 40, 64, 100]), \
        rng.choice([12, 33, 40, 80, 256])
    if rng.random() < 0.5:
        linear = torch.nn.Linear(k, n, bias=rng.random() < 0.7).to(torch.bfloat16).requires_grad_(False)
        x = torch.randn(batch, rows, k, dtype=torch.bfloat16).transpose(0, 1)
        return f"linear {tuple(x.shape)} -> {n}", lambda: linear(x)
    heads = rng.choice([1, 2, 4])
    a = torch.randn(rows, batch * heads, k, dtype=torch.bfloat16).transpose(0, 1)
    b = torch.randn(n, batch * heads, k, dtype=torch.bfloat16).permute(1, 2, 0)
    return f"bmm {tuple(a.shape)} @ {tuple(b.shape)}", lambda: torch.bmm(a, b)


def test_amx_strided_batches_match_measurement(torch_threads: Callable[[int], None]) -> None:
    """A src batch that is not dense reaches oneDNN as a contiguous copy: the rule sizes the copies and the
    dense batch's AMX scratchpad; 30 seeded draws at 1-4 threads equal the allocator's peak inside the op."""
    _require_amx(MODELLED_THREADS[0])
    rng, mismatches = random.Random(41), []
    for _ in range(30):
        torch_threads(rng.choice(MODELLED_THREADS))
        what, fn = _strided_batch_case(rng)

        def step(fn: Callable[[], object] = fn) -> None:
            with torch.inference_mode():
                fn()

        rows = [r for r in calibrate.measure_ops(step, training=False) if r.name.endswith(("linear.default",
                                                                                        "bmm.default"))]
        assert len(rows) == 1, [r.name for r in rows]
        row = rows[0]
        if row.note is not None or row.predicted != row.scratch:
            mismatches.append(f"{torch.get_num_threads()} threads {what}: measured {row.scratch}, rule "
                              f"{row.predicted}, note {row.note}")
    assert not mismatches, "\n".join(mismatches)
