"""Drafters: propose up to k tokens per row, then learn from what the target accepted.

Every drafter speaks the same three verbs (cf. transformers' CandidateGenerator, made batched):
  admit(slots, sequences)          new requests now occupy these slots (sequence = prompt + first token)
  propose(ctx) -> Draft            up to ctx.k[i] tokens for row i; rows may propose 0
  commit(slots, emitted, accepted) the tokens each running row emitted this round, and how many drafts it kept
and declares a DrafterPolicy: what the adaptive controller needs to know about it, so that the
controller never looks inside a drafter. A row that proposes nothing costs only its 1-token decode in
the verify pass.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import PreTrainedModel

from .runner import ModelRunner, to_device
from .sampling import STREAM_DRAFT, SamplingParams, coupled_tokens, sample, to_probs, uniforms


@dataclass(frozen=True, slots=True)
class DrafterPolicy:
    """What choosing each round's number of drafts needs to know about a drafter.

    propose_first: proposing k_max tokens costs no more than proposing fewer and the first tokens do not
        depend on k (lookups): propose, then choose the verify width from the proposals on the table.
    bursty: proposals are right or wrong as a whole (a lookup's match) more often than token by token,
        so acceptance is modelled as first-draft acceptance times job-wide continuation rates instead of
        one geometric alpha.
    draft_forwards: each drafted token costs one forward of a draft model.
    catches_up: after rounds without drafting, the next drafted round first feeds the draft the tokens it
        missed, a cost of the plain rounds before and not of that round's k.
    """

    propose_first: bool = False
    bursty: bool = False
    draft_forwards: bool = False
    catches_up: bool = False


LOOKUP_POLICY = DrafterPolicy(propose_first=True, bursty=True)
MODEL_POLICY = DrafterPolicy(draft_forwards=True, catches_up=True)


@dataclass(slots=True)
class DraftContext:
    """What a drafter may read in a round.

    rows/lengths/k are host lists of equal length b: the slots of this round (every slot, in order, when
    `static`; then idle slots have k = 0), each row's sequence length L (prompt + output so far) and its
    budget. rows_t [b] and lengths_t [b] are the same on the device. tokens [B, S] holds every slot's
    sequence on the device, valid up to its length.
    """

    rows: list[int]
    lengths: list[int]
    k: list[int]
    tokens: torch.Tensor
    presence: torch.Tensor | None  # [B, V] bool: tokens already in each slot's context (repetition penalty)
    noise_keys: torch.Tensor  # [B] int64
    rows_t: torch.Tensor | None = None
    lengths_t: torch.Tensor | None = None
    static: bool = False
    span: slice | None = None  # rows as a slice when they are consecutive slots (eager forwards read views)
    gumbel: torch.Tensor | None = None  # [b, >= k, V]: coupled sampling's noise of positions L .. (sampling.py)

    def __post_init__(self):
        device = self.tokens.device
        if self.rows_t is None:
            self.rows_t = to_device(self.rows, device)
        if self.lengths_t is None:
            self.lengths_t = to_device(self.lengths, device)


@dataclass(slots=True)
class Draft:
    tokens: torch.Tensor  # [b, W] int64, padded with 0 past num_tokens; W sets the verify width W+1
    num_tokens: torch.Tensor  # [b] int64 on the device: how many of each row's tokens are proposals
    probs: torch.Tensor | None = None  # [b, W, V] q after the sampling transforms; None = one-hot q
    host_num: list[int] | None = None  # num_tokens on the host, when the drafter has it without a device sync

    def truncate(self, width: int) -> "Draft":
        """The same proposals cut to at most `width` tokens per row (a lookup's first tokens do not depend
        on how many were asked for)."""
        host = None if self.host_num is None else [min(n, width) for n in self.host_num]
        probs = None if self.probs is None else self.probs[:, :width]
        return Draft(self.tokens[:, :width], self.num_tokens.clamp(max=width), probs, host)


class Drafter(Protocol):
    policy: DrafterPolicy

    def admit(self, slots: list[int], sequences: list[list[int]]) -> None: ...
    def propose(self, ctx: DraftContext) -> Draft: ...
    def commit(self, slots: list[int], emitted: list[list[int]], num_accepted: list[int]) -> None: ...
    def draft_seconds(self, k: int, kv_len: int) -> float: ...  # device time of proposing k tokens (captured steps)


def empty_draft(b: int, device: torch.device) -> Draft:
    return Draft(tokens=torch.zeros(b, 0, dtype=torch.long, device=device),
                 num_tokens=torch.zeros(b, dtype=torch.long, device=device), host_num=[0] * b)


def _pad(rows: list[list[int]], device: torch.device) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    return to_device([r + [0] * (width - len(r)) for r in rows], device).reshape(len(rows), width)


class NoDrafter:
    """Plain decoding on the same machinery: every round verifies just the pending token."""

    policy = DrafterPolicy()

    def __init__(self, device: torch.device):
        self.device = device

    def admit(self, slots, sequences):
        pass

    def propose(self, ctx: DraftContext) -> Draft:
        return empty_draft(len(ctx.rows), self.device)

    def commit(self, slots, emitted, num_accepted):
        pass

    def draft_seconds(self, k, kv_len):
        return 0.0


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
        num = to_device(host_num, self.device)
        return Draft(tokens=_pad(drafts, self.device), num_tokens=num, host_num=host_num)

    def commit(self, slots, emitted, num_accepted):
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

    def commit(self, slots, emitted, num_accepted):
        pass

    def draft_seconds(self, k, kv_len):
        return 0.0  # one vectorized match whatever k is: part of the round's overhead

    def propose(self, ctx: DraftContext) -> Draft:
        b, k_max = len(ctx.rows), max(ctx.k, default=0)
        if k_max == 0:
            return empty_draft(b, self.device)
        lengths = ctx.lengths_t
        seq = ctx.tokens[ctx.rows_t, : max(ctx.lengths)]  # [b, S]
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


class ModelDrafter:
    """A small draft model, driven through its own ModelRunner, run k times per round over the rows.

    It proposes greedily (its argmax) under greedy decoding, argmax(its scores + the round's Gumbel noise)
    under coupled sampling (the same noise the target's tokens are drawn with, so a draft that knows the
    target's distribution guesses its token), and a draw from q under rejection sampling.

    A round over rows of sequence length L feeds the draft [seq[L-2], seq[L-1]] at positions L-2, L-1 (a
    fixed 2-token step, so it can be captured: rewriting L-2 when the draft already has it is harmless;
    eager rounds feed only seq[L-1] when every row already has L-2), then one drafted token per step. So the draft cache only has to be valid up to L-2 when a round
    starts, which holds after any drafted round: a verdict of m accepted drafts leaves it valid up to
    L + min(m, steps-1), and the next round starts at L' - 2 = L + m - 1. After rounds without drafting
    (adaptive k = 0) a row catches up on what it missed first, eagerly (`valid` tracks it on the host).
    """

    policy = MODEL_POLICY

    def __init__(self, model: PreTrainedModel, *, num_slots: int, capacity: int, max_position: int,
                 target_vocab_size: int, sampling: SamplingParams, capture: str | None = None):
        self.runner = ModelRunner(model, num_slots=num_slots, capacity=capacity, max_position=max_position,
                                  capture=capture, widths=(1, 2), name="draft")
        self.sampling, self.device = sampling, model.device
        self.draft_vocab = self.runner.vocab_size
        self.target_vocab = target_vocab_size
        self.valid = [0] * num_slots  # per slot: leading draft-cache entries known to be right (host)
        self._round: tuple[list[int], list[int], int] | None = None  # rows, lengths, steps of the last propose
        self._step_times: dict[int, tuple[float, float]] = {}  # bucket -> seconds of the 2-token, 1-token step

    def _align(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [..., V_draft] -> [..., V_target]: ids the target lacks are dropped, ids the draft
        lacks get -inf, so q is a distribution over the target's vocabulary."""
        if self.draft_vocab >= self.target_vocab:
            return logits[..., : self.target_vocab]
        pad = logits.new_full((*logits.shape[:-1], self.target_vocab - self.draft_vocab), float("-inf"))
        return torch.cat([logits, pad], dim=-1)

    @torch.inference_mode()
    def admit(self, slots, sequences):
        """Prefill the draft on sequence[:-1]; the last token is fed in the first round."""
        todo = [(s, seq[:-1]) for s, seq in zip(slots, sequences) if len(seq) > 1]
        if todo:
            chunks = [c for _, c in todo]
            self.runner.prefill([s for s, _ in todo], _pad(chunks, self.device), [0] * len(todo),
                                [len(c) for c in chunks])
        for slot, seq in zip(slots, sequences):
            self.valid[slot] = len(seq) - 1

    def _catch_up(self, ctx: DraftContext) -> None:
        """Eagerly feed rows that missed tokens (rounds without drafting) up to position L-2."""
        lagging = [(i, self.valid[row], n - 2) for i, (row, n, k) in enumerate(zip(ctx.rows, ctx.lengths, ctx.k))
                   if k > 0 and self.valid[row] < n - 2]
        if not lagging:
            return
        width = max(end - start for _, start, end in lagging)
        index = to_device([i for i, _, _ in lagging], self.device)
        starts = to_device([start for _, start, _ in lagging], self.device)
        ids = ctx.tokens[ctx.rows_t[index][:, None], (starts[:, None] + torch.arange(width, device=self.device))
                         .clamp(max=ctx.tokens.shape[1] - 1)]
        self.runner.prefill([ctx.rows[i] for i, _, _ in lagging], ids, [s for _, s, _ in lagging],
                            [end - start for _, start, end in lagging])

    @torch.inference_mode()
    def propose(self, ctx: DraftContext) -> Draft:
        b, steps = len(ctx.rows), max(ctx.k, default=0)
        if steps == 0:
            self._round = None
            return empty_draft(b, self.device)
        self._catch_up(ctx)
        runner, arange = self.runner, torch.arange(b, device=self.device)
        rows = None if ctx.static else (ctx.span or ctx.rows_t)
        where = slice(None) if ctx.static else (ctx.span or ctx.rows_t)
        # Captured steps always feed the last 2 tokens; eager ones feed only 1 when every row has the
        # one before (after a round that rejected a draft): on CPU a step's cost grows with its tokens.
        width = 2 if ctx.static or any(self.valid[r] < n - 1 for r, n in zip(ctx.rows, ctx.lengths)) else 1
        start = (ctx.lengths_t - width).clamp(min=0)  # [b]; idle slots (length 1) ride along from 0
        runner.commit(where, start)
        feed = ctx.tokens[ctx.rows_t[:, None], start[:, None] + torch.arange(width, device=self.device)]
        kv_len = max(ctx.lengths) + steps - 1
        logits = runner.forward(feed, kv_len=kv_len, rows=rows, last_only=True)[:, -1]
        presence = ctx.presence[ctx.rows_t].clone() if ctx.presence is not None else None
        keys = ctx.noise_keys[ctx.rows_t]
        tokens, probs = [], []
        coupled = self.sampling.greedy or self.sampling.coupled
        for i in range(steps):
            aligned = self._align(logits.float())
            if coupled:  # argmax(q's scores + the target's noise for this position): the target's guess
                token = coupled_tokens(aligned, self.sampling, presence,
                                       ctx.gumbel[:, i] if ctx.gumbel is not None else None)
            else:
                q = to_probs(aligned, self.sampling, presence)
                token = sample(q, uniforms(keys, (ctx.lengths_t + i)[:, None], STREAM_DRAFT)[:, 0])
                probs.append(q)
            tokens.append(token)
            if presence is not None:
                presence[arange, token] = True
            if i + 1 < steps:
                runner.commit(where, start + width + i)
                logits = runner.forward(token[:, None], kv_len=kv_len, rows=rows)[:, -1]
        self._round = (list(ctx.rows), list(ctx.lengths), steps)
        return Draft(
            tokens=torch.stack(tokens, dim=1),
            num_tokens=to_device(ctx.k, self.device),
            probs=torch.stack(probs, dim=1) if probs else None,
            host_num=list(ctx.k),
        )

    def draft_seconds(self, k: int, kv_len: int) -> float:
        """k drafted tokens: one 2-token step and k - 1 one-token steps (timed replays, per length bucket)."""
        if k == 0:
            return 0.0
        bucket = self.runner.bucket(kv_len)
        if bucket not in self._step_times:
            self._step_times[bucket] = (self.runner.time_step(2, bucket, last_only=True),
                                        self.runner.time_step(1, bucket))
        first, step = self._step_times[bucket]
        return first + (k - 1) * step

    def commit(self, slots, emitted, num_accepted):
        if self._round is None:
            return
        rows, lengths, steps = self._round
        by_slot = dict(zip(rows, lengths))
        for slot, m in zip(slots, num_accepted):
            self.valid[slot] = by_slot[slot] + min(m, steps - 1)
        self._round = None


def make_drafter(
    name: str,
    *,
    device: torch.device,
    num_slots: int,
    capacity: int,
    max_position: int,
    target_vocab_size: int,
    sampling: SamplingParams,
    draft_model: PreTrainedModel | None = None,
    capture: str | None = None,
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
        return ModelDrafter(draft_model, num_slots=num_slots, capacity=capacity, max_position=max_position,
                            target_vocab_size=target_vocab_size, sampling=sampling, capture=capture)
    raise ValueError(f"unknown drafter {name!r}: choose none, model, ngram or prompt_lookup")
