"""Drafters that need no model: n-gram tables and prompt lookup over each request's own tokens."""

from __future__ import annotations

from collections import defaultdict

import torch

from .base import LOOKUP_POLICY, Draft, DraftContext, _pad, empty_draft
from ..runner import to_device
from ..tree import TreeSpec, prefix_tree


def lookup_tree(sequences: list[list[list[int]]], spec: TreeSpec, device: torch.device) -> Draft:
    """Per row, up to `branching` candidate continuations (host lists) -> their prefix tree."""
    b, m, depth = len(sequences), spec.branching, spec.depth
    tokens = [[(c[j] if j < len(c) else 0) for j in range(depth)] for row in sequences
              for c in (row + [[]] * m)[:m]]
    valid = [[j < len(c) for j in range(depth)] for row in sequences for c in (row + [[]] * m)[:m]]
    tokens_t = to_device(tokens, device).reshape(b, m, depth)
    valid_t = to_device(valid, device, torch.bool).reshape(b, m, depth)
    return tree_draft(tokens_t, valid_t, spec)


def tree_draft(continuations: torch.Tensor, valid: torch.Tensor, spec: TreeSpec) -> Draft:
    tokens, parents, keep = prefix_tree(continuations, valid)
    return Draft(tokens=tokens * keep, num_tokens=keep.sum(1), parents=parents, valid=keep, spec=spec)


class NGramDrafter:
    """Frequency tables over the request's own prompt + output (seed 004, akunu's predictor).

    For orders 4, 3, 2 (contexts of 3, 2, 1 tokens), longest context first, propose the most frequent
    continuation (ties: the most recently seen), append it to a tentative context, and chain.
    """

    policy = LOOKUP_POLICY

    def __init__(self, device: torch.device, max_order: int = 4, min_order: int = 2):
        if not 2 <= min_order <= max_order:
            raise ValueError(f"drafter n-gram orders must satisfy 2 <= min_order <= max_order, got {min_order}, {max_order}")
        self.device, self.max_order, self.min_order = device, max_order, min_order
        self.tables: dict[int, dict[tuple[int, ...], dict[int, list[int]]]] = {}
        self.history: dict[int, list[int]] = {}

    def admit(self, slots, sequences):
        for slot, seq in zip(slots, sequences):
            self.tables[slot] = defaultdict(dict)
            self.history[slot] = []
            self._learn(slot, seq)

    def _learn(self, slot: int, tokens: list[int]) -> None:
        history, table = self.history[slot], self.tables[slot]
        for token in tokens:
            history.append(token)
            pos = len(history) - 1
            for order in range(self.min_order, self.max_order + 1):
                if pos >= order - 1:
                    counts = table[tuple(history[pos - order + 1 : pos])]
                    entry = counts.setdefault(token, [0, 0])
                    entry[0] += 1
                    entry[1] = pos

    def _candidates(self, slot: int, context: list[int], n: int) -> list[int]:
        """The n best continuations of `context`: from the longest context with counts, most frequent
        first (ties: the most recently seen)."""
        table = self.tables[slot]
        for order in range(self.max_order, self.min_order - 1, -1):
            if len(context) >= order - 1:
                counts = table.get(tuple(context[len(context) - order + 1 :]))
                if counts:
                    return [t for t, _ in sorted(counts.items(), key=lambda kv: kv[1], reverse=True)[:n]]
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

    def propose_tree(self, ctx: DraftContext, spec: TreeSpec) -> Draft:
        """The `branching` best first tokens, each continued as a chain to `depth`: their prefix tree."""
        rows = []
        for slot, k in zip(ctx.rows, ctx.k):
            depth = min(k, spec.depth)
            context = list(self.history[slot][-(self.max_order - 1) :]) if depth > 0 else []
            firsts = self._candidates(slot, context, spec.branching) if depth > 0 else []
            rows.append([[t] + self._predict(slot, depth - 1, self._extend(context, t)) for t in firsts])
        return lookup_tree(rows, spec, self.device)

    def propose(self, ctx: DraftContext) -> Draft:
        drafts = [self._predict(slot, k) if k > 0 else [] for slot, k in zip(ctx.rows, ctx.k)]
        host_num = [len(d) for d in drafts]
        num = to_device(host_num, self.device)
        return Draft(tokens=_pad(drafts, self.device), num_tokens=num, host_num=host_num)

    def commit(self, slots, emitted, num_accepted, path=None):
        for slot, tokens in zip(slots, emitted):
            self._learn(slot, tokens)

    def draft_seconds(self, k, kv_len):
        return 0.0  # host work, the same for every k: part of the round's overhead



class PromptLookupDrafter:
    """Prompt lookup: find the most recent earlier occurrence of the trailing n-gram (n from max_n down
    to min_n) in the request's prompt + output and propose what followed it. Vectorized over rows."""

    policy = LOOKUP_POLICY

    def __init__(self, device: torch.device, max_n: int = 3, min_n: int = 1):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"prompt lookup needs 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.device, self.max_n, self.min_n = device, max_n, min_n

    def admit(self, slots, sequences):
        pass

    def commit(self, slots, emitted, num_accepted, path=None):
        pass

    def draft_seconds(self, k, kv_len):
        return 0.0  # one vectorized match whatever k is: part of the round's overhead

    def _matches(self, seq: torch.Tensor, lengths: torch.Tensor, n: int) -> torch.Tensor | None:
        """seq [b, S], lengths [b] -> [b, S - n + 1]: the start of every earlier occurrence of each row's
        trailing n-gram, -1 elsewhere (None: the sequences are too short). An earlier match must end
        before the last token, so that a continuation exists."""
        if seq.shape[1] < n + 1:
            return None
        tail = seq.gather(1, (lengths[:, None] - n + torch.arange(n, device=self.device)).clamp(min=0))  # [b, n]
        windows = seq.unfold(1, n, 1)  # [b, S-n+1, n]
        where = torch.arange(windows.shape[1], device=self.device)[None, :]
        match = (windows == tail[:, None, :]).all(-1) & (where + n < lengths[:, None]) & (lengths[:, None] > n)
        return torch.where(match, where, -1)

    def propose(self, ctx: DraftContext) -> Draft:
        b, k_max = len(ctx.rows), max(ctx.k, default=0)
        if k_max == 0:
            return empty_draft(b, self.device)
        lengths = ctx.lengths_t
        seq = ctx.tokens[ctx.rows_t, : max(ctx.lengths)]  # [b, S]
        start = torch.full((b,), -1, dtype=torch.long, device=self.device)  # continuation start per row
        for n in range(self.max_n, self.min_n - 1, -1):
            found = self._matches(seq, lengths, n)
            if found is None:
                continue
            last = found.max(dim=1).values  # the most recent match
            start = torch.where((start < 0) & (last >= 0), last + n, start)
        k = to_device(ctx.k, self.device)
        num = torch.where(start >= 0, torch.minimum(k, lengths - start), torch.zeros_like(k)).clamp(min=0)
        idx = (start.clamp(min=0)[:, None] + torch.arange(k_max, device=self.device)).clamp(max=seq.shape[1] - 1)
        tokens = seq.gather(1, idx) * (torch.arange(k_max, device=self.device)[None, :] < num[:, None])
        host_num = None
        if self.device.type == "cpu":
            # Trim the verify width to the longest match; reading it is free on CPU (a sync on a GPU).
            host_num = num.tolist()
            tokens = tokens[:, : max(host_num)]
        return Draft(tokens=tokens, num_tokens=num, host_num=host_num)

    def propose_tree(self, ctx: DraftContext, spec: TreeSpec) -> Draft:
        """The continuations of the `branching` most recent earlier occurrences of the trailing n-gram
        (the longest n that has any), each up to `depth` tokens: their prefix tree. Vectorized over rows."""
        b, m, depth = len(ctx.rows), spec.branching, spec.depth
        lengths = ctx.lengths_t
        width = max(ctx.lengths)
        seq = ctx.tokens[ctx.rows_t, :width]  # [b, S]
        starts = torch.full((b, m), -1, dtype=torch.long, device=self.device)
        for n in range(self.max_n, self.min_n - 1, -1):
            found = self._matches(seq, lengths, n)
            if found is None:
                continue
            found = found.topk(min(m, found.shape[1]), dim=1).values + n  # most recent first
            found = torch.nn.functional.pad(found, (0, m - found.shape[1]), value=-1)
            found = torch.where(found >= n, found, -1)
            starts = torch.where((starts[:, :1] < 0), found, starts)  # rows without a longer match take this n
        budget = to_device(ctx.k, self.device).clamp(max=depth)  # [b]: the deepest a row may go
        j = torch.arange(depth, device=self.device)[None, None, :]
        index = starts[:, :, None] + j
        valid = (starts[:, :, None] >= 0) & (index < lengths[:, None, None]) & (j < budget[:, None, None])
        continuations = seq.gather(1, index.clamp(0, width - 1).reshape(b, m * depth)).reshape(b, m, depth)
        return tree_draft(continuations, valid, spec)
