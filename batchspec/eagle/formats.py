"""Load and save EAGLE-3 heads in the two layouts in use (docs/eagle.md says what was checked against what:
the names and config fields below were read off the loaders' source; no engine was run here).

eagle (EAGLE / SpecForge / SGLang; also read by vLLM's llama_eagle3): config.json of a 1-layer
  `LlamaForCausalLMEagle3` with `draft_vocab_size` (and `target_hidden_size`); weights `fc.weight`,
  `midlayer.*`, `norm.weight`, `lm_head.weight`, `d2t`, `t2d`, usually no `embed_tokens` (the target's
  are used). Target layers: top-level `eagle_aux_hidden_state_layer_ids` as hidden-state indices (what
  vLLM reads first) and `eagle_config.eagle_aux_hidden_state_layer_ids` as layer OUTPUTS, index - 1
  (what SGLang reads, adding 1); both are written, either is read, and they must agree.
speculators (vLLM's `speculators`): config.json with `speculators_model_type: eagle3`,
  `speculators_config`, `transformer_layer_config` (the Llama layer), `draft_vocab_size`,
  `norm_before_residual`, `eagle_aux_hidden_state_layer_ids` (hidden-state indices, vLLM's meaning);
  weights `embed_tokens.weight`, `fc.weight`, `layers.0.*`, `norm.weight`, `lm_head.weight`, and
  `d2t`/`t2d` only when the draft vocabulary is reduced.
Either is read from `model.safetensors`, `pytorch_model.bin`, or shards listed in
`model.safetensors.index.json` / `pytorch_model.bin.index.json`. Every weight and config flag that
batchspec does not implement (EAGLE-3.1's `fc_norm`, `norm_output`, biases, ...) is refused with one line.
Our own `batchspec` block in the config records the exact hidden-state indices and target depth; other
tools ignore it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import save_file

from ..util.files import atomic_write
from .config import EagleConfig, HeadError, default_layer_ids, target_num_layers
from .head import EagleHead
from .layer_ids import check_layer_ids_for_saving, file_layer_ids
from .weights import check_vocab_maps, read_weights, what_weight

FORMATS = ("eagle", "speculators")
SPECULATORS_VERSION = "0.3.0"  # the speculators config schema this writer follows

# What each layout's files were checked against (said by train_draft and docs/eagle.md; nothing was loaded
# in these engines here).
CHECKED = {
    "eagle": "written in the layout SGLang's and vLLM's llama_eagle3.py read (names and config fields checked "
             "against their source; not loaded in SGLang or vLLM here)",
    "speculators": "written in the speculators layout vLLM reads (names and config fields checked against vLLM's "
                   "speculators config reader, llama_eagle3.py and the speculators package source; not loaded in "
                   "vLLM here)",
}


# ------------------------------------------------------------------------------------------------ layer ids


# ------------------------------------------------------------------------------------------------ reading


def rope_of(c: dict[str, Any]) -> dict[str, Any]:
    """transformers-5 `rope_parameters` from either spelling (rope_parameters, or rope_theta + rope_scaling)."""
    if isinstance(c.get("rope_parameters"), dict):
        return dict(c["rope_parameters"])
    rope = dict(c.get("rope_scaling") or {"rope_type": "default"})
    rope.setdefault("rope_type", rope.pop("type", "default"))
    rope["rope_theta"] = float(c.get("rope_theta", 10000.0))
    return rope


def layer_fields(c: dict[str, Any]) -> dict[str, Any]:
    """The decoder layer's shape from a Llama-style config dict."""
    hidden, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
    return dict(
        hidden_size=hidden, intermediate_size=int(c["intermediate_size"]), num_attention_heads=heads,
        num_key_value_heads=int(c.get("num_key_value_heads") or heads), head_dim=int(c.get("head_dim") or hidden // heads),
        rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)), max_position_embeddings=int(c.get("max_position_embeddings", 4096)),
        rope_parameters=rope_of(c), hidden_act=c.get("hidden_act", "silu"),
    )


def _off(value) -> bool:
    return not value


def _full_attention(value) -> bool:
    return not value or all(t == "full_attention" for t in value)


def _no_mrope(value) -> bool:
    return not (isinstance(value, dict) and "mrope_section" in value)


# Config flags whose other values batchspec does not implement: key -> (is the value one batchspec
# implements, what the flag asks for, who reads it). Checked on the config a head's layer is built from
# (the eagle layout's top level, speculators' transformer_layer_config) and, for the head-level flags, on
# speculators' top level.
LAYER_FLAGS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "model_type": (lambda v: v in (None, "llama"), "a decoder layer other than Llama's"),
    "attention_bias": (_off, "biases on the attention projections (vLLM llama_eagle3)"),
    "mlp_bias": (_off, "biases on the MLP projections (vLLM llama_eagle3)"),
    "qkv_bias": (_off, "biases on q/k/v (vLLM llama_eagle3)"),
    "bias": (_off, "biases (on fc in SGLang's llama_eagle3, on attention in vLLM's)"),
    "logit_scale": (lambda v: v is None or float(v) == 1.0, "scaled logits (vLLM llama_eagle3)"),
    "layer_types": (_full_attention, "sliding-window attention"),
    "use_sliding_window": (_off, "sliding-window attention"),
    "rope_scaling": (_no_mrope, "multimodal RoPE (mrope_section)"),
    "rope_parameters": (_no_mrope, "multimodal RoPE (mrope_section)"),
}
HEAD_FLAGS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "fc_norm": (_off, "EAGLE-3.1's RMSNorm of each target hidden state before fc (SpecForge, speculators)"),
    "norm_before_fc": (_off, "an RMSNorm of the concatenated target hidden states before fc (speculators)"),
    "norm_output": (_off, "EAGLE-3.1's normed output fed to the next draft step (speculators, SGLang)"),
}
EAGLE_FLAGS = {**LAYER_FLAGS, **HEAD_FLAGS,
               "tie_word_embeddings": (_off, "an LM head tied to the token embeddings (SGLang llama_eagle3)")}


def check_flags(c: dict[str, Any], flags: dict, where: str, prefix: str = "") -> None:
    for key, (implemented, what) in flags.items():
        if key in c and not implemented(c[key]):
            raise HeadError(f"{where}: config.json sets {prefix}{key}={json.dumps(c[key])}: {what}, "
                            "which batchspec does not implement")


def parse_config(raw: dict[str, Any], target_config, where: str) -> tuple[EagleConfig, str]:
    """(EagleConfig, format) from a head's config.json and the target's config."""
    layers = target_num_layers(target_config)
    ours = raw.get("batchspec") or {}
    try:
        if "speculators_model_type" in raw:
            fmt = "speculators"
            if raw["speculators_model_type"] != "eagle3":
                raise HeadError(f"{where}: speculators model type {raw['speculators_model_type']!r} is not eagle3")
            layer = raw.get("transformer_layer_config") or {}
            check_flags(raw, HEAD_FLAGS, where)
            check_flags(layer, LAYER_FLAGS, where, "transformer_layer_config.")
            vocab = int(layer["vocab_size"])
            norm_before_residual = bool(raw.get("norm_before_residual", True))  # vLLM's default when absent
        else:
            fmt = "eagle"
            layer = raw
            check_flags(raw, EAGLE_FLAGS, where)
            vocab = int(raw["vocab_size"])
            norm_before_residual = bool(raw.get("norm_before_residual", False))
        eagle_config = raw.get("eagle_config") or {}
        if not eagle_config.get("use_aux_hidden_state", True):
            raise HeadError(f"{where}: config.json sets eagle_config.use_aux_hidden_state=false: a head without fc "
                            "over target hidden states, which batchspec does not implement")
        if int(layer.get("num_hidden_layers", 1)) != 1:
            raise HeadError(f"{where}: {layer['num_hidden_layers']} decoder layers; only 1-layer heads are supported")
        ids = file_layer_ids(raw, where)
        if ours.get("target_layer_ids") and ids and tuple(ours["target_layer_ids"]) != ids:
            raise HeadError(f"{where}: config.json's batchspec.target_layer_ids {list(ours['target_layer_ids'])} "
                            f"disagree with the eagle_aux_hidden_state_layer_ids other engines read ({list(ids)})")
        ids = ours.get("target_layer_ids") or ids or default_layer_ids(layers)
        config = EagleConfig(
            **layer_fields(layer), target_hidden_size=int(raw.get("target_hidden_size") or layer["hidden_size"]),
            target_vocab_size=vocab, draft_vocab_size=int(raw.get("draft_vocab_size") or vocab),
            target_num_layers=int(ours.get("target_num_layers") or layers), target_layer_ids=tuple(ids),
            norm_before_residual=norm_before_residual,
        )
    except HeadError as e:
        raise HeadError(str(e) if str(e).startswith(where) else f"{where}: {e}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise HeadError(f"{where}: config.json is not an EAGLE-3 head config ({type(e).__name__}: {e})") from None
    return config, fmt


def load_head(path: str | os.PathLike, target, *, dtype: torch.dtype | None = None,
              device: torch.device | str | None = None) -> EagleHead:
    """Load a head for `target` (a transformers model, or only its config: then the head must carry its
    own embeddings). Raises HeadError (a ValueError) with one line for anything that does not fit."""
    path = Path(path)
    where = f"eagle head {path}"
    if not path.is_dir():
        raise HeadError(f"{where}: no such directory")
    if not (path / "config.json").is_file():
        raise HeadError(f"{where}: missing config.json")
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise HeadError(f"{where}: config.json is not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise HeadError(f"{where}: config.json is not an EAGLE-3 head config (not a JSON object)")
    target_config = getattr(target, "config", target)
    config, fmt = parse_config(raw, target_config, where)
    config.check_target(target_config, where)
    weights, sources = read_weights(path, where)
    names = {k: k for k in weights}  # our name -> the file's name
    file_name = (lambda k: k.replace("midlayer.", "layers.0.", 1)) if fmt == "speculators" else (lambda k: k)
    if fmt == "speculators":
        names = {k.replace("layers.0.", "midlayer.", 1) if k.startswith("layers.0.") else k: k for k in weights}
        weights = {ours: weights[theirs] for ours, theirs in names.items()}
    head = EagleHead(config)
    expected = {k: v.shape for k, v in head.state_dict().items() if k not in ("d2t", "t2d", "embed_tokens.weight")}
    for key in sorted(weights):
        if key not in expected and key not in ("d2t", "t2d", "embed_tokens.weight"):
            theirs = names[key]
            raise HeadError(f"{where}: {sources[theirs]} holds weight {theirs} ({what_weight(theirs)}), which "
                            "batchspec does not implement")
    target_ids = check_vocab_maps(weights, config, where)
    for key, shape in expected.items():
        if key not in weights:
            raise HeadError(f"{where}: missing weight {file_name(key)}")
        if weights[key].shape != shape:
            raise HeadError(f"{where}: weight {names[key]} ({sources[names[key]]}) has shape {tuple(weights[key].shape)}, expected {tuple(shape)}")
    head.load_state_dict({k: weights[k] for k in expected}, strict=False)
    head.set_vocab(target_ids)
    if "embed_tokens.weight" in weights:
        embed = weights["embed_tokens.weight"]
    else:
        module = target.get_input_embeddings() if hasattr(target, "get_input_embeddings") else None
        if module is None:
            raise HeadError(f"{where}: carries no token embeddings; load it with the target model to share its embeddings")
        embed = module.weight.detach()
    if embed.shape[0] < config.target_vocab_size or embed.shape[1] != config.hidden_size:
        raise HeadError(f"{where}: token embeddings of shape {tuple(embed.shape)} do not fit a head of hidden size "
                        f"{config.hidden_size} over {config.target_vocab_size} tokens")
    head.set_embeddings(embed.float() if embed.dtype != head.embed_tokens.weight.dtype else embed)
    return head.to(device=device, dtype=dtype).eval()


# ------------------------------------------------------------------------------------------------ writing


def layer_config(config: EagleConfig, dtype: torch.dtype) -> dict[str, Any]:
    """A Llama config dict of the head's layer, readable by transformers 4.x and 5.x."""
    rope = dict(config.rope_parameters)
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    return {
        "model_type": "llama", "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads, "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim, "num_hidden_layers": 1, "hidden_act": config.hidden_act,
        "rms_norm_eps": config.rms_norm_eps, "max_position_embeddings": config.max_position_embeddings,
        "rope_theta": rope.get("rope_theta", 10000.0),
        "rope_scaling": None if scaling.get("rope_type", "default") == "default" else scaling,
        "rope_parameters": rope, "vocab_size": config.target_vocab_size, "tie_word_embeddings": False,
        "attention_bias": False, "mlp_bias": False, "torch_dtype": str(dtype).removeprefix("torch."),
        "dtype": str(dtype).removeprefix("torch."),
    }


def save_head(head: EagleHead, path: str | os.PathLike, *, format: str = "eagle", target_name: str | None = None,
              target_architectures: list[str] | None = None, speculative_tokens: int = 4) -> Path:
    """Write `head` to directory `path` (config.json + model.safetensors, in the head's dtype), each file
    atomically. Raises HeadError for target layer ids other engines cannot use (`check_layer_ids_for_saving`)."""
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    path = Path(path)
    c = head.config
    check_layer_ids_for_saving(c.target_layer_ids, c.target_num_layers, f"cannot save eagle head {path}")
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
    dtype = head.fc.weight.dtype
    ids = list(c.target_layer_ids)
    ours = {"target_layer_ids": ids, "target_num_layers": c.target_num_layers,
            "target": target_name, "note": "target_layer_ids index output_hidden_states (input of layer i)"}
    full_vocab = c.draft_vocab_size == c.target_vocab_size
    if format == "eagle":
        state.pop("embed_tokens.weight")  # the target's own (SpecForge's exporter drops them too)
        config = {"architectures": ["LlamaForCausalLMEagle3"], **layer_config(c, dtype),
                  "draft_vocab_size": c.draft_vocab_size, "target_hidden_size": c.target_hidden_size}
        if c.norm_before_residual:
            config["norm_before_residual"] = True
        # Both spellings, always: vLLM reads the top-level ids first (as hidden-state indices); SGLang reads
        # eagle_config's as layer outputs and adds 1 (docs/eagle.md, "Layer ids in files").
        config["eagle_aux_hidden_state_layer_ids"] = ids
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in ids], "use_aux_hidden_state": True}
    else:
        state = {k.replace("midlayer.", "layers.0.", 1) if k.startswith("midlayer.") else k: v for k, v in state.items()}
        if full_vocab:  # speculators keeps no maps for a full vocabulary (vLLM then maps identically)
            state.pop("d2t"), state.pop("t2d")
        config = {
            "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
            "speculators_version": SPECULATORS_VERSION,
            "speculators_config": {
                "algorithm": "eagle3", "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens,
                                      "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                "verifier": {"name_or_path": target_name, "architectures": target_architectures or []},
            },
            "transformer_layer_config": layer_config(c, dtype), "draft_vocab_size": c.draft_vocab_size,
            "target_hidden_size": None if c.target_hidden_size == c.hidden_size else c.target_hidden_size,
            "eagle_aux_hidden_state_layer_ids": ids,
            "norm_before_residual": c.norm_before_residual, "norm_before_fc": False, "fc_norm": False,
            "norm_output": False, "embed_requires_grad": False, "torch_dtype": str(dtype).removeprefix("torch."),
        }
    config["batchspec"] = ours
    atomic_write(path / "model.safetensors", lambda tmp: save_file(state, tmp, metadata={"format": "pt"}))
    atomic_write(path / "config.json", lambda tmp: Path(tmp).write_text(json.dumps(config, indent=2) + "\n"))
    return path
