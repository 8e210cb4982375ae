"""A run's statistics, one collector fed by the round's stages: drafting per request (the Slot's lists) and
per run (RunStats), fed once per row-round; what target forwards computed (TokenCounts, fed by the verify
pass); the phases' seconds (phases.Timers, which the stages time into). A benchmark's next repeat resets
all three at once (`reset`).

A round's counts are cut where the row's output was cut: an EOS or a stop string inside the round
makes the drafts past the cut moot, counted neither way (the tokens kept are the accepted drafts first,
then the target's own). The same cut counts feed the statistics and adaptive speculation.
"""

from __future__ import annotations

from dataclasses import dataclass

from .control.line import Line
from .phases import Timers
from .runstats import RunStats
from .types import Result
from .round import RoundShape
from .slots import Slot


@dataclass(frozen=True, slots=True)
class RowCounts:
    """One row's part in one round, after the cut."""

    drafted: int  # drafts it proposed (a tree: its nodes)
    positions: int  # draft positions it proposed at: a chain's drafts, a tree's depth
    accepted: int  # leading drafts kept


def cut_counts(num_drafts: int, positions: int, num_accepted: int, kept_tokens: int) -> RowCounts:
    """The counts of a row that proposed num_drafts drafts at `positions` positions, had num_accepted
    accepted and kept `kept_tokens` of the num_accepted + 1 tokens it emitted."""
    if kept_tokens < num_accepted + 1:
        num_drafts, positions = min(num_drafts, kept_tokens), min(positions, kept_tokens)
    return RowCounts(num_drafts, positions, min(num_accepted, kept_tokens))


class Statistics:
    """Feeds RunStats, each request's per-round lists, the forwards' TokenCounts and holds the run's Timers.
    max_positions: the most draft positions a row can have (k_max, or a tree's depth); max_drafts: the most
    drafts a chain round can have."""

    def __init__(self, max_positions: int, max_drafts: int, timers: Timers):
        self.max_positions, self.max_drafts, self.timers = max_positions, max_drafts, timers
        self.reset()

    def reset(self) -> None:
        """Count afresh (a benchmark's next repeat): drafting, forwards and the phases' seconds."""
        self.run = RunStats(proposed_by_position=[0] * self.max_positions,
                            accepted_by_position=[0] * self.max_positions, rounds_by_k=[0] * (self.max_drafts + 1))
        self.forwards = TokenCounts()
        self.timers.reset()

    def continue_into(self, run: RunStats) -> None:
        """Count drafting into `run` from now on (an earlier generator's), widened to this one's drafts: one
        run's statistics across generators that follow each other (a self-training job's phases)."""
        run.widen(len(self.run.proposed_by_position), len(self.run.rounds_by_k) - 1)  # e.g. after k=0's none
        self.run = run

    def forward(self, computed: int, padding: int, prefilled: int, prefill_s: float = 0.0,
                seconds: float | None = None) -> None:
        """One target forward (the verify pass's): see TokenCounts.add."""
        self.forwards.add(computed, padding, prefilled, prefill_s, seconds)

    def round(self, shape: RoundShape) -> None:
        self.run.rounds += 1
        if shape.tree is None:
            if shape.drafts >= len(self.run.rounds_by_k):  # a grammar's forced drafts, past k
                self.run.rounds_by_k += [0] * (shape.drafts + 1 - len(self.run.rounds_by_k))
            self.run.rounds_by_k[shape.drafts] += 1
        else:
            key = str(shape.tree)
            self.run.rounds_by_tree[key] = self.run.rounds_by_tree.get(key, 0) + 1

    def row(self, slot: Slot, shape: RoundShape, counts: RowCounts, forced: bool = False) -> None:
        """forced: the row's drafts were its grammar's forced continuation, not the drafter's: counted apart
        (forced_tokens, forced_accepted) and left out of acceptance by position, which judges the drafter."""
        slot.draft_tokens += counts.drafted
        slot.accepted_per_round.append(counts.accepted)
        slot.drafts_per_round.append(counts.drafted)
        slot.tree_per_round.append(str(shape.tree) if shape.tree is not None else "")
        if forced:
            slot.forced_tokens += counts.drafted
            slot.forced_accepted += counts.accepted
        else:
            self.run.add_round_row(counts.positions, counts.accepted)

    def result(self, result: Result) -> None:
        self.run.add_result(result)

    def error(self) -> None:
        self.run.requests += 1
        self.run.errors += 1


class TokenCounts:
    """What target forwards computed, over a run: tokens in all (padding included), padding tokens (the
    rows' width beyond their own drafts, idle rows riding along), prompt tokens prefilled inside packed
    rounds, and admission's share of those forwards' time two ways: in proportion to their prompt tokens
    (`prefill_s`), and at the marginal cost of a token (`prefill_marginal_s`: the slope of forward time
    against tokens, fitted over the run, times the prompt tokens; what the prompts add to forwards that
    run anyway)."""

    def __init__(self):
        self.computed, self.padding, self.prefilled, self.prefill_s = 0, 0, 0, 0.0
        self._cost = Line(decay=1.0)

    def add(self, computed: int, padding: int, prefilled: int, prefill_s: float = 0.0,
            seconds: float | None = None) -> None:
        """computed tokens (padding of them), prompt tokens prefilled, their share of the forward's seconds,
        and the forward's seconds (None: not timed, the static path's)."""
        self.computed += computed
        self.padding += padding
        self.prefilled += prefilled
        self.prefill_s += prefill_s
        if seconds is not None:
            self._cost.add(computed, seconds)

    @property
    def prefill_marginal_s(self) -> float:
        fit = self._cost.fit()
        return fit[1] * self.prefilled if fit else 0.0

    def summary(self) -> dict:
        return {"computed": self.computed, "padding": self.padding, "prefilled": self.prefilled,
                "prefill_s": self.prefill_s, "prefill_marginal_s": self.prefill_marginal_s}
