"""SpecBatchGenerator: B fixed slots, each round draft -> verify -> accept -> per-row rollback -> refill.

Per slot, with the sequence seq = prompt + output so far and L = len(seq):
  - admission prefills the whole prompt and takes the first output token from its last logits (as
    generate does), so from then on the target cache holds seq[:L-1]; the last token g = seq[L-1] is pending;
  - a round feeds [g, d_1 .. d_n] at positions L-1 .. L-1+n (n <= k drafts, 0 allowed) and gets the
    target's distribution for positions L .. L+n in one forward over every active row;
  - acceptance keeps m drafts and one more token (recovered or bonus): L' = L + m + 1;
  - rollback sets the cache length to L' - 1, O(1): the rejected entries are stale and never attended.
Stops (EOS ids, stop strings, max_new_tokens, max_seq_len) are checked on emitted tokens only.
There is one host sync per round: the emitted tokens and counts come back to decide stops and stats.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .adaptive import AdaptiveK
from .drafters import DraftContext, Drafter
from .kv_cache import SlotKVCache, forward
from .sampling import (
    STREAM_ACCEPT, STREAM_RESAMPLE, SamplingParams, greedy_tokens, growing_presence, request_key, sample,
    to_probs, uniforms, verify_greedy, verify_sampling,
)
from ..types import FINISH_LENGTH, FINISH_STOP, Request, Result, RunStats


@dataclass(slots=True)
class Slot:
    """Host-side state of one running request."""

    request: Request
    prompt_ids: list[int]
    length: int  # tokens in seq (prompt + output)
    started: float
    output: list[int] = field(default_factory=list)
    draft_tokens: int = 0
    accepted_per_round: list[int] = field(default_factory=list)


class SpecBatchGenerator:
    """Runs requests through `batch_size` slots; yields a Result as each request finishes.

    Args are plain values: the target model and tokenizer, a Drafter (see drafters.py), the sampling
    params, the slot count, max_seq_len (prompt + completion tokens per slot), max_new_tokens, the EOS
    ids, stop strings, and k (the most drafts per row per round).
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
    ):
        if batch_size < 1 or k < 0 or max_new_tokens < 1 or max_seq_len < 2:
            raise ValueError(
                f"need batch_size >= 1, k >= 0, max_new_tokens >= 1, max_seq_len >= 2; got "
                f"{batch_size}, {k}, {max_new_tokens}, {max_seq_len}"
            )
        self.target, self.tokenizer, self.drafter, self.sampling = target, tokenizer, drafter, sampling
        self.batch_size, self.max_seq_len, self.max_new_tokens, self.k = batch_size, max_seq_len, max_new_tokens, k
        self.stop = tuple(s for s in stop if s)
        # A stop string of L characters spans at most 4L byte-level tokens, not counting special tokens
        # (they decode to nothing): a round only decodes its new tokens and this many before them.
        self.stop_window = 4 * max(map(len, self.stop), default=0) + 8
        self.special_ids = set(tokenizer.all_special_ids)
        self.device = target.device
        self.vocab_size = target.get_output_embeddings().weight.shape[0]
        self.eos_ids = set(eos_token_ids)
        self.eos = torch.tensor(sorted(self.eos_ids), dtype=torch.long, device=self.device)
        # Slack past max_seq_len: rows that draft fewer than the longest row write padding there.
        capacity = max_seq_len + k + 1
        self.cache = SlotKVCache.for_model(target, batch_size, capacity)
        self.tokens = torch.zeros(batch_size, capacity, dtype=torch.long, device=self.device)
        self.noise_keys = torch.zeros(batch_size, dtype=torch.long, device=self.device)
        self.presence = (
            torch.zeros(batch_size, self.vocab_size, dtype=torch.bool, device=self.device)
            if sampling.repetition_penalty != 1.0 else None
        )
        self.slots: list[Slot | None] = [None] * batch_size
        self.stats = RunStats(proposed_by_position=[0] * k, accepted_by_position=[0] * k, rounds_by_k=[0] * (k + 1))
        self._admitting = True
        # With adaptive speculation k is the most drafts per round; each round's k is chosen from acceptance and cost.
        self.adaptive = AdaptiveK(k, lookup=drafter.free_proposals) if adaptive and k > 0 else None
        # Seconds spent per phase. On a GPU the split is only exact with profile=True, which adds a
        # device sync per phase; otherwise work queued in one phase is paid in the next sync.
        self.timings = dict.fromkeys(("admit", "draft", "verify", "accept", "bookkeeping"), 0.0)
        self._sync_phases = profile and self.device.type == "cuda"

    def stop_admitting(self) -> None:
        """Finish the requests in flight, take no new ones; run() then returns."""
        self._admitting = False

    # ---- admission -------------------------------------------------------------------------------

    def _prompt_ids(self, request: Request) -> list[int] | str:
        """Token ids for a request, or an error message."""
        if request.error:
            return request.error
        prompt = request.prompt
        if prompt is None:
            return "prompt is null"
        if isinstance(prompt, str):
            if not prompt.strip():
                return "prompt is empty"
            ids = self.tokenizer(prompt)["input_ids"]
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                return f"prompt token id {bad[0]} is outside the model's vocabulary [0, {self.vocab_size})"
        else:
            return f"prompt must be a string or a list of token ids, got {type(prompt).__name__}"
        if not ids:
            return "prompt is empty after tokenization"
        if len(ids) >= self.max_seq_len:
            return f"prompt has {len(ids)} tokens but max_seq_len is {self.max_seq_len}: no room for a new token"
        return ids

    @torch.inference_mode()
    def _admit(self, new: list[tuple[int, Request, list[int]]]) -> list[Result]:
        """Prefill the new rows' prompts and take each row's first token from the prefill's last logits,
        as `generate` does (so a request costs no extra round for it). Returns the requests that this
        first token already finished (EOS, max_new_tokens = 1, a stop string)."""
        now = time.perf_counter()
        rows = [slot for slot, _, _ in new]
        lengths = [len(ids) for _, _, ids in new]
        for slot, request, ids in new:
            # The prefill is the request's first target forward; it drafts nothing, so it accepts 0.
            self.slots[slot] = Slot(request=request, prompt_ids=ids, length=len(ids), started=now,
                                    accepted_per_round=[0])
            self.tokens[slot, : len(ids)] = torch.tensor(ids, device=self.device)
            self.noise_keys[slot] = request_key(self.sampling.seed, request.id)
            if self.adaptive:
                self.adaptive.admit(slot)
            self.cache.lengths[slot] = len(ids)
            if self.presence is not None:
                self.presence[slot] = False
                self.presence[slot, torch.tensor(ids, device=self.device)] = True
        width = max(lengths)
        input_ids = torch.tensor([ids + [0] * (width - len(ids)) for _, _, ids in new], device=self.device)
        # Logits only at each row's last prompt position (rows are right-padded): the distinct positions
        # for every row, then each row's own column. A 1-D logits_to_keep works in transformers 4.56+.
        keep = sorted(set(n - 1 for n in lengths))
        logits = forward(self.target, self.cache, input_ids, rows, [0] * len(rows), self.max_seq_len,
                         logits_to_keep=torch.tensor(keep, device=self.device))  # [b, len(keep), V]
        column = torch.tensor([keep.index(n - 1) for n in lengths], device=self.device)
        last = logits[torch.arange(len(rows), device=self.device), column]  # [b, V]
        rows_t, lengths_t = torch.tensor(rows, device=self.device), torch.tensor(lengths, device=self.device)
        presence = self.presence[rows_t] if self.presence is not None else None
        if self.sampling.greedy:
            first = greedy_tokens(last, self.sampling, presence)
        else:  # the same noise a verify pass would use to decide position len(prompt)
            u = uniforms(self.noise_keys[rows_t], lengths_t[:, None], STREAM_RESAMPLE)[:, 0]
            first = sample(to_probs(last, self.sampling, presence), u)
        self.tokens[rows_t, lengths_t] = first
        if self.presence is not None:
            self.presence[rows_t, first] = True
        finished, running = [], []
        for (slot_index, _, ids), token in zip(new, first.tolist()):
            slot = self.slots[slot_index]
            slot.output.append(token)
            slot.length += 1
            reason = self._finish_reason(slot, token in self.eos_ids, 1)
            if reason is not None:
                finished.append(self._result(slot_index, slot, reason))
            else:
                running.append((slot_index, ids + [token]))
        if running:  # the drafter sees prompt + first token; its last token is fed in the first round
            self.drafter.admit([slot for slot, _ in running], [ids for _, ids in running])
        return finished

    # ---- the loop --------------------------------------------------------------------------------

    def run(self, requests: Iterable[Request]) -> Iterator[Result]:
        """Pull requests lazily as slots free up; yield Results in completion order."""
        pending = iter(requests)
        exhausted = False
        while True:
            new = []
            free = [s for s, slot in enumerate(self.slots) if slot is None]
            while free and self._admitting and not exhausted:
                request = next(pending, None)
                if request is None:
                    exhausted = True
                    break
                ids = self._prompt_ids(request)
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
            active = [s for s, slot in enumerate(self.slots) if slot is not None]
            if not active:
                if exhausted or not self._admitting:
                    return
                continue
            yield from self._round(active)

    def _draft_budget(self, slot: Slot, k: int) -> int:
        """Drafts this row may propose: at most k, and never more than can still be emitted
        (max_new_tokens) or fit (max_seq_len) — the overflow guard."""
        room = min(self.max_new_tokens - len(slot.output), self.max_seq_len - slot.length) - 1
        return max(0, min(k, room))

    @torch.inference_mode()
    def _round(self, rows: list[int]) -> list[Result]:
        started = time.perf_counter()
        slots = [self.slots[r] for r in rows]
        lengths = [s.length for s in slots]
        most = [self._draft_budget(s, self.k) for s in slots]
        rows_t = torch.tensor(rows, device=self.device)
        lengths_t = torch.tensor(lengths, device=self.device)
        context = DraftContext(rows, lengths, most, self.tokens, self.presence, self.noise_keys)
        if self.adaptive and self.drafter.free_proposals:
            # Lookup drafters: proposing is nearly free and bursty (a long match or nothing), so look at
            # what each row proposes first and then choose the verify width from what is on the table.
            draft = self.drafter.propose(context)
            proposed = draft.host_num if draft.host_num is not None else most
            k = self.adaptive.choose(rows, proposed)
            budgets = [min(k, n) for n in proposed]  # a row that proposed less was not refused anything
            draft = draft.truncate(k)
        else:
            k = self.adaptive.choose(rows, most) if self.adaptive else self.k
            budgets = [min(k, b) for b in most]
            context.k = budgets
            draft = self.drafter.propose(context)
        mark = self._phase("draft", started)
        drafts, num_drafts = draft.tokens, draft.num_tokens
        width = 1 + drafts.shape[1]
        pending = self.tokens[rows_t, lengths_t - 1]
        input_ids = torch.cat([pending[:, None], drafts], dim=1)  # [b, T]
        logits = forward(self.target, self.cache, input_ids, rows, [n - 1 for n in lengths], self.max_seq_len)
        mark = self._phase("verify", mark)

        presence = growing_presence(self.presence[rows_t], drafts, width) if self.presence is not None else None
        if self.sampling.greedy:
            tokens, num_accepted = verify_greedy(greedy_tokens(logits, self.sampling, presence), drafts, num_drafts)
        else:
            p = to_probs(logits, self.sampling, presence)
            q = draft.probs
            keys = self.noise_keys[rows_t]
            positions = lengths_t[:, None] + torch.arange(width, device=self.device)  # position each token decides
            u_accept = uniforms(keys, positions[:, :-1], STREAM_ACCEPT)
            u_resample = uniforms(keys, positions, STREAM_RESAMPLE)
            tokens, num_accepted = verify_sampling(p, drafts, num_drafts, q, u_accept, u_resample)

        # Stops on emitted tokens: cut after the first EOS among the m+1 new tokens.
        index = torch.arange(width, device=self.device)[None, :]
        emitted = index < (num_accepted + 1)[:, None]
        is_eos = torch.isin(tokens, self.eos) & emitted
        first_eos = torch.where(is_eos, index, width).min(dim=1).values
        num_emit = torch.minimum(num_accepted + 1, first_eos + 1)
        self.tokens[rows_t[:, None], lengths_t[:, None] + index] = tokens  # past num_emit: stale, harmless
        flags = [num_emit, num_accepted, (first_eos < width).long(), num_drafts]
        host = torch.cat([tokens, torch.stack(flags, dim=1)], dim=1).tolist()  # the round's one host sync
        mark = self._phase("accept", mark)

        self.stats.rounds += 1
        self.stats.rounds_by_k[width - 1] += 1
        finished: list[Result] = []
        emitted_lists, accepted_list, new_lengths = [], [], []
        for row, slot, values in zip(rows, slots, host):
            num, m, hit_eos, n_drafts = values[width:]
            new = values[:num]
            # An EOS inside the round cuts it: drafts past the cut were moot, counted neither way.
            accepted = min(m, num)
            n_drafts = min(n_drafts, num) if num < m + 1 else n_drafts
            slot.output.extend(new)
            slot.length += num
            slot.draft_tokens += n_drafts
            slot.accepted_per_round.append(accepted)
            for i in range(n_drafts):
                self.stats.proposed_by_position[i] += 1
            for i in range(accepted):
                self.stats.accepted_by_position[i] += 1
            self.stats.rejected_rounds += accepted < n_drafts
            emitted_lists.append(new)
            accepted_list.append(m)
            new_lengths.append(slot.length - 1)
            reason = self._finish_reason(slot, bool(hit_eos), len(new))
            if reason is not None:
                finished.append(self._result(row, slot, reason))
        self.cache.rollback(rows, new_lengths)
        self.drafter.commit(rows, emitted_lists, accepted_list)
        if self.presence is not None:
            flat_rows = [r for r, new in zip(rows, emitted_lists) for _ in new]
            flat_tokens = [t for new in emitted_lists for t in new]
            self.presence[torch.tensor(flat_rows, device=self.device), torch.tensor(flat_tokens, device=self.device)] = True
        self._phase("bookkeeping", mark)
        if self.adaptive:  # the whole round, the drafter's commit included, is the cost of this k
            self.adaptive.observe(k, time.perf_counter() - started, rows, budgets,
                                  [values[width + 3] for values in host], [values[width + 1] for values in host])
        return finished

    def _phase(self, name: str, since: float) -> float:
        if self._sync_phases:
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.timings[name] += now - since
        return now

    # ---- finishing -------------------------------------------------------------------------------

    def _finish_reason(self, slot: Slot, hit_eos: bool, num_new: int) -> str | None:
        if hit_eos:
            return FINISH_STOP
        if self.stop and self._cut_at_stop(slot, num_new):
            return FINISH_STOP
        if len(slot.output) >= self.max_new_tokens or slot.length >= self.max_seq_len:
            return FINISH_LENGTH
        return None

    def _cut_at_stop(self, slot: Slot, num_new: int) -> bool:
        """If the decoded output contains a stop string, keep the shortest token prefix whose text
        contains it (the tokens that produced it) and return True.

        Earlier rounds found no stop string, so a new one must end in this round's `num_new` tokens:
        decoding only the tail keeps a long completion from costing a full decode every round.
        """
        output, start, need = slot.output, len(slot.output), num_new + self.stop_window
        while start > 0 and need > 0:
            start -= 1
            need -= output[start] not in self.special_ids
        tail = self.tokenizer.decode(output[start:], skip_special_tokens=True)
        if not any(s in tail for s in self.stop):
            return False
        for n in range(len(slot.output) - num_new + 1, len(slot.output) + 1):  # shorter prefixes had no stop
            if any(s in self.tokenizer.decode(slot.output[:n], skip_special_tokens=True) for s in self.stop):
                slot.length -= len(slot.output) - n
                del slot.output[n:]
                return True
        return True

    def _result(self, row: int, slot: Slot, reason: str) -> Result:
        self.slots[row] = None
        completion = self.tokenizer.decode(slot.output, skip_special_tokens=True)
        if reason == FINISH_STOP and self.stop:
            cut = [completion.find(s) for s in self.stop if s in completion]
            if cut:
                completion = completion[: min(cut)]
        forwards = len(slot.accepted_per_round)
        accepted = sum(slot.accepted_per_round)
        request = slot.request
        prompt = request.prompt if isinstance(request.prompt, str) else self.tokenizer.decode(slot.prompt_ids)
        stats = self.stats
        stats.requests += 1
        stats.prompt_tokens += len(slot.prompt_ids)
        stats.completion_tokens += len(slot.output)
        stats.target_forwards += forwards
        stats.draft_tokens += slot.draft_tokens
        stats.accepted_tokens += accepted
        return Result(
            id=request.id, prompt=prompt, completion=completion, completion_token_ids=list(slot.output),
            finish_reason=reason, error=None, prompt_tokens=len(slot.prompt_ids),
            completion_tokens=len(slot.output), target_forwards=forwards, draft_tokens=slot.draft_tokens,
            accepted_tokens=accepted, acceptance_rate=accepted / slot.draft_tokens if slot.draft_tokens else None,
            tokens_per_forward=len(slot.output) / forwards if forwards else None,
            accepted_per_round=list(slot.accepted_per_round), latency_s=time.perf_counter() - slot.started,
            extra=dict(request.extra),
        )
