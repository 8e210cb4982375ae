"""Tiny random models of every causal-LM type transformers ships, for the coverage test (test_model_types.py)
and the table in docs/how_it_works.md (tools/model_types.py writes it from the same run).

`tiny_config(model_type, vocab)` shrinks a type's default config to a few layers of width 64 (every size
attribute a config may use for it), a small sliding window where the type has one, and few experts where it
is a mixture; `build(model_type, ...)` builds the model with AutoModelForCausalLM.from_config, fixed seed,
fp32, or says in one line why it could not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PretrainedConfig
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


def _configs(config) -> list:
    """The config, its text config and every sub-config below them (a model of parts: BLT's four)."""
    found, todo = {}, [config, config.get_text_config()]
    while todo:
        c = todo.pop()
        if id(c) not in found:
            found[id(c)] = c
            todo += [v for v in vars(c).values() if isinstance(v, PretrainedConfig)]
    return list(found.values())


def tiny_config(model_type: str, vocab_size: int):
    config = AutoConfig.for_model(model_type)
    for target in _configs(config):
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
        for key in [k for k in vars(target) if k.endswith("layer_types")]:  # layer_types, mlp_layer_types, ...
            types = getattr(target, key)
            if isinstance(types, list) and types and isinstance(layers, int) and len(types) != layers:
                setattr(target, key, [types[i % len(types)] for i in range(layers)])
        for key, value in (("bos_token_id", 0), ("eos_token_id", 1), ("pad_token_id", 2)):
            if hasattr(target, key):
                setattr(target, key, value)
    return config


MAX_PARAMETERS = 20_000_000  # a type whose shrunk config is still larger is not built (BLT's defaults: 8B)


def build(model_type: str, vocab_size: int, seed: int = 0):
    """(model, None) or (None, why it could not be built, in one line). The size is checked on the meta
    device first: a config this shrinking misses would otherwise allocate its full size (the process is
    killed)."""
    try:
        config = tiny_config(model_type, vocab_size)
        with torch.device("meta"):
            size = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
        if size > MAX_PARAMETERS:
            return None, f"its shrunk config still has {size / 1e6:.0f}M parameters"
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval(), None
    except Exception as error:  # any: a type this shrinking does not fit is listed, not hidden
        text = " ".join(str(error).split()) or type(error).__name__
        return None, f"{type(error).__name__}: {text[:160]}"


# ---- the coverage check: one type, its outcome ------------------------------------------------------

NEW_TOKENS = 6
DRAFTERS = ("none", "ngram", "model")  # the model drafter's draft is the target itself: its drafts are accepted
EXACT, REFUSED, NOT_BUILT, NO_REFERENCE, MISMATCH, TRACEBACK = (
    "exact", "refused", "not built", "no reference", "mismatch", "traceback")


@dataclass(frozen=True)
class Outcome:
    model_type: str
    status: str  # one of the six above
    detail: str = ""  # the refusal's line, why it was not built, or what went wrong
    windowed: bool = False  # it has a sliding window (also checked on the static path)


def prompts_past(tokenizer, window: int) -> list[str]:
    """Three prompts, each longer than the window in tokens."""
    from tiny import PROMPTS

    chosen = [p * 3 for p in PROMPTS[:3]]
    assert all(len(tokenizer(p)["input_ids"]) > window for p in chosen)
    return chosen


def check_type(model_type: str, tokenizer, folder: Path) -> Outcome:
    """Build a tiny `model_type`, save it to `folder`, load it as batchspec does, and compare batchspec's greedy
    output (batch 3; drafters none, ngram and model; the static path too where it has a window) with
    `generate` on each prompt alone."""
    import batchspec
    from batchspec.engine.model.models import ModelLoadError, load_model

    built, why = build(model_type, len(tokenizer) + 12)
    if built is None:
        return Outcome(model_type, NOT_BUILT, why)
    text = built.config.get_text_config()
    windowed = isinstance(getattr(text, "sliding_window", None), int) and (
        getattr(text, "use_sliding_window", True) is not False)
    prompts = prompts_past(tokenizer, WINDOW)
    try:
        built.save_pretrained(folder)
    except Exception as error:  # its shrunk config does not validate when written
        return Outcome(model_type, NOT_BUILT, f"cannot be saved: {one_line(error)}", windowed)
    try:
        model = load_model(str(folder), dtype=torch.float32, device=torch.device("cpu"))
    except ModelLoadError as error:  # from_pretrained cannot read back what from_config built (a composite's part)
        text = re.sub(r"^cannot load model '[^']*': ", "", str(error))
        return Outcome(model_type, NOT_BUILT, f"not loadable from its saved folder: {text}"[:240], windowed)
    try:
        references = []
        for prompt in prompts:
            enc = tokenizer(prompt, return_tensors="pt")
            with torch.no_grad():
                # A plain greedy config: a type's own (Whisper's suppress_tokens) would add processors
                out = model.generate(**enc, generation_config=GenerationConfig(
                    do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=1, pad_token_id=2))
            references.append(out[0, enc["input_ids"].shape[1]:].tolist())
    except Exception as error:  # transformers cannot run it either: nothing to compare with, but batchspec must
        reference = one_line(error)  # still refuse it in one line or run it, never raise from inside a round
        references = None
    cases = [(d, {}) for d in DRAFTERS] + ([("none", dict(compile="static"))] if windowed else [])
    for drafter, extra in cases[: 1 if references is None else len(cases)]:
        try:
            results = batchspec.generate(prompts, target=model, draft=model if drafter == "model" else None,
                                         tokenizer=tokenizer, drafter=drafter, batch_size=3, k=3, adaptive=False,
                                         max_new_tokens=NEW_TOKENS, max_seq_len=256, **extra)
        except ModelLoadError as error:
            text = str(error)
            return Outcome(model_type, REFUSED if "\n" not in text else TRACEBACK, text, windowed)
        except Exception as error:
            return Outcome(model_type, TRACEBACK, f"{drafter}: {one_line(error)}", windowed)
        if references is None:
            return Outcome(model_type, NO_REFERENCE, reference, windowed)
        got = [r.completion_token_ids if r.error is None else r.error for r in results]
        if got != references:
            return Outcome(model_type, MISMATCH, f"{drafter} {extra or ''}: {got} != {references}", windowed)
    return Outcome(model_type, EXACT, "", windowed)


def one_line(error: Exception) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return f"{type(error).__name__}: {text[:200]}"
