"""A lookup's proposals judged by what the rows went on to emit: acceptance learnt without verifying.

A lookup (ngram, prompt_lookup, suffix) proposes on the host before the choice cuts its proposal to each row's
budget, so a row that drafts 1 of 4 proposed tokens, or none, leaves drafts nobody verified. The row's own
next tokens say whether they would have been kept: a draft is accepted exactly when it is the token the target
then emits (greedy, and coupled sampling, whose tokens do not depend on the drafts; with speculative sampling
a one-hot draft d is accepted with probability p(d), the chance that the token emitted is d, so the count is
unbiased there too). Each unverified draft is judged as the row's tokens reach it, and counted as the verify
pass would have counted it: the acceptance model learns from every proposal at no forward's cost, where
exploration verified one draft on a few rows a round and fixed k=4 drafted from the first round (q384, 32
fixed rows at batch 8: the books took 14-22 rounds to say that drafting paid; docs/benchmarks.md).

Every round's proposal is followed (a row may have several open, none for more than k_max tokens), and each
draft is counted when its token is known, not when its proposal ends: judged whole, a proposal kept whole came
in k rounds after one refused at its first draft, and a job's first verdicts read the refusals alone (q384: 8
first drafts judged, none kept, while the rows' proposals were being kept whole).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Judged:
    """One draft judged: the row's slot, its position in its proposal (1: the first draft), whether the target
    kept it (all before it were), and the drafter's prior for the proposal's first draft (None: none)."""

    slot: int
    position: int
    kept: bool
    prior: float | None = None


@dataclass
class _Open:
    """A proposal whose tail the row's tokens have not judged yet."""

    tail: list[int]  # the drafts not yet judged, first first
    position: int  # the first of them's position in the proposal (from 1)
    prior: float | None


class Hindsight:
    """The open proposals of each row (by slot), oldest first."""

    def __init__(self):
        self.open: dict[int, list[_Open]] = {}

    def forget(self, slot: int) -> None:
        """A new request took `slot` (or its row ended): its open proposals say nothing of the new one."""
        self.open.pop(slot, None)

    def follow(self, slots: list[int], proposals: list[list[int] | None], drafted: list[int], accepted: list[int],
               emitted: list[list[int]], priors: dict[int, float]) -> list[Judged]:
        """After a round, per row that goes on (slots): its whole proposal (None or []: it proposed nothing or
        is not to be followed), the drafts verified and kept, the tokens it emitted (the kept drafts, then the
        target's own), and the drafter's priors (slot -> prior). Returns the drafts judged by this round's
        tokens that the verify pass did not judge."""
        judged: list[Judged] = []
        for slot, proposal, n, m, tokens in zip(slots, proposals, drafted, accepted, emitted):
            # Every open tail starts at the row's next token: this round's tokens continue each of them.
            still = [row for row in self.open.pop(slot, ()) if not _match(slot, row, tokens, judged)]
            if proposal and m == n < len(proposal):  # verified drafts all kept, some not verified
                row = _Open(list(proposal[n:]), n + 1, priors.get(slot))
                if not _match(slot, row, tokens[m:], judged):
                    still.append(row)
            if still:
                self.open[slot] = still
        return judged


def _match(slot: int, row: _Open, tokens: list[int], judged: list[Judged]) -> bool:
    """The tail against the row's next tokens, each draft judged as its token comes; True once the proposal
    is done (a draft refused, or the whole tail kept)."""
    for token in tokens:
        kept = token == row.tail.pop(0)
        judged.append(Judged(slot, row.position, kept, row.prior))
        row.position += 1
        if not kept or not row.tail:
            return True
    return False
