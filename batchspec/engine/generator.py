"""SpecBatchGenerator: B fixed slots; each round schedule -> draft -> verify -> accept -> commit.

Per slot, with seq = prompt + output so far and L = len(seq):
  - admission prefills the whole prompt and takes the first output token from its last logits (as
    generate does), so from then on the target cache holds seq[:L-1]; the last token g = seq[L-1] is pending;
  - a round feeds [g, d_1 .. d_k] at positions L-1 .. L-1+k and gets the target's distribution for
    positions L .. L+k in one forward;
  - acceptance keeps m drafts and one more token (recovered or bonus): L' = L + m + 1;
  - commit sets the cache length to L' - 1, O(1): the rejected entries are stale and never attended.
With captured forwards (a GPU) every round runs every slot, idle ones as padding, at a verify width
from a fixed set, so that each shape is captured once; eager rounds (CPU) run the busy slots only.
Stops (EOS ids, stop strings, max_new_tokens, max_seq_len) are checked on emitted tokens only. There
is one host sync per round: the verdict comes back to decide stops and statistics.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..types import Request, Result, RunStats
from .adaptive import AdaptiveK, RoundTimes, StepTable
from .drafters import Draft, DraftContext, Drafter
from .runner import ModelRunner, to_device
from .sampling import STREAM_RESAMPLE, SamplingParams, coupled_tokens, gumbel_noise, sample, to_probs, uniforms
from .slots import SlotTable, prompt_ids
from .stops import StopRules
from .tree import TreeShape, TreeSpec, compaction, tree_shape
from .verdict import RoundOutcome, decide, decide_tree


@dataclass(slots=True)
class RoundPlan:
    """Who takes part in a round and how many drafts each may propose."""

    rows: list[int]  # slots in this round's forwards (every slot, in order, when static)
    rows_t: torch.Tensor
    lengths: list[int]  # sequence length L of each row (1 for an idle slot)
    lengths_t: torch.Tensor
    busy: list[int]  # indices into rows of the running requests
    budgets: list[int]  # drafts each row may propose this round (0 for idle slots)
    k: int  # the round's number of drafts: the verify width is k + 1
    span: slice | None = None  # rows as a slice when they are consecutive slots
    gumbel: torch.Tensor | None = None  # [b, k + 1, V]: coupled sampling's noise of positions L .. L + k
    tree: TreeShape | None = None  # a tree round: its geometry (k is then its node slots)
    spec: TreeSpec | None = None  # ... and its shape
    shape: int = 0  # what adaptive speculation chose: a chain's k, or k_max + 1 + j for tree j

    @property
    def busy_slots(self) -> list[int]:
        return [self.rows[i] for i in self.busy]


class SpecBatchGenerator:
    """Runs requests through `batch_size` slots; yields a Result as each request finishes.

    Args are plain values: the target model and tokenizer, a Drafter (see drafters.py), the sampling
    params, the slot count, max_seq_len (prompt + completion tokens per slot), max_new_tokens, the EOS
    ids, stop strings, k (the most drafts per row per round), adaptive (choose each round's k), capture
    (None, "static", "cuda_graphs" or "inductor": how the static-shape steps are captured; see
    runner.py), and trees (TreeSpecs of tree rounds; see tree.py): without adaptive every round drafts
    the first tree, with adaptive each round chooses between plain decoding, chains and the trees.
    """

    def __init__(
        self,
        target: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        drafter: Drafter,
        sampling: SamplingParams,
        batch_size: int,
        max_seq_len: int,
        max_new_tokens: int,
        eos_token_ids: Iterable[int],
        stop: Iterable[str] = (),
        k: int = 4,
        adaptive: bool = False,
        profile: bool = False,
        capture: str | None = None,
        trees: tuple[TreeSpec, ...] = (),
    ):
        if batch_size < 1 or k < 0 or max_new_tokens < 1 or max_seq_len < 2:
            raise ValueError(
                f"need batch_size >= 1, k >= 0, max_new_tokens >= 1, max_seq_len >= 2; got "
                f"{batch_size}, {k}, {max_new_tokens}, {max_seq_len}"
            )
        self.tokenizer, self.drafter, self.sampling = tokenizer, drafter, sampling
        self.batch_size, self.max_seq_len, self.max_new_tokens, self.k = batch_size, max_seq_len, max_new_tokens, k
        self.device = target.device
        if trees and not drafter.policy.trees:
            raise ValueError("this drafter proposes no trees")
        self.trees = tuple(trees)
        self.deepest = max([k, *(spec.depth for spec in self.trees)])  # the most drafts a row may need room for
        self.widest = max([k, *(spec.nodes for spec in self.trees)])  # the most tokens a round verifies past the pending one
        # Slack past max_seq_len: rows that draft fewer than the longest row write padding there, and a
        # tree's nodes take scratch entries past its root.
        capacity = max_seq_len + self.widest + 1
        self.runner = ModelRunner(target, num_slots=batch_size, capacity=capacity, max_position=max_seq_len,
                                  capture=capture, widths={*range(1, k + 2), *(s.nodes + 1 for s in self.trees)},
                                  name="target")
        self.static = capture is not None
        self.slots = SlotTable(batch_size, capacity, self.runner.vocab_size, self.device, seed=sampling.seed,
                               track_presence=sampling.repetition_penalty != 1.0)
        self.stops = StopRules(tokenizer, eos_token_ids=eos_token_ids, stop=stop, max_new_tokens=max_new_tokens,
                               max_seq_len=max_seq_len, device=self.device)
        self.stats = RunStats(proposed_by_position=[0] * self.deepest, accepted_by_position=[0] * self.deepest,
                              rounds_by_k=[0] * (k + 1))  # draft positions: a tree has one per depth
        self._admitting = True
        # With adaptive speculation k is the most drafts per round; each round's k is chosen from acceptance and cost.
        self.costs = StepTable(self._step_seconds) if self.static else RoundTimes()
        self.adaptive = (AdaptiveK(k, policy=drafter.policy, costs=self.costs,
                                   tree_depths=tuple(spec.depth for spec in self.trees))
                         if adaptive and (k > 0 or self.trees) else None)
        # Seconds spent per phase. On a GPU the split is only exact with profile=True, which adds a
        # device sync per phase; otherwise work queued in one phase is paid in the next sync.
        self.timings = dict.fromkeys(("admit", "draft", "verify", "accept", "bookkeeping"), 0.0)
        self._sync_phases = profile and self.device.type == "cuda"
        # Coupled sampling's noise is ~20 elementwise passes over [b, k+1, V]; captured runs fuse them into
        # one kernel (a shape's first call compiles it), eager runs keep them as they are.
        self._gumbel = (torch.compile(gumbel_noise, dynamic=False) if capture in ("cuda_graphs", "inductor")
                        else gumbel_noise)
        self.noise_s = 0.0  # seconds making coupled sampling's noise (inside the admit and draft phases)

    @property
    def capture_s(self) -> float:
        """Seconds spent capturing (or compiling) forwards so far, target and draft."""
        draft = getattr(getattr(self.drafter, "runner", None), "capture_s", 0.0)
        return self.runner.capture_s + draft

    def stop_admitting(self) -> None:
        """Finish the requests in flight, take no new ones; run() then returns."""
        self._admitting = False

    # ---- the loop --------------------------------------------------------------------------------

    def run(self, requests: Iterable[Request]) -> Iterator[Result]:
        """Pull requests lazily as slots free up; yield Results in completion order."""
        pending = iter(requests)
        exhausted = False
        while True:
            new = []
            free = self.slots.free()
            while free and self._admitting and not exhausted:
                request = next(pending, None)
                if request is None:
                    exhausted = True
                    break
                ids = prompt_ids(request, self.tokenizer, self.runner.vocab_size, self.max_seq_len)
                if isinstance(ids, str):
                    self.stats.requests += 1
                    self.stats.errors += 1
                    yield Result.error_result(request, ids)
                    continue
                new.append((free.pop(0), request, ids))
            if new:
                mark = time.perf_counter()
                done = self._admit(new)
                self._phase("admit", mark)
                yield from done
            if not self.slots.active():
                if exhausted or not self._admitting:
                    return
                continue
            yield from self.step()

    @torch.inference_mode()
    def step(self) -> list[Result]:
        """One round over the running requests; returns those it finished."""
        started = time.perf_counter()
        plan, draft = self._schedule()
        mark = self._phase("draft", started)
        logits = self._verify(plan, draft)
        mark = self._phase("verify", mark)
        outcome = self._accept(plan, draft, logits)
        mark = self._phase("accept", mark)
        finished = self._commit(plan, outcome)
        self._phase("bookkeeping", mark)
        if self.adaptive:  # the whole round, the drafter's commit included, is the cost of this k
            busy = plan.busy
            self.adaptive.observe(plan.shape, time.perf_counter() - started, plan.busy_slots,
                                  [plan.budgets[i] for i in busy], [outcome.num_drafts[i] for i in busy],
                                  [outcome.num_accepted[i] for i in busy])
        return finished

    # ---- admission -------------------------------------------------------------------------------

    @torch.inference_mode()
    def _admit(self, new: list[tuple[int, Request, list[int]]]) -> list[Result]:
        """Prefill the new rows' prompts and take each row's first token from the prefill's last logits,
        as `generate` does (so a request costs no extra round for it). Returns the requests that this
        first token already finished (EOS, max_new_tokens = 1, a stop string)."""
        self.slots.occupy(new)
        rows = [slot for slot, _, _ in new]
        lengths = [len(ids) for _, _, ids in new]
        if self.adaptive:
            for slot in rows:
                self.adaptive.admit(slot)
        width = max(lengths)
        ids = to_device([ids + [0] * (width - len(ids)) for _, _, ids in new], self.device)
        last = self.runner.prefill(rows, ids, [0] * len(rows), lengths)  # [b, V]
        rows_t, lengths_t = to_device(rows, self.device), to_device(lengths, self.device)
        presence = self.slots.presence[rows_t] if self.slots.presence is not None else None
        if self.sampling.greedy or self.sampling.coupled:  # the noise any pass would use for position len(prompt)
            noise = self._noise(rows_t, lengths_t, 1)[:, 0] if self.sampling.coupled else None
            first = coupled_tokens(last, self.sampling, presence, noise)
        else:  # the same noise a verify pass would use to decide position len(prompt)
            u = uniforms(self.slots.noise_keys[rows_t], lengths_t[:, None], STREAM_RESAMPLE)[:, 0]
            first = sample(to_probs(last, self.sampling, presence), u)
        self.slots.tokens[rows_t, lengths_t] = first
        if self.slots.presence is not None:
            self.slots.presence[rows_t, first] = True
        finished, running = [], []
        for (slot_index, _, ids), token in zip(new, first.tolist()):
            slot = self.slots[slot_index]
            slot.output.append(token)
            slot.length += 1
            reason = self.stops.finish_reason(slot, token in self.stops.eos_ids, 1)
            if reason is not None:
                finished.append(self._finish(slot_index, reason))
            else:
                running.append((slot_index, ids + [token]))
        if running:  # the drafter sees prompt + first token; its last token is fed in the first round
            self.drafter.admit([slot for slot, _ in running], [seq for _, seq in running])
        return finished

    # ---- a round ---------------------------------------------------------------------------------

    def _schedule(self) -> tuple[RoundPlan, Draft]:
        """Choose the rows and the round's shape (a chain of k drafts, or a tree), and get the drafts."""
        rows = list(range(self.batch_size)) if self.static else self.slots.active()
        records = [self.slots[r] for r in rows]
        lengths = [r.length if r is not None else 1 for r in records]
        # room: how many drafts each row can take before max_new_tokens / max_seq_len (0 for an idle slot)
        room = [r.budget(self.deepest, self.max_new_tokens, self.max_seq_len) if r is not None else 0 for r in records]
        most = [min(self.k, n) for n in room]
        busy = [i for i, r in enumerate(records) if r is not None]
        rows_t = self.runner.slot_index if self.static else to_device(rows, self.device)
        lengths_t = self.runner.lengths[rows_t] + 1  # the cache holds seq[:L-1]
        span = slice(rows[0], rows[-1] + 1) if rows and rows[-1] - rows[0] == len(rows) - 1 else None
        ctx = DraftContext(rows, lengths, most, self.slots.tokens, self.slots.presence, self.slots.noise_keys,
                           rows_t=rows_t, lengths_t=lengths_t, static=self.static, span=span)
        base = RoundPlan(rows, rows_t, lengths, lengths_t, busy, most, 0, span)
        if not self.adaptive:
            if self.trees:  # every round drafts the first tree
                return self._tree_round(base, ctx, room, 0)
            return self._chain_round(base, ctx, self.k)
        if self.static:
            self.costs.use_bucket(self.runner.bucket(max(lengths) + self.widest))
        slots, busy_room = [rows[i] for i in busy], [room[i] for i in busy]
        if self.drafter.policy.propose_first:
            # Lookup drafters: proposing is nearly free and bursty (a long match or nothing), so look at
            # what each row proposes first and then choose the verify width from what is on the table.
            draft = self.drafter.propose(ctx)
            proposed = draft.host_num if draft.host_num is not None else most
            shape = self.adaptive.choose(slots, [proposed[i] for i in busy], busy_room)
            if shape > self.k:
                return self._tree_round(base, ctx, room, shape - self.k - 1)
            # a row that proposed less was not refused anything
            return self._chain_round(base, ctx, shape, draft.truncate(shape), [min(shape, n) for n in proposed])
        shape = self.adaptive.choose(slots, [most[i] for i in busy], busy_room)
        if shape > self.k:
            return self._tree_round(base, ctx, room, shape - self.k - 1)
        return self._chain_round(base, ctx, shape)

    def _chain_round(self, plan: RoundPlan, ctx: DraftContext, k: int, draft: Draft | None = None,
                     budgets: list[int] | None = None) -> tuple[RoundPlan, Draft]:
        """A round of chains of at most k drafts (a lookup's proposals may come already made)."""
        plan.budgets = budgets if budgets is not None else [min(k, b) for b in plan.budgets]
        if draft is None:
            ctx.k = plan.budgets
            ctx.gumbel = self._noise(plan.rows_t, plan.lengths_t, 1 + max(plan.budgets)) if self.sampling.coupled else None
            draft = self.drafter.propose(ctx)
        plan.k = plan.shape = draft.tokens.shape[1]
        plan.gumbel = ctx.gumbel
        if self.sampling.coupled and plan.gumbel is None:  # the drafter proposed before the width was chosen
            plan.gumbel = self._noise(plan.rows_t, plan.lengths_t, plan.k + 1)
        return plan, draft

    def _tree_round(self, plan: RoundPlan, ctx: DraftContext, room: list[int], j: int) -> tuple[RoundPlan, Draft]:
        """A round of tree j: each row's tree is as deep as its room allows."""
        spec = self.trees[j]
        ctx.k = plan.budgets = room
        ctx.gumbel = self._noise(plan.rows_t, plan.lengths_t, spec.depth + 1) if self.sampling.coupled else None
        draft = self.drafter.propose_tree(ctx, spec)
        plan.tree, plan.spec, plan.gumbel = tree_shape(draft.parents, draft.valid, spec.depth), spec, ctx.gumbel
        plan.k, plan.shape = draft.tokens.shape[1], self.k + 1 + j
        return plan, draft

    def _verify(self, plan: RoundPlan, draft: Draft) -> torch.Tensor:
        """One target forward over [pending token, drafts] of every row -> logits [b, k+1, V]."""
        pending = self.slots.tokens[plan.rows_t, plan.lengths_t - 1]
        input_ids = torch.cat([pending[:, None], draft.tokens], dim=1)
        kv_len = max(plan.lengths[i] for i in plan.busy) + plan.k
        return self.runner.forward(input_ids, kv_len=kv_len, rows=None if self.static else (plan.span or plan.rows_t),
                                   tree=plan.tree)

    def _accept(self, plan: RoundPlan, draft: Draft, logits: torch.Tensor) -> RoundOutcome:
        """Decide on the device, commit the target's cache lengths and the sequences, then the one sync."""
        rows_t, lengths_t = plan.rows_t, plan.lengths_t
        presence = self.slots.presence[rows_t] if self.slots.presence is not None else None
        if plan.tree is None:
            verdict = decide(logits, draft, sampling=self.sampling, stops=self.stops, lengths=lengths_t,
                             presence=presence, noise_keys=self.slots.noise_keys[rows_t], gumbel=plan.gumbel)
        else:
            verdict = decide_tree(logits, draft, plan.tree, sampling=self.sampling, stops=self.stops,
                                  lengths=lengths_t, presence=presence, noise_keys=self.slots.noise_keys[rows_t],
                                  gumbel=plan.gumbel)
            # The accepted path's keys and values go to the positions they stand for (tree.py).
            src, dst = compaction(lengths_t - 1, verdict.path, verdict.num_accepted)
            self.runner.compact(rows_t, src, dst)
        width = verdict.tokens.shape[1]
        index = torch.arange(width, device=self.device)[None, :]
        self.slots.tokens[rows_t[:, None], lengths_t[:, None] + index] = verdict.tokens  # past num_emit: stale
        # The pending token and the accepted drafts stay cached; idle slots ride along from 0 again.
        kept = lengths_t - 1 + verdict.num_emit
        self.runner.commit(rows_t, torch.where(self.slots.busy[rows_t], kept, 0))
        if presence is not None:
            emitted = (index < verdict.num_emit[:, None]).to(torch.int32)
            seen = torch.zeros_like(presence, dtype=torch.int32).scatter_add_(1, verdict.tokens, emitted)
            self.slots.presence[rows_t] = presence | (seen > 0)
        return verdict.to_host()

    def _commit(self, plan: RoundPlan, outcome: RoundOutcome) -> list[Result]:
        """Host bookkeeping: outputs, per-request and run statistics, stops, the drafter's commit."""
        self.stats.rounds += 1
        if plan.tree is None:
            self.stats.rounds_by_k[plan.k] += 1
        else:
            key = str(plan.spec)
            self.stats.rounds_by_tree[key] = self.stats.rounds_by_tree.get(key, 0) + 1
        finished: list[Result] = []
        emitted, accepted = [], []
        for i in plan.busy:
            row, slot, new = plan.rows[i], self.slots[plan.rows[i]], outcome.emitted[i]
            m, n_drafts = outcome.num_accepted[i], outcome.num_drafts[i]
            # Draft positions: a chain's drafts, a tree's depth (only one node per depth can be accepted).
            positions = outcome.depth[i] if outcome.depth is not None else n_drafts
            before = len(slot.output)
            slot.output.extend(new)
            slot.length += len(new)
            reason = self.stops.finish_reason(slot, outcome.hit_eos[i], len(new))  # a stop string cuts output
            # An EOS or a stop string inside the round cuts it: drafts past the cut were moot, counted
            # neither way (the tokens kept are the accepted drafts first, then the target's own).
            kept_tokens = len(slot.output) - before
            kept = min(m, kept_tokens)
            if kept_tokens < m + 1:
                n_drafts, positions = min(n_drafts, kept_tokens), min(positions, kept_tokens)
            slot.draft_tokens += n_drafts
            slot.accepted_per_round.append(kept)
            slot.drafts_per_round.append(n_drafts)
            slot.tree_per_round.append(str(plan.spec) if plan.tree is not None else "")
            self.stats.add_round_row(positions, kept)
            emitted.append(new)
            accepted.append(m)
            if reason is not None:
                finished.append(self._finish(row, reason))
        if plan.tree is None:
            self.drafter.commit(plan.busy_slots, emitted, accepted)
        else:
            self.drafter.commit(plan.busy_slots, emitted, accepted, path=[outcome.last_node[i] for i in plan.busy])
        return finished

    # ---- finishing -------------------------------------------------------------------------------

    def _finish(self, row: int, reason: str) -> Result:
        slot = self.slots.release(row)
        self.runner.release(row)
        request = slot.request
        prompt = request.prompt if isinstance(request.prompt, str) else self.tokenizer.decode(slot.prompt_ids)
        result = slot.to_result(reason, self.stops.completion(slot, reason), prompt)
        self.stats.add_result(result)
        return result

    def _noise(self, rows_t: torch.Tensor, lengths_t: torch.Tensor, width: int) -> torch.Tensor:
        """Coupled sampling's Gumbel noise for positions L .. L + width - 1 of each row: [b, width, V]."""
        started = self._phase(None, 0.0)
        positions = lengths_t[:, None] + torch.arange(width, device=self.device)
        noise = self._gumbel(self.slots.noise_keys[rows_t], positions, self.runner.vocab_size)
        self.noise_s += self._phase(None, 0.0) - started
        return noise

    def _phase(self, name: str | None, since: float) -> float:
        if self._sync_phases:
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        if name is not None:
            self.timings[name] += now - since
        return now

    def _step_seconds(self, kv_len: int) -> list[float]:
        """Device seconds of a round's forwards at this attended length, for every shape adaptive
        speculation chooses from (k = 0..k_max, then the trees): timed replays of the captured steps."""
        chains = [self.runner.time_step(k + 1, kv_len) + self.drafter.draft_seconds(k, kv_len)
                  for k in range(self.k + 1)]
        trees = [self.runner.time_step(spec.nodes + 1, kv_len, tree=True) + self.drafter.draft_seconds(spec.depth, kv_len)
                 for spec in self.trees]
        return chains + trees
