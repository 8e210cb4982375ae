"""A suffix automaton with occurrence counts: the structure behind suffix_index.py (its docstring says why
an automaton and what the counts mean). Standalone: no torch, nothing else from the engine."""

from __future__ import annotations

import heapq
from typing import Iterable, Iterator, Sequence

ROOT = 0  # the state of the empty string
_RANK_CACHE_MIN = 8  # cache the ranked children of states with at least this many (re-sorting them is the cost)


class SuffixAutomaton:
    """An online suffix automaton over several token strings, with occurrence counts.

    Strings are added with `begin()`, `append(token)` per token, and `close()` (at most one is open).
    `window` bounds the substrings whose statistics are kept exact: counts are updated only for states
    holding a suffix of at most `window` tokens of the open string, so a reader must only visit
    states reached from a suffix of at most `window` tokens by at most `window` tokens in total.

    Per state s (parallel lists): length[s] the longest substring in s; link[s] its suffix link (the
    state of the longest suffix of s's strings that occurs at more end positions); next[s] its
    transitions {token: state}; count[s] the number of end positions (occurrences); ends[s] how many of
    them end a closed string; last_end[s] the serial number of the most recent one (tokens are numbered
    in the order they were appended, across strings).
    """

    def __init__(self, window: int):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self.length: list[int] = [0]
        self.link: list[int] = [-1]
        self.next: list[dict[int, int]] = [{}]
        self.count: list[int] = [0]
        self.ends: list[int] = [0]
        self.last_end: list[int] = [-1]
        self.num_tokens = 0  # tokens appended, over all strings (the next token's serial number)
        self.num_strings = 0  # strings begun: a version that changes whenever the automaton grows by a string
        self._last = ROOT  # the state of the whole open string
        self._win, self._win_len = ROOT, 0  # the state of the open string's last min(len, window) tokens
        self._open_len = -1  # tokens in the open string; -1 when none is open
        self._ranked: dict[int, tuple[int, list[tuple[int, int]]]] = {}  # state -> (denominator, ranking)

    @property
    def num_states(self) -> int:
        return len(self.length)

    # ---- building ---------------------------------------------------------------------------------

    def begin(self) -> None:
        """Open a new string (closing the open one, if any)."""
        if self._open_len >= 0:
            self.close()
        self._last, self._win, self._win_len, self._open_len = ROOT, ROOT, 0, 0
        self.num_strings += 1

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        """Append one token to the open string."""
        if self._open_len < 0:
            raise RuntimeError("append() needs an open string: call begin() first")
        nxt, length, link = self.next, self.length, self.link
        last = self._last
        q = nxt[last].get(token)
        if q is not None:
            # The string so far + token already occurs (in an earlier string): reuse its state, or split
            # off the part of it that ends here too (generalized construction).
            cur = q if length[q] == length[last] + 1 else self._clone(last, q, token)
        else:
            cur = self._new_state(length[last] + 1)
            p = last
            while p != -1 and token not in nxt[p]:
                nxt[p][token] = cur
                p = link[p]
            if p == -1:
                link[cur] = ROOT
            else:
                q = nxt[p][token]
                link[cur] = q if length[p] + 1 == length[q] else self._clone(p, q, token)
        self._last = cur
        self._open_len += 1
        # The window state moves with the string; every state on its suffix-link chain gains this end
        # position (states of longer suffixes are never read, so they are not counted).
        self._win, self._win_len = self.advance(self._win, self._win_len, token, self.window)
        serial = self.num_tokens
        count, last_end = self.count, self.last_end
        v = self._win
        while v != ROOT:
            count[v] += 1
            last_end[v] = serial
            v = link[v]
        self.num_tokens += 1

    def close(self) -> None:
        """Close the open string: its end positions have no continuation (`ends`)."""
        if self._open_len < 0:
            return
        ends, link = self.ends, self.link
        v = self._win
        while v != ROOT:
            ends[v] += 1
            v = link[v]
        self._last, self._win, self._win_len, self._open_len = ROOT, ROOT, 0, -1

    def add_string(self, tokens: Sequence[int]) -> None:
        """Add a whole closed string."""
        self.begin()
        self.extend(tokens)
        self.close()

    def _new_state(self, length: int) -> int:
        self.length.append(length)
        self.link.append(ROOT)
        self.next.append({})
        self.count.append(0)
        self.ends.append(0)
        self.last_end.append(-1)
        return len(self.length) - 1

    def _clone(self, p: int, q: int, token: int) -> int:
        """Split q: a clone takes q's strings up to length[p] + 1 (which now also end at the new position),
        with q's transitions and statistics, and the transitions from p's suffix chain move to it."""
        clone = self._new_state(self.length[p] + 1)
        self.next[clone] = dict(self.next[q])
        self.link[clone] = self.link[q]
        self.count[clone] = self.count[q]
        self.ends[clone] = self.ends[q]
        self.last_end[clone] = self.last_end[q]
        self.link[q] = clone
        nxt, link = self.next, self.link
        while p != -1 and nxt[p].get(token) == q:
            nxt[p][token] = clone
            p = link[p]
        return clone

    # ---- reading ----------------------------------------------------------------------------------

    def advance(self, state: int, matched: int, token: int, cap: int) -> tuple[int, int]:
        """Matching statistics, one token at a time: (state, matched) holds the last `matched` tokens of
        some text (matched <= cap); return the same for text + token: the state and length of the longest
        suffix of text + token, of at most `cap` tokens, that occurs in the automaton.

        `state` may come from before the automaton grew: a split since then may have moved the shorter
        strings of a state to a clone (its suffix link), and this first moves there."""
        link, length, nxt = self.link, self.length, self.next
        if matched >= cap:
            matched = cap - 1  # drop the oldest token so that the match stays within cap
        while state != ROOT and matched <= length[link[state]]:
            state = link[state]
        while True:
            child = nxt[state].get(token)
            if child is not None:
                return child, matched + 1
            if state == ROOT:
                return ROOT, 0
            state = link[state]
            matched = length[state]

    def normalize(self, state: int, matched: int) -> int:
        """The state that holds the string of length `matched` that `state` held before the automaton grew
        (a split moves a state's shorter strings to a clone, its suffix link)."""
        link, length = self.link, self.length
        while state != ROOT and matched <= length[link[state]]:
            state = link[state]
        return state

    def match(self, tokens: Sequence[int], cap: int) -> tuple[int, int]:
        """The state and length of the longest suffix of `tokens` (at most `cap` of them) that occurs."""
        state, matched = ROOT, 0
        for token in tokens[len(tokens) - cap:] if len(tokens) > cap else tokens:
            state, matched = self.advance(state, matched, token, cap)
        return state, matched

    def followed(self, state: int) -> int:
        """How many occurrences of `state`'s strings are followed by a token: the sum of its children's
        counts, in O(1) (all occurrences, less those that end a closed string or the open one)."""
        at_open_end = self._open_len > 0 and self.last_end[state] == self.num_tokens - 1
        return self.count[state] - self.ends[state] - at_open_end

    def ranked(self, state: int) -> list[tuple[int, int]]:
        """`state`'s children as (token, child), most frequent first, ties: the most recently seen first.

        Rankings of states with many children are cached, keyed by `followed(state)`: any change to a
        child's count changes that sum, and counts only grow."""
        children = self.next[state]
        if len(children) < _RANK_CACHE_MIN:
            count, last_end = self.count, self.last_end
            return sorted(children.items(), key=lambda kv: (count[kv[1]], last_end[kv[1]]), reverse=True)
        den = self.followed(state)
        cached = self._ranked.get(state)
        if cached is None or cached[0] != den:
            count, last_end = self.count, self.last_end
            ranking = sorted(children.items(), key=lambda kv: (count[kv[1]], last_end[kv[1]]), reverse=True)
            cached = self._ranked[state] = (den, ranking)
        return cached[1]

    def top_child(self, state: int) -> tuple[int, int] | None:
        """The first of `ranked(state)`, without sorting small fan-outs."""
        children = self.next[state]
        if len(children) <= 1:  # the common case: one continuation (or none)
            for item in children.items():
                return item
            return None
        if len(children) >= _RANK_CACHE_MIN:
            return self.ranked(state)[0]
        count, last_end = self.count, self.last_end
        return max(children.items(), key=lambda kv: (count[kv[1]], last_end[kv[1]]))

    def continuations(self, state: int, max_len: int) -> dict[tuple[int, ...], int]:
        """Every continuation of `state`'s strings of 1..max_len tokens with its count (for tests and
        inspection; proposals never enumerate all of them)."""
        out: dict[tuple[int, ...], int] = {}
        stack: list[tuple[int, tuple[int, ...]]] = [(state, ())]
        while stack:
            s, path = stack.pop()
            if len(path) == max_len:
                continue
            for token, child in self.next[s].items():
                out[path + (token,)] = self.count[child]
                stack.append((child, path + (token,)))
        return out


def chain_draft(automaton: SuffixAutomaton, state: int, depth: int, min_token_prob: float,
            prior_count: float) -> tuple[list[int], list[float]]:
    """Follow the most frequent continuation while its probability stays >= min_token_prob: tokens
    and their probabilities."""
    tokens: list[int] = []
    probs: list[float] = []
    prob, count, floor, prior = 1.0, automaton.count, min_token_prob, prior_count
    while len(tokens) < depth:
        den = automaton.followed(state)
        top = automaton.top_child(state) if den > 0 else None
        if top is None:
            break
        token, state = top
        prob *= count[state] / (den + prior)
        if prob < floor:
            break
        tokens.append(token)
        probs.append(prob)
    return tokens, probs

def tree_draft(automaton: SuffixAutomaton, state: int, depth: int, max_nodes: int, min_token_prob: float,
           prior_count: float) -> tuple[list[int], list[int], list[float]]:
    """Best-first: add the likeliest candidate node (ties: shallower, then the earlier candidate) until
    max_nodes; a node's children become candidates if it is above `depth` and they are likely enough."""
    tokens: list[int] = []
    parents: list[int] = []
    probs: list[float] = []
    heap: list[tuple[float, int, int, int, int, int]] = []  # (-prob, depth, order, token, state, parent)
    order = 0

    def push_children(state: int, prob: float, level: int, parent: int) -> None:
        nonlocal order
        den = automaton.followed(state)
        if den <= 0:
            return
        den += prior_count
        for token, child in automaton.ranked(state):
            p = prob * (automaton.count[child] / den)  # as a chain: the product of per-step ratios
            if p < min_token_prob:
                break  # ranked: the rest are rarer still
            heapq.heappush(heap, (-p, level, order, token, child, parent))
            order += 1

    push_children(state, 1.0, 1, -1)
    while heap and len(tokens) < max_nodes:
        neg_p, level, _, token, child, parent = heapq.heappop(heap)
        tokens.append(token)
        parents.append(parent)
        probs.append(-neg_p)
        if level < depth:
            push_children(child, -neg_p, level + 1, len(tokens) - 1)
    return tokens, parents, probs


def suffix_chain(automaton: SuffixAutomaton, state: int, matched: int) -> Iterator[tuple[int, int]]:
    """(state, match length) for the matched suffix and each shorter one with more occurrences, longest
    first: the suffix-link chain, where each state stands for its longest string."""
    link, length = automaton.link, automaton.length
    while state != ROOT:
        yield state, matched
        state = link[state]
        matched = length[state]
