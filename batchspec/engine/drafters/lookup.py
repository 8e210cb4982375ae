"""Drafters that need no model: n-gram tables and prompt lookup over each request's own tokens.

Both keep their state on the host and propose from it with no device work and no host sync: proposals
reach the device in one copy, and the verify width is trimmed to the longest proposal on every path.

Learning is lazy (`LazyLookup`): `admit` and `extend` only queue a row's tokens, and a row's table takes
them in when it next proposes, or in `learn_pending`, which the verify pass calls while the device computes
a captured verify (the host is idle then). A row whose drafts do not pay proposes nothing and so costs no
learning until it drafts again, and a row that ends first never learns its last tokens. Learned eagerly, it
is host time in which the device waits (about 7% of a lookup's round time on an H100 at batch 64).
A row's table is a function of its own tokens only, so the proposals are those of learning eagerly.
"""

from __future__ import annotations

from ..types import TreeSpec
from ..round import Choice, Draft, Plan
from .base import LOOKUP_POLICY, HostDrafter, host_draft, host_tree


class LazyLookup(HostDrafter):
    """The queue of tokens each row has not learnt yet; subclasses define `_start(slot)`, `_learn(slot,
    tokens)` and `_forget(slot)`."""

    policy = LOOKUP_POLICY

    def __init__(self):
        self.pending: dict[int, list[int]] = {}

    def admit(self, slots, prompts, features=None):
        for slot, prompt in zip(slots, prompts):
            self._start(slot)
            self.pending[slot] = list(prompt)

    def extend(self, slots, emitted, num_accepted, path=None):
        pending = self.pending
        for slot, tokens in zip(slots, emitted):
            pending[slot] += tokens

    def learn_pending(self) -> None:
        """Every row's queued tokens into its table (host work for while the device computes)."""
        for slot in self.pending:
            self._catch_up(slot)

    def _catch_up(self, slot: int) -> None:
        tokens = self.pending[slot]
        if tokens:
            self.pending[slot] = []
            self._learn(slot, tokens)

    def _ready(self, plan: Plan, depths: list[int]) -> None:
        """The rows that will propose (depth > 0) learn what they have queued."""
        for slot, depth in zip(plan.rows, depths):
            if depth > 0:
                self._catch_up(slot)

    def release(self, slots):
        for slot in slots:
            self.pending.pop(slot, None)
            self._forget(slot)


class NGramDrafter(LazyLookup):
    """Frequency tables over the request's own prompt + output (the predictor of akunu's n-gram drafter).

    For orders 4, 3, 2 (contexts of 3, 2, 1 tokens), longest context first, propose the most frequent
    continuation (ties: the most recently seen), append it to a tentative context, and chain.
    """

    def __init__(self, max_order: int = 4, min_order: int = 2):
        if not 2 <= min_order <= max_order:
            raise ValueError(f"drafter n-gram orders must satisfy 2 <= min_order <= max_order, got {min_order}, {max_order}")
        super().__init__()
        self.max_order, self.min_order = max_order, min_order
        # per row: a context (tuple) -> {token: [count, last position]}
        self.tables: dict[int, dict[tuple[int, ...], dict[int, list[int]]]] = {}
        self.history: dict[int, list[int]] = {}

    def _start(self, slot: int) -> None:
        self.tables[slot], self.history[slot] = {}, []

    def _forget(self, slot: int) -> None:
        self.tables.pop(slot, None)
        self.history.pop(slot, None)

    def _learn(self, slot: int, tokens: list[int]) -> None:
        history, table = self.history[slot], self.tables[slot]
        widths = range(self.min_order - 1, self.max_order)  # context lengths
        for token in tokens:
            pos = len(history)  # token's position; its contexts end at pos - 1
            for width in widths:
                if pos < width:
                    break
                key = tuple(history[pos - width : pos])
                counts = table.get(key)
                if counts is None:
                    table[key] = {token: [1, pos]}
                    continue
                entry = counts.get(token)
                if entry is None:
                    counts[token] = [1, pos]
                else:
                    entry[0] += 1
                    entry[1] = pos
            history.append(token)

    def _candidates(self, slot: int, context: list[int], n: int) -> list[int]:
        """The n best continuations of `context`: from the longest context with counts, most frequent
        first (ties: the most recently seen; positions are unique, so there are no full ties)."""
        table = self.tables[slot]
        for order in range(self.max_order, self.min_order - 1, -1):
            if len(context) >= order - 1:
                counts = table.get(tuple(context[len(context) - order + 1 :]))
                if counts:
                    if n == 1:
                        return [max(counts.items(), key=_by_count)[0]]
                    return [t for t, _ in sorted(counts.items(), key=_by_count, reverse=True)[:n]]
        return []

    def _predict(self, slot: int, k: int, context: list[int] | None = None) -> list[int]:
        context = list(self.history[slot][-(self.max_order - 1) :]) if context is None else context
        out: list[int] = []
        while len(out) < k:
            best = self._candidates(slot, context, 1)
            if not best:
                return out
            out.append(best[0])
            context = self._extend(context, best[0])
        return out

    def _extend(self, context: list[int], token: int) -> list[int]:
        """The context after `token`: the last max_order - 1 tokens at most."""
        return (context[1:] if len(context) >= self.max_order - 1 else context) + [token]

    def propose(self, plan: Plan, choice: Choice) -> Draft:
        self._ready(plan, choice.budgets)
        drafts = [self._predict(slot, k) if k > 0 else [] for slot, k in zip(plan.rows, choice.budgets)]
        return host_draft(plan.buffers, drafts)

    def propose_tree(self, plan: Plan, choice: Choice, spec: TreeSpec) -> Draft:
        """The `branching` best first tokens, each continued as a chain to `depth`: their prefix tree."""
        self._ready(plan, choice.budgets)  # a tree is at least one deep: the same rows propose
        rows = []
        for slot, k in zip(plan.rows, choice.budgets):
            depth = min(k, spec.depth)
            context = list(self.history[slot][-(self.max_order - 1) :]) if depth > 0 else []
            firsts = self._candidates(slot, context, spec.branching) if depth > 0 else []
            rows.append([[t] + self._predict(slot, depth - 1, self._extend(context, t)) for t in firsts])
        return host_tree(plan.buffers, rows, spec)



def _by_count(item: tuple[int, list[int]]) -> list[int]:
    return item[1]  # [count, last position]


class PromptLookupDrafter(LazyLookup):
    """Prompt lookup: find the most recent earlier occurrence of the trailing n-gram (n from max_n down
    to min_n) in the request's prompt + output and propose what followed it.

    An index per row maps every n-gram to the positions right after its occurrences (most recent last),
    added as tokens arrive: an occurrence counts once a token follows it, so the trailing n-gram itself
    never matches itself and a match always has a continuation.
    """

    KEEP = 8  # positions remembered per n-gram: the most recent ones (trees follow several)

    def __init__(self, max_n: int = 3, min_n: int = 1):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"prompt lookup needs 1 <= min_n <= max_n, got {min_n}, {max_n}")
        super().__init__()
        self.max_n, self.min_n = max_n, min_n
        self.seqs: dict[int, list[int]] = {}
        self.index: dict[int, dict[tuple[int, ...], list[int]]] = {}

    def _start(self, slot: int) -> None:
        self.seqs[slot], self.index[slot] = [], {}

    def _forget(self, slot: int) -> None:
        self.seqs.pop(slot, None)
        self.index.pop(slot, None)

    def _learn(self, slot: int, tokens: list[int]) -> None:
        seq, index, keep = self.seqs[slot], self.index[slot], self.KEEP
        sizes = range(self.min_n, self.max_n + 1)
        for token in tokens:
            p = len(seq)  # the n-grams ending at p - 1 are now followed by `token`
            for n in sizes:
                if p < n:
                    break
                key = tuple(seq[p - n : p])
                after = index.get(key)
                if after is None:
                    index[key] = [p]
                else:
                    after.append(p)
                    if len(after) > keep:
                        del after[0]
            seq.append(token)

    def _starts(self, slot: int, count: int) -> list[int]:
        """Where the continuations of the trailing n-gram start: the `count` most recent occurrences of the
        longest n that has any, most recent first."""
        seq, index = self.seqs[slot], self.index[slot]
        for n in range(self.max_n, self.min_n - 1, -1):
            if len(seq) > n:
                after = index.get(tuple(seq[len(seq) - n :]))
                if after:
                    return after[::-1][:count]
        return []

    def propose(self, plan: Plan, choice: Choice) -> Draft:
        self._ready(plan, choice.budgets)
        drafts = []
        for slot, k in zip(plan.rows, choice.budgets):
            starts = self._starts(slot, 1) if k > 0 else []
            drafts.append(self.seqs[slot][starts[0] : starts[0] + k] if starts else [])
        return host_draft(plan.buffers, drafts)

    def propose_tree(self, plan: Plan, choice: Choice, spec: TreeSpec) -> Draft:
        """The continuations of the `branching` most recent occurrences of the trailing n-gram (the longest n
        that has any), each up to `depth` tokens: their prefix tree."""
        self._ready(plan, choice.budgets)  # a tree is at least one deep: the same rows propose
        rows = []
        for slot, k in zip(plan.rows, choice.budgets):
            depth = min(k, spec.depth)
            seq = self.seqs.get(slot, [])
            rows.append([seq[s : s + depth] for s in self._starts(slot, spec.branching)] if depth > 0 else [])
        return host_tree(plan.buffers, rows, spec)
