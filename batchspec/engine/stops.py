"""When a request is done: EOS ids, stop strings, max_new_tokens, max_seq_len — on emitted tokens only.

The EOS cut runs on the device inside a round (`cut_at_eos`), so a round emits nothing past an EOS;
stop strings need decoded text and run on the host after the round's one sync (`cut_at_stop`, which
cuts the output, then `finish_reason`, which only asks).
"""

from __future__ import annotations

from typing import Iterable

import torch
from transformers import PreTrainedTokenizerBase

from .types import FINISH_LENGTH, FINISH_STOP
from .slots import Slot


class StopRules:
    """EOS ids and max_seq_len for every request; stop strings and max_new_tokens per request (the Slot's
    own). keep_stop: the completion text keeps the stop string that ended it (it is cut before it
    otherwise); the token ids always end with the tokens that produced it."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, *, eos_token_ids: Iterable[int], max_seq_len: int,
                 device: torch.device, keep_stop: bool = False):
        self.tokenizer = tokenizer
        self.eos_ids = set(eos_token_ids)
        self.eos = torch.tensor(sorted(self.eos_ids), dtype=torch.long, device=device)
        self.max_seq_len, self.keep_stop = max_seq_len, keep_stop
        self.special_ids = set(tokenizer.all_special_ids)

    def cut_at_eos(self, tokens: torch.Tensor, num_accepted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [b, T], num_accepted [b] -> (num_emit [b], hit_eos [b] bool): a row emits its
        num_accepted + 1 tokens, cut after the first EOS among them."""
        width = tokens.shape[1]
        index = torch.arange(width, device=tokens.device)[None, :]
        emitted = index < (num_accepted + 1)[:, None]
        is_eos = torch.isin(tokens, self.eos) & emitted
        first_eos = torch.where(is_eos, index, width).min(dim=1).values
        return torch.minimum(num_accepted + 1, first_eos + 1), first_eos < width

    def finish_reason(self, slot: Slot, hit_eos: bool, hit_stop: bool) -> str | None:
        """Why `slot` is done after its latest tokens (None: it is not): an EOS or a stop string among
        them (see `cut_at_stop`; the slot's stop_reason says which), or a length limit."""
        if hit_eos:
            slot.stop_reason = slot.output[-1]
            return FINISH_STOP
        if hit_stop:
            return FINISH_STOP
        if len(slot.output) >= slot.max_new_tokens or slot.length >= self.max_seq_len:
            return FINISH_LENGTH
        return None

    def cut_at_stop(self, slot: Slot, num_new: int) -> bool:
        """Whether the output contains one of the slot's stop strings once its last `num_new` tokens are
        added; if so the output is cut to the tokens that produced it, and the
        slot's stop_reason is the stop string."""
        return bool(slot.stop) and self._cut_at_stop(slot, num_new)

    def _cut_at_stop(self, slot: Slot, num_new: int) -> bool:
        """Earlier rounds found no stop string, so a new one must end in this round's `num_new` tokens:
        decoding only the tail keeps a long completion from costing a full decode every round. A stop
        string of L characters spans at most 4L byte-level tokens, not counting special tokens (they decode
        to nothing)."""
        output, start = slot.output, len(slot.output)
        need = num_new + 4 * max(map(len, slot.stop)) + 8
        while start > 0 and need > 0:
            start -= 1
            need -= output[start] not in self.special_ids
        tail = self.tokenizer.decode(output[start:], skip_special_tokens=True)
        if not any(s in tail for s in slot.stop):
            return False
        for n in range(len(output) - num_new + 1, len(output) + 1):  # shorter prefixes had no stop
            text = self.tokenizer.decode(output[:n], skip_special_tokens=True)
            found = [s for s in slot.stop if s in text]
            if found:
                slot.stop_reason = min(found, key=text.find)
                del output[n:]
                return True
        slot.stop_reason = next(s for s in slot.stop if s in tail)  # bytes joined only in the tail's decode
        return True

    def completion(self, slot: Slot, reason: str) -> str:
        """The output's text, special tokens skipped, cut before the stop string that ended it (after it,
        with keep_stop)."""
        text = self.tokenizer.decode(slot.output, skip_special_tokens=True)
        found = [(text.find(s), s) for s in slot.stop if s in text] if reason == FINISH_STOP else []
        if found:
            at, stop = min(found)
            text = text[: at + len(stop)] if self.keep_stop else text[:at]
        return text
