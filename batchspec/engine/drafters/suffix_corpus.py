"""Suffix decoding's job-wide structure (SuffixIndex holds one, suffix_index.py): the completions of
finished requests, in segments, and each request's match in each segment kept up to date.

It holds at most `corpus_max_tokens` tokens in `corpus_segments` automata of
`corpus_max_tokens // corpus_segments` tokens each: completions go into the newest; when it is full a
new one starts, and when there are more than `corpus_segments` the oldest is dropped whole. So the
oldest completions are evicted first, a segment at a time, and once full it keeps between
(segments - 1) / segments of the bound (less one completion) and all of it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from .suffix_automaton import ROOT, SuffixAutomaton

RECENT = 16  # strings per segment whose n-grams are kept to spare requests a full re-match


@dataclass(slots=True)
class Segment:
    """One automaton of the job-wide structure, and the short n-grams of the strings added last."""

    serial: int  # segments are numbered in creation order; requests key their matches by it
    automaton: SuffixAutomaton
    tokens: int = 0
    # The 1-, 2- and 3-grams of each of the last RECENT strings added (oldest first): a request whose
    # match predates them redoes it only if its tail could match further in one of them.
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT))


@dataclass(slots=True)
class CorpusMatch:
    """A request's longest recent suffix in one job-wide segment, as of that segment's `version`."""

    state: int
    length: int
    version: int


@dataclass(slots=True)
class Request:
    """One request's state in SuffixIndex: its tokens, its own automaton, and its match in each segment."""

    tokens: list[int]  # prompt + output so far
    prompt_len: int
    automaton: SuffixAutomaton
    state: int = ROOT  # the state of the last min(len, max_match) tokens in its own automaton
    matched: int = 0
    corpus: dict[int, CorpusMatch] = field(default_factory=dict)  # segment serial -> match


class JobCorpus:
    """At most max_tokens tokens of finished completions in `num_segments` automata (oldest first), each
    keeping patterns of up to `window` tokens, and the requests' matches of up to max_match tokens in them."""

    def __init__(self, max_tokens: int, num_segments: int, window: int, max_match: int):
        self.num_segments, self.window, self.max_match = num_segments, window, max_match
        self.segment_tokens = max_tokens // num_segments  # one segment's bound
        self.segments: list[Segment] = []  # oldest first
        self._next_serial = 0

    @property
    def tokens(self) -> int:
        """Tokens held (at most max_tokens)."""
        return sum(s.tokens for s in self.segments)

    @property
    def states(self) -> int:
        return sum(s.automaton.num_states for s in self.segments)

    def add(self, tokens: Sequence[int]) -> None:
        """A finished string, into the newest segment (a new one when it is full, the oldest then dropped)."""
        if self.segment_tokens == 0 or not tokens:
            return
        tokens = [int(t) for t in tokens[: self.segment_tokens]]  # longer than a segment: its beginning
        if not self.segments or self.segments[-1].tokens + len(tokens) > self.segment_tokens:
            self.segments.append(Segment(self._next_serial, SuffixAutomaton(self.window)))
            self._next_serial += 1
            if len(self.segments) > self.num_segments:
                self.segments.pop(0)  # evict the oldest completions
        segment = self.segments[-1]
        segment.automaton.add_string(tokens)
        segment.tokens += len(tokens)
        segment.recent.append({tuple(tokens[i:i + n]) for n in (1, 2, 3) for i in range(len(tokens) - n + 1)})

    def match(self, request: Request, segment: Segment) -> CorpusMatch:
        """The request's longest recent suffix in `segment`, brought up to date if the segment grew.

        Strings added since the match can only make it longer, and only by an occurrence inside one of
        them of the request's last m + 1 tokens (m: the old match), hence of its last min(m + 1, 3): when
        none of the new strings holds that n-gram the old match stands (its state possibly split:
        `normalize`); otherwise it is redone from the request's last max_match tokens."""
        automaton = segment.automaton
        match = request.corpus.get(segment.serial)
        version = automaton.num_strings
        if match is not None and match.version == version:
            return match
        tokens = request.tokens
        if match is not None and version - match.version <= len(segment.recent):
            n = min(match.length + 1, 3)
            tail = tuple(tokens[len(tokens) - n:])
            if n > len(tokens) or not any(tail in grams for grams in list(segment.recent)[match.version - version:]):
                match.state = automaton.normalize(match.state, match.length)
                match.version = version
                return match
        state, length = automaton.match(tokens, self.max_match)
        match = request.corpus[segment.serial] = CorpusMatch(state, length, version)
        return match
