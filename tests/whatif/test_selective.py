"""Selective checkpointing (``selective:PLAN``): matmul, convolution and attention outputs kept, the ops between
them recomputed. Its estimate equals the real step, and it sits between no checkpointing and full recomputation."""

from __future__ import annotations

import pytest

import nnmem


def test_selective_plan_parses_over_any_plan() -> None:
    from nnmem.zoo import torch_models

    model = torch_models.gpt(2)[0]
    plan = nnmem.checkpoint_plan(model, "selective:every:2")
    assert plan.selective and plan.modules == ("blocks.0",) and plan.label == "selective:every:2"
    with pytest.raises(nnmem.ConfigError, match="no module named"):
        nnmem.checkpoint_plan(model, "selective:blocks.9")


@pytest.mark.parametrize("model", ["gpt", "resnet"])
def test_selective_checkpointing_matches_the_real_step(model: str) -> None:
    base = nnmem.estimate(model, batch=8, optimizer="adam").peak_bytes
    full = nnmem.estimate(model, batch=8, optimizer="adam", checkpoint="blocks").peak_bytes
    est = nnmem.estimate(model, batch=8, optimizer="adam", checkpoint="selective:blocks")
    meas = nnmem.measure(model, batch=8, optimizer="adam", checkpoint="selective:blocks", timeout_s=180)
    assert est.peaks["allocator"] == meas.peaks["allocator"]
    assert full < est.peak_bytes < base


def test_selective_checkpointing_recomputes_no_matmul() -> None:
    w = nnmem.what_if("gpt", batch=8, techniques=["checkpoint:blocks", "checkpoint:selective:blocks"])
    full, selective = w.rows
    assert w.extra_compute(full) > 0.2 and w.extra_compute(selective) == 0.0


def test_a_selective_plan_pytorch_refuses_is_a_clear_error() -> None:
    transformers = pytest.importorskip("transformers")
    import torch

    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, vocab_size=500)  # use_cache=True: a cache per forward
    model, ids = transformers.LlamaForCausalLM(cfg), torch.randint(0, 500, (2, 16))
    with pytest.raises(nnmem.UnsupportedError, match="use_cache=False"):
        nnmem.estimate(model, (ids,), checkpoint="selective:blocks")
    w = nnmem.what_if(model, (ids,), techniques=None)  # the default list skips it with the reason
    assert any(t == "checkpoint:selective:blocks" and "use_cache=False" in why for t, why in w.skipped)
    assert any(r.technique == "checkpoint:blocks" for r in w.rows)
