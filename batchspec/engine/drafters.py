"""Drafters: propose up to k tokens per active slot, then learn from what the target accepted.

Every drafter speaks the same three verbs (cf. transformers' CandidateGenerator, made batched):
  admit(slots, prompts)            new requests now occupy these slots
  propose(ctx) -> Draft            up to ctx.k[i] tokens for row i; rows may propose 0
  commit(slots, emitted, accepted) the tokens each row emitted this round, and how many drafts it kept
A row that proposes nothing costs only its 1-token decode in the verify pass.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import PreTrainedModel

from .kv_cache import SlotKVCache, forward
from .sampling import STREAM_DRAFT, SamplingParams, greedy_tokens, sample, to_probs, uniforms


@dataclass(slots=True)
class DraftContext:
    """What a drafter may read in a round. rows/lengths/k are host lists of equal length b;
    tokens [B, S] holds every slot's sequence (prompt + output) on the device, valid up to lengths."""

    rows: list[int]
    lengths: list[int]
    k: list[int]
    tokens: torch.Tensor
    presence: torch.Tensor | None  # [B, V] bool: tokens already in each slot's context (repetition penalty)
    noise_keys: torch.Tensor  # [B] int64


@dataclass(slots=True)
class Draft:
    tokens: torch.Tensor  # [b, W] int64, padded with 0 past num_tokens; W sets the verify width W+1
    num_tokens: torch.Tensor  # [b] int64 on the device: how many of each row's tokens are proposals
    probs: torch.Tensor | None = None  # [b, K, V] q after the sampling transforms; None = one-hot q
    host_num: list[int] | None = None  # num_tokens on the host, when the drafter has it without a device sync

    def truncate(self, width: int) -> "Draft":
        """The same proposals cut to at most `width` tokens per row (a lookup's first tokens do not depend
        on how many were asked for)."""
        host = None if self.host_num is None else [min(n, width) for n in self.host_num]
        probs = None if self.probs is None else self.probs[:, :width]
        return Draft(self.tokens[:, :width], self.num_tokens.clamp(max=width), probs, host)


class Drafter(Protocol):
    # True when proposing k_max tokens costs no more than proposing fewer and its first tokens do not depend
    # on k (lookup drafters): the adaptive controller then proposes first and picks the verify width after.
    free_proposals: bool

    def admit(self, slots: list[int], prompts: list[list[int]]) -> None: ...
    def propose(self, ctx: DraftContext) -> Draft: ...
    def commit(self, slots: list[int], emitted: list[list[int]], num_accepted: list[int]) -> None: ...


def empty_draft(b: int, device: torch.device) -> Draft:
    return Draft(tokens=torch.zeros(b, 0, dtype=torch.long, device=device),
                 num_tokens=torch.zeros(b, dtype=torch.long, device=device))


def _pad(rows: list[list[int]], device: torch.device) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    return torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.long, device=device).reshape(
        len(rows), width
    )


class NoDrafter:
    """Plain decoding on the same machinery: every round verifies just the pending token."""

    free_proposals = False

    def __init__(self, device: torch.device):
        self.device = device

    def admit(self, slots, prompts):
        pass

    def propose(self, ctx: DraftContext) -> Draft:
        return empty_draft(len(ctx.rows), self.device)

    def commit(self, slots, emitted, num_accepted):
        pass


class NGramDrafter:
    """Frequency tables over the request's own prompt + output (seed 004, akunu's predictor).

    For orders 4, 3, 2 (contexts of 3, 2, 1 tokens), longest context first, propose the most frequent
    continuation (ties: the most recently seen), append it to a tentative context, and chain.
    """

    free_proposals = True

    def __init__(self, device: torch.device, max_order: int = 4, min_order: int = 2):
        if not 2 <= min_order <= max_order:
            raise ValueError(f"drafter n-gram orders must satisfy 2 <= min_order <= max_order, got {min_order}, {max_order}")
        self.device, self.max_order, self.min_order = device, max_order, min_order
        self.tables: dict[int, dict[tuple[int, ...], dict[int, list[int]]]] = {}
        self.history: dict[int, list[int]] = {}

    def admit(self, slots, prompts):
        for slot, prompt in zip(slots, prompts):
            self.tables[slot] = defaultdict(dict)
            self.history[slot] = []
            self._learn(slot, prompt)

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

    def _predict(self, slot: int, k: int) -> list[int]:
        table, context = self.tables[slot], list(self.history[slot][-(self.max_order - 1) :])
        out: list[int] = []
        while len(out) < k:
            for order in range(self.max_order, self.min_order - 1, -1):
                if len(context) >= order - 1:
                    counts = table.get(tuple(context[len(context) - order + 1 :]))
                    if counts:
                        token = max(counts.items(), key=lambda kv: kv[1])[0]  # (count, last seen)
                        break
            else:
                return out
            out.append(token)
            context = context[1:] + [token] if len(context) >= self.max_order - 1 else context + [token]
        return out

    def propose(self, ctx: DraftContext) -> Draft:
        drafts = [self._predict(slot, k) if k > 0 else [] for slot, k in zip(ctx.rows, ctx.k)]
        host_num = [len(d) for d in drafts]
        num = torch.tensor(host_num, dtype=torch.long, device=self.device)
        return Draft(tokens=_pad(drafts, self.device), num_tokens=num, host_num=host_num)

    def commit(self, slots, emitted, num_accepted):
        for slot, tokens in zip(slots, emitted):
            self._learn(slot, tokens)


class PromptLookupDrafter:
    """Prompt lookup: find the most recent earlier occurrence of the trailing n-gram (n from max_n down
    to min_n) in the request's prompt + output and propose what followed it. Vectorized over rows."""

    free_proposals = True

    def __init__(self, device: torch.device, max_n: int = 3, min_n: int = 1):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"prompt lookup needs 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.device, self.max_n, self.min_n = device, max_n, min_n

    def admit(self, slots, prompts):
        pass

    def commit(self, slots, emitted, num_accepted):
        pass

    def propose(self, ctx: DraftContext) -> Draft:
        b, k_max = len(ctx.rows), max(ctx.k, default=0)
        if k_max == 0:
            return empty_draft(b, self.device)
        lengths = torch.tensor(ctx.lengths, device=self.device)
        seq = ctx.tokens[torch.tensor(ctx.rows, device=self.device), : max(ctx.lengths)]  # [b, S]
        start = torch.full((b,), -1, dtype=torch.long, device=self.device)  # continuation start per row
        for n in range(self.max_n, self.min_n - 1, -1):
            if seq.shape[1] < n + 1:
                continue
            tail_idx = (lengths[:, None] - n + torch.arange(n, device=self.device)).clamp(min=0)
            tail = seq.gather(1, tail_idx)  # [b, n]
            windows = seq.unfold(1, n, 1)  # [b, S-n+1, n]
            where = torch.arange(windows.shape[1], device=self.device)[None, :]
            # An earlier match must end before the last token, so that a continuation exists.
            match = (windows == tail[:, None, :]).all(-1) & (where + n < lengths[:, None]) & (lengths[:, None] > n)
            last = torch.where(match, where, -1).max(dim=1).values
            start = torch.where((start < 0) & (last >= 0), last + n, start)
        k = torch.tensor(ctx.k, device=self.device)
        num = torch.where(start >= 0, torch.minimum(k, lengths - start), torch.zeros_like(k)).clamp(min=0)
        idx = (start.clamp(min=0)[:, None] + torch.arange(k_max, device=self.device)).clamp(max=seq.shape[1] - 1)
        tokens = seq.gather(1, idx) * (torch.arange(k_max, device=self.device)[None, :] < num[:, None])
        host_num = None
        if self.device.type == "cpu":
            # Trim the verify width to the longest match; reading it is free on CPU (a sync on a GPU).
            host_num = num.tolist()
            tokens = tokens[:, : max(host_num)]
        return Draft(tokens=tokens, num_tokens=num, host_num=host_num)


class ModelDrafter:
    """A small draft model with its own slot cache, run k times per round over all active rows.

    The draft cache of slot s is valid for its first `cache.lengths[s]` tokens. A round first feeds the
    tokens the draft has not seen (normally the last 1-2 emitted tokens; the prompt is prefilled at
    admit), then one token per step. After the verdict a row's draft cache stays valid up to
    L + min(num_accepted, steps - 1): the last draft token was never fed, and rejected ones are stale.
    """

    free_proposals = False  # every drafted token is a draft forward: choose k before proposing

    def __init__(
        self, model: PreTrainedModel, num_slots: int, max_len: int, max_position: int,
        target_vocab_size: int, sampling: SamplingParams,
    ):
        self.model, self.sampling, self.max_position = model, sampling, max_position
        self.device = model.device
        self.cache = SlotKVCache.for_model(model, num_slots, max_len)
        self.draft_vocab = model.get_output_embeddings().weight.shape[0]
        self.target_vocab = target_vocab_size
        self._round: tuple[list[int], list[int], int] | None = None  # rows, lengths, steps of the last propose

    def _align(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [..., V_draft] -> [..., V_target]: ids the target lacks are dropped, ids the draft
        lacks get -inf, so q is a distribution over the target's vocabulary."""
        if self.draft_vocab >= self.target_vocab:
            return logits[..., : self.target_vocab]
        pad = logits.new_full((*logits.shape[:-1], self.target_vocab - self.draft_vocab), float("-inf"))
        return torch.cat([logits, pad], dim=-1)

    def _feed(self, ids: torch.Tensor) -> torch.Tensor:
        return ids.clamp(max=self.draft_vocab - 1)  # a target-only id must not index the draft's embeddings

    @torch.inference_mode()
    def admit(self, slots, prompts):
        """Prefill the draft on prompt[:-1] (the generator passes prompt + first output token); the last
        token is fed in the first round."""
        todo = [(s, p[:-1]) for s, p in zip(slots, prompts) if len(p) > 1]
        for slot, prompt in zip(slots, prompts):
            self.cache.lengths[slot] = len(prompt) - 1
        if todo:
            rows = [s for s, _ in todo]
            ids = _pad([p for _, p in todo], self.device)
            forward(self.model, self.cache, self._feed(ids), rows, [0] * len(rows), self.max_position, logits_to_keep=1)

    @torch.inference_mode()
    def propose(self, ctx: DraftContext) -> Draft:
        b, steps = len(ctx.rows), max(ctx.k, default=0)
        if steps == 0:
            self._round = None
            return empty_draft(b, self.device)
        rows_t = torch.tensor(ctx.rows, device=self.device)
        seen = [self.cache.lengths[s] for s in ctx.rows]
        chunks = [list(range(d, length)) for d, length in zip(seen, ctx.lengths)]
        idx = _pad(chunks, self.device)
        ids = ctx.tokens[rows_t[:, None], idx]
        logits = forward(self.model, self.cache, self._feed(ids), ctx.rows, seen, self.max_position)
        last = torch.tensor([len(c) - 1 for c in chunks], device=self.device)
        logits = logits[torch.arange(b, device=self.device), last]  # [b, V_draft]

        presence = ctx.presence[rows_t].clone() if ctx.presence is not None else None
        keys = ctx.noise_keys[rows_t]
        lengths = torch.tensor(ctx.lengths, device=self.device)
        tokens, probs = [], []
        for i in range(steps):
            aligned = self._align(logits.float())
            if self.sampling.greedy:
                token = greedy_tokens(aligned, self.sampling, presence)
            else:
                q = to_probs(aligned, self.sampling, presence)
                token = sample(q, uniforms(keys, (lengths + i)[:, None], STREAM_DRAFT)[:, 0])
                probs.append(q)
            tokens.append(token)
            if presence is not None:
                presence[torch.arange(b, device=self.device), token] = True
            if i + 1 < steps:
                starts = [length + i for length in ctx.lengths]
                logits = forward(self.model, self.cache, self._feed(token[:, None]), ctx.rows, starts, self.max_position)[:, -1]
        self._round = (list(ctx.rows), list(ctx.lengths), steps)
        return Draft(
            tokens=torch.stack(tokens, dim=1),
            num_tokens=torch.tensor(ctx.k, dtype=torch.long, device=self.device),
            probs=torch.stack(probs, dim=1) if probs else None,
        )

    def commit(self, slots, emitted, num_accepted):
        if self._round is None:
            return
        rows, lengths, steps = self._round
        by_slot = dict(zip(rows, lengths))
        valid = [by_slot[s] + min(m, steps - 1) for s, m in zip(slots, num_accepted)]
        self.cache.rollback(slots, valid)
        self._round = None


def make_drafter(
    name: str,
    *,
    device: torch.device,
    num_slots: int,
    max_len: int,
    max_position: int,
    target_vocab_size: int,
    sampling: SamplingParams,
    draft_model: PreTrainedModel | None = None,
) -> Drafter:
    if name == "none":
        return NoDrafter(device)
    if name == "ngram":
        return NGramDrafter(device)
    if name == "prompt_lookup":
        return PromptLookupDrafter(device)
    if name == "model":
        if draft_model is None:
            raise ValueError("drafter 'model' needs a draft model (model.draft / draft=)")
        return ModelDrafter(draft_model, num_slots, max_len, max_position, target_vocab_size, sampling)
    raise ValueError(f"unknown drafter {name!r}: choose none, model, ngram or prompt_lookup")
