"""A slot's life in one place: a request takes a free slot (`seat`), its prompt is cached (`prefilled`), it
advances by the tokens each round keeps (`advance`) and leaves its slot (`release`), and every part that keeps
state per slot hears of it from here, in one order.

Per-slot state lives with what uses it: the host record (slots.SlotTable: the output, the statistics' lists),
the device state (slots.SlotState: `busy`, the sequence), the target's cache length (the runner), the drafter's
caches or indexes, a constrained row's grammar matcher, and adaptive speculation's per-row acceptance. None of
them tells another about a slot: each hears of it here, in one order, so that no part is told twice or
forgotten when a release comes from a stop, a length cap, an error or a job's end.

A seat's device side is the prefill (admission.py: the sequence, the first token, the drafter's admission
with the prefill's hidden states), which runs after `seat` and before the row's first round.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .grammar.grammar import Grammars
from .model.host_device import HostBuffer
from .slots import Slot, SlotState, SlotTable

if TYPE_CHECKING:
    from .control.adaptive import AdaptiveK
    from .drafters.base import Drafter
    from .intake import Admission
    from .model.runner import ModelRunner


class SlotLife:
    """Seats, advances and releases the slots of `table`. A seat tells the grammars (None: no structured output)
    and the controller (None: adaptive speculation off, else it forgets the slot's last row); a prefill and an
    advance tell the `drafter`; a release tells the target's `runner`, the slots' device `state`, the drafter and
    the grammars. (A row's cache rolls back to what it accepted in the verdict, accept.py; a grammar advances
    where its row's stops are decided, postprocess.py: both before the round's outcome reaches here.)"""

    def __init__(self, table: SlotTable, *, grammars: Grammars | None, adaptive: AdaptiveK | None,
                 runner: ModelRunner, state: SlotState, drafter: Drafter):
        self.table, self.grammars, self.adaptive = table, grammars, adaptive
        self.runner, self.state, self.drafter = runner, state, drafter
        self._released = HostBuffer((len(table.records),), runner.device)

    def seat(self, slot: int, row: Admission) -> Slot:
        """A new request's row takes the free `slot`: its host record, its grammar, no acceptance history."""
        record = self.table.occupy(slot, row.request, row.prompt_ids, max_new_tokens=row.max_new_tokens,
                                   stop=row.stop, logprobs=row.logprobs)
        if self.grammars is not None:
            self.grammars.seat(slot, row.constraint)
        if self.adaptive is not None:
            self.adaptive.admit(slot)
        return record

    def prefilled(self, slots: list[int], prompts: list[list[int]], features: list | None = None) -> None:
        """These rows' prompts are in their sequences (and, eagerly, the target's cache): the drafter admits them
        (features: the target's hidden states over each prompt, for a drafter that reads them)."""
        if features is None:
            self.drafter.admit(slots, prompts)
        else:
            self.drafter.admit(slots, prompts, features=features)

    def advance(self, slots: list[int], tokens: list[list[int]], num_accepted: list[int],
                path: list[int] | None = None) -> None:
        """These rows go on with `tokens` each (their accepted drafts and the target's next token; a new row's
        first token alone): the drafter extends them and rolls back what it drafted past num_accepted (path: a
        tree round's deepest accepted node per row)."""
        self.drafter.extend(slots, tokens, num_accepted, path)  # (every round: a drafter may keep time by it)

    def release(self, slots: list[int]) -> None:
        """These rows finished (their Results are made): the target's cache lengths back to 0 and the slots
        idle (idle slots ride along in static rounds from position 0), the drafter's and the grammars' state
        for them dropped, and their host records freed."""
        if not slots:
            return
        index = self._released.put(slots)
        self.runner.reset_lengths(index)
        self.state.busy.index_fill_(0, index, False)
        self.drafter.release(slots)
        for slot in slots:
            if self.grammars is not None:
                self.grammars.release(slot)
            self.table.release(slot)
