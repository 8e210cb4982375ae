"""Suffix decoding as a drafter: what followed the request's current suffix in its own prompt + output and
in every completion the job has finished (suffix_index.py), as chains or trees."""

from __future__ import annotations

from dataclasses import replace

from itertools import count
from typing import Iterable, Sequence

from ..types import TreeSpec
from ..round import Choice, Draft, Plan
from .base import SUFFIX_POLICY, HostDrafter, host_draft, host_tree_nodes
from .suffix_index import SuffixIndex


class SuffixDrafter(HostDrafter):
    """Proposes first and is bursty, like the other lookups: a match runs on or fails as a whole. Each
    proposal's first-token probability (how often that token followed the matched suffix, with a
    pseudo-count so that a continuation seen once is not certain) is the row's acceptance prior for
    adaptive speculation (Draft.priors).

    corpus: earlier completions (token lists) that seed the job-wide structure, oldest first;
    corpus_max_tokens: the job-wide structure's bound (the oldest completions are evicted first)."""

    policy = SUFFIX_POLICY

    def __init__(self, *, corpus: Iterable[Sequence[int]] = (), corpus_max_tokens: int = 200_000):
        if corpus_max_tokens < 0:
            raise ValueError(f"suffix corpus_max_tokens={corpus_max_tokens}: need >= 0")
        self.index = SuffixIndex(corpus_max_tokens=corpus_max_tokens, prior_count=1.0)
        self.index.add_corpus(corpus)
        self.keys: dict[int, int] = {}  # slot -> the key of the request in it (slots are reused)
        self._next = count()

    def admit(self, slots, prompts, features=None):
        for slot, prompt in zip(slots, prompts):
            self.keys[slot] = next(self._next)
            self.index.start(self.keys[slot], prompt)

    def extend(self, slots, emitted, num_accepted, path=None):
        for slot, tokens in zip(slots, emitted):
            self.index.extend(self.keys[slot], tokens)

    def release(self, slots):
        """Finished rows' completions join the job-wide structure."""
        for slot in slots:
            key = self.keys.pop(slot, None)
            if key is not None:
                self.index.finish(key)

    def propose(self, plan: Plan, choice: Choice) -> Draft:
        drafts, priors = [], []
        for slot, k in zip(plan.rows, choice.budgets):
            tokens, probs = self.index.propose(self.keys[slot], k) if k > 0 else ([], [])
            drafts.append(tokens)
            priors.append(probs[0] if tokens else None)
        return replace(host_draft(plan.buffers, drafts), priors=priors)

    def propose_tree(self, plan: Plan, choice: Choice, spec: TreeSpec) -> Draft:
        """Its own frequency-ranked tree within the shape's node budget and depth (a node may have more
        children than the shape's branching; rejection sampling tries the first `branching` of them, in
        rank order)."""
        rows = []
        for slot, k in zip(plan.rows, choice.budgets):
            depth = min(k, spec.depth)
            if depth > 0:
                tokens, parents, _ = self.index.propose_tree(self.keys[slot], spec.nodes, depth)
            else:
                tokens, parents = [], []
            rows.append((tokens, parents))
        return host_tree_nodes(plan.buffers, rows, spec)
