"""The shipped demo pair (batchspec/assets/demo, built by tools/build_demo.py) loads, matches and is trained."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(2)

DEMO = Path(__file__).resolve().parents[1] / "batchspec" / "assets" / "demo"
pytestmark = pytest.mark.skipif(not (DEMO / "target").is_dir(), reason="demo assets not built")


@pytest.fixture(scope="module")
def assets():
    tokenizers = {name: AutoTokenizer.from_pretrained(DEMO / name) for name in ("target", "draft")}
    models = {name: AutoModelForCausalLM.from_pretrained(DEMO / name, dtype=torch.float32).eval()
              for name in ("target", "draft")}
    prompts = pq.read_table(DEMO / "prompts.parquet").to_pylist()
    return tokenizers, models, prompts


def test_tokenizers_and_special_ids_agree(assets):
    tokenizers, models, _ = assets
    target_tok, draft_tok = tokenizers["target"], tokenizers["draft"]
    assert target_tok.get_vocab() == draft_tok.get_vocab()
    assert len(target_tok) == models["target"].config.vocab_size == models["draft"].config.vocab_size
    for tok in (target_tok, draft_tok):
        assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 1, 2)
    for model in models.values():
        assert model.generation_config.eos_token_id == 1
        assert model.generation_config.bos_token_id == 0
        assert model.generation_config.pad_token_id == 2
    # The draft must be much smaller than the target.
    n = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    assert n["draft"] * 3 < n["target"]


def test_tokenizer_prepends_bos_and_round_trips_code(assets):
    tok = assets[0]["target"]
    text = 'def f(x: int) -> str:\n\t"""Dé\\tail."""\n    return f"{x!r:>8}"  # ok\n'
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_prompt_file(assets):
    tok, prompts = assets[0]["target"], assets[2]
    assert len(prompts) >= 100
    assert set(prompts[0]) == {"id", "prompt", "source_file"}
    ids = [p["id"] for p in prompts]
    assert len(set(ids)) == len(ids)
    assert all(i.startswith("heldout-") for i in ids)
    for p in prompts:
        assert p["source_file"].endswith(".py") and p["prompt"].strip()
        assert 20 <= len(tok(p["prompt"])["input_ids"]) <= 150


def test_models_are_trained(assets):
    """Held-out prompt loss far below a random model's ln(vocab) ~ 8.3 nats; the draft mostly follows the target."""
    tokenizers, models, prompts = assets
    enc = tokenizers["target"]([p["prompt"] for p in prompts[:8]], return_tensors="pt", padding=True)
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    with torch.no_grad():
        losses = {name: m(**enc, labels=labels).loss.item() for name, m in models.items()}
        target_next = models["target"](**enc).logits.argmax(-1)
        draft_next = models["draft"](**enc).logits.argmax(-1)
    assert losses["target"] < 5.0, losses  # a random model scores ~8.3; the shipped target ~3.8
    assert losses["draft"] < 5.0, losses
    mask = enc["attention_mask"].bool()
    agreement = (target_next == draft_next)[mask].float().mean().item()
    assert agreement > 0.4, agreement


@pytest.mark.parametrize("index", [0, 1])
def test_greedy_continuation_is_not_degenerate(assets, index):
    tokenizers, models, prompts = assets
    tok = tokenizers["target"]
    enc = tok(prompts[index]["prompt"], return_tensors="pt")
    with torch.no_grad():
        out = models["target"].generate(**enc, do_sample=False, max_new_tokens=40)
    new = out[0, enc["input_ids"].shape[1]:].tolist()
    assert len(new) >= 8
    assert len(set(new)) >= 5, new  # not one token (or a short loop of two) repeated
    text = tok.decode(new, skip_special_tokens=True)
    assert sum(c.isalpha() for c in text) >= 10, text  # produces words, not only whitespace/punctuation
