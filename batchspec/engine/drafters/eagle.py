"""An EAGLE-3 head as the drafter: one decoder layer over the target's own hidden states (batchspec/eagle).

Alignment (batchspec/eagle/head.py): the head's entry at position p reads the target's features of
position p and the token at p + 1, and predicts the token at p + 2. A round over a row of length L (the
pending token at L - 1) needs the head's entries up to L - 2: the first step computes every entry the
head lacks, valid .. L - 2, from the target features the last verify pass left (stashed per slot, along
the accepted path) and the tokens after them; its output at L - 2 is the first draft. Each later step
feeds the draft just made with the head's own output, one position further. After the verdict the
head is valid up to L - 1 entries (its drafted entries are stale) and the stash holds the features of
the accepted positions L - 1 .. L - 1 + m: exactly what the next round's first step computes.
The captured (static) path runs the first step for every row every round; eager rounds only for the rows that
draft, or whose stash would overflow (`lag_max` entries): the others' features wait in the stash, as do a packed
round's prompt features (where they fit), so a row that never drafts never costs a head forward (docs/eagle.md).
"""

from __future__ import annotations

import torch

from ..types import TreeSpec
from ..model.graphs import StepGraphs
from ..model.host_device import wall
from ..round import Choice, Draft, Plan, RoundBuffers, RoundShape
from ..model.runner import ModelRunner
from ..model.timing import time_rows
from ..sampling import SamplingParams, row_transforms
from ..slots import SlotState
from .base import DrafterPolicy, empty_draft
from .choosing import buffered_draft, choose_draft, laid_out_draft, no_tree
from .eagle_static import EagleStaticSteps
from .head_model import HeadAsModel

EAGLE_POLICY = DrafterPolicy(draft_forwards=True, trees=True)
LAG_MAX = 4096  # eager: the most stashed entries a row holds before its first step must catch it up
STASH_BYTES = 256 * 2**20  # eager: the stash's size in all, which bounds lag_max below LAG_MAX (16 at least)


class EagleDrafter:
    policy = EAGLE_POLICY

    def __init__(self, head, *, num_slots: int, capacity: int, max_position: int, target_vocab_size: int,
                 sampling: SamplingParams, graphs: StepGraphs, k_max: int, trees: tuple[TreeSpec, ...] = (),
                 buckets: list[int] | None = None):
        self.head = head
        self.feature_layers = tuple(head.config.target_layer_ids)  # what the target's runner hands out
        self.catch_up = max([k_max, *(t.depth for t in trees)]) + 1  # the most entries a first step computes
        self.runner = ModelRunner(HeadAsModel(head, target_vocab_size), num_slots=num_slots, capacity=capacity,
                                  max_position=max_position, graphs=graphs, widths=(1, self.catch_up),
                                  buckets=buckets, name="eagle", feature_layers=(0,))
        self.sampling, self.graphs, self.device = sampling, graphs, self.runner.device
        self.num_slots, width = num_slots, head.config.target_hidden_size * len(self.feature_layers)
        # The static path's first step reads exactly catch_up entries; an eager row may lag lag_max entries
        # behind (its whole prompt, deferred), and the verdict then appends up to catch_up more.
        fits = STASH_BYTES // (num_slots * width * torch.finfo(self.runner.model.dtype).bits // 8) - self.catch_up
        self.lag_max = 0 if self.runner.static else min(LAG_MAX, capacity, max(fits, min(LAG_MAX, 16)))
        entries = self.lag_max + self.catch_up
        self.stash = torch.zeros(num_slots, entries, width, dtype=self.runner.model.dtype, device=self.device)
        self.out = torch.zeros(num_slots, 1, head.config.hidden_size, dtype=self.runner.model.dtype, device=self.device)
        self.valid = [0] * num_slots  # per slot: the head's entries known to be right (host)
        self.waiting: dict[int, int] = {}  # slot -> P - 1 while packed rounds bring its prompt in
        self._round: tuple | None = None
        self._verify_index: torch.Tensor | None = None  # packed: the last forward's [b, W] verify positions
        self._ran: set[int] = set()  # slots whose first step ran in the last round (the others lag)
        self._target: ModelRunner | None = None
        self.static_steps = (EagleStaticSteps(self.runner, graphs, sampling, stash=self.stash, out=self.out,
                                              catch_up=self.catch_up) if self.runner.static else None)
        self._steps: list[tuple[int, float]] = []  # the last round's drafting forwards after the first: (rows, seconds)
        # The path is chosen once: captured steps over every slot, or eager steps over the rows that draft.
        self._draft_steps = self._captured_steps if self.runner.static else self._eager_steps
        self._buffered = laid_out_draft if self.runner.static else buffered_draft
        self._stash_kept = self._captured_stash if self.runner.static else self._eager_stash

    def bind(self, shapes: list[RoundShape], target: ModelRunner, state: SlotState, buffers: RoundBuffers,
             acceptor) -> None:
        """The generator's device state; on the static path, declare the steps: each drafting step of each
        shape over each bucket, and the stash's update for each verify width."""
        self._target, self._state, self._acceptor = target, state, acceptor
        if self.static_steps is not None:
            self.static_steps.bind(shapes, target, state, buffers, acceptor)

    @torch.inference_mode()
    def admit(self, slots, prompts, features: list[torch.Tensor] | None = None):
        """The head's entries over each prompt: position p from the target's features of p and token p + 1 (0 ..
        P - 2); P - 1's features wait in the stash. features: per seat, the target's over its prompt [P, F] (its
        eager prefill); None when packed rounds prefill the prompts (packed_forward takes them chunk by chunk)."""
        if features is None:
            for slot, prompt in zip(slots, prompts):
                self.valid[slot], self.waiting[slot] = 0, len(prompt) - 1
            return
        todo = [(slot, p, f) for slot, p, f in zip(slots, prompts, features) if len(p) > 1]
        if todo:
            width = max(len(p) - 1 for _, p, _ in todo)
            ids = torch.tensor([p[1:] + [0] * (width - len(p) + 1) for _, p, _ in todo], device=self.device)
            hidden = torch.stack([torch.nn.functional.pad(f[:-1], (0, 0, 0, width - len(f) + 1)) for _, _, f in todo])
            self.runner.prefill([s for s, _, _ in todo], ids, [0] * len(todo), [len(p) - 1 for _, p, _ in todo],
                                extra={"hidden": hidden.to(self.stash.dtype)})
        index = torch.tensor(slots, device=self.device)
        self.stash[index, 0] = torch.stack([f[-1] for f in features]).to(self.stash.dtype)
        for slot, prompt in zip(slots, prompts):
            self.valid[slot] = len(prompt) - 1

    def learn_pending(self):
        pass  # its entries are device work, written in the forwards that make them

    @torch.inference_mode()
    def packed_forward(self, chunks, verify_index):
        """A packed forward just ran: the head's entries over its prompt chunks (slot, start, count, at: the chunk's
        first token in it), or for a prompt that fits their features into the stash; verify_index [b, W] (each
        deciding row's verify positions) is where extend finds the features of the tokens the rows keep."""
        self._verify_index = verify_index
        chunks = [c for c in chunks if c[0] in self.waiting]
        if not chunks:
            return
        features, computed = self._target.features, []  # [N, F]
        for slot, start, count, at in chunks:
            if self.waiting[slot] <= self.lag_max:  # deferred: entry p is position p's (valid = 0)
                self.stash[slot, start:start + count] = features[at:at + count].to(self.stash.dtype)
            else:
                computed.append((slot, start, count, at))
        if computed:
            self._prompt_entries(computed, features)
        for slot, start, count, _ in chunks:
            if start + count >= self.waiting[slot]:
                del self.waiting[slot]

    def _prompt_entries(self, chunks, features: torch.Tensor) -> None:
        """The head's entries over prompt chunks (slot, start, count, at) from the forward's features [N, F]."""
        slots, starts, counts, ats = (torch.tensor(c, device=self.device) for c in zip(*chunks))
        arange = torch.arange(max(c[2] for c in chunks), device=self.device)  # the host's width: no sync
        tokens = self._state.tokens  # [B, S]
        ids = tokens[slots[:, None], (starts[:, None] + 1 + arange).clamp(max=tokens.shape[1] - 1)]
        inside = (arange < counts[:, None])[..., None]
        hidden = features[(ats[:, None] + arange).clamp(max=features.shape[0] - 1)] * inside
        self.runner.prefill([c[0] for c in chunks], ids, [c[1] for c in chunks], [c[2] for c in chunks],
                            extra={"hidden": hidden.to(self.stash.dtype)})
        for slot, start, count, _ in chunks:
            self.valid[slot] = start + count

    def extend(self, slots, emitted, num_accepted, path=None):
        """After the verdict: the head is valid up to L - 1 entries of each row whose first step ran, and the stash
        takes the verify pass's features along the accepted path (what the next first step reads)."""
        if self._round is None:
            return
        (rows, lengths), self._round = self._round, None
        by_slot = dict(zip(rows, lengths))
        for slot in slots:
            if slot in self._ran:
                self.valid[slot] = by_slot[slot] - 1
        self._stash_kept(rows, lengths, self._target.features)

    def _captured_stash(self, rows: list[int], lengths: list[int], features: torch.Tensor) -> None:
        self.static_steps.stash_from(features.shape[1])  # [B, W, F]: every slot's, by slot

    def _eager_stash(self, rows: list[int], lengths: list[int], features: torch.Tensor) -> None:
        """Features [b, T, F] (rows' order; packed: [N, F]) along the accepted paths, after what each row holds."""
        if features.dim() == 2:  # a packed forward's [N, F]: each row's verify positions at verify_index
            where = self._verify_index
            along = self._acceptor.path_out[: len(rows), : where.shape[1]]
            gathered = features[where.gather(1, along)][:, : self.catch_up]
        else:
            along = self._acceptor.path_out[: len(rows), : features.shape[1]]  # [b, E] verify positions kept
            gathered = features.gather(1, along[:, :, None].expand(-1, -1, features.shape[-1]))[:, : self.catch_up]
        index = torch.tensor(rows, device=self.device)
        held = torch.tensor([0 if r in self._ran else n - 1 - self.valid[r] for r, n in zip(rows, lengths)],
                            device=self.device)  # entries each row already holds: where its new ones go
        at = held[:, None] + torch.arange(gathered.shape[1], device=self.device)
        self.stash[index[:, None], at] = gathered.to(self.stash.dtype)

    def release(self, slots):
        pass

    def lags(self, slots, lengths):
        """Per row the head's entries its first step computes before its first draft (valid .. L - 2)."""
        return [max(n - 1 - self.valid[s], 0) for s, n in zip(slots, lengths)]

    @torch.inference_mode()
    def propose(self, plan: Plan, choice: Choice) -> Draft:
        return self._propose(plan, choice, None)

    @torch.inference_mode()
    def propose_tree(self, plan: Plan, choice: Choice, spec: TreeSpec) -> Draft:
        """A spine with side branches (as the draft model's: the head's chain and its next guesses beside
        each spine token)."""
        return self._propose(plan, choice, spec)

    def _propose(self, plan: Plan, choice: Choice, spec: TreeSpec | None) -> Draft:
        b, buffers = len(plan.rows), plan.buffers
        depth = spec.depth if spec is not None else max(choice.budgets, default=0)
        steps = min(depth, max(choice.budgets, default=0))
        num = buffers.put_num_drafts([min(k, depth) for k in choice.budgets])
        branching = spec.branching if spec is not None else 0
        rejection = not (self.sampling.greedy or self.sampling.coupled)
        probs = (buffers.q_at if spec is not None else buffers.probs) if rejection else None
        self._draft_steps(plan, choice, max(steps, 1), branching, probs, steps > 0, spec)
        self._round = (list(plan.rows), list(plan.lengths))
        if steps == 0:
            return empty_draft(buffers, b) if spec is None else no_tree(buffers, b, spec)
        return self._buffered(plan, choice.budgets, steps, num, probs, spec, self.device)

    def _captured_steps(self, plan: Plan, choice: Choice, steps: int, branching: int, probs, draft, spec) -> None:
        self.static_steps.run(plan.lengths, *self._first_entries(plan), steps, spec)  # the first step: every row
        self._ran = set(plan.rows)

    def _eager_steps(self, plan: Plan, choice: Choice, steps: int, branching: int, probs, draft: bool,
                     spec: TreeSpec | None) -> None:
        """The first step (the entries each row lacks, up to L - 2), then one drafted token per step."""
        runner, b, state = self.runner, len(plan.rows), plan.state
        rows = plan.rows_t
        kv_len = max(plan.lengths) - 1 + steps
        # The first step runs for the rows that draft (in a tree round every row) or whose stash would overflow;
        # the others, and rows whose prompt is still coming in, sit it out (their entries wait in the stash).
        starts, counts = self._first_entries(plan)
        drafting = [draft and (branching > 0 or k > 0) for k in choice.budgets]
        run = [i for i, slot in enumerate(plan.rows)
               if slot not in self.waiting and (drafting[i] or counts[i] > self.lag_max)]
        self._ran = {plan.rows[i] for i in run}
        if not run:
            return
        logits, out = self._first_step(plan, run, starts, counts, kv_len)
        if not draft:
            return
        # Rows drafting further come first, so that those still drafting at step i are a prefix (a tree
        # round drafts every row to its depth).
        budgets = [steps] * b if branching else list(choice.budgets)
        order = sorted(range(b), key=lambda i: -budgets[i])
        budgets = [budgets[i] for i in order]
        perm = torch.tensor(order, device=self.device)
        rows, logits, out, lengths = rows[perm], logits[perm], out[perm], plan.lengths_t[perm]
        presence = state.presence[rows].clone() if state.presence is not None else None
        keys = state.noise_keys[rows]
        sampling = row_transforms(self.sampling, state.sampling, rows)
        gumbel = choice.gumbel[perm] if choice.gumbel is not None else None
        drafts = torch.zeros_like(plan.buffers.drafts[:b])
        q = torch.zeros_like(probs[:b]) if probs is not None else None
        for i in range(steps):
            n = sum(k > i for k in budgets)
            token = choose_draft(logits[:n], i, self.sampling, lengths[:n], keys[:n],
                                 presence[:n] if presence is not None else None,
                                 gumbel[:n] if gumbel is not None else None, drafts[:n],
                                 q[:n] if q is not None else None, branching, sampling[:n] if sampling is not None else None)
            if presence is not None:
                presence[torch.arange(n, device=self.device), token] = True
            going = sum(k > i + 1 for k in budgets)
            if going:
                runner.set_lengths(rows[:going], lengths[:going] - 2 + i + 1)
                started = wall(self.device)
                logits = runner.forward(token[:going, None], kv_len=kv_len, rows=rows[:going],
                                        extra={"hidden": out[:going]})[:, -1]
                self._steps.append((going, wall(self.device) - started))
                out = runner.features
        plan.buffers.drafts[perm] = drafts
        if q is not None:
            probs[perm] = q

    def _first_step(self, plan: Plan, run: list[int], starts: list[int], counts: list[int],
                    kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's first forward over the rows `run` (indices into plan.rows), counts[i] entries from starts[i]
        + 1 -> (logits after each row's last entry [b, V], its features [b, 1, H]; zero for the other rows)."""
        runner, b, state = self.runner, len(plan.rows), plan.state
        logits = torch.zeros(b, runner.vocab_size, dtype=self.stash.dtype, device=self.device)
        out = torch.zeros(b, 1, self.out.shape[-1], dtype=self.stash.dtype, device=self.device)
        # A forward pads every row to its longest: rows as far behind within 2x share one (a deferred prompt
        # padded the rest: fixed k=2 at batch 32 on SmolLM2's head ran 0.55x drafter none, grouped 0.83x).
        groups: dict[int, list[int]] = {}
        for i in run:
            groups.setdefault(max(counts[i], self.catch_up).bit_length(), []).append(i)
        for group in groups.values():
            at, width = torch.tensor(group, device=self.device), max(counts[i] for i in group)
            sub, start_t = plan.rows_t[at], torch.tensor([starts[i] for i in group], device=self.device)
            positions = (start_t[:, None] + 1 + torch.arange(width, device=self.device)).clamp(max=state.tokens.shape[1] - 1)
            runner.set_lengths(sub, start_t)
            last = torch.tensor([counts[i] for i in group], device=self.device)[:, None] - 1
            started = wall(self.device)
            logits[at] = runner.forward(state.tokens[sub[:, None], positions], kv_len=kv_len, rows=sub,
                                        extra={"hidden": self.stash[sub, :width]}, keep=last)[:, 0]
            self._steps.append((len(group) * width, wall(self.device) - started))
            out[at] = runner.features.gather(1, last[:, :, None].expand(-1, -1, runner.features.shape[-1]))
        return logits, out

    def draft_seconds(self, k: int, kv_len: int) -> float:
        """0: the captured head steps are not timed apart (adaptive's overhead estimate absorbs them)."""
        return 0.0

    def step_times(self) -> list[tuple[int, float]]:
        """The last round's head forwards (tokens, seconds): the first step, when it ran, and each later one."""
        steps, self._steps = self._steps, []
        return steps

    def step_seconds(self, rows: int, repeats: int, tokens: int | None = None) -> float | None:
        """One head step over `rows` rows of one token (startup_costs.py); None for more (the step line's)."""
        if tokens is not None:
            return None
        hidden = torch.zeros(rows, 1, self.stash.shape[-1], dtype=self.stash.dtype, device=self.device)
        return time_rows(self.runner, rows, repeats=repeats, extra={"hidden": hidden})

    def _first_entries(self, plan: Plan) -> tuple[list[int], list[int]]:
        """Per row, the first head entry the first step computes and how many (up to L - 2). An idle slot on
        the static path (L = 1) computes one throwaway entry at 0."""
        starts = [min(self.valid[r], max(n - 2, 0)) for r, n in zip(plan.rows, plan.lengths)]
        return starts, [max(n - 1 - v, 1) for n, v in zip(plan.lengths, starts)]
