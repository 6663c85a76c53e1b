"""The workspace rules of the attention kernels: the fused multi-head attention and encoder layer of the
inference fast path, and the CPU flash-attention kernel behind ``F.scaled_dot_product_attention``.

The fused kernels run a fixed sequence of ATen calls whose allocations are replayed here in order
(aten/src/ATen/native/transformers/attention.cpp ``native_multi_head_attention_cpu``, ``masked_softmax``;
transformer.cpp ``transformer_encoder_layer_forward``; SoftMax.cpp ``masked_softmax_cpu``; layer_norm.cpp).
The flash kernel's per-thread buffers follow aten/src/ATen/native/cpu/FlashAttentionKernel.cpp, which the
CPU picks whenever ``sdp_utils_cpp.cpp`` ``use_flash_attention_cpp`` allows (no dropout, dense 4-D inputs,
grouped-query heads included); otherwise the math path decomposes into ops the trace sees.
"""

from __future__ import annotations

from typing import Any

import torch

from nnmem.cpu import CpuInfo
from nnmem.frontends.pytorch.workspace._common import NOT_MODELLED, alloc_peak, aten, dtype_name
from nnmem.frontends.pytorch.workspace.matmul import (
    AMX_ISA,
    MODELLED_ISA,
    MODELLED_THREADS,
    OnednnMatmul,
    onednn_matmul,
    onednn_scratchpad,
)

_REDUCED = (torch.float16, torch.bfloat16)


class _Replay:
    """A kernel's allocations in order: ``alloc`` returns a handle, ``free`` gives its bytes back."""

    def __init__(self) -> None:
        self.events: list[int] = []

    def alloc(self, nbytes: int) -> int:
        self.events.append(nbytes)
        return nbytes

    def free(self, *sizes: int) -> None:
        self.events.extend(-s for s in sizes if s)

    @property
    def peak(self) -> int:
        return alloc_peak(self.events)


def _contiguous_copy(t: torch.Tensor) -> int:
    """Bytes of ``t.reshape(-1, last)`` where the view is impossible (a strided 3-D activation)."""
    return 0 if t.is_contiguous() else t.numel() * t.element_size()


def _bool_mask(run: _Replay, mask: torch.Tensor | None) -> int:
    """``masked_softmax``: ``mask.to(kBool)`` unless bool, then ``mask_.contiguous()`` in
    ``masked_softmax_cpu``: the bool mask's bytes live during the softmax (one byte per element)."""
    if mask is None:
        return 0
    if mask.dtype != torch.bool or not mask.is_contiguous():
        return run.alloc(mask.numel())
    return 0


def _mha(run: _Replay, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, num_head: int,
         mask: torch.Tensor | None, need_weights: bool, average: bool) -> tuple[int, int]:
    """Replay ``native_multi_head_attention_cpu``; returns the bytes of its two outputs (left allocated)."""
    e = query.element_size()
    batch, steps, dim = (int(s) for s in query.shape)
    s = batch * steps * dim * e  # one [B, T, D] activation
    scores = batch * num_head * steps * steps * e  # [B, H, T, T]
    # qkv_projection: one packed gemm for self-attention, else per-part gemms and a cat (3 x D columns)
    if key is value and query is key:
        copy = run.alloc(_contiguous_copy(query))
        qkv = run.alloc(3 * s)
        run.free(copy)
    else:
        parts = [(query, s), (key, 2 * s)] if key is value else [(query, s), (key, s), (value, s)]
        held = []
        for t, nbytes in parts:
            copy = run.alloc(_contiguous_copy(t))
            held.append(run.alloc(nbytes))
            run.free(copy)
        qkv = run.alloc(3 * s)
        run.free(*held)
    q_k_v = run.alloc(3 * s)  # _transform_bias_rescale_qkv: [3, B, H, T, dh]
    run.free(qkv)
    qkt = run.alloc(scores)  # bmm_nt
    if mask is not None:
        bool_mask = _bool_mask(run, mask)
        soft = run.alloc(scores)  # masked_softmax_cpu's output; the scores die on assignment
        run.free(bool_mask, qkt)
        qkt = soft
    # bmm_nn writes the context into q's storage; the scores die here unless returned
    if not need_weights:
        run.free(qkt)
    a_0213 = run.alloc(s)  # transform_0213: permute(0, 2, 1, 3).contiguous()
    proj = run.alloc(s)
    run.free(a_0213)
    weights = 0
    if need_weights and average:
        weights = run.alloc(scores // num_head)  # qkt.sum(1); the per-head scores die
        run.free(qkt)
    elif need_weights:
        weights = qkt
    run.free(q_k_v)
    return proj, weights


def rule_native_multi_head_attention(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                                     training: bool, info: CpuInfo) -> int:
    """``_native_multi_head_attention`` (nn.MultiheadAttention's inference fast path)."""
    query, key, value, _, num_head = args[:5]
    mask = args[9] if len(args) > 9 else kwargs.get("mask")
    need_weights = bool(args[10] if len(args) > 10 else kwargs.get("need_weights", True))
    average = bool(args[11] if len(args) > 11 else kwargs.get("average_attn_weights", True))
    if query.is_nested or query.numel() == 0:
        return 0
    run = _Replay()
    proj, weights = _mha(run, query, key, value, int(num_head), mask, need_weights, average)
    return run.peak - proj - weights


def _layer_norm(run: _Replay, x: int, rows: int, src: torch.Tensor, weight: torch.Tensor) -> int:
    """``at::layer_norm``: the output, and mean and rstd (freed on return) in the parameters' type when
    they differ from the input's (layer_norm.cpp ``param_scalar_type``)."""
    stats_size = 4 if weight.dtype != src.dtype else src.element_size()
    y = run.alloc(x)
    stats = run.alloc(2 * rows * stats_size)
    run.free(stats)
    return y


def rule_transformer_encoder_layer_fwd(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                                       training: bool, info: CpuInfo) -> int:
    """``_transformer_encoder_layer_fwd`` (nn.TransformerEncoderLayer's inference fast path): the layer norms,
    the fused attention and the feed-forward block in transformer.cpp's order, pre- or post-norm."""
    src, num_heads, norm_first = args[0], int(args[2]), bool(args[8])
    w_norm1, w_norm2, w_ffn1 = args[10], args[12], args[14]
    mask = args[18] if len(args) > 18 else kwargs.get("mask")
    if src.is_nested or src.numel() == 0:
        return 0
    rows = src.numel() // int(src.shape[-1])
    s = src.numel() * src.element_size()
    hidden = rows * int(w_ffn1.shape[0]) * src.element_size()
    run = _Replay()
    x = _layer_norm(run, s, rows, src, w_norm1) if norm_first else 0
    proj, _ = _mha(run, src, src, src, num_heads, mask, False, True)
    run.free(x)  # pre-norm: the normed input dies when x takes the attention's output
    if norm_first:
        residual = proj
        normed = _layer_norm(run, s, rows, src, w_norm2)
    else:
        residual = normed = _layer_norm(run, s, rows, src, w_norm1)
        run.free(proj)
    h = run.alloc(hidden)  # linear_for_ffn: _addmm_activation, then addmm
    y = run.alloc(s)
    run.free(h)
    if norm_first:
        run.free(normed, residual)
        return run.peak - y
    final = _layer_norm(run, s, rows, src, w_norm2)
    run.free(y, residual)
    return run.peak - final


# ---- scaled dot-product attention: the CPU flash kernel ---------------------------------------------------
def _flash_blocks(q_len: int, kv_len: int) -> tuple[int, int]:
    """The kernel's query and key/value block sizes (FlashAttentionKernel.cpp ``flash_attention_kernel_impl``:
    256 / 64 / 32 query rows for sequences of at least 768 / 192 / fewer, 512 key rows; capped by the lengths)."""
    q_split = 256 if q_len >= 768 else 64 if q_len >= 192 else 32
    return min(q_split, q_len), min(512, kv_len)


def _opmath_size(dtype: torch.dtype) -> int:
    return 8 if dtype == torch.float64 else 4


def rule_flash_attention_cpu(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                             training: bool, info: CpuInfo) -> int:
    """``_scaled_dot_product_flash_attention_for_cpu``: per-thread ``buf`` (scores block, row max and sum,
    output block, in the accumulate type) and, for float16/bfloat16, a scores block in the input type."""
    query, key = args[0], args[1]
    if query.dim() != 4 or query.numel() == 0:
        return 0
    q_split, kv_split = _flash_blocks(int(query.shape[2]), int(key.shape[2]))
    threads = torch.get_num_threads()
    head = int(query.shape[3])
    buf = threads * (q_split * kv_split + 2 * q_split + q_split * head) * _opmath_size(query.dtype)
    reduced = threads * q_split * kv_split * query.element_size() if query.dtype in _REDUCED else 0
    return buf + reduced


def rule_flash_attention_cpu_backward(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                                      training: bool, info: CpuInfo) -> int:
    """``_scaled_dot_product_flash_attention_for_cpu_backward``: ``grad_out`` made contiguous in the kernel's
    [B, L, H, E] order, per-thread scores and grad-scores blocks (accumulate type, and input type for
    float16/bfloat16), the calling thread's row sums (worker threads allocate theirs outside the profiler), and
    for bfloat16 the largest oneDNN scratchpad of its block gemms (:func:`flash_backward_gemm_scratch`)."""
    grad_out, query, key = args[0], args[1], args[2]
    if query.dim() != 4 or query.numel() == 0:
        return 0
    q_split, kv_split = _flash_blocks(int(query.shape[2]), int(key.shape[2]))
    threads = torch.get_num_threads()
    acc = _opmath_size(query.dtype)
    copy = 0 if grad_out.transpose(1, 2).is_contiguous() else grad_out.numel() * grad_out.element_size()
    buf = threads * 2 * q_split * kv_split * acc
    reduced = threads * 2 * q_split * kv_split * query.element_size() if query.dtype in _REDUCED else 0
    gemms = flash_backward_gemm_scratch(query, key, _flash_scale(args, kwargs), info, _flash_causal(args, kwargs)) or 0
    return copy + buf + reduced + q_split * acc + gemms


def _flash_scale(args: tuple[Any, ...], kwargs: dict[str, Any]) -> float | None:
    """The backward's ``scale`` argument, keyword-only (None: the default, 1 / sqrt(head size))."""
    scale = kwargs.get("scale")
    return None if scale is None else float(scale)


def _flash_causal(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """The backward's ``is_causal`` argument (grad_out, query, key, value, out, logsumexp, dropout_p, is_causal)."""
    return bool(args[7] if len(args) > 7 else kwargs.get("is_causal", False))


def _flash_block_shapes(q_len: int, kv_len: int, causal: bool) -> set[tuple[int, int]]:
    """The distinct (query rows, key rows) blocks ``cpu_flash_attention_backward`` multiplies: for the block of
    ``qBlockSize = min(q_split, q_len - m)`` rows at row m, key blocks at ``n < num_keys`` (``kv_len``, causal:
    ``min(m + qBlockSize, kv_len)``) of ``min(kv_split, kv_len - n)`` rows."""
    q_split, kv_split = _flash_blocks(q_len, kv_len)
    # without a mask every query block sees the same keys: its first block and its tail suffice
    starts = range(0, q_len, q_split) if causal else sorted({0, (q_len - 1) // q_split * q_split})
    shapes = set()
    for m in starts:
        rows = min(q_split, q_len - m)
        keys = min(m + rows, kv_len) if causal else kv_len
        last = (keys - 1) // kv_split * kv_split
        shapes |= {(rows, min(kv_split, kv_len - n)) for n in {0, last}}
    return shapes


def flash_backward_gemm_scratch(query: torch.Tensor, key: torch.Tensor, scale: float | None,
                                info: CpuInfo, causal: bool = False) -> int | None:
    """The largest oneDNN scratchpad among the reduced-precision flash backward's block gemms, in bytes; 0 where
    none goes to oneDNN; None where they do and no rule models them (the note says so).

    FlashAttentionKernel.cpp ``cpu_flash_attention_backward`` multiplies per block of ``q_split`` query and
    ``kv_split`` key rows: ``grad_v += grad_out^T attn``, ``grad_q += scale · grad_attn k``, ``grad_k += scale ·
    grad_attn^T q`` into the bfloat16 gradients (CPUBlas.cpp ``gemm`` → Matmul.cpp ``mkldnn_bf16_gemm`` above
    16^3: an ideep matmul with a sum post-op, ``C^T = B^T A^T``, its scratchpad one block per call, sized for
    ``torch.get_num_threads()`` threads: :func:`.matmul.brgemm_scratchpad`), plus a 4 B dst scale where
    ``scale != 1``. The scores and their gradient accumulate in float32 through ATen's own gemm (no
    scratchpad). Calls run one after another on the calling thread: the peak holds the largest. Measured exact
    on seeded shapes at 1-4 threads (tests/frontends/pytorch/test_flash_scratch.py). On AMX
    (:func:`.matmul.onednn_scratchpad`) the scratchpad does not grow with the block: every distinct block shape,
    tails included (:func:`_flash_block_shapes`), is sized and the largest taken.
    """
    if query.dtype not in _REDUCED or query.dim() != 4:
        return 0
    e = int(query.shape[3])
    alpha = scale if scale is not None else e ** -0.5
    # (m, n, k, B transposed, scaled) of cpublas::gemm for grad_v, grad_q, grad_k, per block shape
    gemms = [g for rows, keys in sorted(_flash_block_shapes(int(query.shape[2]), int(key.shape[2]), causal))
             for g in ((e, keys, rows, True, False), (e, rows, keys, False, True), (e, keys, rows, True, True))]
    gemms = [g for g in gemms if onednn_matmul(query.dtype, g[0] * g[2], g[1], info)]
    if not gemms:
        return 0
    threads = torch.get_num_threads()
    if query.dtype != torch.bfloat16 or info.isa not in (MODELLED_ISA, AMX_ISA) or threads not in MODELLED_THREADS:
        return None
    sizes = [onednn_scratchpad(OnednnMatmul(n, k, m, 1, transposed), threads, info.isa, query.dtype)
             for m, n, k, transposed, _ in gemms]
    if any(size is None for size in sizes):
        return None
    return max((size or 0) + (4 if scaled and alpha != 1.0 else 0) for size, (*_, scaled) in zip(sizes, gemms))


def _flash_mask_ok(mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> bool:
    """sdp_utils_cpp.h ``check_attn_mask_shape``: 2-D, or 4-D with batch and heads 1 or full; no gradient."""
    if mask.requires_grad or int(mask.shape[-2]) not in (1, int(query.shape[2])) \
            or int(mask.shape[-1]) not in (1, int(key.shape[2])):
        return False
    if mask.dim() == 2:
        return True
    return mask.dim() == 4 and int(mask.shape[0]) in (1, int(query.shape[0])) \
        and int(mask.shape[1]) in (1, int(query.shape[1]))


def uses_flash(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
               dropout_p: float, enable_gqa: bool) -> bool:
    """Whether ``scaled_dot_product_attention`` on the CPU runs the flash kernel rather than the math path
    (sdp_utils_cpp.cpp ``use_flash_attention_cpp``; ``_fused_sdp_choice`` itself answers "math" for fake
    tensors, so its checks are taken here one by one)."""
    qkv = (query, key, value)
    if not torch.backends.cuda.flash_sdp_enabled() or any(t.is_nested or t.dim() != 4 for t in qkv):
        return False
    if dropout_p > 0.0 or query.dtype not in (torch.float32, torch.float64, *_REDUCED):
        return False
    (b, qh, _, e), (kb, kh, _, ke), (vb, vh, _, ve) = (tuple(int(x) for x in t.shape) for t in qkv)
    heads_ok = kh == vh and (qh % kh == 0 if enable_gqa else qh == kh)
    if not (b == kb == vb and heads_ok and e == ke == ve):
        return False
    if any(int(t.shape[-2]) == 0 or t.stride(-1) != 1 for t in qkv):
        return False
    return mask is None or _flash_mask_ok(mask, query, key)


def _sdpa_mask(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
    return mask if isinstance(mask, torch.Tensor) else None


def _sdpa_flags(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[float, bool]:
    """``dropout_p`` and ``enable_gqa`` of a ``scaled_dot_product_attention`` call."""
    return float(args[4] if len(args) > 4 else kwargs.get("dropout_p", 0.0)), bool(kwargs.get("enable_gqa", False))


def rule_scaled_dot_product_attention(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                                      training: bool, info: CpuInfo) -> int:
    """``scaled_dot_product_attention`` seen whole (under inference mode) on the flash path: a bool mask
    becomes an additive one (``where`` with two scalars), then the kernel's output, logsumexp and buffers."""
    query, key, value = args[:3]
    mask = _sdpa_mask(args, kwargs)
    if query.numel() == 0 or not uses_flash(query, key, value, mask, *_sdpa_flags(args, kwargs)):
        return 0
    e = query.element_size()
    run = _Replay()
    additive = 0
    if mask is not None and mask.dtype == torch.bool:
        scalars = run.alloc(e), run.alloc(e)
        additive = run.alloc(mask.numel() * e)
        run.free(*scalars)
    output = run.alloc(query.numel() // int(query.shape[3]) * int(value.shape[3]) * e)
    lse = run.alloc(query.numel() // int(query.shape[3]) * _opmath_size(query.dtype))
    buf = run.alloc(rule_flash_attention_cpu((query, key), {}, None, training, info))
    run.free(buf, lse, additive)
    return run.peak - output


_FLASH = (aten._scaled_dot_product_flash_attention_for_cpu.default,
          aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
_FUSED = (aten._native_multi_head_attention.default, aten._transformer_encoder_layer_fwd.default)


def attention_note(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], info: CpuInfo) -> str | None:
    """Why an attention kernel's scratch is not modelled on this CPU, or None.

    The fused kernels' projections run through oneDNN where its matmul takes the type (matmul.py
    ``onednn_matmul``), whose reorders no rule models; float16 flash attention packs K and V through
    oneDNN's brgemm on CPUs with AMX-FP16 (FlashAttentionKernel.cpp ``could_pack``, ``cpublas::need_pack``);
    the reduced-precision backward's block gemms above 16^3 go to oneDNN (CPUBlas.cpp ``mkldnn_bf16_gemm``),
    modelled for bfloat16 where the matmul scratchpad is (:func:`flash_backward_gemm_scratch`).
    """
    if func in _FUSED:
        x, w = args[0], args[3]
        if x.is_nested or not onednn_matmul(x.dtype, x.numel(), int(w.shape[0]), info):
            return None
        return f"{dtype_name(x.dtype)} fused attention through oneDNN (ISA {info.isa}): {NOT_MODELLED}"
    if func is aten.scaled_dot_product_attention.default:
        if uses_flash(args[0], args[1], args[2], _sdpa_mask(args, kwargs), *_sdpa_flags(args, kwargs)):
            return None
        return f"scaled_dot_product_attention on the math path under inference mode: {NOT_MODELLED}"
    if func is _FLASH[0]:
        if args[0].dtype == torch.float16 and info.isa_at_least("avx512_core_amx_fp16"):
            return f"float16 flash attention with oneDNN packing (ISA {info.isa}): {NOT_MODELLED}"
    elif func is _FLASH[1] and args[1].dtype in _REDUCED and args[1].dim() == 4:
        query, key = args[1], args[2]
        if flash_backward_gemm_scratch(query, key, _flash_scale(args, kwargs), info, _flash_causal(args, kwargs)) \
                is None:
            return (f"{dtype_name(query.dtype)} flash attention backward through oneDNN's gemm (ISA {info.isa}): "
                    f"{NOT_MODELLED}")
    return None


WORKSPACE = {
    aten._native_multi_head_attention.default: rule_native_multi_head_attention,
    aten._transformer_encoder_layer_fwd.default: rule_transformer_encoder_layer_fwd,
    aten._scaled_dot_product_flash_attention_for_cpu.default: rule_flash_attention_cpu,
    aten.scaled_dot_product_attention.default: rule_scaled_dot_product_attention,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: rule_flash_attention_cpu_backward,
}
