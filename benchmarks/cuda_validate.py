"""CUDA allocator validation: measured vs predicted allocated / reserved peaks for the zoo, on a real GPU.

Run on a machine with a CUDA GPU:  python benchmarks/cuda_validate.py [--models mlp,vgg] [--json out.json]
Keras on each backend (torch, jax, tensorflow; ``cuda_validate_keras.py``):
                                   python benchmarks/cuda_validate.py --keras [--models keras_mlp,...]

For each zoo model × (Adam train step, inference) it
  * predicts the step for the GPU with ``nnmem.estimate(name, device="cuda")`` (traced without a GPU:
    the allocated level from the trace's blocks rounded to 512 B plus cuBLAS workspace, the reserved
    level from nnmem's model of PyTorch's CUDACachingAllocator), and
  * measures the same step on the GPU: the model and inputs moved to ``cuda``, 2 warm-up steps (1 for
    inference), ``torch.cuda.reset_peak_memory_stats()``, one step, then ``max_memory_allocated()``
    and ``max_memory_reserved()``.
The caching allocator keeps the warm-up steps' segments, so the measured reserved peak is the steady
state the prediction models. It prints a table with the signed error at both levels and exits 0; on a
machine without CUDA it says so and exits 0, since nothing can be validated there. The numbers it
printed on a lent GPU are committed in ``benchmarks/results/`` with the command that made them.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys

from _common import zoo_parser  # benchmarks/ is the script's directory, first on sys.path

import nnmem
from nnmem import zoo

CONFIGS = (("train", "adam"), ("infer", "sgd"))


def measure_cuda(name: str, batch: int, mode: str, optimizer: str) -> dict[str, int]:
    """Run the zoo model's step on the GPU as nnmem's contract defines it; return the CUDA peaks."""
    import torch

    from nnmem.frontends.pytorch.step import make_optimizer, run_step

    model, inputs, target, loss_fn = zoo.resolve(name)(batch)
    device = torch.device("cuda")
    model = model.to(device)
    inputs = tuple(t.to(device) for t in inputs)
    target = target.to(device) if isinstance(target, torch.Tensor) else target
    if mode == "infer":
        model.eval()
        opt = None
    else:
        model.train()
        opt = make_optimizer(optimizer, [p for p in model.parameters() if p.requires_grad])
    for _ in range(2 if mode == "train" else 1):
        run_step(model, inputs, mode=mode, opt=opt, loss_fn=loss_fn, target=target)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    run_step(model, inputs, mode=mode, opt=opt, loss_fn=loss_fn, target=target)
    torch.cuda.synchronize()
    peaks = {"allocator": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.max_memory_reserved()}
    del model, inputs, target, opt
    torch.cuda.empty_cache()
    return peaks


def main(argv: list[str] | None = None) -> int:
    parser = zoo_parser(__doc__)
    parser.add_argument("--keras", action="store_true",
                        help="validate the Keras zoo on each backend instead (each case in its own process)")
    args = parser.parse_args(argv)
    import torch

    no_gpu = "no CUDA device on this machine: nothing to validate (the CUDA figures stay predicted only)"
    if args.keras:  # a backend with its own GPU build may see the GPU where this torch does not
        if not torch.cuda.is_available() and shutil.which("nvidia-smi") is None:
            print(no_gpu)
            return 0
        import cuda_validate_keras

        models = (args.models.split(",") if "--models" in (argv if argv is not None else sys.argv)
                  else list(cuda_validate_keras.MODELS))
        keras_rows = cuda_validate_keras.validate(models, args.batch)
        if args.json_path:
            with open(args.json_path, "w") as fh:
                json.dump({"rows": keras_rows}, fh, indent=2)
        return 0
    if not torch.cuda.is_available():
        print(no_gpu)
        return 0
    print(f"GPU: {torch.cuda.get_device_name()} · torch {torch.__version__} · batch {args.batch}")
    header = (f"{'model':20s} {'mode':5s} {'pred alloc':>13s} {'meas alloc':>13s} {'err':>8s}"
              f" {'pred reserved':>13s} {'meas reserved':>13s} {'err':>8s}")
    print(header)
    print("-" * len(header))
    rows = []
    for name in args.models.split(","):
        for mode, optimizer in CONFIGS:
            est = nnmem.estimate(name, batch=args.batch, mode=mode, optimizer=optimizer, device="cuda")
            meas = measure_cuda(name, args.batch, mode, optimizer)
            row: dict[str, object] = {"model": name, "mode": mode, "optimizer": optimizer}
            for level in ("allocator", "reserved"):
                row[f"pred_{level}"], row[f"meas_{level}"] = est.peaks[level], meas[level]
                row[f"err_{level}"] = (est.peaks[level] - meas[level]) / meas[level]
            rows.append(row)
            print(f"{name:20s} {mode:5s} {row['pred_allocator']:>13,} {row['meas_allocator']:>13,} "
                  f"{row['err_allocator']:>+8.2%} {row['pred_reserved']:>13,} {row['meas_reserved']:>13,} "
                  f"{row['err_reserved']:>+8.2%}", flush=True)
    for level in ("allocator", "reserved"):
        errs = [abs(float(r[f"err_{level}"])) for r in rows]  # type: ignore[arg-type]
        print(f"{level}: median |err| {statistics.median(errs):.2%}, max {max(errs):.2%} over {len(rows)} cases")
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
