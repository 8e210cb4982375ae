"""Sliding-window attention at any length (engine/model/kv_cache.py's SlidingWindow): greedy output equals Hugging Face
`generate` on prompts several times the window, for models whose every layer keeps to it (Mistral), whose layers
mix windowed and full attention (Qwen2, Gemma 3), and whose attention is not sdpa's (Gemma 2's logit soft-capping,
gpt-oss's and MiMo-V2-Flash's attention sinks, the latter's values of another head size: loaded with their eager
attention, written out in the packed attention); packed
forwards, with every kind of drafter, chain and tree, eager and on the static path. Tiny random models (window 8,
prompts of 25-85 tokens), fp32."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import batchspec
from batchspec.engine.model.kv_cache import SlidingWindow
from tiny import PROMPTS

WINDOW = 8
NEW = 16
FAMILIES = {  # model type -> its window settings
    "mistral": dict(sliding_window=WINDOW),
    "qwen2": dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
    "gemma3_text": dict(sliding_window=WINDOW, head_dim=16,
                        layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
    "gemma2": dict(sliding_window=WINDOW, head_dim=16),
    "gpt_oss": dict(sliding_window=WINDOW, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
    # Sinks, and values of another head size than the queries' and keys'.
    "mimo_v2_flash": dict(sliding_window=WINDOW, head_dim=16, v_head_dim=8, mlp_layer_types=["dense"] * 3,
                          layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
}
CASES = [  # (drafter, extra generate arguments): the draft model is the target itself, so that drafts are accepted
    ("none", {}), ("ngram", {}), ("model", dict(adaptive=False)), ("ngram", dict(tree="2x2", adaptive=False)),
    ("model", dict(adaptive=False, compile="static")), ("ngram", dict(compile="static", tree="2x2", adaptive=False)),
]


@pytest.fixture(scope="module", params=list(FAMILIES))
def windowed(request, tmp_path_factory, tokenizer):
    """A 3-layer random model of the family, saved, and `generate`'s greedy output on each prompt alone."""
    name = request.param
    config = AutoConfig.for_model(name, vocab_size=len(tokenizer) + 12, hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                  max_position_embeddings=512, bos_token_id=0, eos_token_id=1, pad_token_id=2,
                                  **FAMILIES[name])
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp(name)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    tokenizer.save_pretrained(path)
    loaded = AutoTokenizer.from_pretrained(path)  # transformers picks the family's tokenizer class
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    prompts = [p * 3 for p in PROMPTS[:4]]
    references = []
    for prompt in prompts:
        enc = loaded(prompt, return_tensors="pt")
        assert enc["input_ids"].shape[1] > 3 * WINDOW
        with torch.no_grad():
            out = model.generate(**enc, do_sample=False, max_new_tokens=NEW)
        references.append(out[0, enc["input_ids"].shape[1]:].tolist())
    return name, path, prompts, references


def test_the_window_is_read_from_the_config(windowed):
    name, path, _, _ = windowed
    model = AutoModelForCausalLM.from_pretrained(path)
    assert SlidingWindow.of(model) == SlidingWindow(WINDOW, per_layer=name != "mistral")


@pytest.mark.parametrize("drafter,extra", CASES, ids=[f"{d}-{'-'.join(map(str, e.values())) or 'default'}"
                                                     for d, e in CASES])
def test_greedy_parity_past_the_window(windowed, drafter, extra):
    _, path, prompts, references = windowed
    results = batchspec.generate(prompts, target=str(path), draft=str(path) if drafter == "model" else None,
                                 drafter=drafter, batch_size=3, k=3, max_new_tokens=NEW, max_seq_len=256, **extra)
    assert [r.completion_token_ids for r in results] == references
    if drafter == "model":  # the target drafting for itself: drafts were verified past the window too
        assert sum(r.accepted_tokens for r in results) > 0
