"""Which target layers an EAGLE-3 head reads, as other engines need them (distinct, ascending, >= 1) and
as config files write them."""

from __future__ import annotations

from typing import Any

from .config import HeadError, default_layer_ids


def engine_layer_problem(ids, num_layers: int) -> str | None:
    """Why vLLM and SGLang could not feed a head these hidden-state indices (None when they can). Both
    capture each listed layer once, in layer order (`if idx in layers`), so ids must be distinct and
    ascending; vLLM's index 0 has no residual yet and SGLang reads `eagle_config` ids as index - 1, so
    they must be >= 1."""
    ids = [int(i) for i in ids]
    if len(set(ids)) != len(ids) or ids != sorted(ids) or min(ids) < 1:
        return (f"target layer ids {tuple(ids)} are not distinct, ascending and >= 1, as vLLM and SGLang "
                "need (each captures a layer once, in layer order, from index 1)")
    if max(ids) > num_layers - 1:
        return f"target layer ids {tuple(ids)} go past the {num_layers}-layer target's last layer input ({num_layers - 1})"
    return None


def engine_layer_ids(num_layers: int) -> tuple[int, int, int] | None:
    """Ids near the default (2, L//2, L-3) that other engines can use, or None for a target of fewer than 4
    layers (no three distinct indices in 1..L-1)."""
    return default_layer_ids(num_layers) if num_layers >= 4 else None


def check_layer_ids_for_saving(ids, num_layers: int, where: str) -> None:
    """Refuse ids other engines cannot use for a target of at least 4 layers (a shallower one is saved; its
    train_draft summary says that other engines cannot load it)."""
    problem = engine_layer_problem(ids, num_layers)
    if problem and num_layers >= 4:
        raise HeadError(f"{where}: {problem}; choose e.g. {engine_layer_ids(num_layers)}")


def file_layer_ids(raw: dict[str, Any], where: str) -> tuple[int, ...] | None:
    """Hidden-state indices from the top-level `eagle_aux_hidden_state_layer_ids` (vLLM's and speculators'
    meaning) or `eagle_config.eagle_aux_hidden_state_layer_ids` + 1 (SGLang's and SpecForge's layer
    outputs); both present must agree."""
    top = raw.get("eagle_aux_hidden_state_layer_ids")
    nested = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    top = tuple(int(i) for i in top) if top else None
    nested = tuple(int(i) + 1 for i in nested) if nested else None
    if top and nested and top != nested:
        raise HeadError(f"{where}: config.json's eagle_aux_hidden_state_layer_ids {list(top)} and "
                        f"eagle_config.eagle_aux_hidden_state_layer_ids {[i - 1 for i in nested]} (layer outputs, "
                        f"i.e. indices {list(nested)}) name different target layers")
    return top or nested
