"""A small draft model as the drafter, driven through its own ModelRunner."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from .base import MODEL_POLICY, Draft, DraftContext, _pad, empty_draft
from ..runner import ModelRunner, to_device
from ..sampling import STREAM_DRAFT, SamplingParams, coupled_tokens, sample, scores, to_probs, uniforms
from ..tree import TreeSpec


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
                 target_vocab_size: int, sampling: SamplingParams, capture: str | None = None,
                 trees: tuple[TreeSpec, ...] = ()):
        # Widths worth capturing: the first step (1 or 2 tokens) and one drafted token (trees too: their
        # spine is drafted like a chain).
        self.runner = ModelRunner(model, num_slots=num_slots, capacity=capacity, max_position=max_position,
                                  capture=capture, widths=(1, 2), name="draft")
        self.sampling, self.device = sampling, model.device
        self.draft_vocab = self.runner.vocab_size
        self.target_vocab = target_vocab_size
        for spec in trees:  # its B guesses per depth are distinct tokens of the draft's vocabulary
            if spec.branching > min(self.draft_vocab, target_vocab_size):
                raise ValueError(f"tree {spec}: branching {spec.branching} exceeds the draft's vocabulary "
                                 f"({min(self.draft_vocab, target_vocab_size)} tokens)")
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
        runner, arange = self.runner, torch.arange(b, device=self.device)
        kv_len = max(ctx.lengths) + steps - 1
        logits, rows, where, start, width = self._first_step(ctx, kv_len)
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

    def _first_step(self, ctx: DraftContext, kv_len: int):
        """Catch up, then feed each row's last tokens: logits after position L - 1 ([b, V]), and the rows,
        the lengths view, the start [b] and the width the step used."""
        self._catch_up(ctx)
        rows = None if ctx.static else (ctx.span or ctx.rows_t)
        where = slice(None) if ctx.static else (ctx.span or ctx.rows_t)
        # Captured steps always feed the last 2 tokens; eager ones feed only 1 when every row has the
        # one before (after a round that rejected a draft): on CPU a step's cost grows with its tokens.
        width = 2 if ctx.static or any(self.valid[r] < n - 1 for r, n in zip(ctx.rows, ctx.lengths)) else 1
        start = (ctx.lengths_t - width).clamp(min=0)  # [b]; idle slots (length 1) ride along from 0
        self.runner.commit(where, start)
        feed = ctx.tokens[ctx.rows_t[:, None], start[:, None] + torch.arange(width, device=self.device)]
        logits = self.runner.forward(feed, kv_len=kv_len, rows=rows, last_only=True)[:, -1]
        return logits, rows, where, start, width

    # ---- trees -------------------------------------------------------------------------------------

    @torch.inference_mode()
    def propose_tree(self, ctx: DraftContext, spec: TreeSpec) -> Draft:
        """A spine with side branches: the chain this drafter would propose (`depth` tokens, its best guess
        at each step), and at every depth `branching - 1` alternatives beside the spine token, as leaves:
        its next best guesses (greedy: by q; coupled: by q's scores plus the position's noise), or under
        rejection sampling further i.i.d. draws from q (the spine token is one of the draws). A miss on
        the spine can then still hit on a branch. The alternatives come from the logits the chain
        computes anyway: the draft's cost is a chain's, only the verify pass is wider."""
        b, width_b, depth = len(ctx.rows), spec.branching, spec.depth
        steps = max(min(k, depth) for k in ctx.k) if ctx.k else 0
        if steps == 0:
            self._round = None
            empty = torch.zeros(b, width_b * depth, dtype=torch.long, device=self.device)
            return Draft(tokens=empty, num_tokens=empty[:, 0], parents=empty - 1, valid=empty.bool(), spec=spec)
        kv_len = max(ctx.lengths) + steps - 1
        logits, rows, where, start, width = self._first_step(ctx, kv_len)
        presence = ctx.presence[ctx.rows_t] if ctx.presence is not None else None
        keys = ctx.noise_keys[ctx.rows_t]
        rejection = not (self.sampling.greedy or self.sampling.coupled)
        levels, q_spine = [], []
        for i in range(depth):
            if i < steps:
                s = scores(self._align(logits.float()), self.sampling, presence)
                if rejection:
                    q = torch.softmax(s, dim=-1)
                    u = torch.stack([uniforms(keys, (ctx.lengths_t + i)[:, None], STREAM_DRAFT + 64 * c)[:, 0]
                                     for c in range(width_b)], dim=1)  # c = 0 is the chain's own draw
                    level = sample(q.repeat_interleave(width_b, dim=0), u.reshape(-1)).reshape(b, width_b)
                    q_spine.append(q)
                else:
                    noise = ctx.gumbel[:, i] if ctx.gumbel is not None else None
                    level = (s if noise is None else s + noise).topk(width_b, dim=-1).indices  # [b, B]: spine first
            else:
                level = torch.zeros(b, width_b, dtype=torch.long, device=self.device)
            levels.append(level)
            if i + 1 < steps:
                self.runner.commit(where, start + width + i)
                logits = self.runner.forward(level[:, :1], kv_len=kv_len, rows=rows)[:, -1]
        tokens = torch.stack(levels, dim=1).reshape(b, depth * width_b)  # node (d, r) at d * B + r
        node_depth = torch.arange(depth, device=self.device).repeat_interleave(width_b)
        spine_above = torch.where(node_depth > 0, (node_depth - 1) * width_b, -1)  # the spine node one level up
        parents = spine_above.expand(b, -1).contiguous()
        budget = to_device(ctx.k, self.device).clamp(max=depth)
        valid = node_depth[None, :] < budget[:, None]
        q_at = None
        if rejection:  # position 0 (the root) and every spine node hold the q their children were drawn from
            q_at = torch.zeros(b, depth * width_b + 1, q_spine[0].shape[-1], device=self.device)
            q_at[:, 0] = q_spine[0]
            for d, q in enumerate(q_spine[1:], start=1):
                q_at[:, (d - 1) * width_b + 1] = q
        self._round = ("tree", list(ctx.rows), list(ctx.lengths), steps, width_b)
        return Draft(tokens=tokens * valid, num_tokens=valid.sum(1), parents=parents, valid=valid, q_at=q_at, spec=spec)

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

    def commit(self, slots, emitted, num_accepted, path: list[int] | None = None):
        """After the verdict: the draft stays valid up to L + min(m, steps - 1) (the last drafted token was
        never fed, rejected ones are stale). In a tree round only the spine was fed: a path that ends on a
        side branch at depth m (path: the verify position of each row's deepest accepted node) kept m - 1
        spine tokens."""
        if self._round is None:
            return
        if self._round[0] == "tree":
            _, rows, lengths, steps, branching = self._round
            self._round = None
            by_slot = dict(zip(rows, lengths))
            for slot, m, last in zip(slots, num_accepted, path):
                spine = m - 1 if m > 0 and (last - 1) % branching != 0 else m
                self.valid[slot] = by_slot[slot] + min(spine, steps - 1)
            return
        rows, lengths, steps = self._round
        by_slot = dict(zip(rows, lengths))
        for slot, m in zip(slots, num_accepted):
            self.valid[slot] = by_slot[slot] + min(m, steps - 1)
        self._round = None
