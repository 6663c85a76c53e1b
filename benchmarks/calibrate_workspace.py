"""Measure the scratch memory each CPU kernel allocates inside an op, and compare it with nnmem's rules.

Run:  python benchmarks/calibrate_workspace.py [--models vgg,lstm_lm] [--modes train,infer] [--top 25] [--all]
      ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 python benchmarks/calibrate_workspace.py  (a lower ISA)

For each zoo model's real step (train with SGD, and infer) it runs the step twice under the torch
profiler with ``profile_memory=True`` (the first run primes the profiler, which reports frees only of
blocks it saw allocated) while a TorchDispatchMode wraps every op it sees in a ``record_function``
range named ``nnmem::<index>``. That mode sees exactly the ops the estimate's tracker sees (below
autograd, after CompositeImplicitAutograd ops such as ``aten::conv2d`` or ``aten::linear`` have
decomposed into ``aten::convolution`` / ``aten::addmm``), so each range holds one dispatch-level op.

For each op it prints the input shapes, the bytes of its new output storages, the scratch measured
inside it (peak of the allocator's running sum inside the range, relative to just before it, minus
those output bytes), the scratch the workspace rules predict for the same call, and the difference;
then a summary of the op kinds with the largest unexplained scratch. It starts with the CPU as the rules
see it (``nnmem.cpu.describe()``: oneDNN's effective ISA under ``ONEDNN_MAX_CPU_ISA``, ATen's capability)
and marks the ops whose kernel path no rule models on that CPU (``WorkspaceRules.notes``).
"""

from __future__ import annotations

import argparse
import bisect
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from nnmem.cpu import describe
from nnmem.frontends.pytorch.measure import quiet_stderr
from nnmem.frontends.pytorch.workspace import WorkspaceRules, note_for

__all__ = ["OpMeasure", "measure_ops", "main"]

_PREFIX = "nnmem::"


@dataclass(frozen=True, slots=True)
class OpMeasure:
    """One dispatch-level op of a real run.

    Attributes:
        index: position among the ops the dispatch mode saw.
        name: the op overload, e.g. ``aten.convolution.default``.
        shapes: shapes of the op's tensor arguments, for display.
        out_bytes: bytes of the new storages the op returned, in bytes.
        peak: peak of the allocator's running sum inside the op relative to just before it, in bytes.
        scratch: ``peak - out_bytes`` (never below 0), in bytes.
        predicted: what ``RULES.workspace`` says for the same call, in bytes.
        real_sizes: storage bytes of each output tensor of the real kernel (flatten order).
        rule_sizes: what ``RULES.output_bytes`` says (None where it has no rule).
        note: why no rule models this call's kernel path on this CPU (None when one does).
    """

    index: int
    name: str
    shapes: str
    out_bytes: int
    peak: int
    scratch: int
    predicted: int
    real_sizes: tuple[int, ...]
    rule_sizes: tuple[int, ...] | None
    note: str | None = None


@dataclass(frozen=True, slots=True)
class _Call:
    name: str
    shapes: str
    out_bytes: int
    predicted: int
    real_sizes: tuple[int, ...]
    rule_sizes: tuple[int, ...] | None
    note: str | None


class _Recorder(TorchDispatchMode):
    """Wraps each op in a named profiler range and remembers what the rules say about it."""

    def __init__(self, training: bool) -> None:
        super().__init__()
        self.training = training
        self.calls: list[_Call] = []
        self.rules = WorkspaceRules()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        before = {_ptr(t) for t in _tensors((args, kwargs))}
        with torch.profiler.record_function(f"{_PREFIX}{len(self.calls)}"):
            out = func(*args, **kwargs)
        outs = _tensors(out)
        fresh = {_ptr(t): t.untyped_storage().nbytes() for t in outs if _ptr(t) not in before and _ptr(t)}
        sizes = self.rules.output_bytes(func, args, kwargs, out)
        self.calls.append(_Call(
            str(func), " ".join(str(list(t.shape)) for t in _tensors((args, kwargs))), sum(fresh.values()),
            self.rules.workspace(func, args, kwargs, out, self.training),
            tuple(t.untyped_storage().nbytes() for t in outs), None if sizes is None else tuple(sizes),
            note_for(func, args, kwargs, self.rules.cpu)))
        return out


def _ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def _events(prof: Any) -> tuple[dict[int, tuple[int, int]], list[tuple[int, int, int]]]:
    """The ``nnmem::`` ranges (index → start, end) and every CPU allocation event (time, size, ptr)."""
    ranges: dict[int, tuple[int, int]] = {}
    allocs: list[tuple[int, int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        size = getattr(event.extra_fields, "alloc_size", None)
        if size is not None:
            if str(getattr(event.extra_fields, "device", "cpu")).startswith("cpu"):
                allocs.append((event.start_time_ns, size, event.extra_fields.ptr))
        elif event.name.startswith(_PREFIX):
            ranges[int(event.name[len(_PREFIX):])] = (event.start_time_ns, event.end_time_ns)
        stack.extend(event.children)
    allocs.sort()
    return ranges, allocs


def measure_ops(fn: Callable[[], Any], *, training: bool, prime: bool = True) -> list[OpMeasure]:
    """Run ``fn`` for real (twice when ``prime``) and measure every dispatch-level op of the last run.

    Args:
        fn: the work, e.g. one training step; it is called once more per priming run.
        training: passed to the rules (train-mode kernels keep different scratch).
        prime: run once under the profiler first, so that frees of blocks allocated before are seen.

    Returns:
        One record per op the dispatch mode saw, in order.
    """
    with quiet_stderr():
        if prime:
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
                fn()
        recorder = _Recorder(training)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, recorder:
            fn()
    ranges, allocs = _events(prof)
    times = [a[0] for a in allocs]
    results = []
    for index, call in enumerate(recorder.calls):
        start, end = ranges.get(index, (0, -1))
        lo, hi = bisect.bisect_left(times, start), bisect.bisect_right(times, end)
        running = peak = 0
        for _, size, _unused in allocs[lo:hi]:
            running += size
            peak = max(peak, running)
        results.append(OpMeasure(index, call.name, call.shapes, call.out_bytes, peak, max(peak - call.out_bytes, 0),
                                 call.predicted, call.real_sizes, call.rule_sizes, call.note))
    return results


# ---- the zoo run ---------------------------------------------------------------------------------------
_MATMUL_DIMS = (2, 3, 7, 16, 17, 31, 32, 33, 64, 65, 100, 127, 128, 255, 256, 300, 511, 512, 513, 777, 1000, 1024,
                2048, 4096)


def matmul_case(rng: Any, dtype: torch.dtype, low: int = 1) -> tuple[str, Callable[[], Any]] | None:
    """One seeded matmul step for the scratch rules' tests: ``mm`` (either operand transposed), ``F.linear`` with
    and without bias, ``bmm`` (plain or transposed src), and an ``nn.Linear`` forward and backward (whose
    gradients multiply transposed operands); dimensions from ``low`` up, None where the product is too big.

    Args:
        rng: a seeded ``random.Random``.
        dtype: the operands' type.
        low: the smallest dimension drawn (2 leaves out vector products).
    """
    def dim() -> int:
        return rng.choice([low, *_MATMUL_DIMS, rng.randint(low, 1024)])

    m, k, n = dim(), dim(), dim()
    kind = rng.choice(["mm", "mm_ta", "mm_tb", "linear", "linear_nobias", "bmm", "bmm_ta", "linear_train"])
    if m * k * n > 1 << 26:
        return None
    if kind.startswith("mm"):
        a = torch.randn(k, m, dtype=dtype).t() if kind == "mm_ta" else torch.randn(m, k, dtype=dtype)
        b = torch.randn(n, k, dtype=dtype).t() if kind == "mm_tb" else torch.randn(k, n, dtype=dtype)
        return f"{kind} {m}x{k}x{n}", lambda: torch.mm(a, b)
    if kind.startswith("bmm"):
        batch = rng.randint(1, 6)
        src = (torch.randn(batch, k, m, dtype=dtype).transpose(1, 2) if kind == "bmm_ta"
               else torch.randn(batch, m, k, dtype=dtype))
        wei = torch.randn(batch, k, n, dtype=dtype)
        return f"{kind} {batch}x{m}x{k}x{n}", lambda: torch.bmm(src, wei)
    x = torch.randn(m, k, dtype=dtype)
    lin = torch.nn.Linear(k, n, bias=kind != "linear_nobias").to(dtype)
    if kind == "linear_train":
        x.requires_grad_()

        def step() -> None:
            y = lin(x)
            (y.float() ** 2).sum().backward()
        return f"{kind} {m}x{k}x{n}", step
    return f"{kind} {m}x{k}x{n}", lambda: torch.nn.functional.linear(x, lin.weight, lin.bias)


_MATMUL_OPS = ("aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default",
               "aten.linear.default")


def matmul_draws(rng: Any, dtype: torch.dtype, draws: int, low: int = 1) -> tuple[int, list[str]]:
    """Measure the matmul ops of ``draws`` seeded :func:`matmul_case` steps against their rules: (how many ran
    through oneDNN, i.e. allocated scratch; one line per op whose rule differs from the measurement or that
    carries a note)."""
    through_onednn, mismatches = 0, []
    for _ in range(draws):
        case = matmul_case(rng, dtype, low)
        if case is None:
            continue
        label, fn = case
        for row in measure_ops(fn, training=label.startswith("linear_train")):
            if row.name not in _MATMUL_OPS:
                continue
            through_onednn += row.scratch > 0
            if row.predicted != row.scratch or row.note is not None:
                mismatches.append(f"{label} {row.name} {row.shapes}: measured {row.scratch:,} B, "
                                  f"rule {row.predicted:,} B, note {row.note}")
    return through_onednn, mismatches


def _zoo_step(name: str, mode: str, batch: int) -> tuple[Callable[[], Any], bool]:
    from nnmem import zoo
    from nnmem.frontends.pytorch.step import prepare_step, run_step
    from nnmem.loader import build

    built = build(zoo.resolve(name), batch, name)
    opt = prepare_step(built.model, mode, "sgd")
    inputs = tuple(built.inputs or ())

    def step() -> None:
        run_step(built.model, inputs, mode=mode, opt=opt, loss_fn=built.loss_fn, target=built.target)

    for _ in range(2):
        step()
    return step, mode == "train"


def report(rows: list[OpMeasure], *, show_all: bool, threshold: int = 4096) -> list[str]:
    lines = [f"{'#':>5s} {'op':44s} {'out':>11s} {'measured':>11s} {'predicted':>11s} {'diff':>11s}  inputs"]
    for r in rows:
        diff = r.predicted - r.scratch
        size_bad = r.rule_sizes is not None and tuple(r.rule_sizes) != r.real_sizes
        if show_all or abs(diff) > threshold or size_bad:
            lines.append(f"{r.index:5d} {r.name[:44]:44s} {r.out_bytes:>11,} {r.scratch:>11,} {r.predicted:>11,} "
                         f"{diff:>+11,}  {r.shapes[:120]}")
            if size_bad:
                lines.append(f"      output sizes: real {list(r.real_sizes)} rule {list(r.rule_sizes or ())}")
            if r.note:
                lines.append(f"      not modelled: {r.note}")
    return lines


def summary(rows: list[OpMeasure], top: int) -> list[str]:
    by_op: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for r in rows:
        entry = by_op[r.name]
        entry[0] += 1
        entry[1] = max(entry[1], abs(r.scratch - r.predicted))
        entry[2] = max(entry[2], r.scratch)
        entry[3] += abs(r.scratch - r.predicted)
    order = sorted(by_op.items(), key=lambda kv: -kv[1][1])[:top]
    lines = [f"{'op':48s} {'calls':>6s} {'max |unexplained|':>18s} {'max measured':>13s} {'sum |unexpl.|':>14s}"]
    lines += [f"{k[:48]:48s} {v[0]:>6d} {v[1]:>18,} {v[2]:>13,} {v[3]:>14,}" for k, v in order]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None)
    parser.add_argument("--modes", default="train,infer")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--all", action="store_true", help="print every op, not only mispredicted ones")
    parser.add_argument("--batch", type=int, default=None, help="batch size (default: the zoo's)")
    args = parser.parse_args(argv)
    from nnmem import zoo

    names = args.models.split(",") if args.models else list(zoo.ACCURACY_ZOO)
    print(f"CPU: {describe().to_dict()}")
    everything: list[OpMeasure] = []
    for name in names:
        for mode in args.modes.split(","):
            step, training = _zoo_step(name, mode, args.batch or zoo.DEFAULT_BATCH)
            rows = measure_ops(step, training=training)
            everything += rows
            print(f"== {name} {mode}: {len(rows)} ops, measured scratch max "
                  f"{max((r.scratch for r in rows), default=0):,} B")
            print("\n".join(report(rows, show_all=args.all)))
    print()
    print("\n".join(summary(everything, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
