"""A small draft model as the drafter, driven through its own ModelRunner: requests in and out, and its
eager and packed drafting loops (its static path, captured steps, is a ModelStaticSteps: model_static.py)."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ..types import TreeSpec
from ..model.graphs import StepGraphs
from ..model.host_device import wall
from ..model.packed import RowTokens
from ..round import Choice, Draft, Plan, RoundBuffers, RoundShape
from ..model.runner import ModelRunner
from ..sampling import SamplingParams, row_transforms
from ..slots import SlotState
from ..model.timing import time_packed, time_rows
from .base import MODEL_POLICY, empty_draft
from .choosing import buffered_draft, choose_draft, laid_out_draft, no_tree
from .model_static import ModelStaticSteps


class ModelDrafter:
    """A small draft model, driven through its own ModelRunner, run k times per round over the rows.

    It proposes greedily (its argmax) under greedy decoding, argmax(its scores + the round's Gumbel noise)
    under coupled sampling (the same noise the target's tokens are drawn with, so a draft that knows the
    target's distribution guesses its token), and a draw from q under rejection sampling.

    A round over rows of sequence length L feeds the draft [seq[L-2], seq[L-1]] at positions L-2, L-1 (a
    fixed 2-token step: rewriting L-2 when the draft already has it is harmless; eager rounds feed only
    seq[L-1] when every row already has L-2), then one drafted token per step. So the draft cache only
    has to be valid up to L-2 when a round starts, which holds after any drafted round: a verdict of m
    accepted drafts leaves it valid up to L + min(m, steps-1), and the next round starts at L' - 2 =
    L + m - 1. After rounds without drafting (adaptive k = 0) a row first catches up on what it missed
    (`valid` tracks it on the host). On the static path step i of a round is one captured step: the
    forward and the choice of draft i, written into the round's buffers.
    """

    policy = MODEL_POLICY
    feature_layers: tuple[int, ...] = ()  # it reads tokens, not the target's hidden states

    def __init__(self, model: PreTrainedModel, *, num_slots: int, capacity: int, max_position: int,
                 target_vocab_size: int, sampling: SamplingParams, graphs: StepGraphs,
                 trees: tuple[TreeSpec, ...] = (), buckets: list[int] | None = None):
        self.runner = ModelRunner(model, num_slots=num_slots, capacity=capacity, max_position=max_position,
                                  graphs=graphs, widths=(1, 2), buckets=buckets, name="draft")
        self.sampling, self.graphs, self.device = sampling, graphs, model.device
        self.draft_vocab, self.target_vocab = self.runner.vocab_size, target_vocab_size
        for spec in trees:  # its B guesses per depth are distinct tokens of the draft's vocabulary
            if spec.branching > min(self.draft_vocab, target_vocab_size):
                raise ValueError(f"tree {spec}: branching {spec.branching} exceeds the draft's vocabulary "
                                 f"({min(self.draft_vocab, target_vocab_size)} tokens)")
        self.valid = [0] * num_slots  # per slot: leading draft-cache entries known to be right (host)
        self._round: tuple | None = None  # what the last propose drafted, for extend
        self._state: SlotState | None = None  # the generator's sequences (bind)
        self.static_steps = ModelStaticSteps(self.runner, graphs, sampling, self._align) if graphs.static else None
        self._steps: list[tuple[int, float]] = []  # the last round's packed drafting forwards: (tokens, seconds)
        # The path is chosen once: the draft's caches are fed by captured chunks (static) or eager prefills, and
        # a round drafts by captured steps, by packed forwards (a chain, where the draft's forwards pack) or by
        # eager forwards over the round's rows.
        self._feed = self._static_feed if graphs.static else self._eager_feed
        self._buffered = laid_out_draft if graphs.static else buffered_draft
        self._admit_feed = self._feed_later if self.runner.packs else self._feed_prompts
        self._step_seconds = self._packed_seconds if self.runner.packs else self._row_seconds
        if self.static_steps is not None:  # timed replays of its steps
            self.draft_seconds = self.static_steps.draft_seconds
        self._tree_steps = self._captured_steps if graphs.static else self._eager_round
        self._chain_steps = (self._captured_steps if graphs.static else
                             self._packed_steps if self.runner.packs else self._eager_round)

    def _align(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [..., V_draft] -> [..., V_target]: ids the target lacks are dropped, ids the draft
        lacks get -inf, so q is a distribution over the target's vocabulary."""
        if self.draft_vocab >= self.target_vocab:
            return logits[..., : self.target_vocab]
        pad = logits.new_full((*logits.shape[:-1], self.target_vocab - self.draft_vocab), float("-inf"))
        return torch.cat([logits, pad], dim=-1)

    # ---- requests in and out ----------------------------------------------------------------------

    @torch.inference_mode()
    def admit(self, slots, prompts, features=None):
        """Prefill the draft on each prompt (the first token is fed in the row's first drafted round); where the
        draft's forwards pack, nothing yet: its first drafting forward feeds a row's prompt."""
        for slot, fed in zip(slots, self._admit_feed(slots, prompts)):
            self.valid[slot] = fed

    def _feed_prompts(self, slots: list[int], prompts: list[list[int]]) -> list[int]:
        self._feed(self._state.tokens, slots, [0] * len(slots), [len(p) for p in prompts])
        return [len(p) for p in prompts]

    @staticmethod
    def _feed_later(slots: list[int], prompts: list[list[int]]) -> list[int]:
        return [0] * len(slots)  # the first drafting forward of each row feeds its prompt (_packed_steps)

    def _catch_up(self, plan: Plan, budgets: list[int], tokens: torch.Tensor) -> None:
        """Feed rows that missed tokens (rounds without drafting) up to position L-2."""
        lagging = [(row, self.valid[row], n - 2) for row, n, k in zip(plan.rows, plan.lengths, budgets)
                   if k > 0 and self.valid[row] < n - 2]
        if lagging:
            self._feed(tokens, *([x[j] for x in lagging] for j in range(3)))

    def _static_feed(self, tokens: torch.Tensor, rows: list[int], starts: list[int], ends: list[int]) -> None:
        """The draft's cache of each row fed tokens[row, start:end] (tokens: the sequences [B, capacity]), in
        captured chunks."""
        self.runner.static_prefill.prefill(tokens, rows, starts, ends)

    def _eager_feed(self, tokens: torch.Tensor, rows: list[int], starts: list[int], ends: list[int]) -> None:
        """The same, in one eager prefill over the rows."""
        width = max(e - s for s, e in zip(starts, ends))
        index = torch.tensor(starts, device=self.device)[:, None] + torch.arange(width, device=self.device)
        ids = tokens[torch.tensor(rows, device=self.device)[:, None], index.clamp(max=tokens.shape[1] - 1)]
        self.runner.prefill(rows, ids, starts, [e - s for s, e in zip(starts, ends)])

    def extend(self, slots, emitted, num_accepted, path: list[int] | None = None):
        """After the verdict: the draft stays valid up to L + min(m, steps - 1) (the last drafted token was
        never fed, rejected ones are stale). In a tree round only the spine was fed: a path that ends on a
        side branch at depth m (path: the verify position of each row's deepest accepted node) kept m - 1
        spine tokens."""
        if self._round is None:
            return
        rows, lengths, steps, branching = self._round
        self._round = None
        by_slot = {slot: (length, n) for slot, length, n in zip(rows, lengths, steps)}
        for i, (slot, m) in enumerate(zip(slots, num_accepted)):
            if slot not in by_slot:  # it drafted nothing this round: its draft cache is as it was
                continue
            if path is not None and m > 0 and (path[i] - 1) % branching != 0:
                m -= 1
            length, n = by_slot[slot]
            self.valid[slot] = length + min(m, n - 1)

    def release(self, slots):
        pass

    def lags(self, slots, lengths):
        """Per row the tokens its draft cache lacks before the pending one (a drafting forward feeds from
        min(valid, L - 1) to the pending token at L - 1)."""
        return [max(n - 1 - self.valid[s], 0) for s, n in zip(slots, lengths)]

    def bind(self, shapes: list[RoundShape], target: ModelRunner, state: SlotState, buffers: RoundBuffers,
             acceptor) -> None:
        """The generator's device state (its sequences); on the static path the captured steps are declared."""
        self._state = state
        if self.static_steps is not None:
            self.static_steps.bind(shapes, target, state, buffers)

    def draft_seconds(self, k: int, kv_len: int) -> float:
        """Device time of drafting k tokens (the static path's: timed replays of its steps; 0 off it)."""
        return 0.0

    def packed_forward(self, chunks, verify_index):
        pass  # it reads tokens, not the target's hidden states

    def learn_pending(self):
        pass  # its catch-up is device work, run when a row drafts

    # ---- proposing --------------------------------------------------------------------------------

    @torch.inference_mode()
    def propose(self, plan: Plan, choice: Choice) -> Draft:
        return self._propose(plan, choice, None)

    @torch.inference_mode()
    def propose_tree(self, plan: Plan, choice: Choice, spec: TreeSpec) -> Draft:
        """A spine with side branches: the chain this drafter would propose (`depth` tokens, its best guess
        at each step), and at every depth `branching - 1` alternatives beside the spine token, as leaves:
        its next best guesses (greedy: by q; coupled: by q's scores plus the position's noise), or under
        rejection sampling further i.i.d. draws from q (the spine token is one of the draws). A miss on
        the spine can then still hit on a branch. The alternatives come from the logits the chain
        computes anyway: the draft's cost is a chain's, only the verify pass is wider."""
        return self._propose(plan, choice, spec)

    def _propose(self, plan: Plan, choice: Choice, spec: TreeSpec | None) -> Draft:
        b, buffers = len(plan.rows), plan.buffers
        depth = spec.depth if spec is not None else max(choice.budgets, default=0)
        steps = min(depth, max(choice.budgets, default=0))
        if steps == 0:
            self._round = None
            return empty_draft(buffers, b) if spec is None else no_tree(buffers, b, spec)
        num = buffers.put_num_drafts([min(k, depth) for k in choice.budgets])  # the budgets, on the device
        rejection = not (self.sampling.greedy or self.sampling.coupled)
        probs = (buffers.q_at if spec is not None else buffers.probs) if rejection else None
        steps_of = self._tree_steps if spec is not None else self._chain_steps
        steps_of(plan, choice, steps, spec, probs)
        return self._buffered(plan, choice.budgets, steps, num, probs, spec, self.device)

    def _fed_rows(self, plan: Plan, choice: Choice, steps: int, spec: TreeSpec | None) -> int:
        """Before a round's captured or eager steps: rows that missed tokens caught up; what the round feeds
        (for `extend`); returns the attended length."""
        self._catch_up(plan, choice.budgets, plan.state.tokens)
        # Rows that did not draft and lag behind (a new row whose prompt the draft has not seen) are not fed
        # up to their pending token: their draft cache stays as it was.
        fed = [i for i, (slot, n, k) in enumerate(zip(plan.rows, plan.lengths, choice.budgets))
               if k > 0 or self.valid[slot] >= n - 2]
        self._round = ([plan.rows[i] for i in fed], [plan.lengths[i] for i in fed], [steps] * len(fed),
                       max(spec.branching if spec is not None else 0, 1))
        return max(plan.lengths) + steps - 1

    def _captured_steps(self, plan: Plan, choice: Choice, steps: int, spec: TreeSpec | None, probs) -> None:
        kv_len = self._fed_rows(plan, choice, steps, spec)
        self.static_steps.run(steps, kv_len, spec)

    def _eager_round(self, plan: Plan, choice: Choice, steps: int, spec: TreeSpec | None, probs) -> None:
        kv_len = self._fed_rows(plan, choice, steps, spec)
        self._eager_steps(plan, choice, steps, kv_len, spec.branching if spec is not None else 0, probs)

    def _eager_steps(self, plan: Plan, choice: Choice, steps: int, kv_len: int, branching: int, probs) -> None:
        """The drafting loop over the round's rows: one forward per drafted token."""
        runner, b = self.runner, len(plan.rows)
        rows = plan.span if plan.span is not None else plan.rows_t
        where = plan.span if plan.span is not None else plan.rows_t
        # Feed only the last token when every row has the one before (after a round that accepted every
        # draft it has only L - 2): on CPU a step's cost grows with its tokens.
        width = 2 if any(self.valid[r] < n - 1 for r, n in zip(plan.rows, plan.lengths)) else 1
        lengths = plan.lengths_t
        start = (lengths - width).clamp(min=0)
        runner.set_lengths(where, start)
        feed = plan.state.tokens[plan.rows_t[:, None], start[:, None] + torch.arange(width, device=self.device)]
        logits = runner.forward(feed, kv_len=kv_len, rows=rows, last_only=True)[:, -1]
        state = plan.state
        presence = state.presence[plan.rows_t].clone() if state.presence is not None else None
        keys, drafts = state.noise_keys[plan.rows_t], plan.buffers.drafts[:b]
        sampling = row_transforms(self.sampling, state.sampling, plan.rows_t)
        gumbel = choice.gumbel
        arange = torch.arange(b, device=self.device)
        for i in range(steps):
            token = choose_draft(self._align(logits), i, self.sampling, lengths, keys, presence, gumbel, drafts,
                                 probs[:b] if probs is not None else None, branching, sampling)
            if presence is not None:
                presence[arange, token] = True
            if i + 1 < steps:
                runner.set_lengths(where, start + width + i)
                logits = runner.forward(token[:, None], kv_len=kv_len, rows=rows)[:, -1]

    def _packed_steps(self, plan: Plan, choice: Choice, steps: int, spec: None, probs) -> None:
        """The drafting loop over the rows that draft (budget > 0), each forward packed (packed.py): the first
        feeds each row what its draft cache lacks up to its pending token (valid .. L - 1: after rounds it
        sat out, the tokens it missed; a new row, its prompt), each later one the draft just made, for the
        rows whose budget goes that far. A row that drafts nothing costs the draft nothing."""
        order = sorted((i for i, k in enumerate(choice.budgets) if k > 0), key=lambda i: -choice.budgets[i])
        slots = [plan.rows[i] for i in order]
        lengths = [plan.lengths[i] for i in order]
        budgets = [choice.budgets[i] for i in order]  # descending: the rows still drafting are a prefix
        self._round = (slots, lengths, budgets, 1)
        state = plan.state  # steps: budgets[0], the longest
        sub = torch.tensor(order, device=self.device)
        rows_t = plan.rows_t[sub]
        lengths_t, keys = plan.lengths_t[sub], state.noise_keys[rows_t]
        presence = state.presence[rows_t].clone() if state.presence is not None else None
        sampling = row_transforms(self.sampling, state.sampling, rows_t)
        gumbel = choice.gumbel[sub] if choice.gumbel is not None else None
        drafts = torch.zeros(len(slots), steps, dtype=torch.long, device=self.device)
        q = torch.zeros(len(slots), steps, probs.shape[-1], device=self.device) if probs is not None else None
        starts = [min(self.valid[slot], n - 1) for slot, n in zip(slots, lengths)]
        logits = self._timed([RowTokens(slot, v, n - v) for slot, v, n in zip(slots, starts, lengths)])
        for i in range(steps):
            n = sum(k > i for k in budgets)
            token = choose_draft(self._align(logits[:n]), i, self.sampling, lengths_t[:n], keys[:n],
                                 presence[:n] if presence is not None else None,
                                 gumbel[:n] if gumbel is not None else None, drafts[:n],
                                 q[:n] if q is not None else None, 0, sampling[:n] if sampling is not None else None)
            if presence is not None:
                presence[torch.arange(n, device=self.device), token] = True
            going = sum(k > i + 1 for k in budgets)
            if going:
                logits = self._timed([RowTokens(slots[j], lengths[j] + i, 1) for j in range(going)], token[:going])
        plan.buffers.drafts[sub, :steps] = drafts
        if q is not None:
            probs[sub, :steps] = q

    def _timed(self, rows: list[RowTokens], tokens: torch.Tensor | None = None) -> torch.Tensor:
        """One packed drafting forward over `rows` (tokens [n]: one per row; None: read them from the
        sequences) -> the logits after each row's last token [n, V]; its (tokens, seconds) are kept for
        the round's cost model."""
        batch = self.runner.pack(rows, keep=[sum(r.count for r in rows[: j + 1]) - 1 for j in range(len(rows))])
        ids = tokens if tokens is not None else self._state.tokens[batch.slots, batch.index]
        started = wall(self.device)
        logits = self.runner.forward_packed(ids, batch)
        self._steps.append((batch.num_tokens, wall(self.device) - started))
        return logits

    def step_times(self) -> list[tuple[int, float]]:
        steps, self._steps = self._steps, []
        return steps

    def step_seconds(self, rows: int, repeats: int, tokens: int | None = None) -> float | None:
        """One drafting forward over `rows` rows of one token, as rounds run it, or (tokens) of that many tokens
        in all, as a first drafting forward feeds rows what their caches lack (startup_costs.py; None where the
        forward does not pack, or the cache cannot hold them)."""
        return self._step_seconds(rows, repeats, tokens)

    def _packed_seconds(self, rows: int, repeats: int, tokens: int | None) -> float | None:
        if tokens is not None and tokens // rows + 1 > self.runner.capacity:
            return None
        return time_packed(self.runner, rows, tokens or rows, repeats=repeats, last_only=True)

    def _row_seconds(self, rows: int, repeats: int, tokens: int | None) -> float | None:
        return time_rows(self.runner, rows, repeats=repeats) if tokens is None else None
