"""Drafters: propose up to k tokens (or a tree) per row, then learn from what the target accepted.

registry.py names them (what each needs, how it is built); base.py holds the protocol every drafter
speaks (admit / propose / extend / release), DrafterPolicy and the drafter that drafts nothing;
lookup.py the model-free drafters (ngram, prompt_lookup); suffix.py suffix decoding over the request and
the job's finished rows (its index: suffix_index.py, the job-wide part suffix_corpus.py); model.py the draft
model and eagle.py an EAGLE-3 head (head_model.py: the head as the model a runner drives), with their captured
steps in model_static.py and eagle_static.py (objects each drafter holds);
choosing.py what the model drafters share (picking tokens, laying out trees).
"""

from __future__ import annotations

from .base import LOOKUP_POLICY, MODEL_POLICY, Drafter, DrafterPolicy, NoDrafter
from .eagle import EagleDrafter
from .lookup import NGramDrafter, PromptLookupDrafter
from .model import ModelDrafter
from .registry import DRAFTERS, REGISTRY, DrafterSpec, drafter_spec, load_paths, make_drafter, needs_draft
from .suffix import SuffixDrafter

__all__ = ["Drafter", "DrafterPolicy", "LOOKUP_POLICY", "MODEL_POLICY", "NoDrafter", "NGramDrafter",
           "PromptLookupDrafter", "ModelDrafter", "SuffixDrafter", "EagleDrafter", "make_drafter", "DRAFTERS",
           "REGISTRY", "DrafterSpec", "drafter_spec", "load_paths", "needs_draft"]
