"""The scratch of a matmul ATen runs through oneDNN: the brgemm matmul scratchpad, or a note where not modelled.

Follows aten/src/ATen/native/mkldnn/Matmul.cpp (``use_mkldnn_{bf16,fp16,bf32}_matmul``, ``checksize``,
``mkldnn_gemm``, ``mkldnn_matmul``), LinearAlgebra.cpp (``addmm_impl_cpu_``, ``bmm_out_or_baddbmm_``) and
oneDNN v3.12 src/cpu/x64/matmul/brgemm_matmul_utils.cpp (``init_brgemm_matmul_conf``,
``compute_blocking_heuristic_avx512``, ``init_aux_values``, ``init_scratchpad``) with
src/common/memory_tracking.hpp (``registry_t::book``). ideep allocates the whole scratchpad (user scratchpad
mode) as one block from PyTorch's CPU allocator per call; ``tests/frontends/pytorch/test_matmul_scratch.py``
measures it. Modelled: bfloat16 on ``brg_matmul:avx512_core_bf16`` at the thread counts measured there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from nnmem.cpu import CpuInfo
from nnmem.frontends.pytorch.workspace._common import NOT_MODELLED, aten, dtype_name, nbytes, round_up
from nnmem.frontends.pytorch.workspace.matmul_amx import amx_scratchpad
from nnmem.frontends.pytorch.workspace.misc import _folds

# The ISA and thread counts where oneDNN's bfloat16 scratch was measured (torch 2.13.0, oneDNN 3.12): the matmuls
# (test_matmul_scratch.py), the flash-attention backward's gemms and the forward convolutions (conv_select.py).
MODELLED_ISA = "avx512_core_bf16"
MODELLED_THREADS = (1, 2, 3, 4)
AMX_ISA = "avx512_core_amx"
# (ISA, dtype) pairs whose scratchpad is modelled: bf16 without AMX, bf16 and f16 on AMX (test_matmul_amx.py).
_MODELLED = {(MODELLED_ISA, torch.bfloat16), (AMX_ISA, torch.bfloat16), (AMX_ISA, torch.float16)}

_BF16, _F32 = 2, 4  # bytes per element: the operands and the f32 accumulator
_ALIGN = 128  # memory_tracking.hpp default_alignment: book() adds it to every non-empty entry
_BATCH_ELEMENT = 40  # sizeof(brgemm_batch_element_t), src/cpu/x64/brgemm/brgemm_types.hpp (x86-64)
_WEI_N_BLK = 64  # get_default_n_block: no blocked tag, no AMX
_WEI_K_BLK = 32  # get_wei_k_blk(bf16): 16 × VNNI granularity 2
_CACHELINE_ELEMS = 64 // _BF16  # get_actual_lda: 64-byte cache line of bf16


def onednn_matmul(dtype: torch.dtype, a_numel: int, n: int, info: CpuInfo) -> bool:
    """Whether ATen runs a matmul through oneDNN (aten/src/ATen/native/mkldnn/Matmul.cpp
    ``use_mkldnn_{bf16,fp16,bf32}_matmul`` and ``checksize``: the type supported by the CPU and
    ``m * k * n`` (times the batch) above 16^3; float32 only at ``set_float32_matmul_precision("medium")``)."""
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled) or a_numel * n <= 16 ** 3:
        return False
    if dtype == torch.bfloat16:
        return info.onednn_bf16
    if dtype == torch.float16:
        return info.onednn_fp16
    return dtype == torch.float32 and info.onednn_bf16 and torch.get_float32_matmul_precision() == "medium"


@dataclass(frozen=True, slots=True)
class OnednnMatmul:
    """A matmul as oneDNN's primitive sees it: ``src [batch, m, k] @ wei [batch, k, n]``.

    Attributes:
        m, k, n: the primitive's dimensions (ATen may swap the operands, see :func:`onednn_call`).
        batch: the batch (1 for a 2-D product).
        a_transposed: whether src comes with the transposed tag (``ba`` / ``acb``).
        b_transposed: whether the weights come with the transposed tag (AMX copies them differently).
    """

    m: int
    k: int
    n: int
    batch: int = 1
    a_transposed: bool = False
    b_transposed: bool = False


def _cast(t: torch.Tensor) -> str | None:
    """How ``addmm_impl_cpu_`` casts a 2-D operand ``[rows, cols]`` of the row-major product: ``"plain"`` when
    ``stride(1) == 1`` and ``stride(0) >= max(1, cols)``, else ``"transposed"`` when ``stride(0) == 1`` and
    ``stride(1) >= max(1, rows)``, else None (a contiguous clone). An operand with a padded leading dimension
    (``x[:, 0]`` of a ``[B, T, D]`` activation: a classifier's first token; one direction's slice of a
    bidirectional output, transposed in backward) goes to oneDNN with its ``lda`` and books the dense operand's
    scratchpad (measured: 16 row-major and 14 column-major seeded draws, 1-4 threads, equal)."""
    rows, cols = int(t.shape[0]), int(t.shape[1])
    s_rows, s_cols = int(t.stride(0)), int(t.stride(1))
    if s_cols == 1 and s_rows >= max(1, cols):
        return "plain"
    if s_rows == 1 and s_cols >= max(1, rows):
        return "transposed"
    return None


def _batched(t: torch.Tensor) -> str | None:
    """``"plain"`` for a contiguous batch, ``"transposed"`` for one whose matrices are column-major and dense
    (Matmul.cpp ``is_mkldnn_optimized_format``), else None (ATen copies it)."""
    if t.is_contiguous():
        return "plain"
    _, rows, cols = (int(d) for d in t.shape)
    strides = tuple(int(s) for s in t.stride())
    return "transposed" if strides == (rows * cols, 1, rows) else None


def _strict_folds(x: torch.Tensor) -> bool:
    """``should_fold``'s stride test (aten/src/ATen/native/LinearAlgebra.cpp): each leading stride is the next
    one times its size, size-1 dimensions included (unlike ``Tensor::is_contiguous``)."""
    shape, stride = x.shape, x.stride()
    return all(int(stride[i]) == int(stride[i + 1]) * int(shape[i + 1]) for i in range(x.dim() - 2))


def linear_batched(x: Any, weight: Any, bias: Any) -> bool:
    """Whether ``aten.linear`` on a 3-D input runs ``matmul``'s batched path: Linear.cpp flattens a contiguous
    input with a bias (``_flatten_nd_linear``); otherwise ``matmul(x, weight.t())`` folds ``x`` to 2-D (a copy
    where its leading dimensions do not fold, :func:`.misc.rule_linear`) when ``should_fold`` holds — always
    for a weight that requires a gradient (``t2->requires_grad()``), else where the strides fold — and
    otherwise expands the weight over ``x``'s first dimension and calls ``bmm``. Measured without a dispatch
    mode: under one (a profiler's op recorder, the tracker) the weight's view loses ``requires_grad`` and the
    real kernel takes ``bmm`` for every weight. Under autocast the weight is a cast copy: ``bmm``."""
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        return False
    if bias is not None and x.is_contiguous():
        return False
    if isinstance(weight, torch.Tensor) and weight.requires_grad:
        return False
    return not _strict_folds(x)


def linear_copies(args: tuple[Any, ...]) -> int:
    """Bytes ``mkldnn_matmul`` copies for a batched ``aten.linear`` (Matmul.cpp: an operand not in
    ``is_mkldnn_optimized_format`` is made contiguous first): the weight expanded to ``[T, k, n]``, always, and
    an input that is not a dense batch (:func:`_batched`). Measured: batch-first projections, seeded draws."""
    x, w = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    if not linear_batched(x, w, bias):
        return 0
    batch, k, n = int(x.shape[0]), int(x.shape[2]), int(w.shape[0])
    weight = batch * k * n * w.element_size()
    return weight + (nbytes(x) if _batched(x) is None else 0)


def _linear_call(x: Any, w: Any, bias: Any = None) -> OnednnMatmul | None:
    """``aten.linear`` (whole under ``inference_mode``): Linear.cpp hands ``addmm`` / ``mm`` (``_flatten_nd_linear``
    or ``matmul``'s fold, over a copy where the input's leading dimensions do not fold) the input viewed as
    ``[-1, k]`` and ``weight.t()``; a 3-D input that ``matmul`` does not fold goes to ``bmm``
    (:func:`linear_batched`) over contiguous copies. None for an input of more dimensions that is not folded
    (``matmul`` reshapes it into a batch first: not modelled)."""
    if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor)) or x.dim() < 2 or w.dim() != 2:
        return None
    k, n = int(x.shape[-1]), int(w.shape[0])
    if linear_batched(x, w, bias):
        transposed = _batched(x) == "transposed"
        if transposed and int(x.shape[0]) == 1:  # measured between the plain and transposed scratchpads
            return None
        return OnednnMatmul(int(x.shape[1]), k, n, int(x.shape[0]), transposed)  # weight: a contiguous copy
    m = x.numel() // max(k, 1)
    if x.dim() > 2 and not _folds(x):
        if not w.requires_grad:
            return None
        # should_fold: a row-major contiguous copy (misc.rule_linear), then the 2-D product
        return OnednnMatmul(1, k, m, 1, False, True) if n == 1 else OnednnMatmul(m, k, n, 1, False, True)
    flat = x if x.dim() == 2 else x.reshape(-1, k)
    a_layout = _cast(flat.t() if n == 1 else flat)
    b_layout = _cast(w if n == 1 else w.t())
    if a_layout is None or b_layout is None:
        return None
    if n == 1:
        return OnednnMatmul(1, k, m, 1, False, a_layout == "transposed")
    return OnednnMatmul(m, k, n, 1, a_layout == "transposed", b_layout == "transposed")


def onednn_call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> OnednnMatmul | None:
    """The primitive a bf16 ``mm`` / ``addmm`` / ``bmm`` / ``baddbmm`` call creates, or None where ATen first copies
    an operand (strided, or a batch not dense) or scales it (``alpha != 1``), which no rule models.

    2-D: ``addmm_impl_cpu_`` computes the fresh row-major result as ``C^T = B^T A^T`` (``transpose_c``) unless
    its last dimension is 1, then ``mkldnn_gemm`` swaps again: oneDNN sees ``A @ B`` (``n == 1``: ``B^T @ A^T``).
    3-D: ``mkldnn_matmul`` takes ``batch1`` and ``batch2`` as they are where ``is_mkldnn_optimized_format``
    holds, else a contiguous copy (:func:`bmm_copies`)."""
    if func is aten.linear.default:
        return _linear_call(args[0], args[1], args[2] if len(args) > 2 else kwargs.get("bias"))
    if func in (aten.mm.default, aten.bmm.default, aten.bmm.out):
        a, b = args[0], args[1]
    elif func is aten.matmul.default:  # whole under inference_mode; two matrices: Tensor::mm (LinearAlgebra.cpp)
        a, b = args[0], args[1]
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dim() != 2 or b.dim() != 2:
            return None
    elif func in (aten.addmm.default, aten.baddbmm.default, aten._addmm_activation.default):
        a, b = args[1], args[2]
        if float(kwargs.get("alpha", args[4] if len(args) > 4 else 1)) != 1.0:
            return None
    else:
        return None
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dim() != b.dim():
        return None
    m, k, n = int(a.shape[-2]), int(a.shape[-1]), int(b.shape[-1])
    if a.dim() == 3:  # Matmul.cpp is_mkldnn_optimized_format, else a contiguous copy (bmm_copies)
        return OnednnMatmul(m, k, n, int(a.shape[0]), _batched(a) == "transposed", _batched(b) == "transposed")
    if a.dim() != 2:
        return None
    if n == 1:  # result [m, 1] is column-major too: no transpose_c; the casts see the operands transposed
        a_layout, b_layout = _cast(a.t()), _cast(b.t())
        if a_layout is None or b_layout is None:
            return None
        return OnednnMatmul(1, k, m, 1, False, a_layout == "transposed")
    a_layout, b_layout = _cast(a), _cast(b)
    if a_layout is None or b_layout is None:
        return None
    return OnednnMatmul(m, k, n, 1, a_layout == "transposed", b_layout == "transposed")


def bmm_copies(func: Any, args: tuple[Any, ...]) -> int:
    """Bytes of the contiguous copies ``mkldnn_matmul`` makes of the batch operands that are not dense batches
    (Matmul.cpp ``is_mkldnn_optimized_format``: ``mat.contiguous()``), live with the scratchpad: the heads of
    ``nn.MultiheadAttention``'s projections are strided slices (batch stride E / H, row stride B·E)."""
    if func in (aten.bmm.default, aten.bmm.out):
        a, b = args[0], args[1]
    elif func is aten.baddbmm.default:
        a, b = args[1], args[2]
    else:
        return 0
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dim() != 3:
        return 0
    return sum(nbytes(t) for t in (a, b) if _batched(t) is None)


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


def _is_pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def _spatial_disbalance(work: int, block: int) -> np.float32:
    """``calculate_spatial_disbalance`` (in float, as oneDNN computes it)."""
    mod = work % block
    return np.float32(block - mod if work < block else min(block - mod, mod)) / np.float32(block)


def _imbalance(c: OnednnMatmul, nthr: int, m_blk: int, n_chunks: int, n_blk: int, k_blk: int,
               nthr_k: int) -> np.float32:
    """``matmul_avx512_blocking_params_t::get_imbalance`` (m_chunks 1), in float32 as oneDNN sums it."""
    f = np.float32
    cur = nthr // nthr_k
    work = _div_up(c.m, m_blk) * _div_up(c.n, n_blk * n_chunks) * c.batch
    num_n_blk = _div_up(c.n, n_blk)
    n_disb = (f(_div_up(num_n_blk, n_chunks)) * f(n_chunks) - f(num_n_blk)) / f(num_n_blk)
    thr_disb = (f(nthr) - f(cur * nthr_k)) / f(nthr) if cur * nthr_k != nthr else f(0)
    total = _spatial_disbalance(work, cur) + f(m_blk * _div_up(c.m, m_blk) % c.m) / f(c.m)
    return f((((total + n_disb) + thr_disb) + _spatial_disbalance(c.k, nthr_k * k_blk)) / f(5))


@dataclass(frozen=True, slots=True)
class _Blocking:
    m_blk: int
    n_chunks: int
    k_blk: int
    nthr_k: int
    buffer_a: bool


def _blocking(c: OnednnMatmul, nthr: int, f16: bool = False) -> _Blocking | None:
    """``compute_blocking_heuristic`` → ``compute_blocking_heuristic_avx512`` for bf16 on avx512_core_bf16 (no
    AMX, N block fixed at 64 by the blocked bf16 tags, so never narrowed to 32), or for f16 on
    avx512_core_fp16 (``f16``: A always copied, ``is_copy_a_required``; the K split needs no power of two)."""
    transposed_a = c.a_transposed and c.m != 1  # treat_A_as_plain when M == 1
    # src_tag: a [1, K] src matches ab and ba, and set_or_check_tags then takes matmul_helper_t::transA(),
    # 'T' unless M > 1 (src/cpu/matmul/matmul_utils.hpp)
    transposed_tag = c.a_transposed or c.m == 1
    lda_big_pow2 = not transposed_a and _is_pow2(c.k) and c.k >= 8192 // _BF16
    buffer_a = f16 or transposed_a or (lda_big_pow2 and c.m >= 1024)  # is_copy_a_required | prefer_copy_a
    max_m_blk, min_m_blk = min(256, c.m), min(32, c.m)
    n_blk = min(_WEI_N_BLK, c.n)
    n_chunks_start = min(16 if buffer_a else 1, _div_up(c.n, n_blk))
    k_blk = min(c.k, 1024 if c.k > 1024 and not transposed_tag else 512)
    start_nthr_k = 1
    if nthr > c.batch * _div_up(c.n, n_blk):  # low_parallel_work
        min_m_blk = min(c.m, 16)
        if c.batch == 1 and transposed_tag and (f16 or _is_pow2(c.k)) and c.k >= 2048:  # bwd_w_par_k_blk
            start_nthr_k = min(nthr, 4)
    best, best_imb = None, np.float32(1)
    for nthr_k in range(start_nthr_k, 0, -1):
        found = False
        for n_chunks in range(n_chunks_start, 0, -1):
            for m_blk in range(max_m_blk, min_m_blk - 1, -1):
                imb = _imbalance(c, nthr, m_blk, n_chunks, n_blk, k_blk, nthr_k)
                work = c.batch * _div_up(c.m, m_blk) * _div_up(c.n, n_blk * n_chunks)
                nthr_bmn = nthr // nthr_k
                if work < nthr_bmn * 3 and work % nthr_bmn != 0 and start_nthr_k == 1:
                    continue
                if imb < best_imb:
                    best, best_imb, found = _Blocking(m_blk, n_chunks, k_blk, nthr_k, buffer_a), imb, True
        if not found:
            imb = _imbalance(c, nthr, min_m_blk, 1, n_blk, k_blk, nthr_k)
            if imb < best_imb:
                best, best_imb = _Blocking(min_m_blk, 1, k_blk, nthr_k, buffer_a), imb
    return best  # None: VERBOSE_BLOCKING_FAIL, oneDNN would pick another implementation (not modelled)


def _book(size: int) -> int:
    """``registry_t::book``: an entry takes its size plus the alignment (128), and nothing when empty."""
    return size + _ALIGN if size > 0 else 0


def brgemm_scratchpad(c: OnednnMatmul, nthr: int, f16: bool = False) -> int | None:
    """Bytes of the scratchpad a bf16 ``brg_matmul:avx512_core_bf16`` primitive books (``init_scratchpad``):
    per thread, the brgemm batch elements, a copy of A (transposed A), a VNNI copy of B's K×N block and the
    f32 accumulator C; entries rounded by :func:`_book`. C is always booked: ``is_buffer_c_required`` runs in
    ``update_configuration`` before ``init_aux_values`` sets ``K_chunk_elems`` (still 0), so a bf16 dst
    (≠ the f32 accumulator) always needs it. With ``f16``, an f16 ``brg_matmul:avx512_core_fp16`` primitive
    (a CPU with AMX but no AMX-FP16): ``init_brgemm_matmul_conf`` converts both operands to f32 in the A and B
    copies (``tr_a_dt_sz`` 4, ``get_wei_k_blk(f32)`` 16), same blocking otherwise.

    Args:
        c: the primitive's shape (:func:`onednn_call`).
        nthr: oneDNN's thread count (``dnnl_get_max_threads``, i.e. ``torch.get_num_threads()``).
        f16: the float16 primitive on avx512_core_fp16.
    """
    blk = _blocking(c, nthr, f16)
    if blk is None:
        return None
    tr_size = _F32 if f16 else _BF16
    cacheline, wei_k_blk = 64 // tr_size, 16 * (1 if f16 else 2)
    n_blk = min(_WEI_N_BLK, c.n)
    batch_elems = nthr * 16 * _BATCH_ELEMENT  # brgemm_batch_size 1 on this path
    lda = round_up(blk.k_blk, cacheline)
    if lda >= 512 and _is_pow2(lda):
        lda += cacheline
    buffer_a = nthr * tr_size * blk.m_blk * lda if blk.buffer_a else 0
    buffer_b = nthr * tr_size * round_up(n_blk, _WEI_N_BLK) * round_up(blk.k_blk, wei_k_blk)
    if blk.nthr_k > 1:  # LDC = LDD (the dst row), rows: all of M
        buffer_c = nthr * _F32 * c.n * c.m
    else:
        chunk = _F32 * n_blk * blk.m_blk
        buffer_c = nthr * chunk * (1 if blk.k_blk >= c.k else blk.n_chunks)
    return _book(batch_elems) + _book(buffer_a) + _book(buffer_b) + _book(buffer_c)


def matmul_scratch(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], info: CpuInfo) -> int | None:
    """The oneDNN scratchpad of a matmul op call, in bytes; 0 when ATen does not send it to oneDNN; None
    when it does but no rule models the call on this CPU (then :func:`matmul_note` gives the reason)."""
    operands = _matmul_operands(func, args)
    if operands is None or not onednn_matmul(operands[0].dtype, operands[0].numel(), operands[1], info):
        return 0
    dtype, nthr = operands[0].dtype, torch.get_num_threads()
    if nthr not in MODELLED_THREADS or (info.isa, dtype) not in _MODELLED:
        return None
    call = onednn_call(func, args, kwargs)
    if call is None or (info.isa == AMX_ISA and dtype == torch.bfloat16 and not _dense(operands[0], func, args)):
        return None
    if dtype == torch.float16 and call.m == 1 and call.batch == 1:
        return None  # a vector product: ATen's own f16 gemv takes some (measured, thread-dependent), not modelled
    scratchpad = onednn_scratchpad(call, nthr, info.isa, dtype)
    if scratchpad is None:
        return None
    return scratchpad + (linear_copies(args) if func is aten.linear.default else bmm_copies(func, args))


def _dense(t: torch.Tensor, func: Any = None, args: tuple[Any, ...] = ()) -> bool:
    """Whether the src oneDNN reads has no padded leading dimension: the AMX heuristics read its real ``lda``
    (measured: a padded row differs), which :class:`OnednnMatmul` does not carry. ATen hands oneDNN a contiguous
    copy of a batch that is not dense (:func:`_batched`: ``bmm`` / ``baddbmm``, ``aten.linear``'s batched path)
    and of a linear's input whose leading dimensions do not fold (:func:`_linear_call`)."""
    if t.is_contiguous():
        return True
    if func is aten.linear.default and t.dim() > 2:
        bias = args[2] if len(args) > 2 else None
        if linear_batched(t, args[1], bias) or not _folds(t):
            return True
        t = t.reshape(-1, int(t.shape[-1]))
    elif t.dim() == 3 and _batched(t) is None:
        return True
    return t.dim() >= 2 and t.transpose(-1, -2).is_contiguous()


def onednn_scratchpad(c: OnednnMatmul, nthr: int, isa: str, dtype: torch.dtype) -> int | None:
    """The scratchpad of the implementation oneDNN picks (``cpu_matmul_list.cpp``): on avx512_core_amx, bf16
    goes to ``brg_matmul:avx512_core_amx`` unless that refuses the shape, then to ``avx512_core_bf16``; f16
    (no AMX-FP16) to ``avx512_core_fp16``."""
    if isa == MODELLED_ISA:
        return brgemm_scratchpad(c, nthr)
    if dtype == torch.float16:
        return brgemm_scratchpad(c, nthr, f16=True)
    b_transposed = c.b_transposed and c.k > 1 and c.n > 1  # a vector matches ab first
    amx = amx_scratchpad(c.m, c.k, c.n, c.batch, c.a_transposed, b_transposed, nthr, _book)
    return amx if amx is not None else brgemm_scratchpad(c, nthr)


def _rule(func: Any) -> Any:
    """The workspace rule of one matmul op: :func:`matmul_scratch`, 0 where not modelled (and noted)."""
    def rule(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool, info: CpuInfo) -> int:
        return matmul_scratch(func, args, kwargs, info) or 0
    return rule


WORKSPACE = {op: _rule(op) for op in (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.bmm.out,
                                      aten.baddbmm.default, aten.matmul.default,
                                      aten._addmm_activation.default, aten.linear.default)}


def _matmul_operands(func: Any, args: tuple[Any, ...]) -> tuple[torch.Tensor, int] | None:
    """The left operand of a matmul op and the right one's last dimension."""
    if func in (aten.mm.default, aten.bmm.default, aten.bmm.out, aten.matmul.default):
        a, b = args[0], args[1]
    elif func in (aten.addmm.default, aten.baddbmm.default, aten.addbmm.default, aten._addmm_activation.default):
        a, b = args[1], args[2]
    elif func is aten.linear.default:  # input @ weight.T: n is the weight's first dimension
        a, b = args[0], args[1]
        return (a, int(b.shape[0])) if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) else None
    else:
        return None
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or b.dim() < 1:
        return None
    return a, int(b.shape[-1])


def matmul_note(func: Any, args: tuple[Any, ...], info: CpuInfo, kwargs: dict[str, Any] | None = None) -> str | None:
    """Why the scratch of a matmul op call is not modelled on this CPU, or None (not a matmul, not oneDNN's, or
    modelled by :func:`matmul_scratch`)."""
    if matmul_scratch(func, args, kwargs or {}, info) is not None:
        return None
    a = (args[0] if func in (aten.mm.default, aten.bmm.default, aten.bmm.out, aten.matmul.default, aten.linear.default)
         else args[1])
    return f"{dtype_name(a.dtype)} matmul through oneDNN (ISA {info.isa}): {NOT_MODELLED}"
