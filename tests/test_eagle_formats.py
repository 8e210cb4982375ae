"""Saving and loading EAGLE-3 heads: both layouts round-trip, foreign files load with the right
conventions, and every bad head is refused with one line before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from batchspec.eagle import HeadError
from batchspec.eagle.formats import load_head, save_head
from batchspec.eagle.init import head_for_target
from tiny import model_config


def tiny_target(layers: int = 6, hidden: int = 64, vocab: int = 120, seed: int = 0, arch: str = "llama"):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(model_config(arch, vocab, layers=layers, hidden=hidden),
                                            dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def trained_looking_head(target, ids=None):
    head = head_for_target(target, draft_target_ids=ids)
    torch.manual_seed(1)
    for p in head.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, mean=1.0 if p.ndim == 1 else 0.0, std=0.1)
    return head.eval()


@pytest.mark.parametrize("fmt", ["eagle", "speculators"])
@pytest.mark.parametrize("reduced", [False, True])
def test_round_trip(tmp_path, target, fmt, reduced):
    ids = torch.tensor([0, 1, 5, 6, 7, 40, 99, 119]) if reduced else None
    head = trained_looking_head(target, ids)
    save_head(head, tmp_path, format=fmt, target_name="tiny")
    loaded = load_head(tmp_path, target)
    a, b = head.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    x = torch.randint(0, 120, (2, 5))
    feats = torch.randn(2, 5, 3 * 64)
    pos = torch.arange(5).expand(2, 5)
    with torch.no_grad():
        assert torch.equal(head.logits(head(x, feats, pos)), loaded.logits(loaded(x, feats, pos)))
    config = json.loads((tmp_path / "config.json").read_text())
    weights = load_file(str(tmp_path / "model.safetensors"))
    if fmt == "eagle":  # what SGLang's and vLLM's LlamaForCausalLMEagle3 loaders read
        assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
        assert config["draft_vocab_size"] == head.config.draft_vocab_size and config["tie_word_embeddings"] is False
        assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "midlayer.self_attn.q_proj.weight",
                "midlayer.hidden_norm.weight"} <= weights.keys()
        assert "embed_tokens.weight" not in weights  # the target's are used
    else:  # what vLLM's speculators config reader and Eagle3LlamaForCausalLM.load_weights read
        assert config["speculators_model_type"] == "eagle3" and config["norm_before_residual"] is False
        assert config["transformer_layer_config"]["num_hidden_layers"] == 1
        assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] >= 1
        assert config["eagle_aux_hidden_state_layer_ids"] == [2, 3, 3]
        assert {"embed_tokens.weight", "fc.weight", "layers.0.self_attn.q_proj.weight"} <= weights.keys()
        assert ("d2t" in weights) == reduced


def test_layer_id_conventions(tmp_path, target):
    """EAGLE layout: eagle_config ids are layer outputs (SGLang adds 1); speculators: hidden-state indices;
    absent: the default (2, L//2, L-3)."""
    head = trained_looking_head(target)
    save_head(head, tmp_path, format="eagle")
    config = json.loads((tmp_path / "config.json").read_text())
    assert "eagle_config" not in config  # default layers: every reader picks the same default
    del config["batchspec"]
    config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [0, 2, 4]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_head(tmp_path, target).config.target_layer_ids == (1, 3, 5)
    del config["eagle_config"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_head(tmp_path, target).config.target_layer_ids == (2, 3, 3)

    head.config.target_layer_ids = (1, 3, 5)
    save_head(head, tmp_path / "custom", format="eagle")
    written = json.loads((tmp_path / "custom" / "config.json").read_text())
    assert written["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 4]
    save_head(head, tmp_path / "spec", format="speculators")
    written = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert written["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5]
    del written["batchspec"]
    (tmp_path / "spec" / "config.json").write_text(json.dumps(written))
    assert load_head(tmp_path / "spec", target).config.target_layer_ids == (1, 3, 5)


def test_specforge_style_checkpoint_loads(tmp_path, target):
    """A head as SpecForge / EAGLE write it: their config fields, pytorch_model.bin, no embeddings, no
    batchspec block."""
    head = trained_looking_head(target, torch.arange(0, 120, 2))
    state = {k: v for k, v in head.state_dict().items() if k != "embed_tokens.weight"}
    torch.save(state, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 512,
        "tie_word_embeddings": False, "torch_dtype": "float32", "vocab_size": 120, "draft_vocab_size": 60,
    }))
    loaded = load_head(tmp_path, target)
    assert loaded.config.target_layer_ids == (2, 3, 3) and loaded.config.draft_vocab_size == 60
    assert torch.equal(loaded.to_target_ids(torch.arange(60)), torch.arange(0, 120, 2))
    assert torch.equal(loaded.embed_tokens.weight, target.get_input_embeddings().weight)


def edit(path: Path, config=None, weights=None):
    if config:
        c = json.loads((path / "config.json").read_text())
        config(c)
        (path / "config.json").write_text(json.dumps(c))
    if weights:
        w = load_file(str(path / "model.safetensors"))
        weights(w)
        save_file(w, str(path / "model.safetensors"))


def setitem(key, value):
    return lambda d: d.__setitem__(key, value)


BAD = {
    "hidden size": (lambda t: tiny_target(hidden=32), None, None, "hidden size is 32"),
    "vocabulary": (lambda t: tiny_target(vocab=130), None, None, "target has 130"),
    "layer count": (lambda t: tiny_target(layers=8), None, None, "made for a 6-layer target"),
    "layer ids": (None, lambda c: c["batchspec"].__setitem__("target_layer_ids", [2, 3, 9]), None, "out of range"),
    "d2t size": (None, None, lambda w: w.__setitem__("d2t", torch.zeros(7, dtype=torch.long)), "d2t has shape (7,)"),
    "d2t range": (None, None, lambda w: w.__setitem__("d2t", torch.full((8,), 200)), "outside the target vocabulary"),
    "d2t duplicates": (None, None, lambda w: w.__setitem__("d2t", -torch.arange(8)), "same target id"),
    "t2d size": (None, None, lambda w: w.__setitem__("t2d", torch.ones(100, dtype=torch.bool)), "t2d has shape"),
    "t2d marks": (None, None, lambda w: w.__setitem__("t2d", torch.ones(120, dtype=torch.bool)), "does not mark"),
    "no d2t": (None, None, lambda w: (w.pop("d2t"), w.pop("t2d")), "no d2t map"),
    "missing weight": (None, None, lambda w: w.pop("fc.weight"), "missing weight fc.weight"),
    "weight shape": (None, None, lambda w: w.__setitem__("norm.weight", torch.ones(3)), "norm.weight has shape"),
    "two layers": (None, setitem("num_hidden_layers", 2), None, "only 1-layer heads"),
    "not a head": (None, lambda c: c.pop("hidden_size"), None, "not an EAGLE-3 head config"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_heads_give_one_line(tmp_path, target, case):
    other_target, config_edit, weights_edit, words = BAD[case]
    save_head(trained_looking_head(target, torch.tensor([0, 1, 5, 6, 7, 40, 99, 119])), tmp_path)
    edit(tmp_path, config_edit, weights_edit)
    with pytest.raises(HeadError) as info:
        load_head(tmp_path, other_target(target) if other_target else target)
    message = str(info.value)
    assert isinstance(info.value, ValueError) and "\n" not in message and words in message, message
    assert message.startswith(f"eagle head {tmp_path}")


def test_missing_files(tmp_path, target):
    with pytest.raises(HeadError, match="no such directory"):
        load_head(tmp_path / "nope", target)
    with pytest.raises(HeadError, match="missing config.json"):
        load_head(tmp_path, target)
    save_head(trained_looking_head(target), tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(HeadError, match="missing weights"):
        load_head(tmp_path, target)
