"""How TensorFlow's CPU kernels use memory, op type by op type: the rule table the graph replay reads.

Each rule says where an op's outputs live — no buffer on the step's allocator, an input's buffer (a view),
an input buffer the kernel may write in place (``OpKernelContext::forward_input_or_allocate_output``), or a
new buffer — and, for the few kernels that need it, the scratch they allocate and free inside the op or the
real bytes of an output whose static shape understates them. Each rule cites the kernel under
``tensorflow/core/kernels/`` or its calibration (docs/backends/keras-tensorflow.md, "Calibration notes").
An op type without a rule gets a new buffer of its static shape and no scratch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
import tensorflow as tf

from nnmem.allocators.bfc import bfc_round
from nnmem.cpu import describe, schedulable_cpus

__all__ = ["RULES", "VIEWS", "KernelRule", "Memory", "depthwise_scratch", "eigen_fallback_note", "eigen_path",
           "grouped_conv_bytes", "onednn_enabled", "onednn_takes", "rule_of", "scratch_bytes", "shard_threads",
           "tensor_bytes"]


class Memory(str, Enum):
    """Where a kernel's outputs live."""

    NONE = "no buffer on the step's allocator"
    VIEW = "the buffer of an input (output i of input i for IdentityN, else input 0)"
    IN_PLACE = "output 0 in an input buffer the op holds the last reference to, else a new buffer"
    NEW = "a new buffer per output"


@dataclass(frozen=True, slots=True)
class KernelRule:
    """The memory rule of one op type.

    Attributes:
        memory: where the outputs live.
        source: the kernel file (under ``tensorflow/core/kernels/``) or the calibration the rule comes from.
        scratch: bytes the kernel allocates and frees inside the op, from the op; None for none.
        output_bytes: real bytes of output ``k`` (``output_bytes(op, k)``) where the static shape is wrong.
    """

    memory: Memory
    source: str
    scratch: Callable[[Any], int] | None = None
    output_bytes: Callable[[Any, int], int] | None = None


_NO_DATA = (tf.resource, tf.variant, tf.string)  # handles and containers: their data are counted elsewhere


def tensor_bytes(t: Any) -> int:
    """Bytes of a graph tensor's static shape; 0 for handles, variants, strings and unknown shapes."""
    if t.dtype in _NO_DATA:
        return 0
    try:
        dims = t.shape.as_list()
    except ValueError:  # unknown rank
        return 0
    if None in dims:
        return 0
    return math.prod(dims) * t.dtype.size


def einsum_scratch(op: Any) -> int:
    """Temporaries of the two-operand ``Einsum`` kernel (``linalg/einsum_op_impl.h``), in bytes.

    The kernel runs a batch matmul on ``[batch, free, contracted]`` (or ``[batch, contracted, free]``) views of
    its operands: an operand whose labels are in neither order is transposed into a temporary copy, and when
    the output's labels are not in ``[batch, free 0, free 1]`` order (or with the operands swapped) the matmul
    writes a temporary that is transposed into the output. Calibrated with the profiler's allocator events on
    Keras MultiHeadAttention's two einsums.
    """
    try:
        equation = op.get_attr("equation").decode()
    except (ValueError, AttributeError):
        return 0
    if "->" not in equation or "." in equation or len(op.inputs) != 2:
        return 0
    lhs, out = equation.split("->")
    parts = lhs.split(",")
    if len(parts) != 2:
        return 0
    a, b = parts
    batch = [c for c in out if c in a and c in b]
    contracted = [c for c in a if c in b and c not in out]
    free_a, free_b = [c for c in a if c not in b], [c for c in b if c not in a]

    def fits(labels: str, free: list[str]) -> bool:
        return list(labels) in ([*batch, *free, *contracted], [*batch, *contracted, *free])

    scratch = sum(bfc_round(tensor_bytes(t)) for t, labels, free in zip(op.inputs, (a, b), (free_a, free_b))
                  if not fits(labels, free))
    if list(out) not in ([*batch, *free_a, *free_b], [*batch, *free_b, *free_a]):
        scratch += bfc_round(tensor_bytes(op.outputs[0]))
    return scratch


def matmul_cast_scratch(op: Any) -> int:
    """``BatchMatMulV3`` with operands of another type than its output (Keras's int8 ``matmul``: int8 x int8 ->
    int32) casts each such operand to the output type first (``batch_matmul_op_impl.h``:
    ``CastTensor<Ta, Tout>`` "to reuse Eigen"); both copies live through the product."""
    out = op.outputs[0]
    return sum(tensor_bytes(t) // t.dtype.size * out.dtype.size for t in op.inputs[:2]
               if t.dtype != out.dtype and t.dtype.size)


_L3_WORKING_SET = 30 << 20
"""Bytes the custom convolution-backprop kernels size their im2col buffer to (``conv_grad_filter_ops.cc``,
``conv_grad_input_ops.h``: "30MB is from ivybridge"), whatever the CPU's cache."""

_L2_PER_THREAD = 256 << 10
"""``conv_grad_input_ops.h``: below this much work per thread the input gradient runs single-threaded matmuls
over shards of images rather than one parallel contraction per image."""


def intra_op_threads() -> int:
    """Threads of TensorFlow's intra-op pool (``tensorflow_cpu_worker_threads``): as set, else one per CPU this
    process may run on (``port::MaxParallelism``)."""
    set_threads = tf.config.threading.get_intra_op_parallelism_threads()
    return int(set_threads) if set_threads > 0 else schedulable_cpus()


def onednn_enabled() -> bool:
    """Whether TensorFlow's oneDNN graph rewrite is on in this process, as TensorFlow itself decides
    (``IsMKLEnabled``, tensorflow/core/util/util.cc): ``TF_ENABLE_ONEDNN_OPTS`` where set, else on only on an x86
    CPU with AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX (off on an AVX2-only AMD EPYC Zen 3: every oneDNN-rewritable
    kernel ran Eigen's, a CNN's training step measured 5.5 times the estimate made for oneDNN)."""
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:  # a TensorFlow without the binding: the variable alone, on when unset
        return os.environ.get("TF_ENABLE_ONEDNN_OPTS", "").strip().lower() not in ("0", "false")
    return bool(_pywrap_util_port.IsMklEnabled())


def eigen_path(dtype: Any) -> bool:
    """Whether this process's TensorFlow runs the oneDNN-rewritable kernels of ``dtype`` as its own Eigen
    kernels: oneDNN is off (``TF_ENABLE_ONEDNN_OPTS=0``) or does not take the dtype on this CPU."""
    return not onednn_enabled() or not onednn_takes(dtype, describe().flags)


def _nhwc(op: Any) -> bool:
    """Whether a convolution op runs channels-last, the only layout TensorFlow's own CPU kernels take."""
    return op.get_attr("data_format") in (b"NHWC", "NHWC")


def conv_backprop_col_bytes(op: Any, threads: int | None = None) -> int:
    """The im2col buffer of TensorFlow's custom ``Conv2DBackpropFilter`` / ``Conv2DBackpropInput`` CPU kernels.

    ``Conv2DCustomBackpropFilterOp`` (``conv_grad_filter_ops.cc``) and ``Conv2DCustomBackpropInputOp``
    (``conv_grad_input_ops.h``) allocate ``shard x output_image_size x filter_total_size`` elements as one temp,
    ``shard = ceil(30 MiB / sizeof(T) / work_unit)`` with ``work_unit`` the three matmul operands of one image
    (not capped by the batch: 257 x 1024 x 27 half elements for a 3x3x3->32 filter gradient at batch 8). The
    input gradient takes one image at a time (``shard = 1``) at batch 1 or when a thread's share of the work
    unit reaches 256 KiB. 0 for other layouts and dilations (those kernels refuse them) or unknown shapes.
    """
    if not _nhwc(op):
        return 0
    if any(int(d) != 1 for d in op.get_attr("dilations")):
        return 0
    grad = op.inputs[2].shape
    filt = (op.outputs[0] if op.type == "Conv2DBackpropFilter" else op.inputs[1]).shape
    if not (grad.is_fully_defined() and filt.is_fully_defined()) or grad.rank != 4 or filt.rank != 4:
        return 0
    size = op.outputs[0].dtype.size
    batch, out_h, out_w, out_depth = grad.as_list()
    image = out_h * out_w
    filter_total = filt[0] * filt[1] * filt[2]
    work = image * filter_total + image * out_depth + filter_total * out_depth
    if work == 0:
        return 0
    shard = -(-(_L3_WORKING_SET // size) // work)
    if op.type == "Conv2DBackpropInput":
        threads = threads or intra_op_threads()
        if batch == 1 or work // threads >= _L2_PER_THREAD // size:
            shard = 1
    return shard * image * filter_total * size


def half_matmul_cast_bytes(op: Any) -> int:
    """``MatMul`` in half precision (float16, bfloat16) on TensorFlow's own CPU kernel: both operands and the
    product are cast to float32 temporaries (three ``1 x rows x cols`` float tensors beside the half output, seen
    in TensorFlow's allocation log), each its own allocator chunk."""
    a, b = op.inputs[0], op.inputs[1]
    out = op.outputs[0]
    if out.dtype not in (tf.half, tf.bfloat16):
        return 0
    return sum(bfc_round(tensor_bytes(t) // t.dtype.size * 4) for t in (a, b, out) if t.dtype.size)


def max_pool_grad_bytes(op: Any) -> int:
    """TensorFlow's own ``MaxPoolGrad`` CPU kernel (``maxpooling_op.cc`` ``MaxPoolingGradOp``): a copy of the
    forward output (``forward_input_or_allocate_temp``: modelled as allocated, its input is usually still held)
    and the argmax of every output element as int64, redone from the input."""
    pooled = op.inputs[1]
    return bfc_round(tensor_bytes(pooled)) + bfc_round(tensor_bytes(pooled) // max(pooled.dtype.size, 1) * 8)


def grouped_conv_bytes(op: Any) -> int:
    """A grouped ``Conv2D`` (the filter's input depth a fraction of the input's) on TensorFlow's own CPU kernel
    (``conv_ops_impl.h`` ``LaunchGrouped``): the input and the filter shuffled group-major into temporaries, then an
    output temporary the groups' convolutions write, shuffled back into the output; all three live together. 0 for
    one group, another layout or unknown shapes. (Its gradients are refused on the CPU: "Gradients for grouped
    convolutions are not supported".)"""
    if not _nhwc(op):
        return 0
    x, w = op.inputs[0].shape, op.inputs[1].shape
    if x.rank != 4 or w.rank != 4 or x[3] is None or w[2] is None or x[3] == w[2]:
        return 0
    return sum(bfc_round(tensor_bytes(t)) for t in (op.inputs[0], op.inputs[1], op.outputs[0]))


_EIGEN_PACKET_BYTES = 32
"""Bytes of Eigen's packet in TensorFlow's CPU kernels: the wheel is built for AVX (its start-up line asks to
"rebuild TensorFlow" for AVX2 and FMA), so a float packet is 8 floats on every CPU; half has its own 8-lane
``Packet8h``."""


def _packet(size: int) -> int:
    return 8 if size == 2 else _EIGEN_PACKET_BYTES // size


_DEPTHWISE = ("DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter")


_STARTUP_CYCLES = _PER_THREAD_CYCLES = 100_000
"""Eigen's ``TensorCostModel``: cycles to start a parallel region, and cycles of work per thread it starts."""


def shard_threads(units: int, cost_per_unit: float, threads: int) -> int:
    """Threads TensorFlow's ``Shard`` (``work_sharder.cc``) runs ``units`` pieces of work on at once: Eigen's
    ``ThreadPoolDevice::parallelFor`` asks its cost model (``TensorCostModel::numThreads``: 100,000 cycles to start,
    100,000 per thread) and under two threads' worth runs the whole range in the calling thread."""
    if threads <= 1 or units <= 1:
        return 1
    wanted = int((units * cost_per_unit - _STARTUP_CYCLES) / _PER_THREAD_CYCLES + 0.9)
    return max(1, min(threads, wanted, units))


def depthwise_scratch(op: Any, threads: int | None = None) -> int:
    """Temporaries of TensorFlow's own depthwise convolution CPU kernels (NHWC only), in bytes.

    ``depthwise_conv_op.cc`` (forward) and ``depthwise_conv_grad_op.cc`` (both gradients) pad the channels
    (``out_depth``) to whole packets (:func:`_packet`). Each shard of the work allocates one window of the input or
    the output gradient, ``filter_rows x filter_cols x padded_depth`` (the input gradient's shards also a
    ``padded_depth`` row), as many at once as :func:`shard_threads` runs (forward: ``batch x out_rows`` units of
    ``2.5 x out_cols x out_depth`` cycles; gradients: ``batch`` units of an image's ``rows x cols x out_depth``).
    The forward pass and the input gradient copy the filter padded when ``out_depth`` is not whole packets; the
    filter gradient sums per-image copies of the filter, ``batch x filter_rows x filter_cols x padded_depth``,
    allocated for the whole op. Where the cost model starts several threads their windows overlap as timing
    allows: this counts them all. 0 for another layout (the kernels refuse it) or unknown shapes.
    """
    if op.type not in _DEPTHWISE or not _nhwc(op):
        return 0
    filt = (op.outputs[0] if op.type == _DEPTHWISE[2] else op.inputs[1]).shape
    grid = (op.inputs[2] if op.type == _DEPTHWISE[2] else op.outputs[0]).shape  # out / in / out spatial grid
    if not (filt.is_fully_defined() and grid.is_fully_defined()) or filt.rank != 4 or grid.rank != 4:
        return 0
    size = op.outputs[0].dtype.size
    rows, cols, in_depth, multiplier = filt.as_list()
    out_depth = in_depth * multiplier
    packet = _packet(size)
    padded = -(-out_depth // packet) * packet
    window = bfc_round(rows * cols * padded * size)
    padded_filter = window if out_depth % packet else 0
    batch, grid_rows, grid_cols = grid[0], grid[1], grid[2]
    threads = threads or intra_op_threads()
    if op.type == _DEPTHWISE[0]:
        shards = shard_threads(batch * grid_rows, int(2.5 * grid_cols * out_depth), threads)
        return padded_filter + shards * window
    shards = shard_threads(batch, grid_rows * grid_cols * out_depth, threads)
    if op.type == _DEPTHWISE[1]:
        return padded_filter + shards * (window + bfc_round(padded * size))
    return bfc_round(batch * rows * cols * padded * size) + shards * window


def _on_eigen(rule: Callable[[Any], int]) -> Callable[[Any], int]:
    """``rule``'s scratch where the op runs TensorFlow's Eigen kernel (:func:`eigen_path`), else 0 (the oneDNN
    kernel the graph rewrite puts in its place has none of these temporaries)."""

    def scratch(op: Any) -> int:
        return rule(op) if op.outputs and eigen_path(op.outputs[0].dtype) else 0

    return scratch


def list_copy_bytes(t: Any) -> int:
    """Bytes ``TensorListFromTensor`` allocates for ``t``: each row copied into its own chunk.

    ``list_kernels.h``, ``TensorListFromTensor::Compute``: ``allocate_temp`` per element, so every row is its
    own BFC chunk.
    """
    shape = t.shape
    if t.dtype in _NO_DATA or shape.rank is None or shape.rank < 1 or \
            not shape.is_fully_defined():
        return 0
    rows = int(shape[0])
    return rows * bfc_round(int(np.prod(shape.as_list()[1:], dtype=np.int64)) * t.dtype.size)


def _rules(memory: Memory, source: str, op_types: Iterable[str]) -> dict[str, KernelRule]:
    rule = KernelRule(memory, source)
    return dict.fromkeys(op_types, rule)


_ELEMENTWISE = "framework/numeric_op.h: UnaryElementWiseOp / BinaryElementWiseOp forward input 0"
_CWISE = "cwise_ops_common.h: UnaryOp / BinaryOp / SimpleBinaryOp forward an input of the output's shape"

RULES: dict[str, KernelRule] = {
    # ---- no buffer on the step's allocator --------------------------------------------------------------
    **_rules(Memory.NONE, "function arguments: their buffers belong to the caller", ("Placeholder", "_Arg")),
    **_rules(Memory.NONE, "constant_op.cc: ConstantOp keeps its tensor for the kernel's lifetime (resident)",
             ("Const",)),
    **_rules(Memory.NONE, "no_op.cc: no outputs", ("NoOp",)),
    **_rules(Memory.NONE, "resource_variable_ops.cc: a scalar handle; assignments write the variable's buffer",
             ("VarHandleOp", "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "VariableShape")),
    **_rules(Memory.NONE, "list_kernels.h: a variant scalar whose elements are tensors held elsewhere",
             ("EmptyTensorList", "TensorListReserve", "TensorListPushBack", "TensorListSetItem",
              "TensorListLength", "TensorListElementShape")),
    **_rules(Memory.NONE, "shape_ops.h: a few host integers", ("Shape", "ShapeN", "Size", "Rank")),
    # ---- views: the output is the input's buffer --------------------------------------------------------
    **_rules(Memory.VIEW, "identity_op.h: set_output(0, input(0))", ("Identity", "StopGradient", "PreventGradient")),
    **_rules(Memory.VIEW, "snapshot_op.cc: forwards its input (copies it only while another reference holds "
             "it: not modelled)", ("Snapshot",)),
    **_rules(Memory.VIEW, "identity_n_op.h: output i is input i", ("IdentityN",)),
    **_rules(Memory.VIEW, "reshape_op.h: Tensor::CopyFrom shares the buffer", ("Reshape",)),
    **_rules(Memory.VIEW, "shape_ops.h: Tensor::CopyFrom shares the buffer", ("Squeeze", "ExpandDims")),
    **_rules(Memory.VIEW, "shape_ops.cc: EnsureShapeOp outputs its input", ("EnsureShape",)),
    **_rules(Memory.VIEW, "bitcast_op.cc: Tensor::BitcastFrom shares the buffer", ("Bitcast",)),
    **_rules(Memory.VIEW, "resource_variable_ops.cc: ReadVariableOp outputs the variable's tensor",
             ("ReadVariableOp",)),
    # ---- element-wise kernels that write into an input they hold the last reference to ------------------
    **_rules(Memory.IN_PLACE, f"relu_op.h, {_ELEMENTWISE}",
             ("Relu", "Relu6", "Elu", "Selu", "LeakyRelu", "ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad",
              "LeakyReluGrad")),
    **_rules(Memory.IN_PLACE, f"softplus_op.cc, softsign_op.cc, {_ELEMENTWISE}",
             ("Softplus", "SoftplusGrad", "Softsign", "SoftsignGrad")),
    **_rules(Memory.IN_PLACE, f"cwise_op_*.cc, {_CWISE}",
             ("Sigmoid", "Tanh", "SigmoidGrad", "TanhGrad", "Mul", "AddV2", "Add", "Sub", "RealDiv", "Div",
              "DivNoNan", "Maximum", "Minimum", "Sqrt", "Rsqrt", "Square", "Pow", "Neg", "Exp", "Log", "Abs",
              "Sign", "Erf", "Reciprocal", "SquaredDifference", "Floor", "Round", "MulNoNan", "Inv", "Xdivy",
              "Xlogy", "Log1p", "Expm1", "Sin", "Cos", "Tan", "Sinh", "Cosh", "Asinh", "Atan", "Ceil", "Rint",
              "Lgamma", "Digamma", "FloorDiv", "FloorMod", "Mod", "Atan2", "RsqrtGrad", "SqrtGrad",
              "ReciprocalGrad", "InvGrad")),
    **_rules(Memory.IN_PLACE, f"cwise_op_erfc.cc, {_CWISE}; calibrated: GELU's Erfc writes in place",
             ("Erfc",)),
    **_rules(Memory.IN_PLACE, "bias_op.cc: BiasOp forward_input_or_allocate_output({0})", ("BiasAdd",)),
    **_rules(Memory.IN_PLACE, "aggregate_ops.cc: AddNOp accumulates into a forwarded input", ("AddN",)),
    **_rules(Memory.IN_PLACE, "softmax_op.cc: SoftmaxOp forwards its logits", ("Softmax", "LogSoftmax")),
    **_rules(Memory.IN_PLACE, "cwise_op_select.cc: forwards t or e", ("Select", "SelectV2")),
    **_rules(Memory.IN_PLACE, "constant_op.cc: ZerosLikeOp / OnesLikeOp forward their input",
             ("ZerosLike", "OnesLike")),
    **_rules(Memory.IN_PLACE, "cast_op.cc: a same-type cast outputs its input; other casts are modelled in "
             "place when the sizes match", ("Cast",)),
    # ---- kernels with scratch or outputs larger than their static shape ---------------------------------
    "Einsum": KernelRule(Memory.NEW, "linalg/einsum_op_impl.h; calibrated on MultiHeadAttention",
                         scratch=einsum_scratch),
    "BatchMatMulV3": KernelRule(Memory.NEW, "batch_matmul_op_impl.h: operands cast to the output's type",
                                scratch=matmul_cast_scratch),
    "Conv2DBackpropFilter": KernelRule(Memory.NEW, "conv_grad_filter_ops.cc: Conv2DCustomBackpropFilterOp im2col "
                                       "buffer (Eigen path only)", scratch=_on_eigen(conv_backprop_col_bytes)),
    "Conv2DBackpropInput": KernelRule(Memory.NEW, "conv_grad_input_ops.h: Conv2DCustomBackpropInputOp im2col "
                                      "buffer (Eigen path only)", scratch=_on_eigen(conv_backprop_col_bytes)),
    "MatMul": KernelRule(Memory.NEW, "matmul_op_impl.h: half operands and product cast to float (Eigen path "
                         "only)", scratch=_on_eigen(half_matmul_cast_bytes)),
    "MaxPoolGrad": KernelRule(Memory.NEW, "maxpooling_op.cc: MaxPoolingGradOp output copy and int64 argmax (Eigen "
                              "path only)", scratch=_on_eigen(max_pool_grad_bytes)),
    **{kind: KernelRule(Memory.NEW, "depthwise_conv_op.cc, depthwise_conv_grad_op.cc: packet-padded windows per "
                        "shard, padded filter, per-image filter gradients (Eigen path only)",
                        scratch=_on_eigen(depthwise_scratch)) for kind in _DEPTHWISE},
    "Conv2D": KernelRule(Memory.NEW, "conv_ops_impl.h: LaunchGrouped's shuffled input, filter and output of a grouped "
                         "convolution (Eigen path only)", scratch=_on_eigen(grouped_conv_bytes)),
    "TensorListFromTensor": KernelRule(Memory.NEW, "list_kernels.h: allocate_temp per row",
                                       output_bytes=lambda op, k: list_copy_bytes(op.inputs[0])),
}

_NEW = KernelRule(Memory.NEW, "default: a new buffer of the output's static shape")

VIEWS = frozenset(kind for kind, rule in RULES.items() if rule.memory is Memory.VIEW)
"""Op types whose outputs share an input's buffer."""


def rule_of(op_type: str) -> KernelRule:
    """The memory rule of an op type (a new buffer, no scratch, where the table has none)."""
    return RULES.get(op_type, _NEW)


def scratch_bytes(op: Any) -> int:
    """Bytes the op's kernel allocates and frees inside the op (0 for most kernels)."""
    scratch = rule_of(op.type).scratch
    return 0 if scratch is None else scratch(op)


# Kernels the oneDNN (MKL) graph rewrite takes over for float32, which fall back to TensorFlow's own Eigen
# kernels for a dtype oneDNN does not run on this CPU. Their scratch differs and is not modelled: the
# custom backprop kernels allocate an im2col buffer sized to a 30 MiB working set
# (conv_grad_filter_ops.cc Conv2DCustomBackpropFilterOp, conv_grad_input_ops.h).
_MODELLED_ON_EIGEN = frozenset({"Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput", "MatMul", *_DEPTHWISE})
"""Of those, the Eigen kernels whose memory the rules model (their temporaries checked against TensorFlow's
allocation log of ``keras_mixed_float16``: the forward convolution allocates only its output; Eigen's contraction
buffers do not come from the step's allocator)."""

_ONEDNN_KERNELS = frozenset({
    "Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput", "Conv3D", "Conv3DBackpropFilterV2",
    "Conv3DBackpropInputV2", "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropFilter",
    "DepthwiseConv2dNativeBackpropInput", "MatMul", "BatchMatMulV2", "BatchMatMulV3", "FusedBatchNormV3",
    "FusedBatchNormGradV3",
})


def onednn_takes(dtype: Any, flags: Iterable[str]) -> bool:
    """Whether TensorFlow's oneDNN kernels run ``dtype`` on a CPU with these ISA flags
    (``tensorflow/core/util/util.cc`` IsDataTypeSupportedByOneDNNOnThisCPU)."""
    have = set(flags)
    if dtype == tf.half:
        return "avx512bw" in have and bool(have & {"avx512_fp16", "amx_fp16", "avx_ne_convert"})
    if dtype == tf.bfloat16:
        return bool(have & {"avx512f", "avx_ne_convert"})
    return True


def eigen_fallback_note(ops: Iterable[Any], flags: Iterable[str], onednn: bool = True) -> str | None:
    """A report line naming the oneDNN kernels of the step that fall back to Eigen on this CPU (all of them with
    ``onednn`` off) and whose Eigen kernel's memory is not modelled, or None."""
    flags = tuple(flags)
    fallen: dict[str, set[str]] = {}
    for op in ops:
        if op.type in _ONEDNN_KERNELS - _MODELLED_ON_EIGEN and op.outputs and \
                (not onednn or not onednn_takes(op.outputs[0].dtype, flags)):
            fallen.setdefault(op.outputs[0].dtype.name, set()).add(op.type)
    cast = sorted({f"{op.inputs[0].dtype.name} -> {op.outputs[0].dtype.name}" for op in ops
                   if op.type == "BatchMatMulV3" and op.outputs and op.inputs[0].dtype != op.outputs[0].dtype})
    lines = []
    if fallen:
        kinds = "; ".join(f"{dtype} {', '.join(sorted(types))}" for dtype, types in sorted(fallen.items()))
        why = ("oneDNN takes float16 only with AVX512-FP16, AMX-FP16 or AVX-NE-CONVERT, bfloat16 only with AVX-512 "
               "or AVX-NE-CONVERT" if onednn else "oneDNN is off: TF_ENABLE_ONEDNN_OPTS=0, or TensorFlow's default on "
               "a CPU without AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX")
        lines.append(f"not modelled on this CPU: {kinds} run TensorFlow's Eigen kernels ({why}); their kernel "
                     "scratch is not modelled and the allocator level may be far higher")
    if cast:
        lines.append(f"not modelled: BatchMatMulV3 {', '.join(cast)} (Keras's int8 matmul) runs Eigen's integer "
                     "contraction: its operands' casts are counted, its packing buffers are not; the allocator "
                     "level may be higher")
    return "\n".join(lines) or None
