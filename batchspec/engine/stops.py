"""When a request is done: EOS ids, stop strings, max_new_tokens, max_seq_len — on emitted tokens only.

The EOS cut runs on the device inside a round (`cut_at_eos`), so a round emits nothing past an EOS;
stop strings need decoded text and run on the host after the round's one sync (`cut_at_stop`, which
cuts the output, then `finish_reason`, which only asks).
"""

from __future__ import annotations

from typing import Iterable

import torch
from transformers import PreTrainedTokenizerBase

from ..types import FINISH_LENGTH, FINISH_STOP
from .slots import Slot


class StopRules:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, *, eos_token_ids: Iterable[int], stop: Iterable[str],
                 max_new_tokens: int, max_seq_len: int, device: torch.device):
        self.tokenizer = tokenizer
        self.eos_ids = set(eos_token_ids)
        self.eos = torch.tensor(sorted(self.eos_ids), dtype=torch.long, device=device)
        self.stop = tuple(s for s in stop if s)
        self.max_new_tokens, self.max_seq_len = max_new_tokens, max_seq_len
        # A stop string of L characters spans at most 4L byte-level tokens, not counting special tokens
        # (they decode to nothing): a round only decodes its new tokens and this many before them.
        self.stop_window = 4 * max(map(len, self.stop), default=0) + 8
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
        them (see `cut_at_stop`), or a length limit."""
        if hit_eos or hit_stop:
            return FINISH_STOP
        if len(slot.output) >= self.max_new_tokens or slot.length >= self.max_seq_len:
            return FINISH_LENGTH
        return None

    def cut_at_stop(self, slot: Slot, num_new: int) -> bool:
        """Whether the output contains a stop string once its last `num_new` tokens are added; if so the
        output (and the slot's length) is cut to the tokens that produced it."""
        return bool(self.stop) and self._cut_at_stop(slot, num_new)

    def _cut_at_stop(self, slot: Slot, num_new: int) -> bool:
        """If the decoded output contains a stop string, keep the shortest token prefix whose text
        contains it and return True.

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
        for n in range(len(output) - num_new + 1, len(output) + 1):  # shorter prefixes had no stop
            if any(s in self.tokenizer.decode(output[:n], skip_special_tokens=True) for s in self.stop):
                slot.length -= len(output) - n
                del output[n:]
                return True
        return True

    def completion(self, slot: Slot, reason: str) -> str:
        """The output's text, special tokens skipped, cut before a stop string that ended it."""
        text = self.tokenizer.decode(slot.output, skip_special_tokens=True)
        if reason == FINISH_STOP and self.stop:
            cut = [text.find(s) for s in self.stop if s in text]
            if cut:
                text = text[: min(cut)]
        return text
