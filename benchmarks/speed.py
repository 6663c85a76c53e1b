"""Speed of nnmem's estimate against PyTorch's MemTracker under FakeTensorMode, on GPT-2 small.

Run:  python benchmarks/speed.py [--repeats 3] [--batch 8] [--seq 1024] [--json out.json]

The step: HuggingFace ``GPT2LMHeadModel`` built from ``GPT2Config()`` (12 layers, d_model 768, 12 heads,
vocabulary 50257, 124 M parameters; random weights, no download), batch 8, sequence 1024, AdamW, one
training step in steady state. Each run is a fresh Python process that builds the model without memory
(nnmem: under the meta device; MemTracker: under FakeTensorMode, as its docs do) and answers the step's
peak; a run's time is the wall time from the start of the build to the answer, imports excluded. MemTracker
runs two iterations, because its first one has no optimizer state: that is what it needs to give the
steady-state peak nnmem gives. The table shows each tool's median of ``--repeats`` runs, its peak RSS
(the estimating process's maximum resident set) and the ratio nnmem / MemTracker. Target: ratio ≤ 0.5,
nnmem's RSS < 1.5 GiB.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from typing import Any

RATIO_MAX, RSS_MAX = 0.5, 1.5 * 2**30

_COMMON = r"""
import json, resource, sys, time, warnings
warnings.filterwarnings("ignore")
import torch, transformers
transformers.logging.set_verbosity_error()
BATCH, SEQ = int(sys.argv[1]), int(sys.argv[2])
CFG = transformers.GPT2Config(n_positions=max(SEQ, 1024))
"""

_NNMEM = _COMMON + r"""
import nnmem
t0 = time.perf_counter()
with torch.device("meta"):
    model = transformers.GPT2LMHeadModel(CFG)
ids = torch.empty((BATCH, SEQ), dtype=torch.long, device="meta")
report = nnmem.estimate(model, (ids,), mode="train", optimizer="adamw")
seconds = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"seconds": seconds, "peak": report.peaks["tensor"], "rss": rss}))
"""

_MEMTRACKER = _COMMON + r"""
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
t0 = time.perf_counter()
with FakeTensorMode():
    model = transformers.GPT2LMHeadModel(CFG)
    opt = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, CFG.vocab_size, (BATCH, SEQ))
    tracker = MemTracker()
    tracker.track_external(model, opt)
    with tracker:
        for _ in range(2):
            opt.zero_grad(set_to_none=True)
            model(ids).logits.mean().backward()
            opt.step()
            if _ == 0:
                tracker.reset_mod_stats()
    peak = sum(v for k, v in tracker.get_tracker_snapshot("peak")[torch.device("cpu")].items() if k == "Total")
seconds = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"seconds": seconds, "peak": peak, "rss": rss}))
"""


def _run(script: str, batch: int, seq: int) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", script, str(batch), str(seq)], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise SystemExit(f"a benchmark run failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[str, Any]]] = {"nnmem": [], "memtracker": []}
    for i in range(args.repeats):  # interleaved, so that machine noise hits both alike
        for tool, script in (("nnmem", _NNMEM), ("memtracker", _MEMTRACKER)):
            runs[tool].append(_run(script, args.batch, args.seq))
            print(f"run {i + 1}/{args.repeats} {tool:10s} {runs[tool][-1]['seconds']:7.2f} s", file=sys.stderr)
    rows = {tool: {"median_s": statistics.median(r["seconds"] for r in rs),
                   "times_s": [round(r["seconds"], 3) for r in rs],
                   "rss_bytes": max(r["rss"] for r in rs), "peak_bytes": rs[-1]["peak"]} for tool, rs in runs.items()}
    ratio = rows["nnmem"]["median_s"] / rows["memtracker"]["median_s"]
    print(f"GPT-2 small (HF GPT2LMHeadModel, 124 M parameters), batch {args.batch}, seq {args.seq}, AdamW train step; "
          f"median of {args.repeats} fresh processes")
    print(f"{'tool':12s} {'median s':>9s} {'runs s':>24s} {'peak RSS MiB':>13s} {'step peak (tensor) MiB':>23s}")
    for tool, row in rows.items():
        times = ", ".join(f"{t:.2f}" for t in row["times_s"])
        print(f"{tool:12s} {row['median_s']:9.2f} {times:>24s} {row['rss_bytes'] / 2**20:13.0f} "
              f"{row['peak_bytes'] / 2**20:23.1f}")
    ok = ratio <= RATIO_MAX and rows["nnmem"]["rss_bytes"] < RSS_MAX
    print(f"ratio nnmem / MemTracker = {ratio:.2f} (target ≤ {RATIO_MAX}); nnmem RSS "
          f"{rows['nnmem']['rss_bytes'] / 2**30:.2f} GiB (target < {RSS_MAX / 2**30:.1f}) "
          f"-> {'PASS' if ok else 'FAIL'}")
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump({"rows": rows, "ratio": ratio, "ok": ok, "batch": args.batch, "seq": args.seq}, fh, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
