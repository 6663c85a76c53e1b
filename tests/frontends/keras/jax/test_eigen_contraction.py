"""XLA:CPU's own dots and convolutions: the port of Eigen's thread-pool contraction and oneDNN's AVX2 sgemm.

The first test replays malloc logs taken on an AVX2 host (AMD EPYC Zen 3: 32 KiB L1d, 512 KiB L2, 32 MiB L3, two
threads) through the port with that host's caches, so it runs anywhere. The second measures real jitted dots and
convolutions with the malloc counter where oneDNN runs its AVX2 kernels: on this CPU, or, above AVX2, in a child
capped with ``ONEDNN_MAX_CPU_ISA=AVX2`` (jaxlib's oneDNN reads the cap as ours does).
"""

from __future__ import annotations

import os
import sys

import pytest

from nnmem import cpu
from nnmem.frontends.keras.jax import eigen_contraction, hlo, scratch
from nnmem.frontends.keras.jax.eigen_contraction import Caches, contraction_scratch

_ZEN3 = Caches(32 * 1024, 512 * 1024, 32 * 1024 * 1024)

# (m, n, k, image patches, peaks of the contraction's blocks in the malloc log, bytes): Eigen's column-major
# terms, so a row-major a.T @ b of a f32[k, rows] by f32[k, cols] has m = cols, n = rows.
_LOGGED = [
    (512, 1024, 8, False, (92_928,)),  # packed_mem_ 58,432 B, the context 1,056 B, two sgemm workspaces at once
    (64, 64, 4096, False, (146_904, 277_352)),  # sharded by the inner dimension: a partial sum, one or two tasks
    (256, 256, 2048, False, (1_625_856,)),
    (2048, 2048, 64, False, (3_404_128, 4_405_192)),  # copy-based sgemm buffers (1,001,056 B): two or three at once
    (4096, 8, 8, False, (32_400,)),  # one thread: one lhs and one rhs block
    (8, 4096, 8, False, (43_920,)),
    (600, 600, 600, False, (4_003_584,)),
    (64, 1024, 4096, False, (2_983_680,)),
    (64, 8, 1000, False, (113_552,)),
    (256, 2048, 512, False, (5_343_048,)),  # parallel by the sharding dimension only: thread-local blocks
    (512, 500, 1000, False, (2_787_072,)),
    (512, 128, 8, False, (37_264,)),
    (16, 8192, 27, True, (1_015_208, 1_031_920)),  # 8x32x32x3 -> 16, 3x3 SAME
    (16, 8192, 75, True, (2_855_672,)),  # 5x5: thread-local patches too
    (16, 4096, 27, True, (517_544, 534_256)),
    (8, 3200, 75, True, (1_000_040,)),
    (1, 8192, 75, True, (36_424,)),  # one output feature
]


@pytest.mark.parametrize(("m", "n", "k", "patches", "logged"), _LOGGED)
def test_the_port_holds_the_malloc_logs_of_an_avx2_host(m: int, n: int, k: int, patches: bool,
                                                        logged: tuple[int, ...]) -> None:
    held = contraction_scratch(m, n, k, threads=2, caches=_ZEN3, patches=patches)
    assert all(held.low <= peak <= held.high + 64 for peak in logged), (held, logged)  # 64: glibc's memalign


def test_one_thread_holds_one_block_pair_and_one_workspace() -> None:
    held = contraction_scratch(128, 256, 8, threads=2, caches=_ZEN3)
    assert held.low == held.high == 12_360 + 16_712  # 4,096 + 8,192 B of blocks, asked 64 B more; the workspace


def _rises(cases: list[tuple[str, tuple[int, ...]]]) -> list[tuple[int, int, int]]:
    """(measured malloc rise, modelled low, modelled high) of each jitted op; modelled = the scratch rules + the
    output + the runtime bookkeeping."""
    import gc

    import jax
    import jax.numpy as jnp
    from jax import lax

    from nnmem.runner.mallocpeak import counters

    counter = counters()
    assert counter is not None, "the malloc counter is not preloaded"
    assert eigen_contraction.ported(), "the child does not run oneDNN's AVX2 kernels"
    out = []
    for kind, dims in cases:
        if kind == "dot":
            k, rows, cols = dims
            a, b = jnp.ones((k, rows)), jnp.ones((k, cols))
            compiled = jax.jit(lambda a, b: a.T @ b).lower(a, b).compile()
        else:
            batch, size, channels, features, window = dims
            a, b = jnp.ones((batch, size, size, channels)), jnp.ones((window, window, channels, features))
            compiled = jax.jit(lambda a, b: lax.conv_general_dilated(
                a, b, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))).lower(a, b).compile()
        module = hlo.parse(compiled.as_text())
        assert any(ins.opcode in ("dot", "convolution") for ins in module.entry_body), "not XLA's own kernel"
        workspace = scratch.fusion_workspace(module)
        fixed = int(compiled.memory_analysis().output_size_in_bytes) + scratch.runtime_bookkeeping(module, 1)
        rises = []
        for i in range(6):
            gc.collect()
            before = counter.current()
            counter.reset_peak()
            result = compiled(a, b)
            jax.block_until_ready(result)
            if i >= 2:
                rises.append(counter.peak() - before)
            del result
        out.append((sorted(rises)[len(rises) // 2], fixed + workspace.low, fixed + workspace.high))
    return out


_CASES = [("dot", (8, 1024, 512)), ("dot", (64, 2048, 2048)), ("dot", (600, 600, 600)), ("dot", (4096, 64, 64)),
          ("dot", (8, 256, 128)), ("conv", (8, 32, 3, 16, 5)), ("conv", (4, 32, 3, 16, 3))]


@pytest.mark.accuracy
@pytest.mark.skipif(os.environ.get("KERAS_BACKEND") != "jax", reason="needs KERAS_BACKEND=jax")
def test_real_dots_and_convolutions_fall_inside_the_ported_range() -> None:
    import cloudpickle

    from nnmem.runner.child import run_in_child
    from nnmem.runner.mallocpeak import library

    info = cpu.describe()
    if not info.isa_at_least("avx2"):
        pytest.skip("oneDNN runs no AVX2 kernels on this CPU")
    env = {"KERAS_BACKEND": "jax"}
    if info.isa_at_least("avx512_core"):
        env["ONEDNN_MAX_CPU_ISA"] = "AVX2"
    cloudpickle.register_pickle_by_value(sys.modules[_rises.__module__])
    results = run_in_child(lambda: _rises(_CASES), timeout_s=240, preload=library(), env=env)
    slack = 4096  # small blocks of the execute call beside the bookkeeping's fit (measured: up to 2.3 KB)
    assert all(low - slack <= measured <= high + slack for measured, low, high in results), results
