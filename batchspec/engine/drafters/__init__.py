"""Drafters: propose up to k tokens (or a tree) per row, then learn from what the target accepted.

base.py holds the protocol every drafter speaks (admit / propose / commit), the records (DraftContext,
Draft) and DrafterPolicy; lookup.py the model-free drafters (ngram, prompt_lookup); model.py the draft
model.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ..sampling import SamplingParams
from .base import LOOKUP_POLICY, MODEL_POLICY, Draft, DraftContext, Drafter, DrafterPolicy, NoDrafter, empty_draft
from .lookup import NGramDrafter, PromptLookupDrafter
from .model import ModelDrafter

__all__ = ["Draft", "DraftContext", "Drafter", "DrafterPolicy", "LOOKUP_POLICY", "MODEL_POLICY", "NoDrafter",
           "NGramDrafter", "PromptLookupDrafter", "ModelDrafter", "empty_draft", "make_drafter"]


def make_drafter(
    name: str,
    *,
    device: torch.device,
    num_slots: int,
    capacity: int,
    max_position: int,
    target_vocab_size: int,
    sampling: SamplingParams,
    draft_model: PreTrainedModel | None = None,
    capture: str | None = None,
    trees: tuple = (),
) -> Drafter:
    if name == "none":
        return NoDrafter(device)
    if name == "ngram":
        return NGramDrafter(device)
    if name == "prompt_lookup":
        return PromptLookupDrafter(device)
    if name == "model":
        if draft_model is None:
            raise ValueError("drafter 'model' needs a draft model (model.draft / draft=)")
        return ModelDrafter(draft_model, num_slots=num_slots, capacity=capacity, max_position=max_position,
                            target_vocab_size=target_vocab_size, sampling=sampling, capture=capture, trees=trees)
    raise ValueError(f"unknown drafter {name!r}: choose none, model, ngram or prompt_lookup")
