"""ATen's fused transformer kernels, op by op, where the trace cannot take them whole.

``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` run one native kernel each under inference mode
(``_native_multi_head_attention``: aten/src/ATen/native/transformers/attention.cpp
``native_multi_head_attention_cpu``; ``_transformer_encoder_layer_fwd``: transformer.cpp
``transformer_encoder_layer_forward``). In float32 their scratch is replayed by workspace/attention.py. In
bfloat16 or float16 their inner products run on oneDNN's matmul, and under CPU autocast (their fast-path check
``torch.is_autocast_enabled()`` asks about CUDA, so they are taken) the encoder layer's inner calls are cast by
autocast, which the dispatch mode cannot see. Where either holds, the tracker runs these replicas instead: the
same ATen calls in the same order, each through the dispatcher, so that every product, cast and temporary is
traced with its own rule and freed where the C++ local dies.

Each replica covers the dense case (contiguous 3-D inputs, no nested tensor); :func:`applies` says where, and
anything else stays one op with its note.
"""

from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten

__all__ = ["applies", "run"]

_MHA = aten._native_multi_head_attention.default
_ENCODER = aten._transformer_encoder_layer_fwd.default
_REDUCED = (torch.bfloat16, torch.float16)


def _dense(*tensors: Any) -> bool:
    return all(isinstance(t, torch.Tensor) and not t.is_nested and t.dim() == 3 and t.is_contiguous()
               and t.numel() > 0 for t in tensors)


def applies(func: Any, args: tuple[Any, ...], autocast: bool) -> bool:
    """Whether ``func`` is one of the fused kernels and is replayed here: a reduced-precision call (the
    attention kernel is cast by autocast before it runs), or the encoder layer under autocast."""
    if func is _MHA:
        return _dense(*args[:3]) and args[0].dtype in _REDUCED
    if func is _ENCODER:
        return _dense(args[0]) and (autocast or args[0].dtype in _REDUCED)
    return False


def run(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The replica of ``func`` on these arguments (call it with the tracker active)."""
    if func is _MHA:
        return multi_head_attention(*args, **kwargs)
    return encoder_layer(*args, **kwargs)


def _gemm_nt(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``at::native::matmul(x, w.t())`` on a contiguous ``[B, T, D]``: ``should_fold`` holds, so a view folded
    to ``[B·T, D]``, one ``mm`` and an ``_unsafe_view`` back (LinearAlgebra.cpp ``_matmul_impl``)."""
    b, t, d = (int(s) for s in x.shape)
    out = aten.mm.default(aten.view.default(x, [b * t, d]), aten.t.default(w))
    return aten._unsafe_view.default(out, [b, t, int(w.shape[0])])


def _qkv_projection(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, embed_dim: int,
                    qkv_weight: torch.Tensor) -> torch.Tensor:
    if key is value and query is key:  # self-attention: one product
        return _gemm_nt(query, qkv_weight)
    if key is value:
        w_q, w_kv = aten.split_with_sizes.default(qkv_weight, [embed_dim, 2 * embed_dim])
        return aten.cat.default([_gemm_nt(query, w_q), _gemm_nt(key, w_kv)], 2)
    w_q, w_k, w_v = aten.chunk.default(qkv_weight, 3)
    return aten.cat.default([_gemm_nt(query, w_q), _gemm_nt(key, w_k), _gemm_nt(value, w_v)], 2)


def _bmm_nt(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a_ = aten.view.default(a, [a.shape[0] * a.shape[1], a.shape[2], a.shape[3]])
    b_ = aten.view.default(b, [b.shape[0] * b.shape[1], b.shape[2], b.shape[3]])
    c = aten.bmm.default(a_, aten.transpose.int(b_, 2, 1))
    return aten.view.default(c, [a.shape[0], a.shape[1], a.shape[2], b.shape[2]])


def _masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None, mask_type: int | None) -> torch.Tensor:
    if mask is None:
        return aten._softmax.out(scores, scores.dim() - 1, False, out=scores)
    if mask.dtype != torch.bool:
        mask = aten._to_copy.default(mask, dtype=torch.bool)
    return aten._masked_softmax.default(scores, mask, scores.dim() - 1, mask_type)


def _bmm_nn(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The attention context written into ``q``'s storage (``at::bmm_out``)."""
    a_ = aten.view.default(a, [a.shape[0] * a.shape[1], a.shape[2], a.shape[3]])
    b_ = aten.view.default(b, [b.shape[0] * b.shape[1], b.shape[2], b.shape[3]])
    out_ = aten.view.default(out, [a_.shape[0], a_.shape[1], b_.shape[2]])
    c = aten.bmm.out(a_, b_, out=out_)
    return aten.view.default(c, [a.shape[0], a.shape[1], a.shape[2], b.shape[3]])


def _transform0213_gemm_nt_bias(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``transform_0213`` (a contiguous ``[B, T, H·dh]`` copy), then ``at::native::linear`` of its 2-D view:
    one ``addmm``."""
    b, h, t, dh = (int(s) for s in a.shape)
    permuted = aten.permute.default(a, [0, 2, 1, 3])  # contiguous() copies only what is not (T = 1, H = 1)
    a_0213 = (permuted if permuted.is_contiguous()
              else aten.clone.default(permuted, memory_format=torch.contiguous_format))
    del permuted
    r = aten.addmm.default(bias, aten.view.default(a_0213, [b * t, h * dh]), aten.t.default(w))
    return aten.view.default(r, [b, t, int(r.shape[1])])


def multi_head_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, embed_dim: int,
                         num_head: int, qkv_weight: torch.Tensor, qkv_bias: torch.Tensor,
                         proj_weight: torch.Tensor, proj_bias: torch.Tensor, mask: torch.Tensor | None = None,
                         need_weights: bool = True, average_attn_weights: bool = True,
                         mask_type: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``native_multi_head_attention_cpu``, its locals released where the C++ ones are."""
    qkv = _qkv_projection(query, key, value, int(embed_dim), qkv_weight)
    q, k, v = aten._transform_bias_rescale_qkv.default(qkv, qkv_bias, int(num_head))
    del qkv  # "Not used any more, allow free"
    qkt: torch.Tensor | None = _masked_softmax(_bmm_nt(q, k), mask, mask_type)
    assert qkt is not None
    ctx = _bmm_nn(q, qkt, v)  # reuses q's storage
    if not need_weights:
        qkt = None
    proj = _transform0213_gemm_nt_bias(ctx, proj_weight, proj_bias)
    if need_weights and average_attn_weights and qkt is not None:
        qkt = aten.div_.Scalar(aten.sum.dim_IntList(qkt, [1]), int(num_head))
    return proj, qkt


def _linear_for_ffn(bias: torch.Tensor, x: torch.Tensor, w: torch.Tensor, use_gelu: bool | None) -> torch.Tensor:
    b, t, d = (int(s) for s in x.shape)
    flat = aten.view.default(x, [b * t, d])
    if use_gelu is None:
        out = aten.addmm.default(bias, flat, aten.t.default(w))
    else:
        out = aten._addmm_activation.default(bias, flat, aten.t.default(w), use_gelu=use_gelu)
    return aten.view.default(out, [b, t, -1])


def _norm(x: torch.Tensor, embed_dim: int, eps: float, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return aten.layer_norm.default(x, [int(embed_dim)], weight, bias, eps, True)


def encoder_layer(src: torch.Tensor, embed_dim: int, num_heads: int, qkv_weight: torch.Tensor,
                  qkv_bias: torch.Tensor, proj_weight: torch.Tensor, proj_bias: torch.Tensor, use_gelu: bool,
                  norm_first: bool, eps: float, norm_weight_1: torch.Tensor, norm_bias_1: torch.Tensor,
                  norm_weight_2: torch.Tensor, norm_bias_2: torch.Tensor, ffn_weight_1: torch.Tensor,
                  ffn_bias_1: torch.Tensor, ffn_weight_2: torch.Tensor, ffn_bias_2: torch.Tensor,
                  mask: torch.Tensor | None = None, mask_type: int | None = None) -> torch.Tensor:
    """``transformer_encoder_layer_forward``: pre- or post-norm, the attention kernel through the dispatcher
    (so autocast casts it, and the tracker replays it with :func:`multi_head_attention`), the feed-forward
    block's two products (``_addmm_activation`` with the activation, ``addmm``)."""
    x = _norm(src, embed_dim, eps, norm_weight_1, norm_bias_1) if norm_first else src
    x = aten._native_multi_head_attention.default(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias,
                                                  proj_weight, proj_bias, mask, False, True, mask_type)[0]
    aten.add_.Tensor(x, src)
    if not norm_first:
        x = _norm(x, embed_dim, eps, norm_weight_1, norm_bias_1)
    pre_ffn = x
    if norm_first:
        x = _norm(x, embed_dim, eps, norm_weight_2, norm_bias_2)
    hidden = _linear_for_ffn(ffn_bias_1, x, ffn_weight_1, bool(use_gelu))
    x = _linear_for_ffn(ffn_bias_2, hidden, ffn_weight_2, None)
    del hidden
    aten.add_.Tensor(x, pre_ffn)
    del pre_ffn
    if not norm_first:
        x = _norm(x, embed_dim, eps, norm_weight_2, norm_bias_2)
    return x
