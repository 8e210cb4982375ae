"""Which request sits in which slot: a host record per running request, and the per-slot device state.

The host record (`Slot`) holds what stops, statistics and results need: the output so far and the
sequence length L (prompt + output). The device state (`SlotTable.tokens`, `noise_keys`, `presence`)
holds what a round reads without a host sync: every slot's sequence, its noise key and (for the
repetition penalty) which tokens its context contains. The target's cached length, L - 1, lives in
its ModelRunner; the host mirror L is updated from each round's one sync.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedTokenizerBase

from ..types import Request, Result
from .runner import to_device
from .sampling import request_key


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
    drafts_per_round: list[int] = field(default_factory=list)
    tree_per_round: list[str] = field(default_factory=list)

    def budget(self, k: int, max_new_tokens: int, max_seq_len: int) -> int:
        """Drafts this row may propose: at most k, and never more than can still be emitted
        (max_new_tokens) or fit (max_seq_len) — the overflow guard."""
        room = min(max_new_tokens - len(self.output), max_seq_len - self.length) - 1
        return max(0, min(k, room))

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
            extra=dict(request.extra),
        )


def prompt_ids(request: Request, tokenizer: PreTrainedTokenizerBase, vocab_size: int,
               max_seq_len: int) -> list[int] | str:
    """Token ids for a request, or an error message."""
    if request.error:
        return request.error
    prompt = request.prompt
    if prompt is None:
        return "prompt is null"
    if isinstance(prompt, str):
        if not prompt.strip():
            return "prompt is empty"
        ids = tokenizer(prompt)["input_ids"]
    elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            return f"prompt token id {bad[0]} is outside the model's vocabulary [0, {vocab_size})"
    else:
        return f"prompt must be a string or a list of token ids, got {type(prompt).__name__}"
    if not ids:
        return "prompt is empty after tokenization"
    if len(ids) >= max_seq_len:
        return f"prompt has {len(ids)} tokens but max_seq_len is {max_seq_len}: no room for a new token"
    return ids


class SlotTable:
    """num_slots slots: host records (None = idle) and device state.

    tokens [B, capacity]: each slot's sequence (prompt + output), valid up to its length;
    noise_keys [B]: each request's key for counter-based noise; busy [B]: which slots run a request;
    presence [B, V] (only with a repetition
    penalty): whether each token occurs in the slot's sequence.
    """

    def __init__(self, num_slots: int, capacity: int, vocab_size: int, device: torch.device, *, seed: int,
                 track_presence: bool):
        self.records: list[Slot | None] = [None] * num_slots
        self.seed, self.device = seed, device
        self.tokens = torch.zeros(num_slots, capacity, dtype=torch.long, device=device)
        self.noise_keys = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.busy = torch.zeros(num_slots, dtype=torch.bool, device=device)  # the device copy of `active()`
        self.presence = (torch.zeros(num_slots, vocab_size, dtype=torch.bool, device=device)
                         if track_presence else None)

    def __getitem__(self, slot: int) -> Slot | None:
        return self.records[slot]

    def free(self) -> list[int]:
        return [s for s, record in enumerate(self.records) if record is None]

    def active(self) -> list[int]:
        return [s for s, record in enumerate(self.records) if record is not None]

    def occupy(self, new: list[tuple[int, Request, list[int]]]) -> None:
        """Seat each (slot, request, prompt ids); the prompt fills the slot's sequence."""
        now = time.perf_counter()
        for slot, request, ids in new:
            # The prefill is the request's first target forward; it drafts nothing, so it accepts 0.
            self.records[slot] = Slot(request=request, prompt_ids=ids, length=len(ids), started=now,
                                      accepted_per_round=[0], drafts_per_round=[0], tree_per_round=[""])
            ids_t = to_device(ids, self.device)
            self.tokens[slot, : len(ids)] = ids_t
            self.noise_keys[slot] = request_key(self.seed, request.id)
            self.busy[slot] = True
            if self.presence is not None:
                self.presence[slot] = False
                self.presence[slot, ids_t] = True

    def release(self, slot: int) -> Slot:
        record, self.records[slot] = self.records[slot], None
        self.busy[slot] = False
        return record
