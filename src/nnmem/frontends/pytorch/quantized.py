"""Dynamic int8 quantization of linear layers (``torch.ao.quantization.quantize_dynamic``), as it sits in memory.

``quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)`` replaces each ``nn.Linear`` by a dynamically quantized
one whose weight lives in FBGEMM's packed form (aten/src/ATen/native/quantized/cpu/qlinear_prepack.cpp
``PackedLinearWeight::prepack``): a ``fbgemm::PackBMatrix<int8_t>`` of ``ceil(K / KCB)`` by ``ceil(N / NCB)``
blocks of ``KCB x NCB`` bytes (K inputs, N outputs, blocking from include/fbgemm/PackingTraits-inl.h for the
instruction set FBGEMM picks), the weight's column sums (``col_offsets``, N int32), its scales and zero points
(one each, or N each per channel) and the float32 bias. The packed matrix and the vectors are allocated by FBGEMM
and the C++ standard library, outside PyTorch's allocator: the profiler and ``torch.cuda``-style statistics
never see them, which is why a quantized model seems to need no weights at all. The estimate counts them as the
module's parameters (:func:`packed_bytes`); a measurement counts them with the malloc counter
(:func:`measure_packed`).

What-if traces use :func:`quantized`: each ``nn.Linear`` becomes a :class:`TracedDynamicLinear` holding meta
tensors of the packed sizes and calling ``nnmem::dynamic_int8_linear``, an op with the real kernel's output
whose scratch the workspace rules give (:mod:`nnmem.frontends.pytorch.workspace.quantized`). A real model is never
quantized to estimate it (its weights may be fake or on the meta device). :func:`apply_quantization` quantizes for
real. Inference only: the quantized modules have no backward.
"""

from __future__ import annotations

import gc
import warnings
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import register_flop_formula

from nnmem.cpu import CpuInfo
from nnmem.errors import ConfigError, UnsupportedError

__all__ = ["Blocking", "TracedDynamicLinear", "apply_quantization", "fbgemm_blocking", "measure_packed",
           "packed_biases", "packed_bytes", "packed_threads_note", "packed_modules", "quantization_targets",
           "quantized", "register_packed", "thread_range", "unmodelled_note"]


@dataclass(frozen=True, slots=True)
class Blocking:
    """FBGEMM's int8 cache blocking (``PackingTraits<int8_t, int32_t, ISA>``) for the instruction set it picks.

    Attributes:
        isa: FBGEMM's instruction set, e.g. "avx512_vnni".
        kcb, ncb: a packed weight block is ``kcb x ncb`` bytes (rows are inputs, columns outputs).
        mcb: rows of the input block each thread quantizes and packs (``PackAWithQuantRowOffset``).
    """

    isa: str
    kcb: int
    ncb: int
    mcb: int

    @property
    def per_thread(self) -> int:
        """Bytes each thread's ``PackAWithQuantRowOffset`` allocates in a forward: its ``mcb x kcb`` uint8 block
        and ``mcb`` int32 row offsets (fbgemm src/PackAWithQuantRowOffset.cc)."""
        return self.mcb * self.kcb + 4 * self.mcb


_BLOCKINGS = (  # fbgemmInstructionSet() order: the first whose flags the CPU has
    ({"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni"}, Blocking("avx512_vnni", 512, 48, 384)),
    ({"avx512f", "avx512bw", "avx512dq", "avx512vl"}, Blocking("avx512", 256, 32, 56)),
    ({"avx2", "fma"}, Blocking("avx2", 512, 8, 120)),
)


def fbgemm_blocking(info: CpuInfo) -> Blocking | None:
    """The blocking FBGEMM uses on this CPU (from its flags, as FBGEMM reads cpuinfo), or None where FBGEMM does not
    run (no AVX2: "Your CPU does not support FBGEMM")."""
    flags = set(info.flags)
    for needed, blocking in _BLOCKINGS:
        if needed <= flags:
            return blocking
    return None


def _dynamic_linear_type() -> type[nn.Module]:
    from torch.ao.nn.quantized.dynamic import Linear

    return Linear  # type: ignore[no-any-return]


def packed_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(path, module) of the dynamically quantized linear layers (packed weights) and their stand-ins."""
    kinds = (_dynamic_linear_type(), TracedDynamicLinear)
    return [(path, m) for path, m in model.named_modules() if isinstance(m, kinds)]


def _unpacked(module: nn.Module) -> tuple[bool, torch.Tensor | None]:
    """(per-channel scales?, the float32 bias tensor) of a packed layer, read outside any fake mode (the packed
    params are a C++ object: unpacking them under FakeTensorMode fails)."""
    if isinstance(module, TracedDynamicLinear):
        return False, module.bias
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        weight, bias = module._weight_bias()  # type: ignore[operator]
    return weight.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric), bias


def packed_bytes(in_features: int, out_features: int, blocking: Blocking, *, per_channel: bool = False) -> int:
    """Bytes FBGEMM's ``PackedLinearWeight`` holds outside PyTorch's allocator: the packed int8 blocks, the int32
    column offsets and the scales and zero points (the float32 bias is a tensor: counted apart)."""
    blocks = -(-in_features // blocking.kcb) * -(-out_features // blocking.ncb)
    return blocks * blocking.kcb * blocking.ncb + 4 * out_features + 8 * (out_features if per_channel else 1)


def packed_threads_note(blocking: Blocking) -> str:
    """What the estimate assumes of FBGEMM's per-thread input blocks, for a report's notes."""
    threads = torch.get_num_threads()
    return (f"dynamically quantized layers: each of the {threads} threads packs its input into a "
            f"{blocking.per_thread:,} B block (FBGEMM, {blocking.isa}); the peak counts them all at once, the "
            f"range's low end one per layer (threads that do not overlap, as in small steps)")


def unmodelled_note(model: nn.Module) -> str | None:
    """A report note for quantized modules other than the dynamic linear layer (quantized LSTM/GRU, static
    quantization): their packed weights also live outside PyTorch's allocator, and no rule counts them."""
    kinds = sorted({type(m).__name__ for m in model.modules()
                    if type(m).__module__.startswith("torch.ao.nn.quantized")
                    and not isinstance(m, _dynamic_linear_type())
                    and type(m).__name__ not in ("LinearPackedParams", "PackedParameter")})  # inside their owners
    if not kinds:
        return None
    return (f"quantized modules ({', '.join(kinds)}): their packed weights and kernel buffers live outside "
            f"PyTorch's allocator and are not modelled; the allocator level may be higher")


PACKED_OPS = ("quantized.linear_dynamic.default", "nnmem.dynamic_int8_linear.default")


def thread_range(trace: Any, blocking: Blocking) -> tuple[int, int] | None:
    """(low, high) allocator peak of a traced step with dynamically quantized layers: high as traced (every
    thread's input block live at once), low with one thread's block per layer (threads that do not overlap);
    None without such layers or with one thread."""
    from dataclasses import replace

    from nnmem.simulate import simulate
    from nnmem.trace import Level

    spare = (torch.get_num_threads() - 1) * blocking.per_thread
    if spare <= 0 or not any(op.name in PACKED_OPS for op in trace.ops):
        return None
    low = replace(trace, ops=tuple(replace(op, workspace=max(op.workspace - spare, 0)) if op.name in PACKED_OPS
                                   else op for op in trace.ops))
    level = Level.ALLOCATOR.value
    return int(simulate(low).peaks[level]), int(simulate(trace).peaks[level])


def register_packed(tracker: Any, model: nn.Module, blocking: Blocking | None) -> list[torch.Tensor]:
    """Register each packed layer's weight (a meta tensor of :func:`packed_bytes`) and bias as resident parameters
    of ``tracker``; returns the stand-ins, to be kept alive for the trace."""
    from nnmem.frontends.pytorch.tracker import Category

    keep: list[torch.Tensor] = []
    if blocking is None:
        return keep
    for path, module in packed_modules(model):
        per_channel, bias = _unpacked(module)
        size = packed_bytes(int(module.in_features), int(module.out_features), blocking,  # type: ignore[arg-type]
                            per_channel=per_channel)
        keep.append(torch.empty(size, dtype=torch.int8, device="meta"))
        tracker.add_resident(keep[-1], Category.PARAMETERS, path)
        if bias is not None and not isinstance(module, TracedDynamicLinear):  # the stand-in's is a parameter
            tracker.add_resident(bias, Category.PARAMETERS, path)
    return keep


@torch.library.custom_op("nnmem::dynamic_int8_linear", mutates_args=())
def _dynamic_int8_linear(x: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    raise RuntimeError("nnmem::dynamic_int8_linear stands for quantized::linear_dynamic in a trace only")


@_dynamic_int8_linear.register_fake
def _(x: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], out_features), dtype=torch.float32)


@register_flop_formula(torch.ops.nnmem.dynamic_int8_linear)
def _int8_linear_flops(x_shape: Any, bias_shape: Any, out_features: int, out_shape: Any = None, **_: Any) -> int:
    """The product's multiply-adds, as FlopCounterMode counts a float linear layer's (2 per element pair): in int8
    they are still the step's compute."""
    rows = 1
    for n in x_shape[:-1]:
        rows *= n
    return 2 * rows * x_shape[-1] * out_features


class TracedDynamicLinear(nn.Module):
    """A dynamically quantized linear layer for a trace: the float32 bias as a parameter, the packed weight counted by
    :func:`register_packed`, and a forward with ``quantized::linear_dynamic``'s output."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.bias = None if linear.bias is None else nn.Parameter(
            torch.empty(linear.out_features, device="meta"), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.nnmem.dynamic_int8_linear(x, self.bias, self.out_features)


def quantization_targets(model: nn.Module) -> list[str]:
    """Paths of the float32 ``nn.Linear`` modules ``quantize:int8`` quantizes.

    ``nn.MultiheadAttention``'s ``out_proj`` stays float (the attention reads its weight itself; quantize_dynamic
    leaves it too), and so do the linear layers of ``nn.TransformerEncoderLayer`` / ``DecoderLayer``: their
    inference fast-path check reads ``linear1.weight`` as a tensor, which a quantized layer makes a method (the
    quantized layer fails in eval: "'function' object has no attribute 'device'", torch 2.13).

    Raises:
        UnsupportedError: the model has none.
    """
    kept = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)
    inside = [path + "." for path, m in model.named_modules() if isinstance(m, kept)]
    names = [path for path, m in model.named_modules()
             if path and type(m) is nn.Linear and m.weight.dtype == torch.float32
             and not any(path.startswith(prefix) for prefix in inside)]
    if not names:
        raise UnsupportedError("quantize:int8 quantizes nn.Linear layers (torch.ao.quantization.quantize_dynamic) "
                               "and the model has no float32 nn.Linear outside attention and nn.Transformer layers")
    return names


def _check(mode: str, info: CpuInfo) -> None:
    if mode == "train":
        raise UnsupportedError("quantize:int8 is for inference: dynamically quantized linear layers have no "
                               "backward (train the float model, quantize it to serve)")
    if fbgemm_blocking(info) is None:
        raise UnsupportedError("quantize:int8 runs on FBGEMM, which needs AVX2 and this CPU has none")


def quantized(model: nn.Module, mode: str, info: CpuInfo) -> AbstractContextManager[None]:
    """A context in which each quantizable ``nn.Linear`` is a :class:`TracedDynamicLinear` (put back after).

    Raises:
        UnsupportedError: training, a CPU without FBGEMM, or no ``nn.Linear`` (at once, not on entering).
    """
    from nnmem.frontends.pytorch.step import swapped_modules

    _check(mode, info)
    return swapped_modules(model, quantization_targets(model), TracedDynamicLinear)  # type: ignore[arg-type]


def apply_quantization(model: nn.Module) -> nn.Module:
    """Quantize the model's ``nn.Linear`` layers for real (``quantize_dynamic``, int8 weights, in place); returns it.

    Raises:
        UnsupportedError: no ``nn.Linear``, or a CPU without FBGEMM. ConfigError: weights on the meta device.
    """
    from nnmem.cpu import describe

    _check("infer", describe())
    names = quantization_targets(model)
    if any(p.is_meta for p in model.parameters()):
        raise ConfigError("quantize:int8 needs the model's real weights (it computes their scales); build it "
                          "with real tensors, not on the meta device")
    with warnings.catch_warnings():  # torch.ao.quantization announces its move to torchao
        warnings.simplefilter("ignore")
        from torch.ao.quantization import default_dynamic_qconfig, quantize_dynamic

        quantize_dynamic(model.eval(), {name: default_dynamic_qconfig for name in names}, dtype=torch.qint8,
                         inplace=True)
    return model


def packed_biases(model: nn.Module) -> list[torch.Tensor]:
    """The float32 bias tensors the packed layers hold (PyTorch storages the module's parameters do not list)."""
    return [bias for _, m in packed_modules(model) if (bias := _unpacked(m)[1]) is not None]


def measure_packed(model: nn.Module, counters: Any) -> int:
    """Bytes the packed layers hold outside PyTorch's allocator, measured with the malloc counter: for each layer,
    what ``quantized::linear_prepack`` (the call ``quantize_dynamic`` made) allocates and keeps for its weight."""
    total = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _, module in packed_modules(model):
            weight, bias = module._weight_bias()  # type: ignore[operator]
            gc.collect()
            before = counters.current()
            packed = torch.ops.quantized.linear_prepack(weight, bias)
            total += counters.current() - before
            del packed
    return total
