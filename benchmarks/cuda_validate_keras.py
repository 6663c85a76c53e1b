"""Keras on a GPU, each backend: measured vs predicted peaks of the Keras zoo's steps (``cuda_validate.py --keras``).

For each backend (torch, jax, tensorflow) a child process with ``KERAS_BACKEND`` set runs, per Keras zoo model ×
(Adam train step, inference):
  * the prediction: ``nnmem.estimate(name, device="cuda", ...)`` (traced on the CPU, replayed through nnmem's
    model of the backend's GPU allocator: PyTorch's caching allocator, TensorFlow's GPU BFC, XLA's client BFC);
  * the measurement on the GPU, as ``train_on_batch`` / ``predict_on_batch`` run there: 2 warm-up steps, then one
    step, the peak read from the backend: torch ``max_memory_allocated`` / ``max_memory_reserved`` after
    ``reset_peak_memory_stats``; TensorFlow ``get_memory_info("GPU:0")["peak"]`` after ``reset_memory_stats``,
    for the default compile (``jit_compile="auto"``: XLA on a GPU) and for ``jit_compile=False`` (the graph
    executor's step the estimate models); JAX ``memory_stats()["peak_bytes_in_use"]`` of the process (JAX
    offers no reset: the child runs one case).
A backend the machine cannot run on a GPU (no GPU build installed) is skipped with its reason. Each case runs in a
fresh process so that one OOM or one backend's pool cannot touch the others.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

BACKENDS = ("torch", "jax", "tensorflow")
MODELS = ("keras_mlp", "keras_two_branch_cnn", "keras_lstm", "keras_transformer_block")
CONFIGS = (("train", "adam"), ("infer", "sgd"))


def _gpu_ready(backend: str) -> str | None:
    """None when ``backend`` sees a GPU in this process, else why not."""
    if backend == "torch":
        import torch

        return None if torch.cuda.is_available() else "torch sees no CUDA device"
    if backend == "jax":
        import jax

        return None if any(d.platform == "gpu" for d in jax.devices()) else "jax has no GPU backend (jax[cuda12])"
    import tensorflow as tf

    return None if tf.config.list_physical_devices("GPU") else "TensorFlow sees no GPU (a tensorflow[and-cuda] build)"


def _measure(name: str, batch: int, mode: str, optimizer: str, backend: str, jit: Any) -> dict[str, int]:
    from nnmem.frontends.keras.common import make_optimizer
    from nnmem.zoo.keras_models import FACTORIES

    model, x, y, loss = FACTORIES[name](batch)
    model.compile(optimizer=make_optimizer(optimizer), loss=loss, jit_compile=jit)

    def step() -> None:
        if mode == "train":
            model.train_on_batch(x, y)
        else:
            model.predict_on_batch(x)

    for _ in range(2):
        step()
    if backend == "torch":
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        return {"allocator": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.max_memory_reserved()}
    if backend == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.reset_memory_stats("GPU:0")
        step()
        return {"allocator": int(tf.config.experimental.get_memory_info("GPU:0")["peak"])}
    step()
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return {"allocator": int(stats.get("peak_bytes_in_use", 0))}


def child(backend: str, name: str, batch: int, mode: str, optimizer: str, jit: str) -> dict[str, Any]:
    """One case in this process (``KERAS_BACKEND`` already set): the prediction and the measurement."""
    import nnmem

    why = _gpu_ready(backend)
    if why is not None:
        return {"skipped": why}
    est = nnmem.estimate(name, batch=batch, mode=mode, optimizer=optimizer, device="cuda")
    meas = _measure(name, batch, mode, optimizer, backend, {"auto": "auto", "off": False}[jit])
    return {"predicted": {level: int(v) for level, v in est.peaks.items() if level in ("allocator", "reserved")},
            "measured": meas}


def _run_child(backend: str, name: str, batch: int, mode: str, optimizer: str, jit: str) -> dict[str, Any]:
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, __file__, backend, name, str(batch), mode, optimizer, jit], env=env,
                          capture_output=True, text=True, timeout=900)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {done.returncode}: {tail}"}
    return dict(json.loads(lines[-1]))


def validate(models: list[str], batch: int) -> list[dict[str, Any]]:
    """Every backend × model × config, each in its own process; prints a table row per case."""
    rows: list[dict[str, Any]] = []
    header = (f"{'backend':10s} {'model':24s} {'mode':5s} {'jit':4s} {'level':9s} {'predicted':>14s} "
              f"{'measured':>14s} {'err':>8s}")
    print(header)
    print("-" * len(header))
    for backend in BACKENDS:
        jits = ("auto", "off") if backend == "tensorflow" else ("auto",)
        for name in models:
            for mode, optimizer in CONFIGS:
                for jit in jits:
                    out = _run_child(backend, name, batch, mode, optimizer, jit)
                    row = {"backend": backend, "model": name, "mode": mode, "jit": jit, **out}
                    rows.append(row)
                    if "predicted" not in out:
                        print(f"{backend:10s} {name:24s} {mode:5s} {jit:4s} {out.get('skipped') or out.get('error')}")
                        continue
                    for level, measured in out["measured"].items():
                        predicted = out["predicted"].get(level, 0)
                        err = (predicted - measured) / measured if measured else float("nan")
                        print(f"{backend:10s} {name:24s} {mode:5s} {jit:4s} {level:9s} {predicted:>14,} "
                              f"{measured:>14,} {err:>+8.2%}", flush=True)
    return rows


if __name__ == "__main__":
    backend_, name_, batch_, mode_, optimizer_, jit_ = sys.argv[1:7]
    print(json.dumps(child(backend_, name_, int(batch_), mode_, optimizer_, jit_)))
