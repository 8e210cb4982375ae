"""Loading and the draft/target compatibility check."""

from __future__ import annotations

import json

import pytest
import torch

import batchspec
from batchspec.engine.model.models import ModelLoadError, load_models, resolve_device, resolve_dtype
from tiny import PROMPTS, build_tokenizer, save_model


def test_loads_local_dir_with_dtype_and_device(llama_pair):
    models = load_models(str(llama_pair.target), str(llama_pair.draft), dtype="bfloat16", device="cpu")
    assert models.target.dtype == torch.bfloat16 and models.draft.dtype == torch.bfloat16
    assert models.target.device.type == "cpu" and not models.target.training
    assert models.eos_token_ids == [llama_pair.tokenizer.eos_token_id]


def test_auto_dtype_is_float32_on_cpu():
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    with pytest.raises(ModelLoadError, match="model.dtype='float64'"):
        resolve_dtype("float64", torch.device("cpu"))
    with pytest.raises(ModelLoadError, match="model.device"):
        resolve_device("tpu:3")


def test_missing_model_is_a_one_line_error(tmp_path):
    with pytest.raises(ModelLoadError, match="cannot load model") as info:
        load_models(str(tmp_path / "nope"))
    assert "\n" not in str(info.value)


def test_vocabulary_mismatch_names_the_first_differing_token(tmp_path, llama_pair):
    """Same vocabulary size, two tokens swapped: the error names the first differing id."""
    tokenizer = build_tokenizer()
    path = save_model(tmp_path / "swapped", "llama", tokenizer, seed=1, vocab_size=len(tokenizer) + 12)
    tok_json = json.loads((path / "tokenizer.json").read_text())
    vocab = tok_json["model"]["vocab"]
    inverse = {i: t for t, i in vocab.items()}
    vocab[inverse[40]], vocab[inverse[41]] = 41, 40
    (path / "tokenizer.json").write_text(json.dumps(tok_json))
    with pytest.raises(ModelLoadError, match=r"token id 40 is .* in the target's vocabulary but .* in the draft's"):
        load_models(str(llama_pair.target), str(path))


def test_eos_mismatch_is_rejected(tmp_path, llama_pair):
    tokenizer = build_tokenizer()
    path = save_model(tmp_path / "other-eos", "llama", tokenizer, seed=1, vocab_size=len(tokenizer), eos_ids=(1, 7))
    with pytest.raises(ModelLoadError, match="EOS ids differ"):
        load_models(str(llama_pair.target), str(path))


def test_generate_accepts_loaded_models_and_token_ids(llama_pair):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(llama_pair.target, dtype=torch.float32)
    ids = llama_pair.tokenizer(PROMPTS[0])["input_ids"]
    results = batchspec.generate([ids, PROMPTS[0]], target=model, tokenizer=llama_pair.tokenizer, drafter="ngram",
                                 max_new_tokens=24)
    assert results[0].completion_token_ids == results[1].completion_token_ids == llama_pair.reference[0]
    assert [r.id for r in results] == ["0", "1"]
