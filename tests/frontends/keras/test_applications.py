"""Models our users did not write: keras.applications architectures, estimated and measured on each backend.

The issue's per-case maximum is the limit where it sets one (torch 10 %, TensorFlow 15 %); JAX, whose target is
a median, is held to TensorFlow's 15 % here.

On TensorFlow the step users run (plain ``train_on_batch``: default executor, Grappler on) peaks differently in
each process, and the report gives the range it expects besides ``peak_bytes`` (the construction order's, checked
exactly against the pinned diagnostic in tests/frontends/keras/tensorflow/test_measure.py). A case passes when the
plain peak is within 15 % of ``peak_bytes`` or inside the range; each alone misses a known case (issue 18):
resnet50 train estimates 398.9 MB where plain runs peak at 344-365 MB (Grappler lets each variable's update free
its gradient early: up to +16 %, inside the range 321.7-492.6 MB), and mobilenet_v2 train's plain runs reached
28.8 MB once in 8 processes, above the range's 28.54 MB (BFC chunks not split, a layout that depends on the
setup's holes: docs/backends/keras-tensorflow.md) yet within 15 % of its 27.85 MB.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

import nnmem
from tests.frontends.keras.sampled import ALL

BACKEND = keras.backend.backend()
LIMIT = {"torch": 0.10, "tensorflow": 0.15, "jax": 0.15}[BACKEND]
BATCH = 8


def _mobilenet_v2() -> keras.Model:
    """Depthwise convolutions, BatchNormalization, ReLU6 and inverted residual adds (~0.4 M parameters)."""
    return keras.applications.MobileNetV2(input_shape=(64, 64, 3), alpha=0.35, weights=None, classes=10)


def _resnet50() -> keras.Model:
    """Bottleneck blocks with BatchNormalization and residual adds (~23.6 M parameters)."""
    return keras.applications.ResNet50(input_shape=(32, 32, 3), weights=None, classes=10)


APPS = {"mobilenet_v2": _mobilenet_v2, "resnet50": _resnet50}

SLOW = {("tensorflow", "resnet50", "train"): 90, ("tensorflow", "mobilenet_v2", "train"): 61,
        ("tensorflow", "resnet50", "infer"): 22, ("jax", "resnet50", "train"): 70, ("jax", "mobilenet_v2", "train"): 85,
        ("jax", "resnet50", "infer"): 35, ("jax", "mobilenet_v2", "infer"): 60}
"""Cases left out of ``make test`` (seconds each on 2 cores), for CI's 30 minutes: with the two resnet50 training
cases out, clean-clone runs on an AVX2 host took 1,674 and 1,878 s; with all but TensorFlow's resnet50 one,
1,973 s. JAX's resnet50 inference made room for the Eigen contraction tests of stop 43 (keras_two_branch_cnn's
range in three processes, now run on AVX2 too); TensorFlow's resnet50 inference for the TensorFlow range and kernel
tests of stop 44 (a clean-clone run with them took 1,662 s on a loaded host); JAX's mobilenet_v2 inference (60 s on
a host where the whole CI took over 30 minutes) went with fewer TensorFlow processes in the range, accumulation and
policy tests. XLA compiles a JAX step in the
estimate and again in the measuring child; TensorFlow's estimate replays some 70 executor orders. torch runs all
four."""


@pytest.mark.accuracy
@pytest.mark.parametrize("mode", ["train", "infer"])
@pytest.mark.parametrize("name", list(APPS))
def test_application_estimate_matches_measurement(name: str, mode: str) -> None:
    slow = SLOW.get((BACKEND, name, mode))
    if slow is not None and not ALL:
        pytest.skip(f"{name} {mode} on {BACKEND} takes {slow} s on 2 cores, past CI's time: set "
                    "NNMEM_ACCURACY_ALL=1; benchmarks/applications.py measures it (docs/accuracy.md)")
    model = APPS[name]()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    x = np.zeros((BATCH, *model.input_shape[1:]), "float32")
    y = np.zeros((BATCH,), "int32") if mode == "train" else None
    estimated = nnmem.estimate(model, x, target=y, mode=mode)
    measured = nnmem.measure(model, x, target=y, mode=mode, timeout_s=300)
    error = (estimated.peak_bytes - measured.peak_bytes) / measured.peak_bytes
    print(f"\n{name} {mode} on {BACKEND}: estimated {estimated.peak_bytes:,} B, measured {measured.peak_bytes:,} B "
          f"({error:+.2%}; range {estimated.peak_range})")  # pytest -s shows the figures
    inside = False
    if BACKEND == "tensorflow":
        assert measured.meta["schedule"] == "plain"
        assert estimated.peak_range is not None
        inside = estimated.peak_range[0] <= measured.peak_bytes <= estimated.peak_range[1]
    assert abs(error) <= LIMIT or inside, (
        f"{name} {mode} on {BACKEND}: estimated {estimated.peak_bytes:,} B (range {estimated.peak_range}), "
        f"measured {measured.peak_bytes:,} B ({error:+.1%})")
    assert estimated.parameter_count == model.count_params()
