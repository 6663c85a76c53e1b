"""The workspace rules against real profiler measurements of the same op (never against themselves).

The kernel paths depend on the CPU; run this file under caps too (``ONEDNN_MAX_CPU_ISA=AVX2
ATEN_CPU_CAPABILITY=avx2``, ``ONEDNN_MAX_CPU_ISA=AVX512_CORE``): each test checks the paths this CPU takes.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import calibrate_workspace as calibrate
import pytest
import torch
from torch import nn

from nnmem import cpu
from nnmem.frontends.pytorch.workspace import (
    RULES,
    WorkspaceRules,
    conv_backend,
    conv_call,
    lstm_workspace_bytes,
    note_for,
)
from nnmem.frontends.pytorch.workspace.matmul import MODELLED_THREADS

HOST = cpu.describe()
needs_mkldnn = pytest.mark.skipif(not torch.backends.mkldnn.is_available() or HOST.isa == "unknown",
                                  reason="needs a build with oneDNN on an x86 CPU")


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
    """The U-Net's up-sampling shape: exact on AVX-512 and AVX2 (nhwc ``brgconv_strided``, workspace/conv_transpose.py
    and conv_transpose_avx2.py); below AVX2 the op says it is not modelled (a note)."""
    conv, x = nn.ConvTranspose2d(32, 16, 2, stride=2), torch.randn(2, 32, 8, 8)
    (row,) = _ops(_train_step(conv, x), "aten.convolution.default", training=True)
    if HOST.onednn_block == 16 or HOST.isa_at_least("avx2"):
        assert row.note is None and row.predicted == row.scratch
    else:
        assert row.note is not None


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


# ---- the kernel ATen picks, and the paths that depend on the CPU ---------------------------------------
def _aten_backend(x: torch.Tensor, w: torch.Tensor, stride: list[int], padding: list[int], dilation: list[int],
                  transposed: bool, output_padding: list[int], groups: int) -> str:
    chosen = torch._C._select_conv_backend(x, w, None, stride, padding, dilation, transposed, output_padding, groups,
                                           None)
    names = {8: "mkldnn", 9: "mkldnn_transpose", 11: "nnpack", 13: "slow2d", 14: "slow3d", 15: "slow_dilated2d",
             16: "slow_dilated3d", 17: "slow_transpose2d", 18: "slow_transpose3d"}
    return names.get(int(chosen), str(chosen))  # type: ignore[call-overload]


BACKEND_CASES = [  # (input shape, weight shape, stride, padding, dilation, transposed, groups)
    ((4, 16, 12, 12), (32, 16, 3, 3), 1, 1, 1, False, 1),
    ((1, 16, 12, 12), (32, 16, 3, 3), 1, 1, 1, False, 1),  # batch 1, small: ATen's own kernel in float32
    ((1, 16, 12, 12), (32, 16, 1, 1), 1, 0, 1, False, 1),
    ((1, 64, 64, 64), (8, 64, 3, 3), 1, 1, 1, False, 1),  # batch 1 but large: oneDNN in float32
    ((4, 16, 12, 12), (16, 1, 3, 3), 1, 1, 1, False, 16),
    ((4, 16, 12, 12), (32, 4, 3, 3), 2, 1, 1, False, 4),
    ((4, 16, 12, 12), (16, 16, 3, 3), 1, 2, 2, False, 1),
    ((4, 16, 6, 6), (16, 8, 2, 2), 2, 0, 1, True, 1),
    ((4, 16, 50), (32, 16, 5), 1, 2, 1, False, 1),
    ((2, 8, 4, 6, 6), (8, 8, 3, 3, 3), 1, 1, 1, False, 1),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("case", BACKEND_CASES, ids=[f"{c[0]}x{c[1]}" for c in BACKEND_CASES])
def test_conv_backend_is_atens_choice(case: tuple[Any, ...], dtype: torch.dtype) -> None:
    """conv_backend, keyed on nnmem.cpu's ISA, picks the kernel ATen picks on this CPU under its caps."""
    x_shape, w_shape, stride, padding, dilation, transposed, groups = case
    x, w = torch.zeros(x_shape, dtype=dtype), torch.zeros(w_shape, dtype=dtype)
    dims = len(x_shape) - 2
    call = conv_call(x, w, stride, padding, dilation, transposed, 0, groups)
    assert call is not None
    aten = _aten_backend(x, w, [stride] * dims, [padding] * dims, [dilation] * dims, transposed, [0] * dims, groups)
    assert conv_backend(call, HOST) == aten


SLOW_CONVS = [
    ("3x3", lambda: nn.Conv2d(16, 32, 3, padding=1), (4, 16, 16, 16)),
    ("first layer", lambda: nn.Conv2d(3, 32, 3, padding=1), (4, 3, 32, 32)),
    ("strided", lambda: nn.Conv2d(16, 32, 3, stride=2, padding=1), (2, 16, 16, 16)),
    ("pointwise", lambda: nn.Conv2d(24, 40, 1), (2, 24, 16, 16)),
    ("no bias", lambda: nn.Conv2d(20, 20, 3, padding=1, bias=False), (2, 20, 12, 12)),
    ("depthwise", lambda: nn.Conv2d(32, 32, 3, padding=1, groups=32), (2, 32, 16, 16)),
    ("grouped", lambda: nn.Conv2d(32, 64, 3, padding=1, groups=4), (2, 32, 16, 16)),
    ("1-D", lambda: nn.Conv1d(16, 32, 5, padding=2), (2, 16, 100)),
    ("batch 1", lambda: nn.Conv2d(16, 32, 3, padding=1), (1, 16, 16, 16)),
    # Keras on torch hands the kernel channels-last tensors in training (NHWC permuted to NCHW)
    ("channels-last", lambda: nn.Conv2d(16, 32, 3, padding=1), (4, 16, 16, 16)),
    ("channels-last grouped", lambda: nn.Conv2d(32, 64, 3, padding=1, groups=4), (2, 32, 16, 16)),
]


def _slow2d_dtypes() -> list[torch.dtype]:
    """The dtypes whose convolutions run on ATen's im2col kernel on this CPU (bfloat16/float16 without oneDNN
    support for the type; float32 only for the small batch-1 case)."""
    return [d for d in (torch.float16, torch.bfloat16, torch.float32)
            if not (d is torch.bfloat16 and HOST.onednn_bf16) and not (d is torch.float16 and HOST.onednn_fp16)]


@pytest.mark.parametrize(("label", "make", "shape"), SLOW_CONVS, ids=[c[0] for c in SLOW_CONVS])
def test_slow2d_forward_and_backward_exact(label: str, make: Any, shape: tuple[int, ...]) -> None:
    """im2col columns, group slices and the float32 sum buffer of grad_bias, against the profiler."""
    checked = 0
    for dtype in _slow2d_dtypes():
        torch.manual_seed(0)
        conv, x = make().to(dtype), torch.randn(*shape, dtype=dtype)
        if label.startswith("channels-last"):
            conv = conv.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
            x = x.contiguous(memory_format=torch.channels_last)
        call = conv_call(x, conv.weight, conv.stride, conv.padding, conv.dilation, False, 0, conv.groups)
        if call is None or conv_backend(call, HOST) != "slow2d":
            continue
        train = _ops(_train_step(conv, x.requires_grad_()), "aten.convolution.default", training=True)
        backward = _ops(_train_step(conv, x), "aten.convolution_backward.default", training=True)
        name = "aten.conv2d.default" if x.dim() == 4 else "aten.conv1d.default"
        infer = _ops(_infer_step(conv.eval(), x.detach()), name, training=False)
        for (row,) in (train, backward, infer):
            assert row.predicted == row.scratch > 0 or label == "pointwise", (dtype, row)
            assert row.predicted == row.scratch, (dtype, row)
        checked += 1
    if not checked:
        pytest.skip(f"no dtype of this case runs on ATen's im2col kernel on {HOST.model} ({HOST.isa})")


def _synthetic(isa: str) -> cpu.CpuInfo:
    return cpu.CpuInfo(model="test", arch="x86_64", flags=(), isa=isa)


def test_notes_follow_the_isa() -> None:
    """A reduced-precision convolution or matmul is modelled where it runs on ATen's kernels and carries a note
    where oneDNN runs it; float32 carries none."""
    conv, mm = torch.ops.aten.convolution.default, torch.ops.aten.mm.default
    for dtype, supported_on in ((torch.bfloat16, "avx512_core"), (torch.float16, "avx512_core_fp16")):
        x, w = torch.zeros(4, 16, 8, 8, dtype=dtype), torch.zeros(32, 16, 3, 3, dtype=dtype)
        args = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        assert note_for(conv, args, {}, _synthetic("avx2")) is None
        note = note_for(conv, args, {}, _synthetic(supported_on))
        assert note is not None and note.startswith(f"{str(dtype)[6:]} convolution through oneDNN")
        a, b = torch.zeros(64, 64, dtype=dtype), torch.zeros(64, 64, dtype=dtype)
        assert note_for(mm, (a, b), {}, _synthetic(supported_on)) is not None
        assert note_for(mm, (a[:4, :4], b[:4, :4]), {}, _synthetic(supported_on)) is None  # below 16^3: ATen's gemm
        assert note_for(mm, (a, b), {}, _synthetic("avx2")) is None
    x, w = torch.zeros(4, 16, 8, 8), torch.zeros(32, 16, 3, 3)
    for isa in ("avx2", "avx512_core_bf16", "avx512_core_amx"):
        assert note_for(conv, (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), {}, _synthetic(isa)) is None
    dilated = note_for(conv, (x.half(), w.half(), None, [1, 1], [2, 2], [2, 2], False, [0, 0], 1), {},
                       _synthetic("avx2"))
    assert dilated is None  # ATen's dilated kernel: modelled (workspace/conv_native.py)
    w_t = torch.zeros(16, 32, 3, 3)  # a transposed convolution's weight: (in, out, kh, kw)
    transposed = note_for(conv, (x.half(), w_t.half(), None, [1, 1], [0, 0], [1, 1], True, [0, 0], 1), {},
                          _synthetic("avx2"))
    assert transposed is None  # ATen's transposed kernel: modelled in any floating type (workspace/conv_transpose.py)
    x3, w3 = torch.zeros(1, 16, 4, 4, 4).half(), torch.zeros(16, 32, 3, 3, 3).half()
    transposed_3d = note_for(conv, (x3, w3, None, [1, 1, 1], [0, 0, 0], [1, 1, 1], True, [0, 0, 0], 1), {},
                             _synthetic("avx2"))
    assert transposed_3d is not None and "slow_transpose3d" in transposed_3d


def test_rules_collect_notes_of_a_trace() -> None:
    """A fake trace with fresh rules lists the unmodelled paths it met, once each; float32 meets none."""
    from nnmem.frontends.pytorch.step import trace_fake_step

    def notes(dtype: torch.dtype, isa: str) -> tuple[str, ...]:
        model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.Flatten(),
                              nn.Linear(8 * 12 * 12, 64)).to(dtype)
        rules = WorkspaceRules(_synthetic(isa))
        trace_fake_step(model, (torch.zeros(4, 3, 16, 16, dtype=dtype),), mode="train", optimizer="sgd",
                        loss_fn=None, target=None, rules=rules)
        return rules.notes

    assert notes(torch.float32, "avx512_core_amx") == ()
    assert notes(torch.bfloat16, "avx2") == ()
    bf16 = notes(torch.bfloat16, "avx512_core_amx_fp16")  # AMX-FP16: neither kernel's scratch is modelled
    assert [n.split(" (")[0] for n in bf16] == ["bfloat16 convolution through oneDNN", "bfloat16 matmul through oneDNN"]
    if torch.get_num_threads() in MODELLED_THREADS:  # the brgemm matmul's scratchpad is modelled on these two
        # the first layer's weights' gradient (3 -> 8 channels) runs gemm:jit on avx512_core_bf16 (conv_gemm_bf16);
        # on AMX the dense unit-stride forwards and backwards are sized (conv_bf16_amx, conv_bf16_amx_bwd)
        assert notes(torch.bfloat16, "avx512_core_bf16") == ()
        assert notes(torch.bfloat16, "avx512_core_amx") == ()


@needs_mkldnn
@pytest.mark.skipif(not HOST.isa_at_least("avx512_core"), reason="needs an AVX-512 CPU to cap at AVX2")
def test_onednn_block_follows_the_isa_cap() -> None:
    """Under ONEDNN_MAX_CPU_ISA=AVX2 oneDNN's blocked layouts shrink to 8 channels while ATen stays AVX-512:
    the rule follows oneDNN's ISA (a child process, since oneDNN reads the cap once)."""
    import os
    import subprocess

    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import torch, calibrate_workspace as cal\n"
        "conv, x = torch.nn.Conv2d(20, 20, 3, padding=1), torch.randn(2, 20, 12, 12)\n"
        "(row,) = [r for r in cal.measure_ops(lambda: conv(x), training=True) if 'convolution' in r.name]\n"
        "print(row.predicted, row.scratch, torch.backends.cpu.get_cpu_capability())\n")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    here = str(Path(__file__).resolve().parents[3] / "benchmarks")
    done = subprocess.run([sys.executable, "-c", script, here], env=env,
                          capture_output=True, text=True, timeout=300, check=True)
    predicted, measured, aten = done.stdout.split()
    assert predicted == measured and aten == HOST.aten
    (row,) = _ops(_train_step(nn.Conv2d(20, 20, 3, padding=1), torch.randn(2, 20, 12, 12)),
                  "aten.convolution.default", training=True)
    assert row.scratch != int(measured)  # the AVX-512 layout differs, so the cap is what the rule followed


@needs_mkldnn
def test_strided_1d_input_is_made_contiguous_first() -> None:
    """``_convolution`` makes a strided 1-D input contiguous before either kernel, and keeps the copy live."""
    for dtype in dict.fromkeys((torch.float32, *_slow2d_dtypes())):
        conv = nn.Conv1d(16, 32, 5, padding=2).to(dtype).eval()
        x = torch.randn(2, 100, 16, dtype=dtype).transpose(1, 2)
        (row,) = _ops(_infer_step(conv, x), "aten.conv1d.default", training=False)
        assert row.predicted == row.scratch >= 2 * 16 * 100 * x.element_size(), (dtype, row)


def test_per_core_cache_counts_cores_not_smt_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN's ``get_per_core_cache_size`` divides a cache by the cores sharing it (xbyak counts an SMT core's
    threads once): a 2 MiB L2 shared by cpu0 and its SMT sibling cpu2 is 2 MiB per core; a 32 MiB L3 over four
    CPUs on two cores is 16 MiB; a level sysfs does not list falls back to oneDNN's guess."""
    from nnmem.frontends.pytorch.workspace import _common

    for number, core in ((0, 0), (1, 1), (2, 0), (3, 1)):
        topology = tmp_path / f"cpu{number}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text("0\n")
        (topology / "core_id").write_text(f"{core}\n")
    for index, (level, kind, size, shared) in enumerate(((2, "Unified", "2048K", "0,2"),
                                                         (3, "Unified", "32M", "0-3"))):
        cache = tmp_path / "cpu0" / "cache" / f"index{index}"
        cache.mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
            (cache / name).write_text(f"{value}\n")
    monkeypatch.setattr(_common, "_SYS_CPU", tmp_path)
    uncached = _common.per_core_cache.__wrapped__
    assert uncached(2) == 2 << 20
    assert uncached(3) == 16 << 20
    assert uncached(1) == 32 * 1024
