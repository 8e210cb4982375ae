"""Lookup drafters on host lists: the suffix index as a chain or a tree, and `ngram` and `prompt_lookup`
re-implemented from their documented rules (engine/drafters/lookup.py)."""

from __future__ import annotations

from collections import defaultdict

from batchspec.engine.drafters.suffix_index import SuffixIndex


class SuffixSim:
    """The suffix index as a drafter: a chain of up to k (scaled by the match), or a tree."""

    def __init__(self, k: int, *, corpus: bool = True, tree: tuple[int, int] | None = None, **settings):
        self.k, self.tree = k, tree
        self.probs: list[float] = []  # of the last proposal
        self.index = SuffixIndex(corpus_max_tokens=settings.pop("corpus_max_tokens", 200_000) if corpus else 0,
                                 **settings)

    def start(self, key, sequence):
        self.index.start(key, sequence)

    def propose(self, key, budget) -> tuple[list[int], list[int]]:
        if self.tree:
            nodes, depth = self.tree
            tokens, parents, self.probs = self.index.propose_tree(key, nodes, min(depth, budget))
            return tokens, parents
        tokens, self.probs = self.index.propose(key, min(self.k, budget))
        return tokens, list(range(-1, len(tokens) - 1))

    def extend(self, key, tokens):
        self.index.extend(key, tokens)

    def finish(self, key):
        self.index.finish(key)


class NGramSim:
    """`ngram`: frequency tables over the request's own tokens, contexts of 3, 2, 1 tokens (longest
    first), the most frequent continuation (ties: the most recently seen), chained on a tentative context."""

    def __init__(self, k: int, max_order: int = 4, min_order: int = 2):
        self.k, self.max_order, self.min_order = k, max_order, min_order
        self.tables: dict = {}
        self.history: dict = {}

    def start(self, key, sequence):
        self.tables[key], self.history[key] = defaultdict(dict), []
        self.extend(key, sequence)

    def extend(self, key, tokens):
        history, table = self.history[key], self.tables[key]
        for token in tokens:
            history.append(token)
            pos = len(history) - 1
            for order in range(self.min_order, self.max_order + 1):
                if pos >= order - 1:
                    entry = table[tuple(history[pos - order + 1:pos])].setdefault(token, [0, 0])
                    entry[0] += 1
                    entry[1] = pos

    def propose(self, key, budget):
        table, out = self.tables[key], []
        context = list(self.history[key][-(self.max_order - 1):])
        while len(out) < min(self.k, budget):
            best = None
            for order in range(self.max_order, self.min_order - 1, -1):
                if len(context) >= order - 1:
                    counts = table.get(tuple(context[len(context) - order + 1:]))
                    if counts:
                        best = max(counts.items(), key=lambda kv: kv[1])[0]
                        break
            if best is None:
                break
            out.append(best)
            context = (context[1:] if len(context) >= self.max_order - 1 else context) + [best]
        return out, list(range(-1, len(out) - 1))

    def finish(self, key):
        del self.tables[key], self.history[key]


class PromptLookupSim:
    """`prompt_lookup`: the continuation of the most recent earlier occurrence of the trailing n-gram,
    n from 3 down to 1 (an occurrence must end before the last token)."""

    def __init__(self, k: int, max_n: int = 3, min_n: int = 1):
        self.k, self.max_n, self.min_n = k, max_n, min_n
        self.seqs: dict = {}

    def start(self, key, sequence):
        self.seqs[key] = list(sequence)

    def extend(self, key, tokens):
        self.seqs[key].extend(tokens)

    def propose(self, key, budget):
        seq, length = self.seqs[key], len(self.seqs[key])
        for n in range(self.max_n, self.min_n - 1, -1):
            if length <= n:
                continue
            tail = seq[length - n:]
            for where in range(length - n - 1, -1, -1):  # most recent first; must end before the last token
                if seq[where:where + n] == tail:
                    out = seq[where + n:where + n + min(self.k, budget)]
                    return out, list(range(-1, len(out) - 1))
        return [], []

    def finish(self, key):
        del self.seqs[key]
