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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
import tensorflow as tf

from nnmem.allocators.bfc import bfc_round

__all__ = ["RULES", "VIEWS", "KernelRule", "Memory", "rule_of", "scratch_bytes", "tensor_bytes"]


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


def eigen_fallback_note(ops: Iterable[Any], flags: Iterable[str]) -> str | None:
    """A report line naming the oneDNN kernels of the step that fall back to Eigen on this CPU, or None."""
    flags = tuple(flags)
    fallen: dict[str, set[str]] = {}
    for op in ops:
        if op.type in _ONEDNN_KERNELS and op.outputs and not onednn_takes(op.outputs[0].dtype, flags):
            fallen.setdefault(op.outputs[0].dtype.name, set()).add(op.type)
    cast = sorted({f"{op.inputs[0].dtype.name} -> {op.outputs[0].dtype.name}" for op in ops
                   if op.type == "BatchMatMulV3" and op.outputs and op.inputs[0].dtype != op.outputs[0].dtype})
    lines = []
    if fallen:
        kinds = "; ".join(f"{dtype} {', '.join(sorted(types))}" for dtype, types in sorted(fallen.items()))
        lines.append(f"not modelled on this CPU: {kinds} run TensorFlow's Eigen kernels (oneDNN takes float16 only "
                     "with AVX512-FP16, AMX-FP16 or AVX-NE-CONVERT, bfloat16 only with AVX-512 or AVX-NE-CONVERT); "
                     "their kernel scratch is not modelled and the allocator level may be far higher")
    if cast:
        lines.append(f"not modelled: BatchMatMulV3 {', '.join(cast)} (Keras's int8 matmul) runs Eigen's integer "
                     "contraction: its operands' casts are counted, its packing buffers are not; the allocator "
                     "level may be higher")
    return "\n".join(lines) or None
