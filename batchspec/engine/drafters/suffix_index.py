"""Suffix decoding's index: what followed the current suffix, in this request and in the job so far.

Suffix decoding (SuffixDecoding, NeurIPS 2025; Snowflake's ArcticInference; vLLM's `suffix` method)
drafts without a model. It keeps a suffix structure over each running request's prompt + output and a
job-wide one over the completions of finished requests, finds the longest recent suffix of the request
that occurred before, and proposes what most often followed it: a chain, or a tree of the likeliest
continuations, each token with its empirical probability. The longer the match, the more it may
propose (`spec_factor * match_length + spec_offset`, as ArcticInference's max_spec_factor/offset), and
tokens whose probability falls under `min_token_prob` are not proposed. The per-request and the
job-wide structures are scored separately and the better draft wins, as in ArcticInference.

This module is standalone (no torch, nothing else from the engine); a Drafter wraps it.

Structure. ArcticInference keeps depth-bounded suffix trees that update O(depth) nodes per token. Here
each structure is a suffix automaton (Blumer et al. 1985; the online "generalized" construction for
several strings) whose states carry occurrence counts: appending a token costs O(1) amortized plus a
walk over the distinct-frequency classes of the suffixes of at most `max_match + max_spec` tokens (the
only ones ever read), which is a handful in ordinary text and at most that bound in degenerate text.
A state is a set of substrings that occur at exactly the same end positions, so it has one
continuation distribution; a state's transition on token c leads to the state of "that substring + c",
whose count is how often c followed it.

Probabilities. P(c | s) = count(s + c) / (occurrences of s followed by some token + prior_count, a
pseudo-count for continuations not seen yet, 0 by default). Occurrences at the end of a string (the
request's current end, or the end of a completion) are left out of the denominator: they had no
continuation, which says nothing about which token comes next (ArcticInference counts them in, and so
discounts every proposal after a suffix that also ends a string). A chain node's and a tree node's
probability is the product along its path: the empirical probability of the whole continuation up to
that node given the matched suffix.

Determinism. Proposals depend only on the sequence of calls (start/extend/finish/add_corpus) that
built the index. Ties are broken by fixed rules: siblings rank by count, then by the most recent
occurrence (as the ngram drafter); a tree adds nodes by decreasing probability, then shallower first,
then in the order they became candidates (parents in the order they were added, siblings by rank);
the draft with the higher score (sum of probabilities) wins; ties (scores within 1e-9) go to the
per-request structure, then to newer job-wide segments, and within one structure to the longer match.
Probabilities are floats, each the product of the per-step ratios along its path in path order.

Memory. The per-request structure holds its request's tokens (O(tokens) states) until `finish`; the
job-wide structure at most `corpus_max_tokens` tokens, in segments evicted oldest first (suffix_corpus.py).
A suffix automaton has at most two states per token; in CPython that is about 0.5 KB per token kept
(measured: 73 MB for 154k tokens of standard-library code).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Iterable, Iterator, Sequence

from .suffix_automaton import ROOT, SuffixAutomaton, chain_draft, suffix_chain, tree_draft
from .suffix_corpus import JobCorpus, Request

# Scores closer than this are a tie (float sums of the same probabilities in another order differ in
# the last bits); with candidates pruned once their bound is <= the best score, nothing pruned could win.
_SCORE_TIE = 1e-9


@dataclass(slots=True)
class SuffixDraft:
    """A proposal: tokens with their parents (-1: a child of the root, i.e. follows the request's last
    token; parents precede children; a chain is 0, 1, 2, ... - 1) and each node's probability given the
    matched suffix (the product of the empirical probabilities along its path).

    match_len: the length of the suffix it continues (0: no proposal); source: "request" or "corpus".
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    match_len: int = 0
    source: str = ""

    @property
    def score(self) -> float:
        """The sum of the nodes' probabilities: the expected number of accepted tokens if they are right."""
        return sum(self.probs)


class SuffixIndex:
    """Suffix decoding's proposals for many concurrent requests (keys) in one job.

    Per request: `start(key, prompt_ids)`, then `extend(key, tokens)` with every emitted token,
    `propose(key, max_tokens)` / `propose_tree(key, max_nodes, max_depth)` between them, and
    `finish(key)` at the end, which adds the request's completion to the job-wide structure.
    `add_corpus(token_lists)` seeds the job-wide structure with earlier outputs.

    max_match: the longest suffix matched (tokens); max_spec: the deepest proposal. Statistics are kept
        for patterns of up to max_match + max_spec tokens (cf. ArcticInference's max depth, 64).
    spec_factor, spec_offset: a match of m tokens may propose floor(spec_factor * m + spec_offset) tokens
        at most (ArcticInference's max_spec_factor / max_spec_offset).
    min_token_prob: nodes with a lower probability are not proposed (ArcticInference's min_token_prob).
    corpus_max_tokens: the job-wide structure's bound in tokens (0: no job-wide structure);
        corpus_segments: how many automata it is split into (the granularity of eviction).
    prompt_context: how many of a request's last prompt tokens are stored before its completion in the
        job-wide structure, so that "end of prompt -> start of answer" is learned too (0: the completion
        only, as ArcticInference).
    prior_count: a pseudo-count added to every denominator, P(c | s) = count(s + c) / (followed(s) +
        prior_count): the share left to continuations not seen yet. 0 is the plain empirical frequency
        (ArcticInference's); with 0 a continuation seen once has probability 1, which on the demo target
        is accepted about 60% of the time, while 1 brings probabilities close to acceptance rates
        (tools/suffix_sim.py prints both calibrations) at the price of shorter drafts.
    """

    def __init__(self, *, max_match: int = 32, max_spec: int = 32, spec_factor: float = 1.0,
                 spec_offset: float = 0.0, min_token_prob: float = 0.1, corpus_max_tokens: int = 200_000,
                 corpus_segments: int = 4, prompt_context: int = 0, prior_count: float = 0.0):
        if max_match < 1 or max_spec < 1:
            raise ValueError(f"max_match and max_spec must be >= 1, got {max_match}, {max_spec}")
        if corpus_max_tokens < 0 or corpus_segments < 1:
            raise ValueError(f"corpus_max_tokens must be >= 0 and corpus_segments >= 1, got "
                             f"{corpus_max_tokens}, {corpus_segments}")
        if not 0.0 <= min_token_prob <= 1.0:
            raise ValueError(f"min_token_prob must be in [0, 1], got {min_token_prob}")
        if prompt_context < 0 or prior_count < 0:
            raise ValueError(f"prompt_context and prior_count must be >= 0, got {prompt_context}, {prior_count}")
        self.max_match, self.max_spec = max_match, max_spec
        self.spec_factor, self.spec_offset = spec_factor, spec_offset
        self.min_token_prob = min_token_prob
        self.prompt_context, self.prior_count = prompt_context, prior_count
        self.window = max_match + max_spec
        self._requests: dict[Hashable, Request] = {}
        self.corpus = JobCorpus(corpus_max_tokens, corpus_segments, self.window, max_match)  # finished completions

    @property
    def corpus_tokens(self) -> int:
        """Tokens held by the job-wide structure (at most corpus_max_tokens)."""
        return self.corpus.tokens

    @property
    def corpus_states(self) -> int:
        return self.corpus.states

    # ---- requests ---------------------------------------------------------------------------------

    @property
    def active(self) -> list[Hashable]:
        return list(self._requests)

    def start(self, key: Hashable, prompt_ids: Sequence[int]) -> None:
        """A new request: index its prompt."""
        if key in self._requests:
            raise ValueError(f"request {key!r} is already active")
        request = Request(tokens=[], prompt_len=len(prompt_ids), automaton=SuffixAutomaton(self.window))
        request.automaton.begin()
        self._requests[key] = request
        self._append(request, prompt_ids)

    def extend(self, key: Hashable, tokens: Sequence[int]) -> None:
        """Tokens the request emitted (accepted drafts and the target's own token), in order."""
        self._append(self._request(key), tokens)

    def finish(self, key: Hashable, learn: bool = True) -> None:
        """The request is done: drop its structure and (learn=True) add its completion to the job-wide
        one, after its last `prompt_context` prompt tokens. learn=False for rows that should not teach
        (an error, a cancelled row)."""
        request = self._request(key)
        del self._requests[key]
        if learn:
            start = max(0, request.prompt_len - self.prompt_context)
            if len(request.tokens) > request.prompt_len:
                self.corpus.add(request.tokens[start:])

    def add_corpus(self, token_lists: Iterable[Sequence[int]]) -> None:
        """Seed the job-wide structure with earlier outputs (oldest first), as if they had finished."""
        for tokens in token_lists:
            self.corpus.add(tokens)

    def _request(self, key: Hashable) -> Request:
        try:
            return self._requests[key]
        except KeyError:
            raise KeyError(f"request {key!r} is not active (start it first)") from None

    def _append(self, request: Request, tokens: Sequence[int]) -> None:
        automaton, cap = request.automaton, self.max_match
        # The request's corpus matches move along with it (O(1) amortized per token), each first brought
        # up to date with its segment if that grew since (a match must describe the tokens so far before
        # it can advance). Segments it has no match in yet are matched when it next proposes.
        moving = [(self.corpus.match(request, segment), segment.automaton.advance)
                  for segment in self.corpus.segments if segment.serial in request.corpus]
        for token in tokens:
            token = int(token)
            request.tokens.append(token)
            automaton.append(token)
            request.state, request.matched = automaton.advance(request.state, request.matched, token, cap)
            for match, advance in moving:
                match.state, match.length = advance(match.state, match.length, token, cap)

    # ---- proposals --------------------------------------------------------------------------------

    def propose(self, key: Hashable, max_tokens: int) -> tuple[list[int], list[float]]:
        """A chain of up to `max_tokens` tokens and their probabilities (see `draft`)."""
        draft = self.draft(key, max_tokens)
        return draft.tokens, draft.probs

    def propose_tree(self, key: Hashable, max_nodes: int, max_depth: int) -> tuple[list[int], list[int], list[float]]:
        """A tree of up to `max_nodes` nodes and `max_depth` levels: tokens, parents (-1: a child of the
        root; parents precede children) and probabilities (see `draft`)."""
        draft = self.draft(key, max_depth, max_nodes=max_nodes)
        return draft.tokens, draft.parents, draft.probs

    def draft(self, key: Hashable, max_depth: int, max_nodes: int | None = None) -> SuffixDraft:
        """The best proposal for the request's current end: a chain (max_nodes None) of up to max_depth
        tokens, or a tree of up to max_nodes nodes and max_depth levels.

        Every suffix of the request's last max_match tokens that occurred before is a candidate, in the
        request's own tokens and in each job-wide segment: a match of m tokens may go
        min(max_depth, max_spec, floor(spec_factor * m + spec_offset)) tokens deep, following the most
        frequent continuation (a chain) or the likeliest nodes best-first (a tree), while a node's
        probability stays >= min_token_prob. The draft with the highest score wins; ties go to the
        request's own tokens, then to newer segments, and within one structure to the longer match."""
        request = self._request(key)
        if max_depth <= 0 or (max_nodes is not None and max_nodes <= 0):
            return SuffixDraft()
        if len(request.corpus) > len(self.corpus.segments):  # forget matches in evicted segments
            live = {s.serial for s in self.corpus.segments}
            request.corpus = {k: v for k, v in request.corpus.items() if k in live}
        best_score, best = 0.0, SuffixDraft()
        # A match of m tokens may go floor(spec_factor * m + spec_offset) deep (the epsilon keeps 1.0 * m
        # from rounding down), and never deeper than asked or than max_spec.
        limit, factor, offset = min(max_depth, self.max_spec), self.spec_factor, self.spec_offset + 1e-9
        for source, automaton, candidates in self._sources(request):
            for state, matched in candidates:
                depth = min(limit, int(factor * matched + offset))
                if depth <= 0:
                    break  # shorter matches may go no deeper
                if min(depth, max_nodes or depth) <= best_score:
                    break  # a score is at most one per level and one per node: none of these can win
                if max_nodes is None:
                    tokens, probs = chain_draft(automaton, state, depth, self.min_token_prob, self.prior_count)
                    parents = list(range(-1, len(tokens) - 1))
                else:
                    tokens, parents, probs = tree_draft(automaton, state, depth, max_nodes, self.min_token_prob, self.prior_count)
                score = sum(probs)
                if score > best_score + _SCORE_TIE:
                    best_score = score
                    best = SuffixDraft(tokens, parents, probs, matched, source)
        return best

    def _sources(self, request: Request) -> Iterator[tuple[str, SuffixAutomaton, Iterator[tuple[int, int]]]]:
        """The structures in tie-break order, each with its candidate matches: the request's own tokens,
        then the job-wide segments, newest first (matched lazily)."""
        yield "request", request.automaton, self._own_candidates(request)
        for segment in reversed(self.corpus.segments):
            match = self.corpus.match(request, segment)
            yield "corpus", segment.automaton, suffix_chain(segment.automaton, match.state, match.length)

    def _own_candidates(self, request: Request) -> Iterator[tuple[int, int]]:
        """Suffixes of the request's own tokens that occurred earlier in them, longest first: the current
        end is one occurrence of every suffix, so skip the states seen only there (count 1)."""
        automaton = request.automaton
        state, matched = request.state, request.matched
        link, length, count = automaton.link, automaton.length, automaton.count
        state = automaton.normalize(state, matched)
        while state != ROOT and count[state] < 2:
            state = link[state]
            matched = length[state]
        return suffix_chain(automaton, state, matched)
