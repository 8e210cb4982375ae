"""Drafters: propose up to k tokens (or a tree) per row, then learn from what the target accepted.

registry.py names them (what each needs, how it is built); base.py holds the protocol every drafter
speaks (admit / propose / propose_tree / extend / release / learn_pending / packed_forward, and the prices it
reports), DrafterPolicy and the drafter that drafts nothing;
lookup.py the model-free drafters (ngram, prompt_lookup); suffix.py suffix decoding over the request and
the job's finished rows (its index: suffix_index.py, the job-wide part suffix_corpus.py); model.py the draft
model and eagle.py an EAGLE-3 head (head_model.py: the head as the model a runner drives), with their captured
steps in model_static.py and eagle_static.py (objects each drafter holds);
choosing.py what the model drafters share (picking tokens, laying out trees).
"""

from __future__ import annotations

import importlib

# Each name is imported from its module when first used (PEP 562): the job's config reads the registry's
# choices (registry.py), and importing this package eagerly would load every drafter, the runner, torch and
# transformers with it (3.9 s of `import batchspec.jobs.config` on 2 cores, 2026-12-02).
_MODULES = {
    "Drafter": "base", "DrafterPolicy": "base", "LOOKUP_POLICY": "base", "MODEL_POLICY": "base", "NoDrafter": "base",
    "EagleDrafter": "eagle", "NGramDrafter": "lookup", "PromptLookupDrafter": "lookup", "ModelDrafter": "model",
    "SuffixDrafter": "suffix", "DRAFTERS": "registry", "REGISTRY": "registry", "DrafterSpec": "registry",
    "drafter_spec": "registry", "load_paths": "registry", "make_drafter": "registry", "needs_draft": "registry",
}
__all__ = list(_MODULES)


def __getattr__(name: str):
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_MODULES[name]}", __name__), name)
