"""Tiny random models of every causal-LM type transformers ships, for the coverage test (test_model_types.py)
and the table in docs/how_it_works.md (tools/model_types.py writes it from the same run).

`tiny_config(model_type, vocab)` shrinks a type's default config to a few layers of width 64 (every size
attribute a config may use for it), a small sliding window where the type has one, and few experts where it
is a mixture; `build(model_type, ...)` builds the model with AutoModelForCausalLM.from_config, fixed seed,
fp32, or says in one line why it could not.
"""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

WINDOW = 8  # the sliding window of the types that have one: prompts run well past it
SIZES = {  # attribute -> value, set wherever a config has the attribute
    "hidden_size": 64, "n_embd": 64, "d_model": 64, "dim": 64, "model_dim": 64,
    "num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "n_layers": 2, "decoder_layers": 2,
    "num_attention_heads": 4, "n_head": 4, "n_heads": 4, "decoder_attention_heads": 4, "num_heads": 4,
    "num_key_value_heads": 2, "num_kv_heads": 2, "n_kv_heads": 2, "multi_query_group_num": 2,
    "intermediate_size": 128, "ffn_dim": 128, "n_inner": 128, "decoder_ffn_dim": 128, "ffn_hidden_size": 128,
    "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64, "head_dim": 16,
    "num_local_experts": 4, "num_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4,
    "num_experts_per_tok": 2, "moe_topk": 2, "top_k": 2, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
    "max_position_embeddings": 512, "n_positions": 512, "n_ctx": 512, "max_sequence_length": 512,
    "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
    "first_k_dense_replace": 1,
}


def model_types() -> list[str]:
    """Every type AutoModelForCausalLM maps, sorted."""
    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def tiny_config(model_type: str, vocab_size: int):
    config = AutoConfig.for_model(model_type)
    text = config.get_text_config()
    for target in {id(config): config, id(text): text}.values():
        for key, value in SIZES.items():
            if isinstance(getattr(target, key, None), int) and not isinstance(getattr(target, key), bool):
                setattr(target, key, value)
        for key in ("head_dim", "num_key_value_heads"):  # None: derived later, from what the default had
            if hasattr(target, key) and getattr(target, key) is None:
                setattr(target, key, SIZES[key])
        for key in ("vocab_size",):
            if hasattr(target, key):
                setattr(target, key, vocab_size)
        if isinstance(getattr(target, "sliding_window", None), int):
            target.sliding_window = WINDOW
        layers = getattr(target, "num_hidden_layers", None)
        types = getattr(target, "layer_types", None)
        if isinstance(types, list) and isinstance(layers, int) and len(types) != layers:
            target.layer_types = [types[i % len(types)] for i in range(layers)]
        for key, value in (("bos_token_id", 0), ("eos_token_id", 1), ("pad_token_id", 2)):
            if hasattr(target, key):
                setattr(target, key, value)
    return config


def build(model_type: str, vocab_size: int, seed: int = 0):
    """(model, None) or (None, why it could not be built, in one line)."""
    try:
        config = tiny_config(model_type, vocab_size)
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval(), None
    except Exception as error:  # any: a type this shrinking does not fit is listed, not hidden
        text = " ".join(str(error).split()) or type(error).__name__
        return None, f"{type(error).__name__}: {text[:160]}"
