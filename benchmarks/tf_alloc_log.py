"""What a plain TensorFlow step holds at its peak, from TensorFlow's own allocation log: a diagnostic.

Run:  python benchmarks/tf_alloc_log.py keras_two_branch_cnn [--steps 8] [--top 12] [--batch 8] [--mode infer]
      [--policy mixed_bfloat16] [--lowest]

Runs the Keras zoo model's Adam step as users run it (``train_on_batch``, default executor, Grappler on, the BFC
allocator on the CPU; ``predict_on_batch`` with ``--mode infer``; the model built under a Keras dtype policy with
``--policy``) in a child process with TensorFlow's memory log on (``log_memory.cc``: ``VLOG(2)``, every
tensor and raw allocation with its kernel, shape, requested and allocated bytes). For the step with the highest
BFC peak (``--lowest``: the lowest, to see what a lean order leaves out) it prints the peak's composition: each
buffer live at the peak, the bytes requested and the bytes of the chunk the BFC allocator handed out
(``allocated_bytes``: a free chunk under twice the request is handed out whole). The logging slows the kernels,
so the peaks shift somewhat from unlogged runs.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

CHILD = r"""
import sys
import numpy as np
import tensorflow as tf
import keras
from nnmem.zoo.keras_models import FACTORIES
keras.config.set_dtype_policy(sys.argv[5])
model, x, y, loss = FACTORIES[sys.argv[1]](int(sys.argv[3]))
keras.config.set_dtype_policy("float32")
model.compile(optimizer="adam", loss=loss)
x, y = tf.convert_to_tensor(x), tf.convert_to_tensor(y)
step = (lambda: model.train_on_batch(x, y)) if sys.argv[4] == "train" else (lambda: model.predict_on_batch(x))
for _ in range(2):
    step()
for i in range(int(sys.argv[2])):
    tf.config.experimental.reset_memory_stats("CPU:0")
    print(f"@@STEP {i} start {tf.config.experimental.get_memory_info('CPU:0')['current']}", file=sys.stderr, flush=True)
    step()
    print(f"@@STEP {i} end {tf.config.experimental.get_memory_info('CPU:0')['peak']}", file=sys.stderr, flush=True)
"""


def steps(log: list[str]) -> list[dict[str, object]]:
    """Each logged step: its start bytes, the BFC's peak, the buffers live at the replayed peak, and the buffers
    the step made that outlive it (``survivors``: variables that adopted a step buffer, copies of updated ones)."""
    out: list[dict[str, object]] = []
    live: dict[int, tuple[int, int, str, str]] = {}
    step: dict[str, object] | None = None
    current = peak = 0
    born: set[int] = set()  # allocation ids made during the current step
    for line in log:
        if line.startswith("@@STEP"):
            _, _, edge, value = line.split()
            if edge == "start":
                current = peak = int(value)
                step = {"start": current, "at_peak": {}, "replayed": current}
                born = set()
            elif step is not None:
                step["peak"] = int(value)
                step["survivors"] = [live[k] for k in sorted(born) if k in live]
                out.append(step)
                step = None
            continue
        if "__LOG_MEMORY__" not in line:
            continue
        ident = re.search(r"allocation_id: (\d+)", line)
        if ident is None:
            continue
        key = int(ident.group(1))
        if "Allocation {" in line:
            allocated = re.search(r"allocated_bytes: (\d+)", line) or re.search(r"num_bytes: (\d+)", line)
            requested = re.search(r"requested_bytes: (\d+)", line) or allocated
            kernel = re.search(r'(?:kernel_name|operation): "([^"]*)"', line)
            if allocated is None or requested is None or key in live:
                continue
            shape = "x".join(re.findall(r"size: (\d+)", line))
            live[key] = (int(requested.group(1)), int(allocated.group(1)), shape, kernel.group(1) if kernel else "?")
            if step is not None:
                born.add(key)
            current += int(allocated.group(1))
            if step is not None and current > peak:
                peak = current
                step["at_peak"], step["replayed"] = dict(live), current
        elif "Deallocation {" in line and key in live:
            current -= live.pop(key)[1]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a Keras zoo name (nnmem examples)")
    parser.add_argument("--steps", type=int, default=8, help="steps logged after 2 warm-up steps")
    parser.add_argument("--top", type=int, default=12, help="largest buffers listed")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--mode", choices=("train", "infer"), default="train")
    parser.add_argument("--policy", default="float32", help="the Keras dtype policy the model is built under")
    parser.add_argument("--lowest", action="store_true", help="show the step with the lowest peak instead")
    args = parser.parse_args(argv)
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPU_ALLOCATOR_USE_BFC": "true",
           "TF_CPP_MIN_LOG_LEVEL": "0", "TF_CPP_VMODULE": "log_memory=2"}
    done = subprocess.run([sys.executable, "-c", CHILD, args.model, str(args.steps), str(args.batch), args.mode,
                           args.policy], env=env,
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        print(f"error: the logged step failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return 2
    logged = steps(done.stderr.splitlines())
    if not logged:
        print("error: no step was logged (is this TensorFlow's memory log still VLOG(2)?)", file=sys.stderr)
        return 2
    print("BFC peak per step: " + ", ".join(f"{s['peak']:,}" for s in logged))
    worst = (min if args.lowest else max)(logged, key=lambda s: int(str(s["peak"])))
    held = sorted(worst["at_peak"].values(), key=lambda b: -b[1])  # type: ignore[attr-defined]
    requested, allocated = sum(b[0] for b in held), sum(b[1] for b in held)
    which = "lowest" if args.lowest else "highest"
    print(f"{which} step: peak {worst['peak']:,} B; replayed from the log {worst['replayed']:,} B = "
          f"{worst['start']:,} before the step + {allocated:,} in chunks for {requested:,} requested "
          f"({allocated - requested:,} B in chunks handed out beyond their requests)")
    print(f"{'requested':>12s} {'chunk':>12s}  {'shape':18s} kernel")
    for req, alloc, shape, kernel in held[:args.top]:
        print(f"{req:>12,} {alloc:>12,}  {shape:18s} {kernel[-80:]}")
    for s in logged:
        kept = s["survivors"]  # type: ignore[union-attr]
        print(f"step made {len(kept)} buffers that outlive it: " + ", ".join(  # type: ignore[arg-type]
            f"{b[1]:,} B {b[3][-50:]}" for b in kept))
    return 0


if __name__ == "__main__":
    sys.exit(main())
