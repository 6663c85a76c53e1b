"""Keras steps on a catalog GPU, on this process's backend: the memory each backend's allocator may use there (the
frameworks' own rules), the answers of fit / explain / estimate with their "modelled" note, and clear refusals.

No GPU is needed: the GPU figures are modelled; the allocator models they rest on are checked against sequences
whose outcome the frameworks' sources fix (tests/allocators/test_bfc.py, tests/test_cuda.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import keras
import pytest
from click.testing import CliRunner, Result

import nnmem
from nnmem.cli import cli
from nnmem.devices import get_device
from nnmem.errors import UnsupportedError
from nnmem.frontends.keras.gpu import MODELLED, jax_memory_limit, keras_gpu, tf_memory_limit
from nnmem.schemas import validate

BACKEND = keras.backend.backend()
MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("free_mib", "cc", "reserve_mib"), [
    (15_060, (7, 5), 1050), (81_520, (8, 0), 1536), (81_059, (9, 0), 1800), (10_000, (6, 1), 500),
    (1_500, (8, 6), 225)])
def test_tensorflow_leaves_the_system_its_reserve(free_mib: int, cc: tuple[int, int], reserve_mib: int) -> None:
    """gpu_device.cc, MinSystemMemory: by compute capability, 225 MiB when under 2 GiB is free."""
    assert tf_memory_limit(free_mib * MiB, cc, env={}) == (free_mib - reserve_mib) * MiB


def test_tensorflow_reserve_from_the_environment() -> None:
    assert tf_memory_limit(15_000 * MiB, (7, 5), env={"TF_DEVICE_MIN_SYS_MEMORY_IN_MB": "500"}) == 14_500 * MiB
    # a reserve above the free memory is ignored (gpu_device.cc warns and keeps its own)
    assert tf_memory_limit(1_000 * MiB, (7, 5), env={"TF_DEVICE_MIN_SYS_MEMORY_IN_MB": "5000"}) == 775 * MiB


def test_jax_preallocates_a_share_of_total_memory() -> None:
    assert jax_memory_limit(16 << 30, env={}) == 12 << 30
    assert jax_memory_limit(16 << 30, env={"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"}) == 8 << 30
    assert jax_memory_limit(16 << 30, env={"XLA_CLIENT_MEM_FRACTION": ".25"}) == 4 << 30


def test_environment_switches_growth_and_pooling() -> None:
    assert keras_gpu("T4", "tensorflow", env={"TF_FORCE_GPU_ALLOW_GROWTH": "true"}).growth  # type: ignore[union-attr]
    assert not keras_gpu("T4", "tensorflow", env={}).growth  # type: ignore[union-attr]
    assert keras_gpu("T4", "jax", env={"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}).growth  # type: ignore[union-attr]
    assert not keras_gpu("T4", "jax", env={"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}).pooled  # type: ignore[union-attr]
    assert keras_gpu("cpu", "jax") is None
    assert keras_gpu("cuda", "tensorflow").limit is None  # type: ignore[union-attr]  # memory unknown


def _limit(device: str) -> int:
    found = get_device(device)
    free = found.memory_bytes - found.context_bytes
    if BACKEND == "tensorflow":
        return tf_memory_limit(free, found.compute_capability or (8, 0))
    if BACKEND == "jax":
        return jax_memory_limit(found.memory_bytes)
    return free


@pytest.fixture(scope="module")
def t4_fits() -> nnmem.Fits:
    """keras_mlp's largest batches on a T4, both modes (searched once for the tests below)."""
    return nnmem.fit("keras_mlp", device="T4")


def test_fit_on_a_catalog_gpu_answers_within_the_backends_limit(t4_fits: nnmem.Fits) -> None:
    assert t4_fits.budget_bytes == _limit("T4")
    assert t4_fits.level == ("reserved" if BACKEND == "torch" else "allocator")
    assert MODELLED in t4_fits.notes
    for mode in ("train", "infer"):
        found = t4_fits[mode]
        assert found.batch > 0 and found.peak_bytes <= _limit("T4") < found.next_peak_bytes
    assert t4_fits["infer"].batch > t4_fits["train"].batch
    validate("fit", t4_fits.to_dict())


def test_an_a100_budget_is_the_backends_share_of_it() -> None:
    from nnmem.frontends.base import StepRequest
    from nnmem.frontends.keras.frontend import FRONTEND

    assert FRONTEND.device_budget(StepRequest(model="keras_mlp", device="A100-80GB")) == (
        _limit("A100-80GB"), "reserved" if BACKEND == "torch" else "allocator")


def test_explain_on_a_gpu_says_its_figures_are_modelled() -> None:
    exp = nnmem.explain("keras_mlp", device="T4")
    assert exp.budget_bytes == _limit("T4") and MODELLED in exp.notes
    assert exp.train.fit is not None and exp.infer.fit is not None and exp.batch_ratio is not None
    validate("explain", exp.to_dict())


def test_estimate_on_a_gpu_drops_the_cpu_kernels_scratch() -> None:
    """The GPU step has no oneDNN scratch: no op's workspace, whatever the CPU trace has."""
    report = nnmem.estimate("keras_two_branch_cnn", batch=8, device="A100-80GB")
    assert report.device == "A100-80GB" and MODELLED in report.notes
    if BACKEND == "torch":  # PyTorch's caching allocator: whole segments reserved
        assert report.peaks["reserved"] >= report.peaks["allocator"] and report.peaks["reserved"] % (2 * MiB) == 0
    else:
        assert report.breakdown.get("kernel workspace", 0) == 0


def test_a_bare_cuda_device_is_estimated_and_a_tpu_refused() -> None:
    assert nnmem.estimate("keras_mlp", batch=8, device="cuda").device == "cuda"
    with pytest.raises(UnsupportedError, match="tpu"):
        nnmem.estimate("keras_mlp", batch=8, device="TPU-v5e")


def _cli(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def test_cli_estimate_on_a_gpu_prints_the_note_and_measure_refuses() -> None:
    done = _cli("estimate", "keras_mlp", "--device", "T4", "--batch", "8", "--json")
    assert done.exit_code == 0, done.output
    out = json.loads(done.stdout)
    assert out["device"] == "T4" and MODELLED in out["notes"]
    refused = _cli("measure", "keras_mlp", "--device", "T4")
    assert refused.exit_code == 2 and "Traceback" not in refused.stderr
    assert "measures CPU steps only" in refused.stderr


def test_the_validation_script_skips_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    if BACKEND == "torch":  # the parent script is the same on every backend: checked once, in its own process
        done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cuda_validate.py"), "--keras"],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert done.returncode == 0 and "no CUDA device" in done.stdout
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import cuda_validate_keras  # one case on this backend, as its child process runs it

    assert cuda_validate_keras.child(BACKEND, "keras_mlp", 8, "train", "adam", "auto")["skipped"]


def test_memory_check_on_a_gpu_uses_the_backends_limit_and_stops_an_oversized_batch(t4_fits: nnmem.Fits) -> None:
    from nnmem.errors import BudgetError
    from nnmem.keras import MemoryCheck
    from nnmem.zoo.keras_models import FACTORIES

    model, x, y, loss = FACTORIES["keras_mlp"](16)
    model.compile(optimizer="adam", loss=loss)
    check = MemoryCheck(batch_size=16, device="T4", verbose=0)
    check.set_model(model)
    check.on_train_begin()
    assert check.budget == _limit("T4") and check.status == "fits"
    assert check.estimate is not None and MODELLED in check.estimate.notes
    largest = t4_fits["train"].batch
    over = MemoryCheck(batch_size=largest + 1, device="T4", verbose=0)
    over.set_model(model)
    with pytest.raises(BudgetError):
        over.on_train_begin()


def test_an_unknown_gpu_name_is_a_one_line_error() -> None:
    done = _cli("fit", "keras_mlp", "--device", "RTX-9999")
    assert done.exit_code == 2 and "Traceback" not in done.stderr and "RTX-9999" in done.stderr


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow's XLA step")
def test_tensorflow_on_a_gpu_is_the_xla_step_keras_compiles_there(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keras compiles with XLA when TensorFlow sees a GPU: the step's HLO aliases every updated variable to its
    input (TensorFlow's resource-update aliasing), so the step adds XLA's temporaries, not a second copy of the
    weights and the optimizer's slots; NNMEM_TF_GPU_STEP=graph estimates the graph executor's step instead."""
    from nnmem.frontends.keras.gpu import TF_STEP_ENV

    report = nnmem.estimate("keras_mlp", batch=64, device="T4", optimizer="adam")
    meta = report.meta
    assert str(meta["executor"]).startswith("XLA")
    trainable = int(meta["trainable_bytes"])  # type: ignore[call-overload]
    assert int(meta["xla.alias_bytes"]) >= 3 * trainable  # type: ignore[call-overload]  # weights, Adam's m and v
    assert int(meta["xla.output_bytes"]) - int(meta["xla.alias_bytes"]) < trainable  # type: ignore[call-overload]
    monkeypatch.setenv(TF_STEP_ENV, "graph")
    graph = nnmem.estimate("keras_mlp", batch=64, device="T4")
    assert "peak_high" in graph.meta and any("graph executor's step" in n for n in graph.notes)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow's virtual devices")
def test_tensorflow_virtual_devices_set_or_refuse_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A memory_limit the process gave its GPU replaces TensorFlow's default; a split into several virtual
    devices (each with its own allocator) is refused with the reason."""
    import tensorflow as tf

    gpu0 = tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [gpu0] if kind == "GPU" else [])
    one = [tf.config.LogicalDeviceConfiguration(memory_limit=4096)]
    monkeypatch.setattr(tf.config, "get_logical_device_configuration", lambda device: one)
    fits = nnmem.fit("keras_mlp", device="T4", modes=("infer",))
    assert fits.budget_bytes == 4096 << 20
    one.append(tf.config.LogicalDeviceConfiguration(memory_limit=4096))
    with pytest.raises(UnsupportedError, match="2 virtual devices"):
        nnmem.estimate("keras_mlp", batch=8, device="T4")
