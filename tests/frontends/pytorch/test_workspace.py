"""The workspace rules against real profiler measurements of the same op (never against themselves)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from nnmem.frontends.pytorch.workspace import RULES, lstm_workspace_bytes

_spec = importlib.util.spec_from_file_location(
    "calibrate_workspace", Path(__file__).resolve().parents[3] / "benchmarks" / "calibrate_workspace.py")
assert _spec is not None and _spec.loader is not None
calibrate = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = calibrate
_spec.loader.exec_module(calibrate)

needs_mkldnn = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available() or not torch.backends.cpu.get_cpu_capability().startswith("AVX512"),
    reason="the rules were measured with oneDNN on AVX-512")


def _ops(fn: Any, name: str, *, training: bool) -> list[Any]:
    rows = [r for r in calibrate.measure_ops(fn, training=training) if r.name == name]
    assert rows, f"{name} did not run"
    return rows


def _train_step(module: nn.Module, x: torch.Tensor) -> Any:
    def step() -> None:
        y = module(x)
        y = y[0] if isinstance(y, tuple) else y
        (y * y).sum().backward()
    return step


def _infer_step(module: nn.Module, x: torch.Tensor) -> Any:
    def step() -> None:
        with torch.inference_mode():
            module(x)
    return step


CONVS = [
    ("first layer", lambda: nn.Conv2d(3, 16, 3, padding=1), (4, 3, 16, 16)),
    ("aligned", lambda: nn.Conv2d(16, 32, 3, padding=1), (2, 16, 16, 16)),
    ("unaligned", lambda: nn.Conv2d(20, 20, 3, padding=1), (2, 20, 12, 12)),
    ("small ic", lambda: nn.Conv2d(8, 24, 3, padding=1), (2, 8, 12, 12)),
    ("strided", lambda: nn.Conv2d(16, 32, 3, stride=2, padding=1), (2, 16, 16, 16)),
    ("pointwise", lambda: nn.Conv2d(24, 40, 1), (2, 24, 16, 16)),
    ("no bias", lambda: nn.Conv2d(24, 40, 3, bias=False), (2, 24, 16, 16)),
    ("depthwise", lambda: nn.Conv2d(32, 32, 3, padding=1, groups=32), (2, 32, 16, 16)),
    ("depthwise unaligned", lambda: nn.Conv2d(24, 24, 3, padding=1, groups=24), (2, 24, 16, 16)),
    ("grouped", lambda: nn.Conv2d(32, 64, 3, padding=1, groups=4), (2, 32, 16, 16)),
    ("1-D", lambda: nn.Conv1d(16, 32, 5, padding=2), (2, 16, 100)),
    ("1-D unaligned", lambda: nn.Conv1d(40, 40, 3, padding=1), (2, 40, 100)),
]


@needs_mkldnn
@pytest.mark.parametrize(("label", "make", "shape"), CONVS, ids=[c[0] for c in CONVS])
def test_conv_forward_exact(label: str, make: Any, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    conv, x = make(), torch.randn(*shape)
    (row,) = _ops(_train_step(conv, x), "aten.convolution.default", training=True)
    assert row.predicted == row.scratch
    name = "aten.conv2d.default" if x.dim() == 4 else "aten.conv1d.default"
    (row,) = _ops(_infer_step(conv.eval(), x), name, training=False)
    assert row.predicted == row.scratch


@needs_mkldnn
@pytest.mark.parametrize(("label", "make", "shape"), CONVS, ids=[c[0] for c in CONVS])
def test_conv_backward_within_reduction_scratchpad(label: str, make: Any, shape: tuple[int, ...]) -> None:
    """Reorders are exact; oneDNN's bwd-weights reduction and strided bwd-data scratchpads are not modelled."""
    torch.manual_seed(0)
    conv, x = make(), torch.randn(*shape, requires_grad=True)
    (row,) = _ops(_train_step(conv, x), "aten.convolution_backward.default", training=True)
    assert row.predicted <= row.scratch
    assert row.scratch - row.predicted <= max(0.1 * row.scratch, 64 * 1024)


@needs_mkldnn
def test_conv_transpose_forward() -> None:
    conv, x = nn.ConvTranspose2d(32, 16, 2, stride=2), torch.randn(2, 32, 8, 8)
    (row,) = _ops(_train_step(conv, x), "aten.convolution.default", training=True)
    assert row.predicted <= row.scratch <= row.predicted + 64 * 1024


LSTMS = [(32, 64, 4, 16), (64, 128, 8, 32), (32, 64, 1, 1), (200, 64, 4, 8), (32, 128, 4, 8),
         (10, 20, 3, 7), (100, 256, 2, 5)]  # unaligned sizes: cell states use the plain hidden size


@needs_mkldnn
@pytest.mark.parametrize(("size", "hidden", "batch", "seq"), LSTMS)
def test_lstm_workspace_output_matches_onednn(size: int, hidden: int, batch: int, seq: int) -> None:
    lstm, x = nn.LSTM(size, hidden, 2), torch.randn(seq, batch, size)
    rows = _ops(_train_step(lstm, x), "aten.mkldnn_rnn_layer.default", training=True)
    assert len(rows) == 2
    for row, width in zip(rows, (size, hidden), strict=True):
        assert row.real_sizes[3] == lstm_workspace_bytes(seq, batch, width, hidden)
        assert row.rule_sizes == row.real_sizes
        assert row.predicted == row.scratch


@needs_mkldnn
def test_lstm_fake_kernel_is_corrected() -> None:
    """The fake kernel's workspace is smaller than the real one; the size rule restores the real size."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        lstm, x = nn.LSTM(64, 128, 1), torch.randn(32, 8, 64)
        calls: list[tuple[Any, list[int] | None, list[int]]] = []

        class Spy(torch.utils._python_dispatch.TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                out = func(*args, **(kwargs or {}))
                if func is torch.ops.aten.mkldnn_rnn_layer.default:
                    fake = [t.untyped_storage().nbytes() for t in out]
                    calls.append((func, RULES.output_bytes(func, args, kwargs or {}, out), fake))
                return out

        with Spy():
            lstm(x)
    ((_, sizes, fake),) = calls
    assert sizes is not None and sizes[3] == 2_023_424 > fake[3]


@needs_mkldnn
def test_lstm_backward_and_inference() -> None:
    lstm, x = nn.LSTM(32, 64, 2), torch.randn(16, 4, 32)
    rows = _ops(_train_step(lstm, x), "aten.mkldnn_rnn_layer_backward.default", training=True)
    for row in rows:
        assert abs(row.predicted - row.scratch) <= 0.1 * row.scratch
    (row,) = _ops(_infer_step(lstm, x), "aten.lstm.input", training=False)
    assert abs(row.predicted - row.scratch) <= 0.1 * row.scratch


def test_batch_norm_and_pooling_exact() -> None:
    model, x = nn.Sequential(nn.BatchNorm2d(20), nn.MaxPool2d(2)), torch.randn(4, 20, 16, 16, requires_grad=True)
    step = _train_step(model, x)
    for name in ("aten.native_batch_norm.default", "aten.native_batch_norm_backward.default"):
        (row,) = _ops(step, name, training=True)
        assert row.predicted == row.scratch
    step = _infer_step(model.eval(), x.detach())
    for name in ("aten.batch_norm.default", "aten.max_pool2d.default"):
        (row,) = _ops(step, name, training=False)
        assert row.predicted == row.scratch


def test_transformer_encoder_fast_path() -> None:
    layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
    model, x = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval(), torch.randn(4, 16, 64)
    rows = _ops(_infer_step(model, x), "aten._transformer_encoder_layer_fwd.default", training=False)
    for row in rows:
        assert row.predicted == row.scratch
