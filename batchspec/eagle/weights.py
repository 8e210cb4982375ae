"""An EAGLE-3 head's weight files: one safetensors or .bin file, or shards named by an index, read into
one dict with where each weight came from; the d2t / t2d vocabulary maps checked; a stray weight named
by what it is."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from .config import EagleConfig, HeadError


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def read_one(file: Path, where: str) -> dict[str, torch.Tensor]:
    try:
        if file.name.endswith(".safetensors"):
            return load_file(str(file))
        weights = torch.load(file, map_location="cpu", weights_only=True)
    except (SafetensorError, OSError, RuntimeError, EOFError, pickle.UnpicklingError, ValueError) as e:
        raise HeadError(f"{where}: cannot read {file.name} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise HeadError(f"{where}: {file.name} is not a state dict of tensors")
    return weights


def read_weights(path: Path, where: str | None = None) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(weights, the file each came from) from model.safetensors, pytorch_model.bin, or the shards an
    `*.index.json` lists (in that order of preference)."""
    where = where or f"eagle head {path}"
    for name in WEIGHT_FILES:
        file = path / name
        if not file.is_file():
            continue
        if not name.endswith(".index.json"):
            weights = read_one(file, where)
            return weights, dict.fromkeys(weights, name)
        try:
            weight_map = json.loads(file.read_text())["weight_map"]
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise TypeError("weight_map is not a {name: shard file} object")
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise HeadError(f"{where}: {name} is not a weight index ({type(e).__name__}: {e})") from None
        weights, sources = {}, {}
        for shard in sorted(set(weight_map.values())):
            if Path(shard).name != shard or not (path / shard).is_file():
                raise HeadError(f"{where}: {name} lists shard {shard!r}, which is not a file in the folder")
            for key, value in read_one(path / shard, where).items():
                if key in weights:
                    raise HeadError(f"{where}: weight {key} is in both {sources[key]} and {shard}")
                weights[key], sources[key] = value, shard
        for key, shard in weight_map.items():
            if sources.get(key) != shard:
                raise HeadError(f"{where}: {name} puts weight {key} in {shard}, but {shard} does not hold it")
        return weights, sources
    raise HeadError(f"{where}: missing weights ({', '.join(WEIGHT_FILES)})")


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


def what_weight(key: str) -> str:
    """A hint for a weight batchspec has no place for."""
    if key.startswith("fc_norm."):
        return "EAGLE-3.1's fc_norm"
    if key.startswith("input_norm."):
        return "speculators' norm_before_fc"
    if key.endswith(".bias"):
        return "a bias"
    if key.startswith(("layers.", "midlayer")) or ".layers." in key:
        return "a decoder layer batchspec does not have"
    return "not part of a batchspec head"
