"""Drafters: propose up to k tokens (or a tree) per row, then learn from what the target accepted.

base.py holds the protocol every drafter speaks (admit / propose / extend / release), DrafterPolicy and
the drafter that drafts nothing; lookup.py the model-free drafters (ngram, prompt_lookup); suffix.py
suffix decoding over the request and the job's finished rows (its index: suffix_index.py); model.py the
draft model.
"""

from __future__ import annotations

from transformers import PreTrainedModel

from ..graphs import StepGraphs
from ..sampling import SamplingParams
from .base import LOOKUP_POLICY, MODEL_POLICY, Drafter, DrafterPolicy, NoDrafter
from .eagle import EagleDrafter
from .lookup import NGramDrafter, PromptLookupDrafter
from .model import ModelDrafter
from .suffix import SuffixDrafter

__all__ = ["Drafter", "DrafterPolicy", "LOOKUP_POLICY", "MODEL_POLICY", "NoDrafter", "NGramDrafter",
           "PromptLookupDrafter", "ModelDrafter", "SuffixDrafter", "EagleDrafter", "make_drafter",
           "DRAFTERS"]

DRAFTERS = ("none", "model", "ngram", "prompt_lookup", "suffix", "eagle")


def make_drafter(name: str, *, graphs: StepGraphs, num_slots: int, capacity: int, max_position: int,
                 target_vocab_size: int, sampling: SamplingParams, draft_model: PreTrainedModel | None = None,
                 trees: tuple = (), buckets: list[int] | None = None, corpus: list[list[int]] = (),
                 corpus_max_tokens: int = 200_000, head=None, k_max: int = 4) -> Drafter:
    """draft_model: drafter "model"'s; head: drafter "eagle"'s EagleHead (batchspec/eagle); corpus,
    corpus_max_tokens: drafter "suffix"'s warm start and job-wide bound (suffix.py)."""
    if name == "none":
        return NoDrafter()
    if name == "ngram":
        return NGramDrafter()
    if name == "prompt_lookup":
        return PromptLookupDrafter()
    if name == "eagle":
        if head is None:
            raise ValueError("drafter 'eagle' needs an EAGLE-3 head (model.draft / draft=: its folder)")
        return EagleDrafter(head, num_slots=num_slots, capacity=capacity, max_position=max_position,
                            target_vocab_size=target_vocab_size, sampling=sampling, graphs=graphs, k_max=k_max,
                            trees=trees, buckets=buckets)
    if name == "suffix":
        return SuffixDrafter(corpus=corpus, corpus_max_tokens=corpus_max_tokens)
    if name == "model":
        if draft_model is None:
            raise ValueError("drafter 'model' needs a draft model (model.draft / draft=)")
        return ModelDrafter(draft_model, num_slots=num_slots, capacity=capacity, max_position=max_position,
                            target_vocab_size=target_vocab_size, sampling=sampling, graphs=graphs, trees=trees,
                            buckets=buckets)
    raise ValueError(f"unknown drafter {name!r}: choose {', '.join(DRAFTERS)}")
