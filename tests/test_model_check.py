"""Models batchspec cannot run exactly are refused when the generator is built, in one line naming the model type
and why (engine/model/model_check.py), never with a traceback from inside a round; models whose attention layers
declare transformers' attention interface but do not pass the forward's keywords on (Nemotron) run padded
forwards instead of packed ones, exactly."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

import batchspec
from batchspec.engine.model.model_check import check_model
from batchspec.engine.model.models import ModelLoadError
from model_zoo import build
from tiny import PROMPTS


@pytest.mark.parametrize("model_type,reason", [
    ("llama", None),
    ("nemotron", None),
    ("bloom", "ALiBi position biases"),
    ("mamba", "its forward fails on batchspec's slot cache"),
    ("bart", "differ from its own forward's"),
])
def test_check_model(tokenizer, model_type, reason):
    model, why = build(model_type, len(tokenizer) + 12)
    assert model is not None, why
    problem = check_model(model)
    if reason is None:
        assert problem is None
    else:
        assert problem.startswith(f"model type {model_type!r} is not supported") and reason in problem
        assert "\n" not in problem


def test_a_refused_model_fails_generate_in_one_line(tokenizer, tmp_path):
    model, _ = build("bloom", len(tokenizer) + 12)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="model type 'bloom' is not supported: its attention adds ALiBi") as error:
        batchspec.generate(["def add(a, b):"], target=str(tmp_path), max_new_tokens=4)
    assert "\n" not in str(error.value)


def test_nemotron_runs_padded_forwards_exactly(tokenizer, tmp_path):
    model, _ = build("nemotron", len(tokenizer) + 12)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    prompts = PROMPTS[:3]
    expected = []
    for prompt in prompts:
        enc = loaded(prompt, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**enc, do_sample=False, max_new_tokens=8, eos_token_id=1, pad_token_id=2)
        expected.append(out[0, enc["input_ids"].shape[1]:].tolist())
    for drafter in ("none", "ngram"):
        results = batchspec.generate(prompts, target=str(tmp_path), drafter=drafter, batch_size=3, max_new_tokens=8)
        assert [r.completion_token_ids for r in results] == expected
