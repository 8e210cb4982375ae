"""Which request sits in which slot: host records (`SlotTable`), the rows whose prompts packed rounds bring in
(`PromptFills`) and the per-slot device state (`SlotState`).

The host record (`Slot`) holds what stops, statistics and results need: the output so far, and from it
the sequence length L (prompt + output). The device state holds what a round reads without a host sync:
every slot's sequence, its noise key and (for the repetition penalty) which tokens its context contains.
The target's cached length, L - 1, lives in its ModelRunner; the host's L is updated from each round's
one host read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .types import Request, Result
from .model.host_device import HostBuffer
from .sampling import RowSampling


@dataclass(slots=True)
class Slot:
    """Host-side state of one running request."""

    request: Request
    prompt_ids: list[int]
    started: float
    max_new_tokens: int
    stop: tuple[str, ...] = ()
    logprobs: int | None = None  # alternatives per completion token (None: no logprobs)
    output: list[int] = field(default_factory=list)
    stop_reason: str | int | None = None
    token_logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[float]] = field(default_factory=list)
    top_logprob_ids: list[list[int]] = field(default_factory=list)
    prompt_logprobs: tuple | None = None  # (logprobs, top values, top ids) of the prompt's tokens
    awaiting_first: bool = True  # its first token (drawn at admission) has not reached the host yet
    first_drawn: bool = False  # its first token was drawn on the device at admission (the static path): it
    #   reaches the host as the pending token of its first round; else eager admission brought it to the host
    #   at once, or a packed round decides it
    # Prefilled inside packed rounds (eager): prompt tokens (of its first P - 1) not yet in the target's
    # cache, and the slot of the sample of the same request whose prompt cache this row copies.
    unfilled: int = 0
    copies: int | None = None
    draft_tokens: int = 0
    accepted_per_round: list[int] = field(default_factory=list)
    drafts_per_round: list[int] = field(default_factory=list)
    tree_per_round: list[str] = field(default_factory=list)
    forced_tokens: int = 0  # drafts its grammar forced (structured output)
    forced_accepted: int = 0  # of those, the ones the target accepted
    structured_complete: bool | None = None  # set as it finishes: its output matches its grammar whole

    @property
    def num_output(self) -> int:
        return len(self.output) + self.awaiting_first

    @property
    def length(self) -> int:
        """Tokens in seq (prompt + output), the first token included while it is awaited: the L of a round
        (the target's cache holds L - 1; derived, never stored, so that a cut output cannot leave it behind)."""
        return len(self.prompt_ids) + self.num_output

    def room(self, max_seq_len: int) -> int:
        """Drafts this row could propose before its max_new_tokens or max_seq_len (the overflow guard); 0
        while its first token is awaited (a host drafter has not seen its context yet)."""
        if self.awaiting_first:
            return 0
        return max(0, min(self.max_new_tokens - self.num_output, max_seq_len - self.length) - 1)

    def add_logprobs(self, values: list[float], top: list[list[float]], ids: list[list[int]]) -> None:
        """The logprobs of tokens just appended to the output (only as many as were kept)."""
        if self.logprobs is not None:
            self.token_logprobs += values
            self.top_logprobs += [t[: self.logprobs] for t in top]
            self.top_logprob_ids += [i[: self.logprobs] for i in ids]

    def cut_logprobs(self) -> None:
        """Drop the logprobs of tokens a stop string cut away."""
        n = len(self.output)
        del self.token_logprobs[n:], self.top_logprobs[n:], self.top_logprob_ids[n:]

    def to_result(self, reason: str, completion: str, prompt: str) -> Result:
        forwards = len(self.accepted_per_round)
        accepted = sum(self.accepted_per_round)
        request = self.request
        return Result(
            id=request.id, prompt=prompt, completion=completion, completion_token_ids=list(self.output),
            finish_reason=reason, error=None, prompt_tokens=len(self.prompt_ids),
            completion_tokens=len(self.output), target_forwards=forwards, draft_tokens=self.draft_tokens,
            accepted_tokens=accepted, acceptance_rate=accepted / self.draft_tokens if self.draft_tokens else None,
            tokens_per_forward=len(self.output) / forwards if forwards else None,
            accepted_per_round=list(self.accepted_per_round), drafts_per_round=list(self.drafts_per_round),
            tree_per_round=list(self.tree_per_round),
            latency_s=time.perf_counter() - self.started,
            extra=dict(request.extra), sample_index=request.sample_index, stop_reason=self.stop_reason,
            logprobs=list(self.token_logprobs) if self.logprobs is not None else None,
            top_logprobs=list(self.top_logprobs) if self.logprobs is not None else None,
            top_logprob_ids=list(self.top_logprob_ids) if self.logprobs is not None else None,
            prompt_logprobs=self.prompt_logprobs[0] if self.prompt_logprobs else None,
            prompt_top_logprobs=self.prompt_logprobs[1] if self.prompt_logprobs else None,
            prompt_top_logprob_ids=self.prompt_logprobs[2] if self.prompt_logprobs else None,
            forced_tokens=self.forced_tokens, forced_accepted=self.forced_accepted,
            structured_complete=self.structured_complete,
        )


class SlotTable:
    """num_slots host records (None = idle)."""

    def __init__(self, num_slots: int):
        self.records: list[Slot | None] = [None] * num_slots

    def __getitem__(self, slot: int) -> Slot | None:
        return self.records[slot]

    def free(self) -> list[int]:
        return [s for s, record in enumerate(self.records) if record is None]

    def active(self) -> list[int]:
        return [s for s, record in enumerate(self.records) if record is not None]

    def every_slot(self) -> list[int]:
        """The static path's rows: every slot in order (idle slots ride along with no drafts)."""
        return list(range(len(self.records)))

    def active_span(self) -> list[int]:
        """An unpacked eager round's rows: the running slots, with the idle ones between them riding along (as
        on the static path) when they are few: eager forwards read a consecutive span of slots as views, and any
        other set of rows as a gather of every layer's cache (about 10% of a round at batch 32 on the demo
        target, more than a few padding rows cost)."""
        active = self.active()
        if not active:
            return active
        holes = active[-1] - active[0] + 1 - len(active)
        if 0 < holes <= max(2, len(active) // 4):
            return list(range(active[0], active[-1] + 1))
        return active

    def occupy(self, slot: int, request: Request, prompt_ids: list[int], *, max_new_tokens: int,
               stop: tuple[str, ...], logprobs: int | None) -> Slot:
        # The prefill is the request's first target forward; it drafts nothing, so it accepts 0. Its first
        # token counts in `length` (awaiting_first) until it reaches the host and joins the output.
        record = Slot(request=request, prompt_ids=prompt_ids, started=time.perf_counter(),
                      max_new_tokens=max_new_tokens, stop=stop, logprobs=logprobs,
                      accepted_per_round=[0], drafts_per_round=[0], tree_per_round=[""])
        self.records[slot] = record
        return record

    def release(self, slot: int) -> Slot:
        record, self.records[slot] = self.records[slot], None
        return record


class PromptFills:
    """The rows of `table` whose prompts packed rounds prefill (their first P - 1 tokens, in chunks; the last
    is the pending token of their first decision), in admission order: the first sample of a request fills,
    its other samples copy its cache once that is in (Slot.unfilled, Slot.copies)."""

    def __init__(self, table: SlotTable):
        self.table = table
        self.slots: list[int] = []

    def add(self, seats) -> None:
        """Seats (intake.Seat) whose prompts the next packed rounds fill in."""
        primary: dict[int, int] = {}
        for seat in seats:
            record = self.table[seat.slot]
            if len(seat.prompt_ids) == 1:  # a one-token prompt is its pending token: nothing to fill or copy
                continue
            first = primary.setdefault(seat.admission.group, seat.slot)
            if first == seat.slot:
                record.unfilled = len(seat.prompt_ids) - 1
            else:
                record.copies = first
            self.slots.append(seat.slot)

    def plan(self, budget: int) -> tuple[list[tuple[int, int, int]], dict[int, int]]:
        """A round's prompt chunks (slot, start, count), first come first served within `budget` tokens, and
        each chunked slot's tokens left unfilled after them."""
        fills, left = [], {}
        for slot in self.slots:
            record = self.table[slot]
            if record.copies is not None or record.unfilled == 0 or budget == 0:
                continue
            count = min(record.unfilled, budget)
            fills.append((slot, len(record.prompt_ids) - 1 - record.unfilled, count))
            left[slot] = record.unfilled - count
            budget -= count
        return fills, left

    def drop(self) -> None:
        """No prompt is left to fill (a job cut short: its rows end as they stand)."""
        self.slots = []

    def samples_of(self, slot: int) -> list[int]:
        """The slot and those of the other samples of its request that copy its prompt cache."""
        return [slot] + [s for s in self.slots if self.table[s] is not None and self.table[s].copies == slot]

    def book(self, fills: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
        """A round will write these chunks: the rows' unfilled counts move on. Returns the copies then due
        (source slot, destination slot, entries): the other samples of a request whose prompt is in."""
        done = set()
        for slot, _, count in fills:
            record = self.table[slot]
            record.unfilled -= count
            if record.unfilled == 0:
                done.add(slot)
        copies = []
        for slot in self.slots:
            record = self.table[slot]
            if record is not None and record.copies in done:
                copies.append((record.copies, slot, len(record.prompt_ids) - 1))
                record.copies = None
        self.slots = [s for s in self.slots if self.table[s] is not None
                      and (self.table[s].unfilled > 0 or self.table[s].copies is not None)]
        return copies


class SlotState:
    """Per-slot device state: tokens [B, capacity] each slot's sequence (prompt + output, valid up to its
    length), noise_keys [B] each request's key for counter-based noise, busy [B] which slots run a
    request, presence [B, V] (only with a repetition penalty) whether each token occurs in the sequence."""

    def __init__(self, num_slots: int, capacity: int, vocab_size: int, device: torch.device, *,
                 track_presence: bool):
        self.device = device
        self.tokens = torch.zeros(num_slots, capacity, dtype=torch.long, device=device)
        self.noise_keys = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.busy = torch.zeros(num_slots, dtype=torch.bool, device=device)
        self.presence = (torch.zeros(num_slots, vocab_size, dtype=torch.bool, device=device)
                         if track_presence else None)
        self.sampling = RowSampling.zeros(num_slots, device)  # each slot's transforms (sampling.py)
        self._prompts = HostBuffer((num_slots, capacity), device)
        self._seats = HostBuffer((3, num_slots), device)  # slot, prompt length, noise key of each new row
        self._rows = HostBuffer((len(RowSampling.FIELDS), num_slots), device, dtype=torch.float64)

    def seat(self, slots: list[int], prompts: list[list[int]], keys: list[int], sampling: list[tuple]) -> None:
        """New requests take `slots`: their prompts fill the slots' sequences, keys [n] are their noise keys,
        sampling [n] their RowSampling.values (a few copies and ops per admission, whatever its size)."""
        width = max(len(p) for p in prompts)
        ids = self._prompts.put([p + [0] * (width - len(p)) for p in prompts])  # [n, W]
        seats = self._seats.put([slots, [len(p) for p in prompts], keys])
        rows = seats[0]
        self.write(rows, torch.zeros_like(rows), ids)
        self.noise_keys[rows] = seats[2]
        self.busy[rows] = True
        values = self._rows.put([list(column) for column in zip(*sampling)])  # [fields, n]
        for name, column in zip(RowSampling.FIELDS, values):
            target = getattr(self.sampling, name)
            target[rows] = column.to(target.dtype)
        if self.presence is not None:
            inside = torch.arange(width, device=self.device)[None, :] < seats[1][:, None]
            seen = torch.zeros(len(slots), self.presence.shape[1], dtype=torch.int32, device=self.device)
            seen.scatter_add_(1, ids, inside.to(torch.int32))
            self.presence[rows] = seen > 0

    def write(self, rows: torch.Tensor, starts: torch.Tensor, tokens: torch.Tensor) -> None:
        """tokens [n, W] into the sequences of rows [n] at positions starts [n] .. starts + W - 1: a new
        row's prompt, a round's drafts (where its verify pass reads them), the tokens a verdict emitted (stale
        past each row's count) or a new row's first token. The one place a sequence is written."""
        index = starts[:, None] + torch.arange(tokens.shape[1], device=self.device)
        self.tokens[rows[:, None], index] = tokens
