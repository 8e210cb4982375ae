"""EAGLE-3 checkpoints written BY HAND in other projects' naming, not from batchspec's state_dict: tensor names
and config.json keys are spelled out below as SpecForge and speculators write them, so a naming mismatch
between them and batchspec's loader fails here.

SpecForge: specforge/modeling/draft/llama3_eagle.py (`LlamaForCausalLMEagle3`: fc, midlayer.{hidden_norm,
input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}, norm,
lm_head, buffers d2t/t2d; EAGLE-3.1 adds fc_norm.{0,1,2}), configs/llama3-8B-eagle3.json and
configs/qwen3-30B-A3B-eagle3.1.json (fields), export/to_sglang.py (embeddings dropped).
speculators: src/speculators/models/eagle3/{config.py, core.py, model_definitions.py} and model.py
(embed_tokens, fc, layers.0.{hidden_norm, ...}, norm, lm_head, d2t/t2d; Eagle3SpeculatorConfig fields),
src/speculators/config.py and proposals/greedy.py (speculators_config).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from batchspec.eagle import HeadError
from batchspec.eagle.formats import load_head
from tiny import model_config

H, V, VD, LAYERS = 64, 120, 60, 8  # head = target width 64, 4 heads x 16, 2 KV heads, MLP 128
DRAFT_IDS = torch.arange(0, V, 2)  # the draft vocabulary: every other target token

# SpecForge's names (llama3_eagle.py), as its exporter writes them: no embed_tokens.
SPECFORGE = {
    "fc.weight": (H, 3 * H),
    "midlayer.hidden_norm.weight": (H,),
    "midlayer.input_layernorm.weight": (H,),
    "midlayer.self_attn.q_proj.weight": (64, 2 * H),
    "midlayer.self_attn.k_proj.weight": (32, 2 * H),
    "midlayer.self_attn.v_proj.weight": (32, 2 * H),
    "midlayer.self_attn.o_proj.weight": (H, 64),
    "midlayer.post_attention_layernorm.weight": (H,),
    "midlayer.mlp.gate_proj.weight": (128, H),
    "midlayer.mlp.up_proj.weight": (128, H),
    "midlayer.mlp.down_proj.weight": (H, 128),
    "norm.weight": (H,),
    "lm_head.weight": (VD, H),
}
# speculators' names (Eagle3DraftModel): layers.0.*, and its own copy of the embeddings.
SPECULATORS = {
    "embed_tokens.weight": (V, H),
    "fc.weight": (H, 3 * H),
    "layers.0.hidden_norm.weight": (H,),
    "layers.0.input_layernorm.weight": (H,),
    "layers.0.self_attn.q_proj.weight": (64, 2 * H),
    "layers.0.self_attn.k_proj.weight": (32, 2 * H),
    "layers.0.self_attn.v_proj.weight": (32, 2 * H),
    "layers.0.self_attn.o_proj.weight": (H, 64),
    "layers.0.post_attention_layernorm.weight": (H,),
    "layers.0.mlp.gate_proj.weight": (128, H),
    "layers.0.mlp.up_proj.weight": (128, H),
    "layers.0.mlp.down_proj.weight": (H, 128),
    "norm.weight": (H,),
    "lm_head.weight": (VD, H),
}
# Where each lands in batchspec's head.
LANDS = {
    "fc.weight": "fc.weight", "norm.weight": "norm.weight", "lm_head.weight": "lm_head.weight",
    "embed_tokens.weight": "embed_tokens.weight",
    "midlayer.hidden_norm.weight": "midlayer.hidden_norm.weight",
    "midlayer.input_layernorm.weight": "midlayer.input_layernorm.weight",
    "midlayer.self_attn.q_proj.weight": "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight": "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight": "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight": "midlayer.self_attn.o_proj.weight",
    "midlayer.post_attention_layernorm.weight": "midlayer.post_attention_layernorm.weight",
    "midlayer.mlp.gate_proj.weight": "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight": "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight": "midlayer.mlp.down_proj.weight",
    "layers.0.hidden_norm.weight": "midlayer.hidden_norm.weight",
    "layers.0.input_layernorm.weight": "midlayer.input_layernorm.weight",
    "layers.0.self_attn.q_proj.weight": "midlayer.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight": "midlayer.self_attn.k_proj.weight",
    "layers.0.self_attn.v_proj.weight": "midlayer.self_attn.v_proj.weight",
    "layers.0.self_attn.o_proj.weight": "midlayer.self_attn.o_proj.weight",
    "layers.0.post_attention_layernorm.weight": "midlayer.post_attention_layernorm.weight",
    "layers.0.mlp.gate_proj.weight": "midlayer.mlp.gate_proj.weight",
    "layers.0.mlp.up_proj.weight": "midlayer.mlp.up_proj.weight",
    "layers.0.mlp.down_proj.weight": "midlayer.mlp.down_proj.weight",
}

# SpecForge's config.json fields (configs/llama3-8B-eagle3.json, shrunk to the tiny target).
SPECFORGE_CONFIG = {
    "architectures": ["LlamaForCausalLMEagle3"], "bos_token_id": 0, "eos_token_id": 1, "hidden_act": "silu",
    "hidden_size": H, "initializer_range": 0.02, "intermediate_size": 128, "max_position_embeddings": 512,
    "model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
    "pad_token_id": 2, "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "torch_dtype": "float16",
    "transformers_version": "4.28.1", "use_cache": True, "vocab_size": V, "draft_vocab_size": VD,
}
# speculators' config.json fields (Eagle3SpeculatorConfig, SpeculatorsConfig, GreedyTokenProposalConfig).
SPECULATORS_CONFIG = {
    "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.3.0",
    "speculators_config": {
        "algorithm": "eagle3", "default_proposal_method": "greedy",
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3, "verifier_accept_k": 1,
                              "accept_tolerance": 0.0}],
        "verifier": {"name_or_path": "tiny/llama", "architectures": ["LlamaForCausalLM"]},
    },
    "transformer_layer_config": {
        "model_type": "llama", "vocab_size": V, "hidden_size": H, "intermediate_size": 128,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "hidden_act": "silu", "max_position_embeddings": 512, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    },
    "draft_vocab_size": VD, "norm_before_residual": True, "target_hidden_size": None,
    "eagle_aux_hidden_state_layer_ids": [1, 4, 6], "norm_before_fc": False, "fc_norm": False,
    "norm_output": False, "embed_requires_grad": False, "torch_dtype": "bfloat16",
}


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(model_config("llama", V, layers=LAYERS, hidden=H), dtype=torch.float32).eval()


def tensors(shapes: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {name: (1.0 if len(shape) == 1 else 0.0) + 0.1 * torch.randn(shape, generator=g) for name, shape in shapes.items()}
    out["d2t"] = DRAFT_IDS - torch.arange(VD)  # SpecForge `used[i] - i`
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[DRAFT_IDS] = True
    out["t2d"] = t2d
    return out


def write(folder: Path, config: dict, weights: dict, how: str = "safetensors") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if how == "safetensors":
        save_file(weights, str(folder / "model.safetensors"))
    elif how == "bin":
        torch.save(weights, folder / "pytorch_model.bin")
    else:  # two shards and an index, as save_pretrained writes a large model
        ext, saver = {"sharded-safetensors": ("safetensors", lambda w, f: save_file(w, str(f))),
                      "sharded-bin": ("bin", lambda w, f: torch.save(w, f))}[how]
        names = sorted(weights)
        shards = {f"model-00001-of-00002.{ext}": names[::2], f"model-00002-of-00002.{ext}": names[1::2]}
        if ext == "bin":
            shards = {k.replace("model-", "pytorch_model-"): v for k, v in shards.items()}
        for file, keys in shards.items():
            saver({k: weights[k] for k in keys}, folder / file)
        index = "model.safetensors.index.json" if ext == "safetensors" else "pytorch_model.bin.index.json"
        (folder / index).write_text(json.dumps({"metadata": {"total_size": 0},
                                                "weight_map": {k: f for f, keys in shards.items() for k in keys}}))
    return folder


def rms(x, w, eps=1e-5):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def reference_logits(w: dict, embed: torch.Tensor, ids, feats, norm_before_residual: bool, p: str = "midlayer.") -> torch.Tensor:
    """EAGLE-3's step-0 pass from the named tensors, written from SpecForge's LlamaDecoderLayer.forward /
    vLLM's llama_eagle3 (residual = hidden, or hidden_norm(hidden) with norm_before_residual)."""
    b, t = ids.shape
    h = feats @ w["fc.weight"].T
    normed = rms(h, w[p + "hidden_norm.weight"])
    residual = normed if norm_before_residual else h
    x = torch.cat([rms(embed[ids], w[p + "input_layernorm.weight"]), normed], -1)
    q = (x @ w[p + "self_attn.q_proj.weight"].T).view(b, t, 4, 16).transpose(1, 2)
    k = (x @ w[p + "self_attn.k_proj.weight"].T).view(b, t, 2, 16).transpose(1, 2)
    v = (x @ w[p + "self_attn.v_proj.weight"].T).view(b, t, 2, 16).transpose(1, 2)
    inv = 1.0 / (10000.0 ** (torch.arange(0, 16, 2).float() / 16))
    ang = torch.arange(t).float()[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    rot = lambda z: torch.cat([-z[..., 8:], z[..., :8]], -1)  # noqa: E731
    q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(16) + torch.full((t, t), float("-inf")).triu(1)
    attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, 64)
    h = residual + attn @ w[p + "self_attn.o_proj.weight"].T
    m = rms(h, w[p + "post_attention_layernorm.weight"])
    mlp = (torch.nn.functional.silu(m @ w[p + "mlp.gate_proj.weight"].T) * (m @ w[p + "mlp.up_proj.weight"].T))
    out = h + mlp @ w[p + "mlp.down_proj.weight"].T
    return rms(out, w["norm.weight"]) @ w["lm_head.weight"].T


CASES = {  # name: (config, weight names, file layout, hidden-state indices the head reads)
    "specforge safetensors": (SPECFORGE_CONFIG, SPECFORGE, "safetensors", (2, 4, 5)),
    "specforge pytorch_model.bin": (SPECFORGE_CONFIG, SPECFORGE, "bin", (2, 4, 5)),
    "specforge sharded safetensors": (SPECFORGE_CONFIG, SPECFORGE, "sharded-safetensors", (2, 4, 5)),
    "specforge sharded bin": (SPECFORGE_CONFIG, SPECFORGE, "sharded-bin", (2, 4, 5)),
    "specforge custom layers": ({**SPECFORGE_CONFIG, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 3, 6],
                                                                       "use_aux_hidden_state": True}},
                                SPECFORGE, "safetensors", (1, 4, 7)),
    "speculators safetensors": (SPECULATORS_CONFIG, SPECULATORS, "safetensors", (1, 4, 6)),
    "speculators sharded": (SPECULATORS_CONFIG, SPECULATORS, "sharded-safetensors", (1, 4, 6)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hand_written_checkpoint_loads_into_the_right_places(tmp_path, target, case):
    config, shapes, how, layer_ids = CASES[case]
    weights = tensors(shapes)
    head = load_head(write(tmp_path, config, weights, how), target)
    assert head.config.target_layer_ids == layer_ids and head.config.draft_vocab_size == VD
    assert head.config.norm_before_residual == bool(config.get("norm_before_residual"))
    for name in shapes:
        assert torch.equal(head.get_parameter(LANDS[name]), weights[name]), name
    assert torch.equal(head.to_target_ids(torch.arange(VD)), DRAFT_IDS)
    embed = weights.get("embed_tokens.weight", target.get_input_embeddings().weight.detach())
    assert torch.equal(head.embed_tokens.weight, embed)
    ids, feats = torch.randint(0, V, (2, 6)), torch.randn(2, 6, 3 * H)
    prefix = "layers.0." if "layers.0.hidden_norm.weight" in shapes else "midlayer."
    want = reference_logits(weights, embed, ids, feats, head.config.norm_before_residual, prefix)
    with torch.no_grad():
        got = head.logits(head(ids, feats, torch.arange(6).expand(2, 6)))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


# EAGLE-3.1 and biased heads, as SpecForge / vLLM / speculators describe them: refused, naming the flag or
# weight and the file.
EAGLE31 = {**SPECFORGE_CONFIG, "fc_norm": True, "norm_output": True, "attention_bias": False,
           "use_sliding_window": False, "sliding_window": None}  # configs/qwen3-30B-A3B-eagle3.1.json's flags
FC_NORM = {"fc_norm.0.weight": (H,), "fc_norm.1.weight": (H,), "fc_norm.2.weight": (H,)}
QKV_BIAS = {"midlayer.self_attn.q_proj.bias": (64,), "midlayer.self_attn.k_proj.bias": (32,),
            "midlayer.self_attn.v_proj.bias": (32,)}
REFUSED = {
    "specforge eagle-3.1": (EAGLE31, {**SPECFORGE, **FC_NORM}, "safetensors", "config.json sets fc_norm=true"),
    "specforge eagle-3.1 norm_output only": ({**SPECFORGE_CONFIG, "norm_output": True}, SPECFORGE, "safetensors",
                                             "config.json sets norm_output=true"),
    "fc_norm weights without the flag": (SPECFORGE_CONFIG, {**SPECFORGE, **FC_NORM}, "safetensors",
                                         "model.safetensors holds weight fc_norm.0.weight (EAGLE-3.1's fc_norm)"),
    "attention_bias": ({**SPECFORGE_CONFIG, "attention_bias": True}, {**SPECFORGE, **QKV_BIAS}, "safetensors",
                       "config.json sets attention_bias=true"),
    "bias weights without the flag": (SPECFORGE_CONFIG, {**SPECFORGE, **QKV_BIAS}, "bin",
                                      "pytorch_model.bin holds weight midlayer.self_attn.k_proj.bias (a bias)"),
    "bias weight in a shard": (SPECFORGE_CONFIG, {**SPECFORGE, "fc.bias": (H,)}, "sharded-safetensors",
                               "model-00002-of-00002.safetensors holds weight fc.bias (a bias)"),
    "speculators fc_norm": ({**SPECULATORS_CONFIG, "fc_norm": True}, {**SPECULATORS, **FC_NORM}, "safetensors",
                            "config.json sets fc_norm=true"),
    "speculators norm_before_fc": ({**SPECULATORS_CONFIG, "norm_before_fc": True},
                                   {**SPECULATORS, "input_norm.weight": (3 * H,)}, "safetensors",
                                   "config.json sets norm_before_fc=true"),
    "speculators input_norm weight": (SPECULATORS_CONFIG, {**SPECULATORS, "input_norm.weight": (3 * H,)},
                                      "safetensors", "holds weight input_norm.weight (speculators' norm_before_fc)"),
    "speculators norm_output": ({**SPECULATORS_CONFIG, "norm_output": True}, SPECULATORS, "safetensors",
                                "config.json sets norm_output=true"),
    "speculators attention_bias": ({**SPECULATORS_CONFIG, "transformer_layer_config": {
        **SPECULATORS_CONFIG["transformer_layer_config"], "attention_bias": True}},
        {**SPECULATORS, "layers.0.self_attn.q_proj.bias": (64,)}, "safetensors",
        "config.json sets transformer_layer_config.attention_bias=true"),
    "speculators qwen3 layer": ({**SPECULATORS_CONFIG, "transformer_layer_config": {
        **SPECULATORS_CONFIG["transformer_layer_config"], "model_type": "qwen3"}}, SPECULATORS, "safetensors",
        'config.json sets transformer_layer_config.model_type="qwen3"'),
    "speculators q_norm weight": (SPECULATORS_CONFIG, {**SPECULATORS, "layers.0.self_attn.q_norm.weight": (16,)},
                                  "safetensors", "holds weight layers.0.self_attn.q_norm.weight"),
    "speculators verifier_lm_head": (SPECULATORS_CONFIG, {**SPECULATORS, "verifier_lm_head.weight": (VD, H)},
                                     "safetensors", "holds weight verifier_lm_head.weight (not part of a batchspec head)"),
    "speculators second layer": (SPECULATORS_CONFIG, {**SPECULATORS, "layers.1.norm.weight": (H,)}, "safetensors",
                                 "holds weight layers.1.norm.weight (a decoder layer batchspec does not have)"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_unimplemented_heads_are_refused_with_one_line(tmp_path, target, case):
    config, shapes, how, words = REFUSED[case]
    write(tmp_path, config, tensors(shapes), how)
    with pytest.raises(HeadError) as info:
        load_head(tmp_path, target)
    message = str(info.value)
    assert isinstance(info.value, ValueError) and "\n" not in message and words in message, message
    assert message.startswith(f"eagle head {tmp_path}: ") and "batchspec does not implement" in message, message


def shard_edit(folder: Path, edit) -> None:
    index = folder / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    edit(folder, data)
    index.write_text(json.dumps(data))


SHARD_BAD = {
    "missing shard": (lambda f, d: (f / "model-00002-of-00002.safetensors").unlink(),
                      "lists shard 'model-00002-of-00002.safetensors', which is not a file in the folder"),
    "shard outside the folder": (lambda f, d: d["weight_map"].__setitem__("fc.weight", "../x.safetensors"),
                                 "lists shard '../x.safetensors', which is not a file in the folder"),
    "weight not in its shard": (lambda f, d: d["weight_map"].__setitem__("d2t", "model-00002-of-00002.safetensors"),
                                "puts weight d2t in model-00002-of-00002.safetensors, but"),
    "weight in two shards": (lambda f, d: save_file({**load_file(str(f / "model-00001-of-00002.safetensors")),
                                                     "fc.weight": torch.zeros(H, 3 * H)},
                                                    str(f / "model-00001-of-00002.safetensors")),
                             "weight fc.weight is in both model-00001-of-00002.safetensors and model-00002-of-00002"),
    "not an index": (lambda f, d: d.pop("weight_map"), "model.safetensors.index.json is not a weight index"),
    "unreadable shard": (lambda f, d: (f / "model-00001-of-00002.safetensors").write_bytes(b"junk"),
                         "cannot read model-00001-of-00002.safetensors"),
}


@pytest.mark.parametrize("case", list(SHARD_BAD))
def test_bad_shards_are_refused_with_one_line(tmp_path, target, case):
    edit, words = SHARD_BAD[case]
    write(tmp_path, SPECFORGE_CONFIG, tensors(SPECFORGE), "sharded-safetensors")
    shard_edit(tmp_path, edit)
    with pytest.raises(HeadError) as info:
        load_head(tmp_path, target)
    message = str(info.value)
    assert "\n" not in message and words in message and message.startswith(f"eagle head {tmp_path}: "), message
