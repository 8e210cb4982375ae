"""The drafters by name: what each needs loaded and how it is built. The one list the Python API, jobs (the
Hydra schema's choices), run-batch, bench and calibrate read.

    spec = drafter_spec("eagle")          # DrafterSpec(name="eagle", needs=HEAD, ...)
    draft_model, head = load_paths("eagle", "path/to/head")   # what load_models loads for it
    drafter = make_drafter("ngram", graphs=..., ...)

Each factory imports its drafter class when called, so the job schema can take its choices from here
without importing every drafter's code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

NOTHING, DRAFT_MODEL, HEAD = "nothing", "a draft model", "an EAGLE-3 head"

# Deferred imports: each builder imports its drafter's module when it is called (the registry is read by the
# job's checks before torch is loaded, and a job loads only the drafter it names).


def _none(**_):
    from .base import NoDrafter
    return NoDrafter()


def _ngram(**_):
    from .lookup import NGramDrafter
    return NGramDrafter()


def _prompt_lookup(**_):
    from .lookup import PromptLookupDrafter
    return PromptLookupDrafter()


def _suffix(*, corpus=(), corpus_max_tokens=200_000, **_):
    from .suffix import SuffixDrafter
    return SuffixDrafter(corpus=corpus, corpus_max_tokens=corpus_max_tokens)


def _model(*, draft_model, graphs, num_slots, capacity, max_position, target_vocab_size, sampling, trees=(),
           buckets=None, **_):
    from .model import ModelDrafter
    return ModelDrafter(draft_model, num_slots=num_slots, capacity=capacity, max_position=max_position,
                        target_vocab_size=target_vocab_size, sampling=sampling, graphs=graphs, trees=trees,
                        buckets=buckets)


def _eagle(*, head, graphs, num_slots, capacity, max_position, target_vocab_size, sampling, trees=(), buckets=None,
           k_max=4, **_):
    from .eagle import EagleDrafter
    return EagleDrafter(head, num_slots=num_slots, capacity=capacity, max_position=max_position,
                        target_vocab_size=target_vocab_size, sampling=sampling, graphs=graphs, k_max=k_max,
                        trees=trees, buckets=buckets)


@dataclass(frozen=True, slots=True)
class DrafterSpec:
    name: str
    needs: str  # NOTHING, DRAFT_MODEL (model.draft / draft=: a model) or HEAD (an EAGLE-3 head's folder)
    make: Callable
    about: str  # one line for help texts and the docs' table


SPECS = (
    DrafterSpec("none", NOTHING, _none, "plain decoding: one token per target forward"),
    DrafterSpec("model", DRAFT_MODEL, _model, "a smaller model of the target's vocabulary drafts k tokens"),
    DrafterSpec("ngram", NOTHING, _ngram, "the request's own text: the continuation of its last n-gram"),
    DrafterSpec("prompt_lookup", NOTHING, _prompt_lookup, "the prompt's text only (transformers' prompt lookup)"),
    DrafterSpec("suffix", NOTHING, _suffix, "suffix decoding over the request and the job's finished rows"),
    DrafterSpec("eagle", HEAD, _eagle, "an EAGLE-3 head over the target's hidden states"),
)
REGISTRY = {spec.name: spec for spec in SPECS}
DRAFTERS = tuple(REGISTRY)


def drafter_spec(name: str) -> DrafterSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown drafter {name!r}: choose {', '.join(DRAFTERS)}") from None


def needs_draft(name: str) -> bool:
    """Whether the drafter needs a path (or model) beside the target: a draft model or an EAGLE-3 head."""
    return drafter_spec(name).needs != NOTHING


def load_paths(name: str, draft, head=None):
    """(draft model, EAGLE head) for load_models: `draft` goes where drafter `name` reads it (`head`, where a
    command has a flag of its own for the head, instead of `draft` for drafter "eagle")."""
    needs = drafter_spec(name).needs
    return (draft if needs == DRAFT_MODEL else None), ((draft if head is None else head) if needs == HEAD else None)


def make_drafter(name: str, **kwargs):
    """The drafter `name`, from the keywords its factory takes (graphs, num_slots, capacity, max_position,
    target_vocab_size, sampling, trees, buckets, k_max; draft_model for "model", head for "eagle", corpus and
    corpus_max_tokens for "suffix"); the others are ignored."""
    spec = drafter_spec(name)
    if spec.needs == DRAFT_MODEL and kwargs.get("draft_model") is None:
        raise ValueError(f"drafter {name!r} needs {spec.needs} (model.draft / draft=)")
    if spec.needs == HEAD and kwargs.get("head") is None:
        raise ValueError(f"drafter {name!r} needs {spec.needs} (model.draft / draft=: its folder)")
    return spec.make(**kwargs)
