"""Saving and loading EAGLE-3 heads: both layouts round-trip, layer ids are written as each engine reads
them, unimplemented flags and bad heads are refused with one line before anything runs, and train_draft
says what it wrote. Checkpoints written by hand in SpecForge's and speculators' naming:
tests/test_eagle_checkpoints.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from batchspec.eagle import HeadError
from batchspec.eagle.formats import FORMATS, load_head, save_head
from batchspec.training.init import head_for_target
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
        assert config["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]  # vLLM: hidden-state indices
        assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 2, 3], "use_aux_hidden_state": True}
        assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "midlayer.self_attn.q_proj.weight",
                "midlayer.hidden_norm.weight"} <= weights.keys()
        assert "embed_tokens.weight" not in weights  # the target's are used
    else:  # what vLLM's speculators config reader and Eagle3LlamaForCausalLM.load_weights read
        assert config["speculators_model_type"] == "eagle3" and config["norm_before_residual"] is False
        assert config["transformer_layer_config"]["num_hidden_layers"] == 1
        assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] >= 1
        assert config["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]
        assert {"embed_tokens.weight", "fc.weight", "layers.0.self_attn.q_proj.weight"} <= weights.keys()
        assert ("d2t" in weights) == reduced


def test_layer_ids_are_written_both_ways_and_read_from_either(tmp_path, target):
    """eagle layout: top-level eagle_aux_hidden_state_layer_ids are hidden-state indices (vLLM reads them
    first), eagle_config's are layer outputs (SGLang adds 1); speculators: top level only. Either is read;
    absent: the default (2, L//2, L-3)."""
    head = trained_looking_head(target)
    head.config.target_layer_ids = (1, 3, 5)
    save_head(head, tmp_path, format="eagle")
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5]
    assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [0, 2, 4], "use_aux_hidden_state": True}
    del config["batchspec"]
    for name, edit, ids in (
        ("both", lambda c: None, (1, 3, 5)),
        ("top level only", lambda c: c.pop("eagle_config"), (1, 3, 5)),
        ("nested only", lambda c: c.pop("eagle_aux_hidden_state_layer_ids"), (1, 3, 5)),
        ("neither", lambda c: (c.pop("eagle_config"), c.pop("eagle_aux_hidden_state_layer_ids")), (2, 3, 4)),
    ):
        c = json.loads(json.dumps(config))
        edit(c)
        (tmp_path / "config.json").write_text(json.dumps(c))
        assert load_head(tmp_path, target).config.target_layer_ids == ids, name

    save_head(head, tmp_path / "spec", format="speculators")
    written = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert written["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5] and "eagle_config" not in written
    del written["batchspec"]
    (tmp_path / "spec" / "config.json").write_text(json.dumps(written))
    assert load_head(tmp_path / "spec", target).config.target_layer_ids == (1, 3, 5)


SAVE_IDS = {  # target layers, ids, refusal words (None: saved)
    "valid": (8, (1, 4, 7), None),
    "default": (8, (2, 4, 5), None),
    "repeated": (8, (2, 4, 4), "are not distinct, ascending and >= 1"),
    "descending": (8, (5, 4, 2), "are not distinct, ascending and >= 1"),
    "embeddings": (8, (0, 4, 5), "are not distinct, ascending and >= 1"),
    "4 layers, valid": (4, (1, 2, 3), None),
    "4 layers, chosen repeats": (4, (1, 1, 3), "choose e.g. (1, 2, 3)"),
    "4 layers, (2, 2, 1) (EAGLE's rule's ids)": (4, (2, 2, 1), "choose e.g. (1, 2, 3)"),
    "6 layers, (2, 3, 3)": (6, (2, 3, 3), "choose e.g. (2, 3, 4)"),
    "3 layers, the clamped default": (3, (2, 1, 0), None),  # shallower than 4: saved, train_draft warns
    "3 layers, chosen": (3, (0, 1, 2), None),
}


@pytest.mark.parametrize("case", list(SAVE_IDS))
@pytest.mark.parametrize("fmt", ["eagle", "speculators"])
def test_saving_requires_layer_ids_other_engines_can_capture(tmp_path, case, fmt):
    layers, ids, words = SAVE_IDS[case]
    head = head_for_target(tiny_target(layers=layers), layer_ids=ids)
    if words is None:
        save_head(head, tmp_path, format=fmt)
        assert json.loads((tmp_path / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == list(ids)
        return
    with pytest.raises(HeadError) as info:
        save_head(head, tmp_path / "out", format=fmt)
    message = str(info.value)
    assert message.startswith(f"cannot save eagle head {tmp_path / 'out'}: target layer ids {ids}") and words in message
    assert "\n" not in message and not (tmp_path / "out").exists()


def test_saved_dtype_is_the_heads(tmp_path, target):
    """A head saved in bfloat16 says so in its config and loads into the same values."""
    head = trained_looking_head(target, torch.tensor([0, 1, 5, 6, 7, 40, 99, 119])).to(torch.bfloat16)
    for fmt in FORMATS:
        save_head(head, tmp_path / fmt, format=fmt)
        weights = load_file(str(tmp_path / fmt / "model.safetensors"))
        assert weights["fc.weight"].dtype == torch.bfloat16 and weights["d2t"].dtype == torch.long
        config = json.loads((tmp_path / fmt / "config.json").read_text())
        layer = config.get("transformer_layer_config", config)
        assert layer["torch_dtype"] == layer["dtype"] == "bfloat16"
        loaded = load_head(tmp_path / fmt, target)
        assert torch.equal(loaded.fc.weight, head.fc.weight.float())


def edit(path: Path, config=None, weights=None):
    if config:
        c = json.loads((path / "config.json").read_text())
        config(c)
        (path / "config.json").write_text(json.dumps(c))
    if weights == "junk":
        (path / "model.safetensors").write_bytes(b"not safetensors")
    elif weights == "truncated":  # a copy or download cut short (issue 34, item 1: was a traceback)
        data = (path / "model.safetensors").read_bytes()
        (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif weights:
        w = load_file(str(path / "model.safetensors"))
        weights(w)
        save_file(w, str(path / "model.safetensors"))


def setitem(key, value):
    return lambda d: d.__setitem__(key, value)


BAD = {
    "hidden size": (lambda t: tiny_target(hidden=32), None, None, "hidden size is 32"),
    "vocabulary": (lambda t: tiny_target(vocab=130), None, None, "target has 130"),
    "layer count": (lambda t: tiny_target(layers=8), None, None, "made for a 6-layer target"),
    "layer ids": (None, lambda c: c.update(batchspec={**c["batchspec"], "target_layer_ids": [2, 3, 9]},
                                           eagle_aux_hidden_state_layer_ids=[2, 3, 9],
                                           eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2, 8]}),
                  None, "out of range"),
    "layer ids disagree": (None, setitem("eagle_config", {"eagle_aux_hidden_state_layer_ids": [2, 3, 4]}), None,
                           "eagle_aux_hidden_state_layer_ids [2, 3, 4] and eagle_config.eagle_aux_hidden_state_layer_ids "
                           "[2, 3, 4] (layer outputs, i.e. indices [3, 4, 5]) name different target layers"),
    "batchspec ids disagree": (None, lambda c: c["batchspec"].__setitem__("target_layer_ids", [1, 3, 5]), None,
                               "batchspec.target_layer_ids [1, 3, 5] disagree with the "
                               "eagle_aux_hidden_state_layer_ids other engines read ([2, 3, 4])"),
    "no aux hidden states": (None, setitem("eagle_config", {"use_aux_hidden_state": False}), None,
                             "config.json sets eagle_config.use_aux_hidden_state=false"),
    "unknown weight": (None, None, lambda w: w.__setitem__("midlayer.self_attn.o_proj.bias", torch.zeros(64)),
                       "model.safetensors holds weight midlayer.self_attn.o_proj.bias (a bias), which batchspec "
                       "does not implement"),
    "unreadable weights": (None, None, "junk", "cannot read model.safetensors"),
    "truncated weights": (None, None, "truncated", "cannot read model.safetensors (SafetensorError"),
    "d2t size": (None, None, lambda w: w.__setitem__("d2t", torch.zeros(7, dtype=torch.long)), "d2t has shape (7,)"),
    "d2t range": (None, None, lambda w: w.__setitem__("d2t", torch.full((8,), 200)), "outside the target vocabulary"),
    "d2t duplicates": (None, None, lambda w: w.__setitem__("d2t", -torch.arange(8)), "same target id"),
    "t2d size": (None, None, lambda w: w.__setitem__("t2d", torch.ones(100, dtype=torch.bool)), "t2d has shape"),
    "t2d marks": (None, None, lambda w: w.__setitem__("t2d", torch.ones(120, dtype=torch.bool)), "does not mark"),
    "no d2t": (None, None, lambda w: (w.pop("d2t"), w.pop("t2d")), "no d2t map"),
    "missing weight": (None, None, lambda w: w.pop("fc.weight"), "missing weight fc.weight"),
    "weight shape": (None, None, lambda w: w.__setitem__("norm.weight", torch.ones(3)),
                     "weight norm.weight (model.safetensors) has shape (3,), expected (64,)"),
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


def layer_key(fmt, key):
    return f"transformer_layer_config.{key}" if fmt == "speculators" else key


# Flags batchspec does not implement: (key, value, words); the layer's flags sit in speculators'
# transformer_layer_config, the head's at either layout's top level.
LAYER_FLAGS = [
    ("attention_bias", True, "biases on the attention projections"),
    ("mlp_bias", True, "biases on the MLP projections"),
    ("qkv_bias", True, "biases on q/k/v"),
    ("bias", True, "biases (on fc in SGLang's llama_eagle3"),
    ("logit_scale", 2.0, "scaled logits"),
    ("layer_types", ["sliding_attention"], "sliding-window attention"),
    ("use_sliding_window", True, "sliding-window attention"),
    ("rope_scaling", {"rope_type": "default", "mrope_section": [8, 4, 4]}, "multimodal RoPE"),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [8, 4, 4]}, "multimodal RoPE"),
    ("model_type", "qwen3", "a decoder layer other than Llama's"),
]
HEAD_FLAGS = [
    ("fc_norm", True, "EAGLE-3.1's RMSNorm of each target hidden state before fc"),
    ("norm_before_fc", True, "an RMSNorm of the concatenated target hidden states before fc"),
    ("norm_output", True, "EAGLE-3.1's normed output fed to the next draft step"),
]
FLAG_CASES = ([("eagle", k, v, w) for k, v, w in LAYER_FLAGS + HEAD_FLAGS]
              + [("eagle", "tie_word_embeddings", True, "an LM head tied to the token embeddings")]
              + [("speculators", k, v, w) for k, v, w in LAYER_FLAGS + HEAD_FLAGS])


@pytest.mark.parametrize("fmt,key,value,words", FLAG_CASES, ids=[f"{c[0]}-{c[1]}" for c in FLAG_CASES])
def test_unimplemented_flags_are_refused_in_both_layouts(tmp_path, target, fmt, key, value, words):
    save_head(trained_looking_head(target), tmp_path, format=fmt)
    config = json.loads((tmp_path / "config.json").read_text())
    where = config["transformer_layer_config"] if fmt == "speculators" and (key, value, words) in LAYER_FLAGS else config
    where[key] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(HeadError) as info:
        load_head(tmp_path, target)
    message = str(info.value)
    shown = layer_key(fmt, key) if (key, value, words) in LAYER_FLAGS else key
    assert message.startswith(f"eagle head {tmp_path}: config.json sets {shown}={json.dumps(value)}: {words}"), message
    assert "\n" not in message and message.endswith(", which batchspec does not implement"), message


@pytest.mark.parametrize("fmt", FORMATS)
def test_flags_at_their_implemented_values_load(tmp_path, target, fmt):
    """The same flags at the values batchspec implements (what the writers put in plain EAGLE-3 heads) load."""
    save_head(trained_looking_head(target), tmp_path, format=fmt)
    config = json.loads((tmp_path / "config.json").read_text())
    layer = config.get("transformer_layer_config", config)
    layer.update(attention_bias=False, mlp_bias=False, qkv_bias=False, bias=False, logit_scale=1.0,
                 layer_types=["full_attention"], use_sliding_window=False, model_type="llama")
    config.update(fc_norm=False, norm_before_fc=False, norm_output=False)
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_head(tmp_path, target).config.target_layer_ids == (2, 3, 4)


def test_missing_files(tmp_path, target):
    with pytest.raises(HeadError, match="no such directory"):
        load_head(tmp_path / "nope", target)
    with pytest.raises(HeadError, match="missing config.json"):
        load_head(tmp_path, target)
    save_head(trained_looking_head(target), tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(HeadError, match="missing weights"):
        load_head(tmp_path, target)


# ------------------------------------------------------------------ train_draft: saved dtype, summary lines

SAVE_DTYPES = {  # --save-dtype, the target config's dtype -> (dtype written, why)
    "auto, bf16 target": ("auto", "bfloat16", ("bfloat16", "the target's dtype")),
    "auto, fp16 target": ("auto", "float16", ("float16", "the target's dtype")),
    "auto, fp32 target": ("auto", "float32", ("float32", "the target's dtype")),
    "auto, no dtype": ("auto", None, ("float32", "the target's config names no dtype")),
    "auto, fp8 target": ("auto", "float8_e4m3fn",
                         ("float32", "the target's dtype float8_e4m3fn is not one a head is saved in")),
    "override": ("float32", "bfloat16", ("float32", "--save-dtype")),
}


@pytest.mark.parametrize("case", list(SAVE_DTYPES))
def test_train_draft_saves_in_the_targets_dtype(case):
    from batchspec.training.train_draft import save_dtype

    requested, target_dtype, expected = SAVE_DTYPES[case]
    assert save_dtype(requested, target_dtype) == expected


def test_train_draft_reads_the_targets_dtype_and_depth(tmp_path):
    from transformers import LlamaConfig

    from batchspec.training.train_draft import target_facts

    LlamaConfig(num_hidden_layers=5, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                dtype="bfloat16").save_pretrained(tmp_path / "t")
    assert target_facts(str(tmp_path / "t")) == ("bfloat16", 5)
    assert target_facts(str(tmp_path / "none")) == (None, None)


NOTES = {  # layers, ids -> the warning line's words (None: no warning)
    "8 layers, default": (8, (2, 4, 5), None),
    "4 layers, default": (4, (1, 2, 3), None),
    "6 layers, default": (6, (2, 3, 4), None),
    "3 layers": (3, (2, 1, 0), "a 3-layer target has no three distinct hidden states 1..2 to give them"),
}


@pytest.mark.parametrize("case", list(NOTES))
@pytest.mark.parametrize("fmt", FORMATS)
def test_train_draft_summary_says_what_was_written(case, fmt):
    from types import SimpleNamespace

    from batchspec.eagle.formats import CHECKED
    from batchspec.training.train_draft import save_notes

    layers, ids, words = NOTES[case]
    summary = SimpleNamespace(out="heads/x", format=fmt, config={"target_num_layers": layers, "target_layer_ids": list(ids)})
    lines = save_notes(summary, "bfloat16", "the target's dtype")
    assert lines[0] == f"  saved: heads/x/config.json + model.safetensors in bfloat16 (the target's dtype); {CHECKED[fmt]}"
    assert "not loaded in" in lines[0] and "checked against" in lines[0]
    if words is None:
        assert len(lines) == 1
    else:
        assert len(lines) == 2 and lines[1].startswith("  warning: other engines cannot load this head (from vLLM's and SGLang's source): ")
        assert words in lines[1], lines[1]


@pytest.mark.parametrize("sizes, shown", [([], None), ([1 << 29, 1 << 29], "1.00 GiB"), ([3 * (1 << 20)], "0.00 GiB")])
def test_train_draft_summary_says_how_much_its_run_folder_keeps(tmp_path, sizes, shown):
    """OUT/.train keeps the samples and the target's states for --resume (3 GiB after SmolLM2's 20 minutes on
    CPU): the summary names the folder and its size, and says nothing when there is none."""
    from types import SimpleNamespace

    from batchspec.training.train_draft import save_notes

    out = tmp_path / "head"
    for i, size in enumerate(sizes):
        path = out / ".train" / "samples" / f"train-{i:05d}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            f.truncate(size)
    summary = SimpleNamespace(out=str(out), format="eagle", config={"target_num_layers": 8, "target_layer_ids": [2, 4, 5]})
    kept = [line for line in save_notes(summary, "float32", "the target's dtype") if line.startswith("  kept: ")]
    if shown is None:
        assert kept == []
    else:
        assert kept == [f"  kept: {out / '.train'} ({shown}: the samples, the target's states and the last checkpoint, "
                        "for --resume; delete it when the head is final)"]


def test_train_draft_refuses_layers_other_engines_cannot_capture_before_running(tmp_path):
    from transformers import LlamaConfig

    from batchspec.training.train_draft import main

    LlamaConfig(num_hidden_layers=8, hidden_size=64, intermediate_size=128, num_attention_heads=4).save_pretrained(tmp_path / "t")
    with pytest.raises(SystemExit) as info:
        main([str(tmp_path / "t"), "--prompts", str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "o"),
              "--layers", "2,2,5", "--steps", "1", "--device", "cpu"])
    assert str(info.value) == ("train_draft: --layers: target layer ids (2, 2, 5) are not distinct, ascending and "
                               ">= 1, as vLLM and SGLang need (each captures a layer once, in layer order, from "
                               "index 1); choose e.g. 2,4,5")
    assert not (tmp_path / "o").exists()
