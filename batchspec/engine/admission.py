"""Admission: new rows' prompts into their slots, the target's prefill (once per prompt: the samples of one
request admitted together copy its cache), the drafter's admission, the first tokens. The device side
returns a value (`Seated`) that the host's part reads (Scheduler.seated: the rows packed rounds fill in,
prompt logprobs, the first tokens); then the drafter extends the rows that go on by their first tokens.

The prefill is eager and ragged on the eager path, captured chunks on the static path; eagerly also on
the static path (a documented exception) for rows that want their prompt's logprobs (every position's
logits) and for every row when the drafter reads the target's hidden states (EAGLE: its head is
prefilled over them).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from .types import Result
from .accept import Acceptor
from .model.runner import ModelRunner
from .sampling import logprobs_at
from .slots import SlotState

if TYPE_CHECKING:
    from .slot_life import SlotLife


@dataclass(frozen=True, slots=True)
class Seated:
    """What admission hands the host: the seats whose prompts packed rounds fill in (`later`), the seats
    prefilled here (`now`), eagerly their first tokens and logprobs blocks (None on the static path, where
    the next round's verdict carries them), and (slot, blocks, k) of rows that asked for their prompt's
    logprobs."""

    later: list = field(default_factory=list)
    now: list = field(default_factory=list)
    tokens: list[int] | None = None
    logprobs: list[list[float]] | None = None
    prompt_logprobs: list[tuple[int, list, int]] = field(default_factory=list)


class Admitter:
    """New rows' device side; the drafter hears of them through the slots' `life` (slot_life.py)."""

    def __init__(self, runner: ModelRunner, state: SlotState, acceptor: Acceptor, life: SlotLife):
        self.runner, self.state, self.acceptor, self.life = runner, state, acceptor, life
        self.device = runner.device
        # The path is chosen once. Packed rounds prefill the prompts themselves (but those whose logprobs are
        # wanted); the static path prefills in captured chunks, its logits by slot, and the next round's verdict
        # carries the first tokens.
        self._waits = _waits_for_rounds if runner.packs else _never
        self._prefill = self._slot_prefill if runner.static else self._row_prefill
        self._first_tokens = self._slot_first_tokens if runner.static else self._row_first_tokens

    def admit(self, seats) -> Seated:
        """New rows' device side: prompt logprobs, and eagerly the first tokens at once (on the static path
        the next round's verdict carries them). Packed rounds prefill the other rows' prompts themselves: only
        their sequences and the drafter's admission happen here (Seated.later)."""
        later = [s for s in seats if self._waits(s)]
        if later:
            self.seat_later(later)
        now = [s for s in seats if s not in later]
        return replace(self.seat(now) if now else Seated(), later=later, now=now)

    def extend(self, seated: Seated, finished: list[tuple[int, Result]]) -> None:
        """The drafter takes the first tokens of the rows admission decided that go on (finished: the rows
        whose first token ended them)."""
        if seated.tokens is None:
            return
        done = {slot for slot, _ in finished}
        going = [(seat.slot, token) for seat, token in zip(seated.now, seated.tokens) if seat.slot not in done]
        if going:
            self.life.advance([s for s, _ in going], [[t] for _, t in going], [0] * len(going))

    def seat_later(self, seats) -> None:
        """Rows whose prompts packed rounds prefill: their sequences and settings, and the drafter's admission."""
        slots, prompts = [s.slot for s in seats], [s.prompt_ids for s in seats]
        self.state.seat(slots, prompts, [s.admission.key for s in seats], [s.admission.sampling for s in seats])
        self.life.prefilled(slots, prompts)

    def seat(self, seats) -> Seated:
        """seats: intake.Seat records (slot, admission) of the new rows."""
        slots, prompts = [s.slot for s in seats], [s.prompt_ids for s in seats]
        self.state.seat(slots, prompts, [s.admission.key for s in seats], [s.admission.sampling for s in seats])
        primary: dict[int, int] = {}  # group -> the slot that prefills for it
        for seat in seats:
            primary.setdefault(seat.admission.group, seat.slot)
        sources = [primary[s.admission.group] for s in seats]
        first = [s for s in seats if primary[s.admission.group] == s.slot]
        blocks: list[tuple[int, list, int]] = []  # the prompt logprobs of the rows that asked for them
        last, features = self._prefill(first, blocks)
        copies = [(src, s.slot) for src, s in zip(sources, seats) if src != s.slot]
        if copies:
            self.runner.copy_prefix([a for a, _ in copies], [b for _, b in copies], max(map(len, prompts)))
        self.life.prefilled(slots, prompts, None if features is None else [features[src] for src in sources])
        return self._first_tokens(slots, first, sources, last, blocks)

    def _row_first_tokens(self, slots: list[int], first, sources: list[int], last: torch.Tensor,
                          blocks: list) -> Seated:
        """The first tokens drawn from last [len(first), V] (each prefilled prompt's; the other samples of a
        request from their group's), back to the host."""
        index = {seat.slot: i for i, seat in enumerate(first)}
        logits = last[torch.tensor([index[src] for src in sources], device=self.device)]
        tokens, logprobs = self.acceptor.first_tokens(slots, logits)
        return Seated(tokens=tokens, logprobs=logprobs, prompt_logprobs=blocks)

    def _slot_first_tokens(self, slots: list[int], first, sources: list[int], last: torch.Tensor,
                           blocks: list) -> Seated:
        """The first tokens drawn on the device from last [B + 1, V] by slot; the next round's verdict carries
        them."""
        self.acceptor.first_tokens(slots, last)
        return Seated(prompt_logprobs=blocks)

    def _slot_prefill(self, seats, blocks: list) -> tuple[torch.Tensor, dict[int, torch.Tensor] | None]:
        """The static path's prefill -> the logits after each prompt [B + 1, V] by slot and, for a drafter that
        reads them, the prompts' features by slot: captured chunks, but eagerly for prompts whose logprobs are
        wanted or whose features a drafter reads."""
        needs_features = bool(self.runner.feature_layers)
        eager = [s for s in seats if needs_features or s.admission.prompt_logprobs is not None]
        chunked = [s for s in seats if s not in eager]
        last, features = None, None
        if chunked:
            last = self.runner.static_prefill.prefill(self.state.tokens, [s.slot for s in chunked], [0] * len(chunked),
                                                      [len(s.prompt_ids) for s in chunked])
        if eager:
            at_end, features = self._row_prefill(eager, blocks)
            last = self.runner.static_prefill.last_logits()
            last[torch.tensor([s.slot for s in eager], device=self.device)] = at_end.to(last.dtype)
        return last, features

    def _row_prefill(self, seats, blocks: list) -> tuple[torch.Tensor, dict[int, torch.Tensor] | None]:
        """The target's eager prefill of the seats' prompts -> the logits after each prompt [n, V] and, for a
        drafter that reads them, the prompts' features by slot; the prompt logprobs of the rows that want them
        go to `blocks`."""
        scored = [s for s in seats if s.admission.prompt_logprobs is not None]
        logits = self._eager_prefill(seats, all_logits=bool(scored))  # [n, W, V] or [n, V]
        ends = torch.tensor([len(s.prompt_ids) - 1 for s in seats], device=self.device)
        at_end = logits[torch.arange(len(seats), device=self.device), ends] if scored else logits
        features = None
        if self.runner.feature_layers:
            features = {s.slot: self.runner.features[i, : len(s.prompt_ids)] for i, s in enumerate(seats)}
        if scored:
            self._prompt_logprobs(seats, logits, blocks)
        return at_end, features

    def _prompt_logprobs(self, seats, logits: torch.Tensor, out: list) -> None:
        """The raw model's log-probabilities of each prompt token after the ones before it (the first has none)."""
        k = max(s.admission.prompt_logprobs or 0 for s in seats)
        width = logits.shape[1]
        ids = torch.tensor([s.prompt_ids[1:] + [0] * (width - len(s.prompt_ids)) for s in seats], device=self.device)
        blocks = logprobs_at(logits[:, :-1].float(), ids, k).tolist() if width > 1 else [[] for _ in seats]
        for seat, row in zip(seats, blocks):
            if seat.admission.prompt_logprobs is not None:
                out.append((seat.slot, row[: len(seat.prompt_ids) - 1], seat.admission.prompt_logprobs))

    def _eager_prefill(self, seats, all_logits: bool = False) -> torch.Tensor:
        width = max(len(s.prompt_ids) for s in seats)
        ids = torch.tensor([s.prompt_ids + [0] * (width - len(s.prompt_ids)) for s in seats], device=self.device)
        return self.runner.prefill([s.slot for s in seats], ids, [0] * len(seats), [len(s.prompt_ids) for s in seats],
                                   all_logits=all_logits)


def _waits_for_rounds(seat) -> bool:
    """A packed path's seat whose prompt the rounds prefill: all but those whose prompt logprobs are wanted."""
    return seat.admission.prompt_logprobs is None


def _never(seat) -> bool:
    return False
