"""The Keras user surface on whichever backend this process runs: summary, MemoryCheck on real fit calls,
estimate / measure / fit through the public API, and the CLI's .keras loading."""

from __future__ import annotations

import os

import pytest

if os.environ.get("KERAS_BACKEND") not in ("torch", "jax", "tensorflow"):
    pytest.skip("needs KERAS_BACKEND", allow_module_level=True)

import keras
import numpy as np
from click.testing import CliRunner

import nnmem
import nnmem.keras as nk
from nnmem.cli import cli

BACKEND = keras.backend.backend()


def _mlp() -> keras.Model:
    model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10, activation="softmax")],
                             name="classic")
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def _data(n: int = 128) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 256)).astype("float32"), rng.integers(0, 10, n).astype("int32")


class Batches(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        self.count += 1


def test_summary_shows_the_classic_arithmetic_and_both_peaks() -> None:
    lines: list[str] = []
    s = nk.summary(_mlp(), batch_size=32, print_fn=lines.append)
    text = lines[0]
    assert "256·128 + 128 = 32,896" in text and "128·64 + 64 = 8,256" in text and "64·10 + 10 = 650" in text
    assert "Total params: 41,802" in text
    assert s.train is not None and s.train.peak_bytes > s.infer.peak_bytes > 0
    dense = next(r for r in s.rows if r.parameters == 32_896)  # layer names depend on what ran before
    assert dense.parameter_bytes == 32_896 * 4 and dense.output_bytes == 32 * 128 * 4
    assert sum(r.saved_bytes for r in s.rows) > 0 or BACKEND == "jax"  # XLA does not attribute saved bytes


def test_summary_rejects_a_bad_batch_size() -> None:
    with pytest.raises(nnmem.ConfigError, match="batch_size"):
        nk.summary(_mlp(), batch_size=0, print_fn=None)


def test_memory_check_passes_and_logs_measured_next_to_estimated() -> None:
    model, (x, y) = _mlp(), _data()
    logged: list[str] = []
    check = nk.MemoryCheck("1GiB", batch_size=32, print_fn=logged.append)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[check])
    assert check.status == "fits" and check.estimate is not None
    assert any("fits" in line for line in logged)
    if BACKEND in ("torch", "tensorflow"):
        assert check.measured_peak is not None and check.measured_peak > 0
        assert any("measured" in line and "error" in line for line in logged)
    else:
        assert check.measured_peak is None and any("exposes no allocator peak" in line for line in logged)


def test_memory_check_stops_before_the_first_batch() -> None:
    model, (x, y) = _mlp(), _data()
    batches = Batches()
    with pytest.raises(nnmem.BudgetError, match="over the budget"):
        model.fit(x, y, batch_size=32, epochs=1, verbose=0,
                  callbacks=[nk.MemoryCheck("200KiB", batch_size=32, verbose=0), batches])
    assert batches.count == 0
    assert int(model.optimizer.iterations.numpy() if hasattr(model.optimizer.iterations, "numpy")
               else model.optimizer.iterations) == 0


def test_memory_check_warns_near_the_budget() -> None:
    model, (x, y) = _mlp(), _data()
    peak = nnmem.estimate(model, x[:32], target=y[:32]).peak_bytes
    check = nk.MemoryCheck(int(peak / 0.95), batch_size=32, verbose=0)
    with pytest.warns(ResourceWarning, match="close to the budget"):
        model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[check])
    assert check.status == "warn"


def test_memory_check_needs_a_batch_size() -> None:
    model, (x, y) = _mlp(), _data()
    with pytest.raises(nnmem.ConfigError, match="batch_size"):
        model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[nk.MemoryCheck("1GiB", verbose=0)])


def test_explain_answers_for_both_modes() -> None:
    """The curve is fitted from traces at two batches: on TensorFlow each trace builds a named optimizer's update ops
    afresh (scope ``adam_1/``, then ``adam_2/``), the same ops under another number."""
    model, (x, y) = _mlp(), _data()
    explanation = nnmem.explain(model, x[:8], target=y[:8], budget="64MiB", optimizer="adam")
    fits = explanation.train.fit, explanation.infer.fit
    assert fits[0] is not None and fits[1] is not None
    assert fits[1].batch > fits[0].batch > 0
    assert explanation.train.per_sample_bytes > 0 and explanation.infer.per_sample_bytes > 0
    for figures in (explanation.train, explanation.infer):  # the parts add up, read where the answer lies
        assert figures.fit is not None and figures.at_batch == figures.fit.batch
        assert sum(figures.fixed_by_category.values()) == figures.fixed_bytes
        assert sum(figures.per_sample_by_category.values()) == figures.per_sample_bytes
        assert set(figures.fixed_by_category) <= {"parameters", "buffers", "gradients", "optimizer state"}
    params = explanation.infer.fixed_by_category["parameters"]
    assert explanation.train.fixed_by_category.get("gradients", 0) <= explanation.gradient_bytes == params
    # max_batch answers what explain found (training grows faster with the batch than inference, above)
    assert nnmem.max_batch(model, x[:8], target=y[:8], budget="64MiB", optimizer="adam").batch == fits[0].batch


def test_cli_refuses_a_lambda_layer_and_estimates_a_plain_file(tmp_path: object) -> None:
    from pathlib import Path

    folder = Path(str(tmp_path))
    risky = keras.Sequential([keras.Input((8,)), keras.layers.Lambda(lambda t: t * 2), keras.layers.Dense(2)])
    risky.compile("adam", "mse")
    risky.save(folder / "lambda.keras")
    result = CliRunner().invoke(cli, ["estimate", str(folder / "lambda.keras"), "--batch", "4"])
    assert result.exit_code == 2 and "Lambda" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    plain = _mlp()
    plain.save(folder / "plain.keras")
    result = CliRunner().invoke(cli, ["estimate", str(folder / "plain.keras"), "--batch", "16", "--json"])
    assert result.exit_code == 0, result.stderr
    assert '"framework": "keras-' in result.stdout


def test_cli_estimates_a_keras_zoo_model() -> None:
    result = CliRunner().invoke(cli, ["estimate", "keras_mlp", "--batch", "8", "--optimizer", "lion"])
    assert result.exit_code == 0, result.stderr
    assert "lion" in result.stdout and "256·128 + 128" in result.stdout


def test_cli_json_matches_its_schema() -> None:
    """Each backend's estimate in the estimate schema (TensorFlow's with its peak_range)."""
    import json

    from nnmem.schemas import validate

    result = CliRunner().invoke(cli, ["estimate", "keras_mlp", "--json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout, parse_constant=lambda constant: pytest.fail(f"{constant} is not JSON"))
    validate("estimate", data)
    assert data["framework"] == f"keras-{keras.backend.backend()}"
    if keras.backend.backend() == "tensorflow":
        assert "peak_range" in data


def test_optimizer_state_follows_the_keras_optimizer() -> None:
    x, y = _data(16)
    states = {}
    for label, opt in (("sgd", keras.optimizers.SGD()), ("adam", keras.optimizers.Adam()),
                       ("adam_ema", keras.optimizers.Adam(use_ema=True))):
        model = _mlp()
        model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
        report = nnmem.estimate(model, x, target=y)
        states[label] = report.breakdown["optimizer state"]
        assert report.optimizer == label.split("_")[0]
    params = 41_802 * 4
    adam, ema = states["adam"] - states["sgd"], states["adam_ema"] - states["adam"]
    if keras.backend.backend() == "tensorflow":
        # TensorFlow's blocks are BFC chunks: at least the request (256-byte multiples), and a slot that lands in a
        # hole an initializer left gets the whole hole, under twice its size
        assert 2 * params <= adam < 2 * 2 * params and params <= ema < 2 * params
        return
    assert adam == pytest.approx(2 * params, abs=2 * 6 * 256)  # Adam: two slots
    assert ema == pytest.approx(params, abs=6 * 256)  # EMA: one copy each


class _Unregistered(keras.Model):
    def __init__(self) -> None:
        super().__init__()
        self.dense = keras.layers.Dense(2)

    def call(self, x: object) -> object:
        return self.dense(x)


def test_measure_of_an_unregistered_subclassed_model_says_how_to_fix_it() -> None:
    model = _Unregistered()
    model(np.zeros((1, 8), "float32"))
    model.compile("sgd", "mse")
    with pytest.raises(nnmem.MeasureError, match="register_keras_serializable"):
        nnmem.measure(model, np.zeros((4, 8), "float32"), target=np.zeros((4, 2), "float32"))


class _NeedsArgs(keras.Model):
    def __init__(self, table: object) -> None:
        super().__init__()
        self.table = table
        self.dense = keras.layers.Dense(2)

    def call(self, x: object) -> object:
        return self.dense(x)


def test_measure_of_a_model_without_a_config_says_how_to_fix_it_in_one_line() -> None:
    model = _NeedsArgs(object())  # Keras cannot write a config for a constructor argument like this
    model(np.zeros((1, 8), "float32"))
    model.compile("sgd", "mse")
    with pytest.raises(nnmem.MeasureError, match="cannot be sent to the measuring child process") as info:
        nnmem.measure(model, np.zeros((4, 8), "float32"), target=np.zeros((4, 2), "float32"))
    assert "get_config()" in str(info.value) and "\n" not in str(info.value)


def test_measure_of_a_model_file_builds_the_model_in_the_child(tmp_path: object) -> None:
    """A ``file.py:factory`` spec: the file's module exists in this process only, so the factory travels by
    value (it failed with ModuleNotFoundError in the child before)."""
    from pathlib import Path

    path = Path(str(tmp_path)) / "user_model.py"
    path.write_text("import keras\nimport numpy as np\n\ndef factory(batch):\n"
                    "    m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(2)])\n"
                    "    m.compile('sgd', 'mse')\n"
                    "    return m, np.zeros((batch, 8), 'float32'), np.zeros((batch, 2), 'float32')\n")
    measured = nnmem.measure(f"{path}:factory", mode="train", batch=4, timeout_s=240)
    estimated = nnmem.estimate(f"{path}:factory", mode="train", batch=4)
    assert measured.source == "measure" and measured.peak_bytes > 0
    assert estimated.meta["batch"] == measured.meta["batch"] == 4


def test_inference_measure_of_an_untrained_compiled_model_holds_no_optimizer_state() -> None:
    """Keras's pickling builds the optimizer; the child must not count Adam moments the caller's model lacks."""
    model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(1024), keras.layers.Dense(8)])
    model.compile(optimizer="adam", loss="mse")
    x = np.zeros((4, 512), "float32")
    params = 4 * model.count_params()  # 2.1 MB; Adam's two moments would add 4.2 MB
    measured = nnmem.measure(model, x, mode="infer", timeout_s=240)
    assert measured.peak_bytes < params + 2 * params // 2, measured.peak_bytes
    assert model.optimizer.built is False  # the caller's model is untouched


def test_cli_needs_an_input_shape_when_the_model_declares_none(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "model.py"
    path.write_text("import keras\n\ndef factory(batch):\n    m = keras.Sequential([keras.layers.Dense(2)])\n"
                    "    m.compile('sgd', 'mse')\n    return m\n")
    result = CliRunner().invoke(cli, ["estimate", f"{path}:factory", "--batch", "4"])
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "--input-shape" in result.stderr
