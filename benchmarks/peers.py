"""nnmem next to PyTorch's MemTracker (under FakeTensorMode), both against a real measurement, on the zoo.

Run:  python benchmarks/peers.py [--models mlp,lstm_lm] [--batch 8] [--json out.json]

For each zoo model, a train step with Adam and an inference step: nnmem's estimate and MemTracker's peak
(``torch.distributed._tools.mem_tracker``, the model built under ``FakeTensorMode`` as its docs do, two
train iterations so that the optimizer state exists, peaks reset after the first) are compared with
``nnmem.measure`` of the same step (child process; protocol in docs/how-it-works.md), at the tensor level
and at the allocator level (which includes oneDNN scratch, what decides an OOM). MemTracker runs in a fresh
process per case, so that its crash (it raises on some models) is reported as such.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from typing import Any

from _common import zoo_parser  # benchmarks/ is the script's directory, first on sys.path

import nnmem

CONFIGS = (("train", "adam"), ("infer", "sgd"))

_MEMTRACKER = r"""
import json, sys, warnings
warnings.filterwarnings("ignore")
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
from nnmem import zoo
name, mode, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
with FakeTensorMode():
    model, inputs, target, loss_fn = zoo.resolve(name)(batch)
    tracker = MemTracker()
    if mode == "train":
        opt = torch.optim.Adam(model.parameters())
        tracker.track_external(model, opt)
        with tracker:
            for i in range(2):
                opt.zero_grad(set_to_none=True)
                out = model(*inputs)
                loss = loss_fn(out, target) if loss_fn is not None else out.mean()
                loss.backward()
                opt.step()
                if i == 0:
                    tracker.reset_mod_stats()
    else:
        model.eval()
        tracker.track_external(model)
        with tracker, torch.inference_mode():
            model(*inputs)
    snapshot = tracker.get_tracker_snapshot("peak")
print(json.dumps({"peak": sum(v["Total"] for v in snapshot.values())}))
"""


def _memtracker(name: str, mode: str, batch: int) -> int | str:
    proc = subprocess.run([sys.executable, "-c", _MEMTRACKER, name, mode, str(batch)], capture_output=True,
                          text=True, check=False, timeout=600)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["exit " + str(proc.returncode)])[-1]
        return "crash: " + last[:80]
    return int(json.loads(proc.stdout.strip().splitlines()[-1])["peak"])


def _err(value: int | str, truth: int) -> float | None:
    return (value - truth) / truth if isinstance(value, int) else None


def _fmt(err: float | None) -> str:
    return f"{err:+.2%}" if err is not None else "crash"


def main(argv: list[str] | None = None) -> int:
    parser = zoo_parser(__doc__)
    args = parser.parse_args(argv)
    header = (f"{'model':20s} {'mode':5s} {'measured tensor':>15s} {'measured alloc':>15s} {'nnmem vs tensor':>15s} "
              f"{'nnmem vs alloc':>15s} {'MemTracker vs tensor':>20s} {'MemTracker vs alloc':>20s}")
    print(header)
    print("-" * len(header))
    rows: list[dict[str, Any]] = []
    for name in args.models.split(","):
        for mode, optimizer in CONFIGS:
            est = nnmem.estimate(name, mode=mode, optimizer=optimizer, batch=args.batch)
            meas = nnmem.measure(name, mode=mode, optimizer=optimizer, batch=args.batch)
            peer = _memtracker(name, mode, args.batch)
            t, a = meas.peaks["tensor"], meas.peaks["allocator"]
            row = {"model": name, "mode": mode, "meas_tensor": t, "meas_allocator": a,
                   "nnmem_tensor": _err(est.peaks["tensor"], t), "nnmem_allocator": _err(est.peaks["allocator"], a),
                   "memtracker_tensor": _err(peer, t), "memtracker_allocator": _err(peer, a),
                   "memtracker": peer}
            rows.append(row)
            print(f"{name:20s} {mode:5s} {t:>15,} {a:>15,} {_fmt(row['nnmem_tensor']):>15s} "
                  f"{_fmt(row['nnmem_allocator']):>15s} {_fmt(row['memtracker_tensor']):>20s} "
                  f"{_fmt(row['memtracker_allocator']):>20s}", flush=True)
    print()
    for tool in ("nnmem", "memtracker"):
        for level in ("tensor", "allocator"):
            errs = [abs(r[f"{tool}_{level}"]) for r in rows if r[f"{tool}_{level}"] is not None]
            crashes = sum(r[f"{tool}_{level}"] is None for r in rows)
            if errs:
                print(f"{tool:10s} {level:9s}: median |err| {statistics.median(errs):.2%}, max {max(errs):.2%}, "
                      f"crashes {crashes}/{len(rows)}")
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
