"""The host side of the engine: requests, slots, budgets, the round's shape, stops, statistics, results.

`Scheduler` never touches a tensor. It pulls requests lazily and tokenizes them (`intake`), decides
each round's rows, budgets and shape (`schedule`, `choose`; adaptive speculation decides the shape when
it is on), and turns a round's verdict into outputs, stops, statistics and Results (`postprocess`).
The device side (runners, drafters, the Acceptor) is driven by the generator between these calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

from transformers import PreTrainedTokenizerBase

from ..types import Request, Result, TreeSpec
from .adaptive import AdaptiveK
from .round import Round, RoundShape
from .slots import Slot, SlotTable
from .stats import RowCounts, Statistics, cut_counts
from .stops import StopRules
from .verdict import RoundOutcome


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


@dataclass(slots=True)
class Seat:
    slot: int
    request: Request
    prompt_ids: list[int]


@dataclass(slots=True)
class Emitted:
    """A round's outcome per running row that goes on: the tokens it emitted (a new row's first token in
    front), the drafts it had accepted and a tree round's deepest accepted node (what the drafter learns),
    its budget and cut counts (what adaptive speculation learns)."""

    slots: list[int]
    tokens: list[list[int]]
    num_accepted: list[int]
    path: list[int] | None
    budgets: list[int]
    counts: list[RowCounts]


class Scheduler:
    """Host bookkeeping for `num_slots` slots. k_max: the most drafts a chain round may have per row;
    trees: the tree shapes rounds may draft; adaptive: the controller choosing each round's shape (None:
    every round drafts the first tree, or a chain of k_max)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stops: StopRules, *, num_slots: int, vocab_size: int,
                 max_seq_len: int, max_new_tokens: int, k_max: int, trees: tuple[TreeSpec, ...] = (),
                 adaptive: AdaptiveK | None = None, static: bool = False):
        self.tokenizer, self.stops, self.adaptive = tokenizer, stops, adaptive
        self.vocab_size, self.max_seq_len, self.max_new_tokens = vocab_size, max_seq_len, max_new_tokens
        self.k_max, self.trees, self.static = k_max, trees, static
        self.slots = SlotTable(num_slots)
        self.reset_stats()
        self.admitting = True
        self._pending: Iterator[Request] | None = None
        self._exhausted = False

    def reset_stats(self) -> None:
        self.stats = Statistics(max([self.k_max, *(t.depth for t in self.trees)]), self.k_max)

    # ---- requests in --------------------------------------------------------------------------------

    def feed(self, requests: Iterable[Request]) -> None:
        self._pending, self._exhausted = iter(requests), False

    @property
    def done(self) -> bool:
        """No request runs and none will be admitted."""
        return not self.slots.active() and (self._exhausted or not self.admitting)

    def intake(self) -> tuple[list[Seat], list[Result]]:
        """Requests for the free slots, pulled lazily: (seats of the new rows, Results of requests that
        cannot run). Seated rows are occupied on the host; the generator fills the device side."""
        seats, errors = [], []
        free = self.slots.free()
        while free and self.admitting and not self._exhausted:
            request = next(self._pending, None)
            if request is None:
                self._exhausted = True
                break
            ids = prompt_ids(request, self.tokenizer, self.vocab_size, self.max_seq_len)
            if isinstance(ids, str):
                self.stats.error()
                errors.append(Result.error_result(request, ids))
                continue
            slot = free.pop(0)
            self.slots.occupy(slot, request, ids)
            if self.adaptive:
                self.adaptive.admit(slot)
            seats.append(Seat(slot, request, ids))
        return seats, errors

    def first_tokens(self, slots: list[int], tokens: list[int]) -> list[tuple[int, Result]]:
        """The first tokens of new rows reached the host: append them; returns the rows they finished."""
        finished = []
        for slot, token in zip(slots, tokens):
            result = self._take_first(slot, self.slots[slot], token)
            if result is not None:
                finished.append((slot, result))
        return finished

    def _take_first(self, slot: int, record: Slot, token: int) -> Result | None:
        record.awaiting_first = False
        record.output.append(token)
        hit_stop = self.stops.cut_at_stop(record, 1)
        reason = self.stops.finish_reason(record, token in self.stops.eos_ids, hit_stop)
        return self._finish(slot, reason) if reason is not None else None

    # ---- a round ------------------------------------------------------------------------------------

    def schedule(self) -> Round:
        """The round's rows (every slot when static, else the running ones), their lengths and room. Its
        budgets and shape come from `choose` (before drafting, or after it for a drafter that proposes first)."""
        rows = list(range(len(self.slots.records))) if self.static else self.slots.active()
        records = [self.slots[r] for r in rows]
        lengths = [r.length if r is not None else 1 for r in records]
        room = [r.room(self.max_new_tokens, self.max_seq_len) if r is not None else 0 for r in records]
        running = [i for i, r in enumerate(records) if r is not None]
        span = slice(rows[0], rows[-1] + 1) if rows and rows[-1] - rows[0] == len(rows) - 1 else None
        budgets = [min(self.k_max, n) for n in room]
        return Round(rows, None, span, lengths, None, running, room, budgets, self.static)

    def choose(self, round: Round, proposed: list[int] | None = None) -> RoundShape:
        """Set the round's shape and budgets. proposed: what each row already proposed (a drafter that
        proposes first), whose longest proposal bounds a chain's width."""
        if self.adaptive is None:
            shape = RoundShape(tree=self.trees[0]) if self.trees else RoundShape(drafts=self.k_max)
        else:
            if self.static:
                self.adaptive.costs.at_length(max(round.lengths) + self._widest)
            slots = round.running_slots
            offer = proposed if proposed is not None else round.budgets
            shape = self.adaptive.choose(slots, [offer[i] for i in round.running], [round.room[i] for i in round.running])
        if shape.tree is not None:
            round.budgets = list(round.room)  # a tree is as deep as each row's room allows
        else:
            offer = proposed if proposed is not None else round.budgets
            round.budgets = [min(shape.drafts, n) for n in offer]
        round.shape = shape
        return shape

    @property
    def _widest(self) -> int:
        return max([self.k_max, *(t.nodes for t in self.trees)])

    def postprocess(self, round: Round, outcome: RoundOutcome) -> tuple[list[tuple[int, Result]], Emitted]:
        """Host bookkeeping after the verdict: outputs, stops, statistics. Returns the rows finished (slot,
        Result) and what was emitted."""
        shape = round.shape
        self.stats.round(shape)
        finished: list[tuple[int, Result]] = []
        emitted = Emitted([], [], [], [] if shape.tree is not None else None, [], [])
        for i in round.running:
            slot, record, new = round.rows[i], self.slots[round.rows[i]], outcome.emitted[i]
            head = []
            if record.awaiting_first:  # its first token arrives with this round (the static path)
                head = [outcome.pending[i]]
                result = self._take_first(slot, record, head[0])
                if result is not None:  # the round it rode in is moot
                    finished.append((slot, result))
                    continue
            before = len(record.output)
            record.output.extend(new)
            record.length += len(new)
            hit_stop = self.stops.cut_at_stop(record, len(new))
            positions = outcome.depth[i] if outcome.depth is not None else outcome.num_drafts[i]
            row = cut_counts(outcome.num_drafts[i], positions, outcome.num_accepted[i], len(record.output) - before)
            self.stats.row(record, shape, row)
            emitted.slots.append(slot)
            emitted.tokens.append(head + new)
            emitted.num_accepted.append(outcome.num_accepted[i])
            emitted.budgets.append(round.budgets[i])
            emitted.counts.append(row)
            if emitted.path is not None:
                emitted.path.append(outcome.last_node[i])
            reason = self.stops.finish_reason(record, outcome.hit_eos[i], hit_stop)
            if reason is not None:
                finished.append((slot, self._finish(slot, reason)))
        return finished, emitted

    def learn(self, round: Round, emitted: Emitted, seconds: float) -> None:
        """Adaptive speculation learns the round's cost and, from the same cut counts as the statistics,
        its acceptance."""
        if self.adaptive is not None:
            self.adaptive.observe(round.shape, seconds, emitted.slots, emitted.budgets,
                                  [c.drafted for c in emitted.counts], [c.accepted for c in emitted.counts])

    # ---- results ------------------------------------------------------------------------------------

    def _finish(self, slot: int, reason: str) -> Result:
        record = self.slots.release(slot)
        request = record.request
        prompt = request.prompt if isinstance(request.prompt, str) else self.tokenizer.decode(record.prompt_ids)
        result = record.to_result(reason, self.stops.completion(record, reason), prompt)
        self.stats.result(result)
        return result
