"""Third-party models for the benchmarks: HuggingFace transformers built from small configs (random weights, no
download), as MODEL factories: ``benchmarks/hf_models.py:gpt2`` and so on. The KV cache is off
(``use_cache=False``), as in training with gradient checkpointing."""

from __future__ import annotations

from typing import Any

import torch

VOCAB, SEQ = 1000, 64


def _ids(batch: int) -> tuple[torch.Tensor]:
    return (torch.randint(0, VOCAB, (batch, SEQ)),)


def gpt2(batch: int) -> tuple[Any, tuple[torch.Tensor]]:
    import transformers

    cfg = transformers.GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=VOCAB, n_positions=128,
                                  bos_token_id=0, eos_token_id=0, use_cache=False)
    return transformers.GPT2LMHeadModel(cfg), _ids(batch)


def bert(batch: int) -> tuple[Any, tuple[torch.Tensor]]:
    import transformers

    cfg = transformers.BertConfig(num_hidden_layers=4, hidden_size=128, num_attention_heads=4, intermediate_size=256,
                                  vocab_size=VOCAB)
    return transformers.BertForSequenceClassification(cfg), _ids(batch)


def llama(batch: int) -> tuple[Any, tuple[torch.Tensor]]:
    import transformers

    cfg = transformers.LlamaConfig(num_hidden_layers=4, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=256, vocab_size=VOCAB, use_cache=False)
    return transformers.LlamaForCausalLM(cfg), _ids(batch)


SPECS = tuple(f"{__file__}:{name}" for name in ("gpt2", "bert", "llama"))


def llama_7b(batch: int) -> tuple[Any, tuple[torch.Tensor]]:
    """Llama-2-7B's shapes (32 layers, hidden 4096, 11008 MLP, 32,000 tokens) in bfloat16, sequence 512: for the
    docs' QLoRA example (built under the meta device by nnmem: nothing is allocated)."""
    import transformers

    cfg = transformers.LlamaConfig(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
                                   intermediate_size=11008, vocab_size=32000, use_cache=False)
    return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16), (torch.randint(0, 32000, (batch, 512)),)
