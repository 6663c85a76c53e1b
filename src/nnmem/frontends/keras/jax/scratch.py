"""Scratch XLA:CPU allocates beside its buffer assignment, one rule per kind of HLO instruction.

XLA's temporaries are one block live for the whole execute call; each top-level instruction of the entry
computation adds its scratch on top: XLA's own (Eigen) convolutions and dots, and YNNPACK fusions, whose
convolutions, dots and reductions have rules of their own. An execute call also mallocs per buffer
(:func:`runtime_bookkeeping`). Each rule names the XLA / Eigen / YNNPACK source it follows; its sizes were
counted with the malloc counter of :mod:`nnmem.frontends.keras.jax.measure` on single jitted ops (the data:
``docs/backends/keras-jax.md``, "Calibration notes"). Rules read only the HLO text (:mod:`.hlo`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from nnmem.cpu import describe, schedulable_cpus
from nnmem.frontends.keras.jax import eigen_contraction
from nnmem.frontends.keras.jax.hlo import (
    NO_BUFFER,
    Conv,
    Instruction,
    Module,
    conv,
    nbytes,
    only_reinterpreted,
    shape,
    through_reinterpret,
)

__all__ = ["Workspace", "eigen_uncalibrated", "fusion_workspace", "rounded_convolution_fusions", "runtime_bookkeeping"]

_EIGEN_PACKING = 74_184
"""Bytes of Eigen's contraction packing buffer, beside a convolution's im2col buffer and in XLA's own dots
(calibrated on single 3x3 and 5x5 convolutions and on keras_mlp's weight-gradient dots)."""
_EIGEN_ALIGN = 64
"""``EIGEN_MAX_ALIGN_BYTES`` with AVX-512: each packed block is rounded up to it (``TensorContractionKernel::
allocate``)."""
_YNN_BLOCK = 128 * 1024
"""Bytes of a YNNPACK reduction's tiling block, one per worker thread (calibrated: 131,144 B mallocs)."""
_YNN_BLOCK_N = 64
"""``block_n`` of YNNPACK's float32 dot kernel, where its task tiles start growing (:func:`_dot_splits`)."""
_DOT_PACK_ROWS = 64
"""With AVX-512, rows from which a YNNPACK dot packs a right operand it does not transpose (calibrated: 8 rows
pack nothing, 64 and 512 do)."""
_UNPACKED_BLOCK_M = 6
"""With AVX2, ``block_m`` of YNNPACK's float32 dot kernel for an unpacked right operand: ``should_pack_b`` packs
when A splits into more than 10 such blocks per batch (measured: 60 rows do not pack, 61 do)."""
_UNIT_LEAD_COPIES = {True: 5, False: 1}
"""Copies of its operand a YNNPACK reduction over the last dimension holds when the fusion computes that operand
and its outermost dimension is 1, by whether the CPU has AVX-512 (YNNPACK picks its kernels by the CPU's vector
extensions, not by oneDNN's cap). Calibrated with single jitted ``sum(a * b, axis=-1)``: with AVX-512 (AMD EPYC
Zen 4, Xeon Sapphire Rapids) f32[1,8,4,64,64], [1,32,64,64], [1,8,4,64,32], [1,512,64] held 5.03-5.07 times the
operand; with AVX2 only (AMD EPYC Zen 3) the same shapes and [1,8,4,64,16], [1,8,4,64,128] 1.02-1.20 times (a
further 9-18 KB not modelled); [8,4,64,64], [32,64,64], [2,8,4,64,64]: tiles only on both."""
_YNN_CALL = 6_704
"""Bytes a YNNPACK fusion call holds while it runs besides its tiles: a 1,216 B aligned block and some 5.5 KB of
small ones (the slinky pipeline's evaluation). Calibrated with the malloc counter on single jitted fusions, a dot
(8x64 @ 64x256, with and without a ReLU), a 64x64 dot and a 3x3 convolution: 6,633-6,801 B above the rules and
the runtime bookkeeping, their mean; keras_mlp and keras_subclassed inference measured 7-10 KB above the
estimate without it."""
_YNN_FUSION = "__ynn_fusion"
"""The ``fusion_config`` kind of a fusion XLA:CPU hands to YNNPACK (``kYnnFusionKind``,
``xla/backends/cpu/ynn_support.h``)."""

# Runtime bookkeeping of one execute call (``runtime_bookkeeping``), least-squares fit of jitted functions of
# k float32[16] arrays, k = 4, 16, 64: k aliased pairs, k inputs to one output, one input to k outputs.
_CALL_BASE = 154
"""Bytes an execute call allocates whatever its arguments."""
_PER_INPUT = 383
"""Bytes per executable parameter that no output aliases (the data)."""
_PER_OUTPUT = 1_655
"""Bytes per new output besides its buffer (the ``jax.Array`` and its PjRt buffer, events)."""
_PER_ALIASED = 1_403
"""Bytes per donated parameter whose buffer an output takes over (a variable of the step's state)."""


def _threads() -> int:
    """Worker threads of XLA:CPU's pool: the CPUs this process may run on."""
    return schedulable_cpus()


# ---- inside a YNNPACK fusion (xla/backends/cpu/runtime/ynnpack/ynn_fusion_thunk.cc runs it as a YNNPACK
# subgraph): each rule gives (bytes held until the fusion ends, bytes held briefly); held add up, brief max.
@dataclass(frozen=True, slots=True)
class _Fusion:
    body: list[Instruction]
    types: dict[str, str]
    threads: int
    named: dict[str, Instruction]
    produced: frozenset[str]  # names an op of the fusion computes (not a parameter or a constant)
    sliced: bool  # the fusion's loop runs over one batch element at a time (see _ynn_convolution)


def _padded_input(c: Conv) -> int:
    """Bytes of a convolution's input with its spatial padding; its plain size when it does not pad."""
    if c.pads is None:
        return math.prod(c.lhs) * c.item
    spatial = math.prod(c.dim(str(k)) + p for k, p in enumerate(c.pads))
    return c.dim("b") * spatial * c.dim("f") * c.item


def _ynn_convolution(ins: Instruction, fusion: _Fusion) -> tuple[int, int]:
    """YNNPACK convolution: its spatially padded input when it pads, its whole input when an op of the fusion
    produces it, both held; its packed filter, briefly (calibrated: 8x32x32x32 k3 SAME, a separable pair).

    YNNPACK runs a fusion as a slinky pipeline that may split its loop along the batch and hand the slices to
    its workers; then each worker holds a slice of these buffers, down to one batch element (measured:
    keras_partly_frozen's forward fusion held 1- and 2-image slices in some processes, whole buffers in others;
    keras_separable_cnn's depthwise chain held them whole). ``fusion.sliced`` is that low end.
    """
    c = conv(ins, fusion.types)
    if c is None:
        return 0, 0
    held = _padded_input(c) if c.pads is not None or ins.operands[0] in fusion.produced else 0
    if fusion.sliced:
        held //= max(c.dim("b"), 1)
    weights = nbytes(fusion.types.get(ins.operands[1], "")) if len(ins.operands) > 1 else None
    return held, weights if weights is not None else 0


def _ynn_dot(ins: Instruction, fusion: _Fusion) -> tuple[int, int]:
    """YNNPACK dot: its result in full when the fusion only reshapes it, in full each operand an op of the fusion
    computes; its right operand packed, one :func:`_dot_splits` tile per worker thread, when ``should_pack_b``
    (``ynnpack/subgraph/dot.cc``) packs it: always when the dot contracts the right operand's
    last dimension (a transposed B: ``always_alias_transpose`` packs it with the transpose; measured with AVX2 at
    2 to 128 rows), else when the left operand is large against it (AVX2: more than 10 blocks of
    :data:`_UNPACKED_BLOCK_M` rows per batch; AVX-512: from :data:`_DOT_PACK_ROWS` rows). Calibrated:
    keras_conv1d_gru's GRU projection, 64x512 @ 512x512, 512x64 @ 64x256."""
    if len(ins.operands) < 2:
        return 0, 0
    lhs, rhs = shape(fusion.types.get(ins.operands[0], "")), shape(fusion.types.get(ins.operands[1], ""))
    out = shape(ins.type)
    if lhs is None or rhs is None or out is None or len(out[0]) < 2:
        return 0, 0
    held = 0
    if not ins.root and only_reinterpreted(ins, fusion.body):
        held += math.prod(out[0]) * out[1]  # a result that is only reshaped is written out in full
    for operand in ins.operands[:2]:
        source = through_reinterpret(operand, fusion.named)
        if source is not None and source.opcode not in ("parameter", "constant", "broadcast", "iota"):
            held += nbytes(source.type) or 0  # produced in the fusion: read from a full buffer
    lead = len(_dims(ins, "lhs_batch_dims"))
    batches, rows, cols = math.prod(out[0][:lead]), math.prod(out[0][lead:-1]), out[0][-1]
    if not _packs_rhs(ins, rows, batches, rhs[0]):
        return held, 0
    depth = math.prod(lhs[0][d] for d in _dims(ins, "lhs_contracting_dims")) or 1
    split_n, split_k = _dot_splits(rows, cols, depth)
    tiles = min(fusion.threads, -(-cols // split_n))
    return held, tiles * min(split_n, cols) * split_k * rhs[1]


def _dims(ins: Instruction, key: str) -> list[int]:
    """A dot's dimension list attribute (``lhs_contracting_dims`` ...)."""
    found = re.search(key + r"=\{([\d,]*)\}", ins.rest)
    return [int(d) for d in found.group(1).split(",") if d] if found else []


def _dot_splits(m: int, n: int, k: int) -> tuple[int, int]:
    """(split_n, split_k) of a YNNPACK dot's tasks (``ynnpack/subgraph/dot.cc``, ``choose_split_factors``): a worker
    packs the right operand one split_n x split_k tile at a time. Square-ish tiles from 16 x :data:`_YNN_BLOCK_N`,
    grown by doubling until their area reaches min(m, 64) x min(n, 64) and then (m + n) x k reaches 64 Ki or the
    area 256 x 256, aspect ratio 4; split_k is k rounded up to 64 from 64."""
    k_cost = min(k, 1024)
    min_area, max_area, max_cost, aspect = min(m, 64) * min(n, 64), 256 * 256, 1024 * 64, 4
    split_n, split_m = min(n, _YNN_BLOCK_N), min(m, 16)
    while True:
        if split_n * split_m >= min_area and ((split_m + split_n) * k_cost >= max_cost or
                                             split_m * split_n >= max_area):
            break
        if (aspect * split_n <= split_m or split_m >= m) and split_n < n:
            split_n *= 2
        elif (split_m <= aspect * split_n or split_n >= n) and split_m < m:
            split_m *= 2
        else:
            break
    return min(split_n, 65536), (-(-k // 64) * 64 if k >= 64 else k)


def _packs_rhs(ins: Instruction, rows: int, batches: int, rhs: list[int]) -> bool:
    """Whether YNNPACK packs a dot's right operand (see :func:`_ynn_dot`), for ``batches`` products of ``rows``
    output rows each."""
    batch, contracted = _dims(ins, "rhs_batch_dims"), _dims(ins, "rhs_contracting_dims")
    if len(rhs) - len(batch) - len(contracted) >= 1 and contracted == [len(rhs) - 1]:
        return True  # B is [n, k]: packed with its transpose
    if "avx512f" in describe().flags:
        return rows * batches >= _DOT_PACK_ROWS
    return -(-rows // _UNPACKED_BLOCK_M) * batches > 10 * math.prod(rhs[i] for i in batch)


def _ynn_reduce(ins: Instruction, fusion: _Fusion) -> tuple[int, int]:
    """YNNPACK reduction over more than :data:`_YNN_BLOCK`: tiles of that size, one per worker thread, briefly
    (calibrated: the softmax of 8x4x64x64). Over the last dimension of an array the fusion computes whose
    outermost dimension is 1 (the softmax backward of keras_transformer_block, f32[1,8,4,64,64]): that array
    in full, and with AVX-512 four times its size more, held (:data:`_UNIT_LEAD_COPIES`)."""
    operand = shape(fusion.types.get(ins.operands[0], ""))
    if operand is None:
        return 0, 0
    dims, item = operand
    reduced = math.prod(dims) * item
    over = re.search(r"dimensions=\{([\d,]*)\}", ins.rest)
    if ins.operands[0] in fusion.produced and len(dims) >= 3 and dims[0] == 1 and over is not None \
            and over.group(1) == str(len(dims) - 1):
        return _UNIT_LEAD_COPIES["avx512f" in describe().flags] * reduced, 0
    return 0, fusion.threads * _YNN_BLOCK if reduced > _YNN_BLOCK else 0


_YNN_RULES: dict[str, Callable[[Instruction, _Fusion], tuple[int, int]]] = {
    "convolution": _ynn_convolution,
    "dot": _ynn_dot,
    "reduce": _ynn_reduce,
}


# ---- top-level instructions of the entry computation -----------------------------------------------------
def _sequential_packing(lhs: int, rhs: int) -> int:
    """Eigen's packing buffer of a contraction it runs on one thread, for operands of ``lhs`` and ``rhs``
    bytes: its blocks never exceed the operands (single-thread ``evaluateProductBlockingSizesHeuristic`` only
    shrinks kc, mc, nc from k, m, n; ``TensorContractionKernel::allocate`` books bm*bk + bk*bn, each aligned),
    and never the calibrated thread-pool size."""
    def aligned(n: int) -> int:
        return -(-n // _EIGEN_ALIGN) * _EIGEN_ALIGN
    return min(_EIGEN_PACKING, aligned(lhs) + aligned(rhs))


def _eigen_convolution(ins: Instruction, module: Module, threads: int, low: bool = False) -> int:
    """XLA's own convolution (``xla/backends/cpu/runtime/conv_impl.h``, ``EigenConv2DImpl``: per feature group,
    ``extract_image_patches`` then a contraction).

    Where the sgemm under Eigen is ported (AVX2, :func:`.eigen_contraction.ported`) and the convolution has one
    group: the contraction's own buffers (:func:`.eigen_contraction.contraction_scratch`: the output features by
    the output positions, over the window times the input channels; the packed image patches are the im2col).
    Otherwise the calibration of AVX-512 hosts: an im2col buffer of the output, one group at a time, and Eigen's
    packing buffer (8x32x32x3 -> 16, 3x3 and 5x5 SAME). With one output feature per group the contraction runs
    sequentially (``TensorContractionThreadPool.h`` ``evalProductImpl``: ``if (n == 1) num_threads = 1``), its
    blocks no larger than the im2col matrix and the group's kernel."""
    c = conv(ins, module.types)
    if c is None or not c.window:
        return 0
    spatial = math.prod(c.out[c.out_labels.index(str(k))] for k in range(len(c.window)))
    rows = math.prod(c.window) * (c.dim("f") // c.groups) * c.item
    features = c.out[c.out_labels.index("f")] // c.groups
    if c.groups == 1 and c.item == 4 and eigen_contraction.ported():
        held = eigen_contraction.contraction_scratch(features, c.dim("b") * spatial, rows // c.item,
                                                     threads=_threads(), caches=eigen_contraction.host_caches(),
                                                     patches=True)
        return held.low if low else held.high
    im2col = c.dim("b") * spatial * rows
    return im2col + (_sequential_packing(im2col, rows * features) if features == 1 else _EIGEN_PACKING)


def _dot_dims(ins: Instruction, module: Module) -> tuple[int, int, int] | None:
    """(m, n, k) of a ``dot`` in Eigen's column-major terms: XLA's ``MatMul`` of a row-major ``[rows, cols]``
    output per batch element contracts with ``m`` = cols, ``n`` = rows (``dot_lib.h``); None where the text
    lacks a shape."""
    out, lhs = shape(ins.type), shape(module.types.get(ins.operands[0], "")) if ins.operands else None
    summed = _dims(ins, "lhs_contracting_dims")
    if out is None or lhs is None or not summed:
        return None
    batch_dims = _dims(ins, "lhs_batch_dims")
    lhs_free = len(lhs[0]) - len(summed) - len(batch_dims)
    free = out[0][len(batch_dims):]
    rows, cols = math.prod(free[:lhs_free]), math.prod(free[lhs_free:])
    if re.search(r"\]\{0,1\}", ins.type):  # a column-major output: the roles swap
        rows, cols = cols, rows
    return cols, rows, math.prod(lhs[0][d] for d in summed)


def _eigen_dot(ins: Instruction, module: Module, threads: int, low: bool = False) -> int:
    """XLA's own dot (``xla/backends/cpu/runtime/dot_thunk.cc``, an Eigen contraction, one batch element at a
    time): where the sgemm under Eigen is ported (AVX2), the contraction's buffers
    (:func:`.eigen_contraction.contraction_scratch`); otherwise the packing buffer calibrated on AVX-512 hosts
    (keras_mlp's weight-gradient dots)."""
    out = shape(ins.type)
    dims = _dot_dims(ins, module) if eigen_contraction.ported() and out is not None and out[1] == 4 else None
    if dims is None:
        return _EIGEN_PACKING
    held = eigen_contraction.contraction_scratch(*dims, threads=_threads(), caches=eigen_contraction.host_caches())
    return held.low if low else held.high


def _ynn_fusion(ins: Instruction, module: Module, threads: int, *, sliced: bool = False) -> int:
    """A YNNPACK fusion: what its convolutions, dots and reductions hold to its end, plus the largest brief block."""
    body = module.computations.get(ins.called or "", [])
    fusion = _Fusion(body, module.types, threads, {i.name: i for i in body},
                     frozenset(i.name for i in body if i.opcode not in ("parameter", "constant")), sliced)
    held = brief = 0
    for op in body:
        rule = _YNN_RULES.get(op.opcode)
        if rule is not None:
            h, b = rule(op, fusion)
            held, brief = held + h, max(brief, b)
    return held + brief + _YNN_CALL


_ENTRY_RULES: dict[str, Callable[[Instruction, Module, int, bool], int]] = {
    "convolution": _eigen_convolution,
    "dot": _eigen_dot,
}


def _bodies(ins: Instruction) -> list[str]:
    """The computations a ``while`` (its body), ``call`` or ``conditional`` (its branches) runs; none for others."""
    if ins.opcode not in ("while", "call", "conditional"):
        return []
    branches = re.search(r"branch_computations=\{([^}]*)\}", ins.rest)
    return re.findall(r"(?:body|to_apply)=%([\w.\-]+)", ins.rest) + \
        (re.findall(r"%([\w.\-]+)", branches.group(1)) if branches else [])


def _run_by(ins: Instruction, module: Module, depth: int = 0) -> list[Instruction]:
    """The instructions of the loop bodies, calls and branches ``ins`` runs, nested ones included."""
    inner = [op for body in _bodies(ins) for op in module.computations.get(body, [])]
    return inner + [nested for op in inner for nested in _run_by(op, module, depth + 1)] if depth < 8 else []


def _scratch(ins: Instruction, module: Module, threads: int, *, sliced: bool = False) -> int:
    """Scratch of one top-level instruction, in bytes: its kind's rule, a YNNPACK fusion's, the largest of the
    instructions of the loop body, call or branches it runs (a recurrent layer's ``while``: keras_lstm's
    gradient loop packs its 128x512 recurrent kernel, 262,207 B, inside the body), or none."""
    if _bodies(ins):
        return max((_scratch(op, module, threads, sliced=sliced) for op in _run_by(ins, module)
                    if not _bodies(op)), default=0)
    rule = _ENTRY_RULES.get(ins.opcode)
    if rule is None and ins.called is not None and _YNN_FUSION in ins.rest:
        return _ynn_fusion(ins, module, threads, sliced=sliced)
    return rule(ins, module, threads, sliced) if rule is not None else 0


@dataclass(frozen=True, slots=True)
class Workspace:
    """Kernel scratch above XLA's buffers at the step's peak, in bytes, at both ends of what threads make of it.

    XLA's thunk executor (``xla/backends/cpu/runtime/thunk_executor.cc``, ``ThunkExecutor::Execute``) runs the
    head of its ready queue inline and hands the tail to the task runner: independent instructions run at once
    when a worker thread is free, one after the other when not. YNNPACK's parallel loops hand tiles to as many
    workers as join them, each with its own tile scratch, and may slice a fusion along the batch. Which happens
    differs from step to step and from process to process.
    """

    high: int
    """Independent Eigen convolutions overlapping, every worker thread holding its tiles."""
    low: int
    """One instruction at a time, one worker's tiles, YNNPACK fusions sliced to one batch element."""
    largest: int
    """The largest scratch of one instruction with every worker's tiles."""


def _peak(module: Module, threads: int, *, overlap: bool) -> tuple[int, int]:
    """(peak scratch, largest single scratch) over the entry computation, in bytes; without ``overlap``, YNNPACK
    fusions sliced to one batch element."""
    peak = largest = 0
    group: list[tuple[str, int]] = []  # neighbouring independent Eigen convolutions
    for ins in module.entry_body:
        scratch = _scratch(ins, module, threads, sliced=not overlap)
        if overlap and ins.opcode == "convolution":
            if any(name in ins.operands for name, _ in group):
                group = []
            group.append((ins.name, scratch))
            peak = max(peak, sum(s for _, s in group))
        else:
            if ins.opcode not in NO_BUFFER:
                group = []
            peak = max(peak, scratch)
        largest = max(largest, scratch)
    return peak, largest


def fusion_workspace(module: Module) -> Workspace:
    """Kernel scratch above XLA's buffers at the step's peak, in bytes (see :class:`Workspace`).

    XLA:CPU allocates its temporaries as one block live for the whole execution, so the scratch adds to all
    of it. Neighbouring Eigen convolutions that do not read each other's results (the two branches of
    keras_two_branch_cnn) hold their scratch together when they overlap.
    """
    high, largest = _peak(module, _threads(), overlap=True)
    low, _ = _peak(module, 1, overlap=False)
    return Workspace(high, low, largest)


def rounded_convolution_fusions(module: Module) -> list[str]:
    """Names of the entry's YNNPACK fusions that hold a convolution or a pooling window (``reduce-window``) and
    round its values to 16 bits.

    Under a ``mixed_bfloat16`` / ``mixed_float16`` policy XLA:CPU computes a convolution in float32 and rounds
    each intermediate through ``convert`` pairs (f32 -> bf16 -> f32) inside the fusion. YNNPACK then runs the
    fusion unsliced and keeps some of those intermediates whole, in 16 or 32 bits (malloc-counted:
    keras_separable_cnn inference held three whole 524,288 B buffers at its tail where the float32 step holds
    2-image tiles; keras_partly_frozen training a whole bf16 padded input and two bf16 activations where the
    float32 step holds 1-image slices). So does a fusion that pools rounded values before a dot (keras_conv1d_gru
    inference under ``mixed_bfloat16``: bias, relu and max pooling of the convolution's output, then the GRU's
    input projection; about 72 KB above the rules in 4 processes). Which ones it keeps is slinky's scheduling,
    not modelled.
    """
    names = []
    for ins in module.entry_body:
        if ins.called is None or _YNN_FUSION not in ins.rest:
            continue
        body = module.computations.get(ins.called, [])
        if any(op.opcode in ("convolution", "reduce-window") for op in body) and \
                any(op.opcode == "convert" and op.type.startswith(("bf16[", "f16[")) for op in body):
            names.append(ins.name)
    return names


def eigen_uncalibrated(module: Module) -> int:
    """How many of the step's top-level convolutions and dots run XLA's own Eigen contractions whose scratch is
    neither ported nor calibrated on this CPU. With oneDNN's AVX2 kernels (:func:`.eigen_contraction.ported`) the
    contraction is ported, except convolutions of several feature groups (``EigenConv2DImpl`` slices each group's
    input and contracts the groups side by side: measured 2 x 374,464 B packed where the port of one group gives
    32,320 B) and non-float32 operands; with AVX-512 the calibrated packing buffer stands (0); below AVX2 (AVX
    kernels: another no-copy workspace and copy blocking) none is."""
    if describe().isa_at_least("avx512_core"):
        return 0
    ours = [op for ins in module.entry_body for op in (ins, *_run_by(ins, module)) if op.opcode in _ENTRY_RULES]
    if not eigen_contraction.ported():
        return len(ours)

    def modelled(ins: Instruction) -> bool:
        out = shape(ins.type)
        if out is None or out[1] != 4:
            return False
        c = conv(ins, module.types) if ins.opcode == "convolution" else None
        return ins.opcode == "dot" or (c is not None and c.groups == 1)
    return sum(1 for ins in ours if not modelled(ins))


def runtime_bookkeeping(module: Module, outputs: int) -> int:
    """Bytes the JAX / PjRt runtime mallocs for its own bookkeeping during one execute call of ``module``.

    A per-buffer cost: each parameter, each new output and each donated parameter an output aliases; ``outputs``
    is the executable's output leaves. A Keras step passes every variable of its state, so on small models this
    is a visible share of the step.
    """
    params = sum(ins.opcode == "parameter" for ins in module.entry_body)
    aliased = min(module.aliases, params, outputs)
    return _CALL_BASE + _PER_ALIASED * aliased + _PER_INPUT * (params - aliased) + _PER_OUTPUT * (outputs - aliased)
