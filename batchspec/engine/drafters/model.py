"""A small draft model as the drafter, driven through its own ModelRunner."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from .base import MODEL_POLICY, Draft, DraftContext, _pad, empty_draft
from ..runner import ModelRunner, to_device
from ..sampling import STREAM_DRAFT, SamplingParams, coupled_tokens, sample, scores, to_probs, uniforms
from ..tree import TreeShape, TreeSpec, compaction, prune

STREAM_TREE_DRAFT = 64  # + child slot: the draws of a tree's i.i.d. children (rejection sampling)


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
        # Widths worth capturing: the first step (1 or 2 tokens), one drafted token, a tree level.
        widths = {1, 2} | {spec.branching for spec in trees}
        self.runner = ModelRunner(model, num_slots=num_slots, capacity=capacity, max_position=max_position,
                                  capture=capture, widths=widths, name="draft")
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

    def tree_slots(self, spec: TreeSpec) -> int:
        full = spec.branching + (spec.depth - 1) * spec.branching ** 2
        reranked = spec.nodes is not None and (self.sampling.greedy or self.sampling.coupled)
        return min(full, spec.nodes) if reranked else full

    def _children(self, logits: torch.Tensor, k: int, noise: torch.Tensor | None, keys: torch.Tensor,
                  positions: torch.Tensor, presence: torch.Tensor | None):
        """logits [b, F, V] of F nodes -> each node's k children: tokens [b, F, k], log q [b, F, k], and
        q [b, F, V] (the distribution rejection sampling's children are drawn from). Greedy: the top k;
        coupled: the top k of the scores plus the position's noise (the first is the coupled guess);
        rejection: k i.i.d. draws from q (counter noise per child slot)."""
        b, f, vocab = logits.shape
        s = scores(self._align(logits.float()), self.sampling,
                   presence[:, None].expand(b, f, -1) if presence is not None else None)
        logq = torch.log_softmax(s, dim=-1)
        if self.sampling.greedy or self.sampling.coupled:
            ranked = s if noise is None else s + noise[:, None, :]
            kids = ranked.topk(k, dim=-1).indices
        else:
            q = logq.exp().reshape(b * f, -1)
            u = torch.stack([uniforms(keys, positions[:, None], STREAM_TREE_DRAFT + c)[:, 0]
                             for c in range(f * k)], dim=1).reshape(b, f, k)
            kids = sample(q.repeat_interleave(k, dim=0), u.reshape(b * f * k)).reshape(b, f, k)
        return kids, logq.gather(2, kids), logq.exp()

    @torch.inference_mode()
    def propose_tree(self, ctx: DraftContext, spec: TreeSpec) -> Draft:
        """An EAGLE-2-style tree: the root's `branching` best children, then at every further depth the
        `branching` most probable nodes of the last level (by the product of draft probabilities along
        their path) each get `branching` children; with `nodes`, only the best that many are kept.
        Every depth after the first is one draft forward of `branching` tokens per row in tree attention
        over the nodes fed before (a scratch window in the draft's cache)."""
        b, k, depth = len(ctx.rows), spec.branching, spec.depth
        full = k + (depth - 1) * k * k
        kv_len = max(ctx.lengths) + 2 + full
        logits, rows, where, _, _ = self._first_step(ctx, kv_len)
        self.runner.commit(where, ctx.lengths_t)  # the root is cached: the tree's window starts after it
        presence = ctx.presence[ctx.rows_t] if ctx.presence is not None else None
        keys = ctx.noise_keys[ctx.rows_t]
        noise = ctx.gumbel  # [b, depth + 1, V] or None
        budget = to_device(ctx.k, self.device).clamp(max=depth)  # [b]: how deep each row may go
        rejection = not (self.sampling.greedy or self.sampling.coupled)
        kids, logq, q = self._children(logits[:, None], k, noise[:, 0] if noise is not None else None, keys,
                                       ctx.lengths_t, presence)
        tokens, parents, score, depths = [kids[:, 0]], [torch.full((b, k), -1, device=self.device)], [logq[:, 0]], [1] * k
        q_at = [(0, q[:, 0])] if rejection else []
        frontier = torch.arange(k, device=self.device).expand(b, k)  # tree indices of the last level's kept nodes
        frontier_tok, frontier_score = kids[:, 0], logq[:, 0]
        frontier_window = torch.full((b, k), -1, dtype=torch.long, device=self.device)  # their parents' window slots
        node_window = torch.full((b, full), -1, dtype=torch.long, device=self.device)
        window = torch.zeros(b, 0, 0, dtype=torch.bool, device=self.device)  # ancestors among fed nodes
        rows_b = torch.arange(b, device=self.device)[:, None]
        for d in range(2, depth + 1):
            fed = window.shape[1]
            parent_rows = (window[rows_b, frontier_window.clamp(min=0)] & (frontier_window >= 0)[:, :, None]
                           if fed else window.new_zeros(b, k, 0))  # a node sees its parent's ancestors and itself
            grown = torch.zeros(b, fed + k, fed + k, dtype=torch.bool, device=self.device)
            grown[:, :fed, :fed] = window
            grown[:, fed:, :fed] = parent_rows
            grown[:, fed:, fed:] = torch.eye(k, dtype=torch.bool, device=self.device)
            window = grown
            node_window.scatter_(1, frontier, fed + torch.arange(k, device=self.device).expand(b, k))
            shape = TreeShape(depth=torch.full((b, k), d - 2, dtype=torch.long, device=self.device),
                              ancestors=window[:, fed:], parent_t=None, rank=None, valid=None)
            step_logits = self.runner.forward(frontier_tok, kv_len=kv_len, rows=rows, tree=shape)  # [b, k, V]
            kids, logq, q = self._children(step_logits, k, noise[:, d - 1] if noise is not None else None, keys,
                                           ctx.lengths_t + d - 1, presence)
            base = sum(t.shape[1] for t in tokens)
            if rejection:
                q_at += [(None, (frontier, q))]
            tokens.append(kids.reshape(b, k * k))
            parents.append(frontier[:, :, None].expand(b, k, k).reshape(b, k * k))
            level_score = (frontier_score[:, :, None] + logq).reshape(b, k * k)
            score.append(level_score)
            depths += [d] * (k * k)
            if d < depth:
                best = level_score.topk(k, dim=1).indices  # [b, k] within this level
                frontier_window = node_window.gather(1, frontier.gather(1, best // k))
                frontier = base + best
                frontier_tok = tokens[-1].gather(1, best)
                frontier_score = level_score.gather(1, best)
        tokens_t, parents_t = torch.cat(tokens, 1), torch.cat(parents, 1)
        depth_t = torch.tensor(depths, device=self.device)
        valid = depth_t[None, :] <= budget[:, None]
        # Scores fall strictly along a path (log q <= 0, less a hair per level), so a reranked set of
        # nodes is closed under ancestors.
        score_t = torch.cat(score, 1) - 1e-4 * depth_t[None, :]
        slots = self.tree_slots(spec)
        q_full = None
        if rejection:
            q_full = torch.zeros(b, full + 1, q.shape[-1], device=self.device)
            q_full[:, 0] = q_at[0][1]
            for _, (nodes, q_nodes) in q_at[1:]:
                q_full.scatter_(1, (nodes + 1)[:, :, None].expand(-1, -1, q_full.shape[2]), q_nodes)
        elif slots < full:
            chosen = torch.where(valid, score_t, float("-inf")).topk(slots, dim=1).indices.sort(dim=1).values
            node_window = node_window.gather(1, chosen)
            tokens_t, parents_t, valid = prune(tokens_t, parents_t, valid, score_t, slots)
        self._round = ("tree", list(ctx.rows), list(ctx.lengths), ctx.rows_t, ctx.lengths_t, node_window)
        return Draft(tokens=tokens_t * valid, num_tokens=valid.sum(1), parents=parents_t, valid=valid,
                     q_at=q_full, depth=depth, branching=k, spec=spec)

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

    def commit(self, slots, emitted, num_accepted, path: torch.Tensor | None = None):
        """After the verdict. A chain round leaves the draft valid up to L + min(m, steps - 1). A tree
        round moves the accepted path's entries (path [b, N + 1]: the verify positions from the root, of
        every row of the round) from their scratch slots to their positions, up to depth m - 1 (the
        deepest accepted node may be a leaf that was never fed): valid up to L + m - 1."""
        if self._round is None:
            return
        if self._round[0] == "tree":
            _, rows, lengths, rows_t, lengths_t, node_window = self._round
            self._round = None
            depth = path.shape[1] - 1
            accepted = (path[:, 1:] != path[:, :-1]).sum(1)
            fed = node_window.gather(1, (path[:, 1:] - 1).clamp(min=0))  # [b, depth]: the path's window slots
            d = torch.arange(1, depth + 1, device=self.device)[None, :]
            on_path = (d < accepted[:, None]) & (fed >= 0)
            src = torch.where(on_path, lengths_t[:, None] + fed, lengths_t[:, None] - 1 + d)
            dst = lengths_t[:, None] - 1 + d
            self.runner.compact(rows_t, src, dst)
            by_slot = dict(zip(rows, lengths))
            for slot, m in zip(slots, num_accepted):
                self.valid[slot] = by_slot[slot] + max(m - 1, 0)
            return
        rows, lengths, steps = self._round
        by_slot = dict(zip(rows, lengths))
        for slot, m in zip(slots, num_accepted):
            self.valid[slot] = by_slot[slot] + min(m, steps - 1)
        self._round = None
