"""The host side of a round's outcome (the Scheduler holds one, scheduler.py): the tokens each row emitted
appended to its output, its grammar advanced, stops and limits checked, statistics counted, finished
rows' Results made; new rows' first tokens likewise, and prompt logprobs kept."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from .types import FINISH_ERROR, FINISH_STOP, Result
from .grammar.grammar import Grammars
from .round import Round
from .slots import Slot, SlotTable
from .stats import RowCounts, Statistics, cut_counts
from .stops import StopRules
from .verdict import RoundOutcome


@dataclass(frozen=True, slots=True)
class Emitted:
    """A round's outcome per running row that goes on: the tokens it emitted (a new row's first token in
    front), the drafts it had accepted and a tree round's deepest accepted node (what the drafter learns),
    and its cut counts (what adaptive speculation learns, with the round's `budgets`: a row that emitted by
    a grammar's forced drafts counts no draft)."""

    slots: list[int]
    tokens: list[list[int]]
    num_accepted: list[int]
    path: list[int] | None
    counts: list[RowCounts]

    def add(self, slot: int, tokens: list[int], num_accepted: int, counts: RowCounts, node: int = 0) -> None:
        """A row that goes on (node: a tree round's deepest accepted node)."""
        self.slots.append(slot)
        self.tokens.append(tokens)
        self.num_accepted.append(num_accepted)
        self.counts.append(counts)
        if self.path is not None:
            self.path.append(node)


class RowOutcomes:
    """What rows' new tokens do to the rows of `slots`: their outputs, grammars (None: no constrained rows),
    stops, statistics, and the Results of the rows they finish (prompts decoded by `tokenizer`)."""

    def __init__(self, slots: SlotTable, stops: StopRules, grammars: Grammars | None, stats: Statistics,
                 tokenizer: PreTrainedTokenizerBase):
        self.slots, self.stops, self.grammars, self.stats, self.tokenizer = slots, stops, grammars, stats, tokenizer

    def first_tokens(self, slots: list[int], tokens: list[int],
                     logprobs: list[list[float]] | None = None) -> list[tuple[int, Result]]:
        """The first tokens of new rows reached the host (with their logprobs blocks): append them; returns
        the rows they finished."""
        finished = []
        for i, (slot, token) in enumerate(zip(slots, tokens)):
            result = self._take_first(slot, self.slots[slot], token, logprobs[i] if logprobs else None)
            if result is not None:
                finished.append((slot, result))
        return finished

    def _take_first(self, slot: int, record: Slot, token: int, block: list[float] | None) -> Result | None:
        record.awaiting_first = False
        record.output.append(token)
        _add_logprobs(record, [block] if block else [])
        problem, hit_eos, hit_stop = self._take(slot, record, 1, token in self.stops.eos_ids)
        if problem:
            return self.finish(slot, FINISH_ERROR, problem)
        reason = self._finish_reason(slot, record, hit_eos, hit_stop)
        return self.finish(slot, reason) if reason is not None else None

    def _take(self, slot: int, record: Slot, num_new: int, hit_eos: bool) -> tuple[str | None, bool, bool]:
        """The row's last `num_new` output tokens (whose last is an EOS when hit_eos): cut at a stop string
        first, then its grammar advanced by the tokens kept, so that it judges the output the row keeps.
        Returns (the grammar's error or None, whether the row ends on an EOS, whether on a stop string): a stop
        string cuts the EOS of the same round away, and the stop string is then the reason."""
        before = len(record.output) - num_new
        hit_stop = self.stops.cut_at_stop(record, num_new)
        if hit_stop:
            record.cut_logprobs()
        kept = record.output[before:]
        problem = None
        if self.grammars is not None:
            taken, problem = self.grammars.advance(slot, kept)
            if problem:  # the row ends with the output its grammar took (its slot is released next)
                del record.output[before + taken:]
                record.cut_logprobs()
        return problem, hit_eos and not hit_stop, hit_stop

    def _finish_reason(self, slot: int, record: Slot, hit_eos: bool, hit_stop: bool) -> str | None:
        """StopRules' reason; and a row whose grammar takes nothing more stops when there is no EOS to end it
        (with an EOS id, the grammar allows only that, and the row ends on it as generate does)."""
        reason = self.stops.finish_reason(record, hit_eos, hit_stop)
        if reason is None and not self.stops.eos_ids and self.grammars is not None and self.grammars.stopped(slot):
            return FINISH_STOP
        return reason

    def postprocess(self, round: Round, outcome: RoundOutcome) -> tuple[list[tuple[int, Result]], Emitted]:
        """Host bookkeeping after the verdict: outputs, stops, statistics. Returns the rows finished (slot,
        Result) and what was emitted."""
        shape = round.shape
        self.stats.round(shape)
        finished: list[tuple[int, Result]] = []
        emitted = Emitted([], [], [], [] if shape.tree is not None else None, [])
        for i in round.plan.running:
            slot, record, new = round.plan.rows[i], self.slots[round.plan.rows[i]], outcome.emitted[i]
            head = []
            if record.awaiting_first and not record.first_drawn:  # a packed round decided its first token
                result = self._take_first(slot, record, new[0], outcome.logprobs[i][0] if outcome.logprobs else None)
                if result is not None:
                    finished.append((slot, result))
                    continue
                emitted.add(slot, new, 0, cut_counts(0, 0, 0, 1))
                continue
            if record.awaiting_first:  # its first token, drawn at admission, arrives with this round
                head = [outcome.pending[i]]
                result = self._take_first(slot, record, head[0],
                                          outcome.pending_logprobs[i] if outcome.pending_logprobs else None)
                if result is not None:  # the round it rode in is moot
                    finished.append((slot, result))
                    continue
            before = len(record.output)
            record.output.extend(new)
            _add_logprobs(record, outcome.logprobs[i] if outcome.logprobs else [])
            problem, hit_eos, hit_stop = self._take(slot, record, len(new), outcome.hit_eos[i])
            if problem:
                finished.append((slot, self.finish(slot, FINISH_ERROR, problem)))
                continue
            forced = round.forced[i] if round.forced else 0
            positions = outcome.depth[i] if outcome.depth is not None else outcome.num_drafts[i]
            row = cut_counts(outcome.num_drafts[i], positions, outcome.num_accepted[i], len(record.output) - before)
            self.stats.row(record, shape, row, forced=bool(forced))
            # A grammar's forced drafts say nothing about the drafter: adaptive speculation does not learn from them.
            emitted.add(slot, head + new, outcome.num_accepted[i], cut_counts(0, 0, 0, 1) if forced else row,
                        outcome.last_node[i] if emitted.path is not None else 0)
            reason = self._finish_reason(slot, record, hit_eos, hit_stop)
            if reason is not None:
                finished.append((slot, self.finish(slot, reason)))
        return finished, emitted

    def set_prompt_logprobs(self, slot: int, blocks: list[list[float]], k: int) -> None:
        """A row's prompt logprobs: blocks [logprob, K best, their ids] for prompt tokens 1.. (the first has
        none), of which the row keeps k alternatives."""
        record = self.slots[slot]
        width = (len(blocks[0]) - 1) // 2 if blocks else 0
        record.prompt_logprobs = ([None] + [b[0] for b in blocks], [[]] + [b[1 : 1 + k] for b in blocks],
                                  [[]] + [[int(x) for x in b[1 + width : 1 + width + k]] for b in blocks])

    def finish(self, slot: int, reason: str, error: str | None = None) -> Result:
        """The row's Result (its caller releases the slot: slot_life.py); an error (its grammar failed) keeps
        the output made before it."""
        record = self.slots[slot]
        if self.grammars is not None:
            record.structured_complete = self._whole_match(slot, record, reason, error)
        request = record.request
        prompt = request.prompt if isinstance(request.prompt, str) else self.tokenizer.decode(record.prompt_ids)
        result = record.to_result(reason, self.stops.completion(record, reason), prompt)
        result.error = error
        self.stats.result(result)
        return result

    def _whole_match(self, slot: int, record: Slot, reason: str, error: str | None) -> bool | None:
        """structured_complete (None: unconstrained): the grammar accepts the output and the row ended because
        the output was whole: on an EOS (allowed only where the grammar accepts) or with a grammar that takes
        nothing more. A row cut short is not: by max_new_tokens or max_seq_len (even where a prefix happens
        to match, as `[0-9]+` does), by a stop string (its completion is cut there), or by an error."""
        complete = self.grammars.complete(slot)
        if complete is None:
            return None
        if not complete or error is not None or isinstance(record.stop_reason, str):
            return False
        return (reason == FINISH_STOP and isinstance(record.stop_reason, int)) or self.grammars.stopped(slot)


def _add_logprobs(record: Slot, blocks: list[list[float]]) -> None:
    """Blocks [logprob, k best, their ids] of the tokens just appended to a row that asked for logprobs."""
    if record.logprobs is None or not blocks:
        return
    k = (len(blocks[0]) - 1) // 2
    record.add_logprobs([b[0] for b in blocks], [b[1 : 1 + k] for b in blocks],
                        [[int(x) for x in b[1 + k :]] for b in blocks])
