"""What the report calls each output: its name (its path below the folder the outputs share) and its
label (what in its configuration differs from the others'), and a configuration in a line."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .data import Output


def flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if key in ("shard", "batchspec") and not prefix:
            continue  # how and with which version it ran, not what it ran
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def drafting(cfg: dict[str, Any]) -> str:
    name = cfg.get("drafter")
    if name is None:
        return "configuration unknown"
    if name == "none":
        return "none (plain decoding)"
    trees = ",".join(cfg.get("trees") or [])
    if cfg.get("adaptive"):
        return f"{name} k≤{cfg.get('k_max')}" + (f" + trees {trees}" if trees else "") + " adaptive"
    # Without adaptive a tree, when given, drafts every round (the first tree of a list).
    return f"{name} tree {trees.split(',')[0]} fixed" if trees else f"{name} k={cfg.get('k_max')} fixed"


def sampling(cfg: dict[str, Any]) -> str:
    s = cfg.get("sampling") or {}
    if not s.get("temperature"):
        return "greedy"
    defaults = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0}
    return " ".join([f"T={s['temperature']:g}"] + [f"{k}={s[k]:g}" for k, d in defaults.items()
                                                    if s.get(k, d) != d] + [f"seed={s.get('seed', 0)}"])


def describe(cfg: dict[str, Any]) -> str:
    """The configuration in a line: drafting, sampling, batch size, length cap."""
    if not cfg:
        return "configuration unknown"
    parts = [drafting(cfg), sampling(cfg)]
    if cfg.get("batch_size") is not None:
        parts.append(f"batch {cfg['batch_size']}")
    if (cfg.get("sampling") or {}).get("max_new_tokens") is not None:
        parts.append(f"≤{cfg['sampling']['max_new_tokens']} new tokens")
    return ", ".join(parts)


def label_outputs(outs: list[Output]) -> None:
    """Name each output by its path below the common folder, and label it by what in its configuration
    differs from the others (one output: its whole configuration)."""
    common = Path(os.path.commonpath([o.path.absolute() for o in outs])) if len(outs) > 1 else None
    for o in outs:
        o.name = str(o.path) if common is None or o.path.absolute() == common else str(o.path.absolute().relative_to(common))
    if len(outs) == 1:
        outs[0].label = describe(outs[0].config)
        return
    flats = [flat(o.config) for o in outs]
    keys = sorted({k for f in flats for k in f})
    differ = [k for k in keys if len({repr(f.get(k)) for f in flats}) > 1]
    if len({repr(f.get("model.draft")) for f in flats if f.get("drafter") == "model"}) <= 1:
        differ = [k for k in differ if k != "model.draft"]  # only other drafters' "no draft model" differs
    in_drafting = {"drafter", "k_max", "adaptive"}.__contains__

    def in_sampling(key: str) -> bool:  # the keys that sampling() writes
        return key.startswith("sampling.") and key not in ("sampling.max_new_tokens", "sampling.stop")

    for o, f in zip(outs, flats):
        parts = [drafting(o.config)] if any(map(in_drafting, differ)) else []
        parts += [sampling(o.config)] if any(map(in_sampling, differ)) else []
        parts += [f"{k.removeprefix('sampling.')}={f.get(k)}" for k in differ if not in_drafting(k) and not in_sampling(k)]
        o.label = ", ".join(parts) or o.name
    seen: dict[str, int] = {}
    for o in outs:
        seen[o.label] = seen.get(o.label, 0) + 1
    for o in outs:
        if seen[o.label] > 1:
            o.label = f"{o.label} ({o.name})"
