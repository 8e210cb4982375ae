"""Load and save EAGLE-3 heads in the two layouts in use (docs/eagle.md says what was checked against what).

eagle (EAGLE / SpecForge / SGLang): config.json of a 1-layer `LlamaForCausalLMEagle3` with
  `draft_vocab_size` (and `target_hidden_size`); weights `fc.weight`, `midlayer.*`, `norm.weight`,
  `lm_head.weight`, `d2t`, `t2d`, usually no `embed_tokens` (the target's are used). Non-default target
  layers: `eagle_config.eagle_aux_hidden_state_layer_ids`, as layer OUTPUTS (SGLang adds 1).
speculators (vLLM's `speculators`): config.json with `speculators_model_type: eagle3`,
  `speculators_config`, `transformer_layer_config` (the Llama layer), `draft_vocab_size`,
  `norm_before_residual`, `eagle_aux_hidden_state_layer_ids` (hidden-state indices, vLLM's meaning);
  weights `embed_tokens.weight`, `fc.weight`, `layers.0.*`, `norm.weight`, `lm_head.weight`, and
  `d2t`/`t2d` only when the draft vocabulary is reduced.
Either is read from `model.safetensors` or `pytorch_model.bin`. Our own `batchspec` block in the
config records the exact hidden-state indices and target depth; other tools ignore it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from .config import EagleConfig, HeadError, default_layer_ids, target_num_layers
from .head import EagleHead

FORMATS = ("eagle", "speculators")
SPECULATORS_VERSION = "0.3.0"  # the speculators config schema this writer follows


# ------------------------------------------------------------------------------------------------ reading

def read_weights(path: Path) -> dict[str, torch.Tensor]:
    if (path / "model.safetensors").is_file():
        return load_file(str(path / "model.safetensors"))
    if (path / "pytorch_model.bin").is_file():
        return torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise HeadError(f"eagle head {path}: missing weights (model.safetensors or pytorch_model.bin)")


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
            if layer.get("model_type", "llama") != "llama":
                raise HeadError(f"{where}: decoder layer type {layer.get('model_type')!r} is not supported (llama only)")
            for flag in ("norm_before_fc", "fc_norm", "norm_output"):
                if raw.get(flag):
                    raise HeadError(f"{where}: {flag}=true heads are not supported")
            vocab = int(layer["vocab_size"])
            ids = raw.get("eagle_aux_hidden_state_layer_ids")  # vLLM's meaning: hidden-state indices
            norm_before_residual = bool(raw.get("norm_before_residual", True))  # vLLM's default when absent
        else:
            fmt = "eagle"
            layer = raw
            if raw.get("tie_word_embeddings"):
                raise HeadError(f"{where}: tie_word_embeddings=true heads are not supported")
            vocab = int(raw["vocab_size"])
            eagle_ids = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
            ids = [i + 1 for i in eagle_ids] if eagle_ids else raw.get("eagle_aux_hidden_state_layer_ids")
            norm_before_residual = bool(raw.get("norm_before_residual", False))
        if int(layer.get("num_hidden_layers", 1)) != 1:
            raise HeadError(f"{where}: {layer['num_hidden_layers']} decoder layers; only 1-layer heads are supported")
        ids = ours.get("target_layer_ids") or ids or default_layer_ids(layers)
        config = EagleConfig(
            **layer_fields(layer), target_hidden_size=int(raw.get("target_hidden_size") or layer["hidden_size"]),
            target_vocab_size=vocab, draft_vocab_size=int(raw.get("draft_vocab_size") or vocab),
            target_num_layers=int(ours.get("target_num_layers") or layers), target_layer_ids=tuple(ids),
            norm_before_residual=norm_before_residual,
        )
    except HeadError as e:
        raise HeadError(str(e) if str(e).startswith(where) else f"{where}: {e}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise HeadError(f"{where}: config.json is not an EAGLE-3 head config ({type(e).__name__}: {e})") from None
    return config, fmt


def check_vocab_maps(weights: dict[str, torch.Tensor], config: EagleConfig, where: str) -> torch.Tensor:
    """The draft vocabulary as ascending target ids [draft_vocab], after checking d2t/t2d."""
    vd, vt = config.draft_vocab_size, config.target_vocab_size
    if "d2t" not in weights:
        if vd != vt:
            raise HeadError(f"{where}: draft vocabulary of {vd} < target vocabulary {vt} but no d2t map")
        return torch.arange(vt)
    d2t = weights["d2t"]
    if d2t.shape != (vd,):
        raise HeadError(f"{where}: d2t has shape {tuple(d2t.shape)}, expected ({vd},) (draft_vocab_size)")
    target_ids = d2t.long() + torch.arange(vd)
    if target_ids.min() < 0 or target_ids.max() >= vt:
        raise HeadError(f"{where}: d2t maps draft ids to target ids {int(target_ids.min())}..{int(target_ids.max())}, "
                        f"outside the target vocabulary 0..{vt - 1}")
    if len(set(target_ids.tolist())) != vd:
        raise HeadError(f"{where}: d2t maps two draft ids to the same target id")
    if "t2d" in weights:
        t2d = weights["t2d"]
        if t2d.shape != (vt,):
            raise HeadError(f"{where}: t2d has shape {tuple(t2d.shape)}, expected ({vt},) (target vocab_size)")
        if int(t2d.bool().sum()) != vd or not bool(t2d.bool()[target_ids].all()):
            raise HeadError(f"{where}: t2d does not mark exactly the {vd} target ids that d2t maps to")
    return target_ids


def load_head(path: str | os.PathLike, target, *, dtype: torch.dtype | None = None,
              device: torch.device | str | None = None) -> EagleHead:
    """Load a head for `target` (a transformers model, or only its config: then the head must carry its
    own embeddings). Raises HeadError with one line for anything that does not fit."""
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
    target_config = getattr(target, "config", target)
    config, fmt = parse_config(raw, target_config, where)
    config.check_target(target_config, where)
    weights = read_weights(path)
    if fmt == "speculators":
        weights = {k.replace("layers.0.", "midlayer.", 1) if k.startswith("layers.0.") else k: v for k, v in weights.items()}
    target_ids = check_vocab_maps(weights, config, where)
    head = EagleHead(config)
    expected = {k: v.shape for k, v in head.state_dict().items() if k not in ("d2t", "t2d", "embed_tokens.weight")}
    for key, shape in expected.items():
        if key not in weights:
            raise HeadError(f"{where}: missing weight {key}")
        if weights[key].shape != shape:
            raise HeadError(f"{where}: weight {key} has shape {tuple(weights[key].shape)}, expected {tuple(shape)}")
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

def atomic_write(path: Path, write) -> None:
    """Call write(tmp_path) and move the result over `path` (a reader never sees half a file)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; the result should be like any new file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
    """Write `head` to directory `path` (config.json + model.safetensors), each file atomically."""
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    c = head.config
    state = {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
    dtype = head.fc.weight.dtype
    ours = {"target_layer_ids": list(c.target_layer_ids), "target_num_layers": c.target_num_layers,
            "target": target_name, "note": "target_layer_ids index output_hidden_states (input of layer i)"}
    full_vocab = c.draft_vocab_size == c.target_vocab_size
    if format == "eagle":
        state.pop("embed_tokens.weight")  # the target's own (SpecForge's exporter drops them too)
        config = {"architectures": ["LlamaForCausalLMEagle3"], **layer_config(c, dtype),
                  "draft_vocab_size": c.draft_vocab_size, "target_hidden_size": c.target_hidden_size}
        if c.norm_before_residual:
            config["norm_before_residual"] = True
        if tuple(c.target_layer_ids) != default_layer_ids(c.target_num_layers):
            # SGLang reads these as layer outputs (+1); vLLM reads the same field as indices: see docs/eagle.md.
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in c.target_layer_ids],
                                      "use_aux_hidden_state": True}
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
            "eagle_aux_hidden_state_layer_ids": list(c.target_layer_ids),
            "norm_before_residual": c.norm_before_residual, "norm_before_fc": False, "fc_norm": False,
            "norm_output": False, "embed_requires_grad": False, "torch_dtype": str(dtype).removeprefix("torch."),
        }
    config["batchspec"] = ours
    atomic_write(path / "model.safetensors", lambda tmp: save_file(state, tmp, metadata={"format": "pt"}))
    atomic_write(path / "config.json", lambda tmp: Path(tmp).write_text(json.dumps(config, indent=2) + "\n"))
    return path

