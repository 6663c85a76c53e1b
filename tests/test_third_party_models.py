"""Models users did not write: HuggingFace transformers built from a config (random weights, no download)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import nnmem  # noqa: E402


def _gpt2() -> Any:
    cfg = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=128,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


def _bert() -> Any:
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
                                  intermediate_size=256, vocab_size=1000)
    return transformers.BertForSequenceClassification(cfg)


def _llama() -> Any:
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=256, vocab_size=1000)
    return transformers.LlamaForCausalLM(cfg)


MODELS: dict[str, Callable[[], Any]] = {"gpt2": _gpt2, "bert": _bert, "llama": _llama}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize(("mode", "optimizer"), [("train", "adamw"), ("infer", "sgd")])
def test_hf_model_estimate_matches_measurement(name: str, mode: str, optimizer: str) -> None:
    model = MODELS[name]()
    ids = torch.randint(0, 1000, (4, 64))
    est = nnmem.estimate(model, (ids,), mode=mode, optimizer=optimizer)
    meas = nnmem.measure(model, (ids,), mode=mode, optimizer=optimizer)
    assert abs(est.peaks["tensor"] - meas.peaks["tensor"]) <= 0.005 * meas.peaks["tensor"]
    assert abs(est.peaks["allocator"] - meas.peaks["allocator"]) <= 0.02 * meas.peaks["allocator"]
    assert est.parameter_count == sum(p.numel() for p in model.parameters())


def test_hf_labels_loss_path() -> None:
    """A model that computes its own loss from labels: the loss_fn picks it from the output."""
    model = _gpt2()
    ids = torch.randint(0, 1000, (2, 32))

    class WithLabels(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, x: Any) -> Any:
            return self.inner(input_ids=x, labels=x).loss

    est = nnmem.estimate(WithLabels(), (ids,), optimizer="adam")
    meas = nnmem.measure(WithLabels(), (ids,), optimizer="adam")
    assert abs(est.peaks["tensor"] - meas.peaks["tensor"]) <= 0.005 * meas.peaks["tensor"]
