"""The host side of the engine: requests, slots, budgets, the round's shape, stops, statistics, results.

`Scheduler` computes on no tensor (a round's rows reach the device through the verify pass's `place`). It
pulls requests lazily and tokenizes them (`intake`), decides each round's rows, the most drafts each may
propose, and the shape and drafts it chooses (`schedule`, `choose`; adaptive speculation decides the shape
when it is on); its `outcomes` (postprocess.RowOutcomes, which callers reach directly) turn a round's verdict
into outputs, stops, statistics and Results (`postprocess`, and new rows' `first_tokens`).
The device side (runners, drafters, the Acceptor) is driven by the generator between these calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from transformers import PreTrainedTokenizerBase

from .types import FINISH_LENGTH, Request, Result, TreeSpec
from .control.costs import PackedCosts, RoundCost
from .intake import Defaults, Intake, Seat
from .control.payoff import PayoffCheck
from .postprocess import Emitted, RowOutcomes
from .round import Plan, Round, RoundShape
from .slot_life import SlotLife
from .slots import PromptFills
from .stats import Statistics
from .stops import StopRules

if TYPE_CHECKING:
    from .admission import Seated

Place = Callable[[list[int], list[int]], dict]  # rows, their lengths -> the round's device fields (verify_pass.py)


class Scheduler:
    """Host bookkeeping for the slots of `life` (slot_life.py: what seats and releases them; its table is the
    scheduler's `slots`, its controller `adaptive` and its grammars `grammars`). k_max: the most drafts a chain
    round may have per row; trees: the tree shapes rounds may draft; the controller chooses each round's shape
    (None: every round drafts the first tree, or a chain of k_max); the grammars are the constrained rows'
    matchers (grammar.py: structured output), which advance by the tokens rows emit; payoff: the wall clock's
    check that drafting pays (payoff.py), which may keep a per-row round's rows from drafting; place: the verify
    pass's placement of a round's rows and lengths on the device (verify_pass.py), so that a round is built here
    once with them; decoding: with spare slots (packed rounds; None: without), the most rows that decide a token
    in a round, the table's other slots holding rows whose prompts are prefilled ahead; wave: how many slots
    must be free before new rows are seated while rows still wait in spare slots (`intake`)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stops: StopRules, *, life: SlotLife, vocab_size: int,
                 max_seq_len: int, defaults: Defaults, k_max: int, trees: tuple[TreeSpec, ...] = (),
                 static: bool = False, fill_budget: int = 0, per_row: bool = False,
                 payoff: PayoffCheck | None = None, stats: Statistics, place: Place, decoding: int | None = None,
                 wave: int = 1):
        self.tokenizer, self.stops, self.adaptive, self.grammars = tokenizer, stops, life.adaptive, life.grammars
        self.payoff = payoff  # per-row rounds: epochs with and without drafting, compared (payoff.py)
        self.max_seq_len = max_seq_len
        self.k_max, self.trees = k_max, trees
        self.fill_budget = fill_budget  # prompt tokens a packed round prefills (0: not packed)
        self.intake_ = Intake(tokenizer, vocab_size=vocab_size, max_seq_len=max_seq_len, defaults=defaults,
                              grammars=self.grammars)
        self.life, self.slots = life, life.table
        self.fills = PromptFills(self.slots)  # rows whose prompts packed rounds prefill
        self.stats = stats
        # What rows' new tokens do (outputs, grammars, stops, statistics, Results): postprocess.py.
        self.outcomes = RowOutcomes(self.slots, stops, self.grammars, self.stats, tokenizer)
        self.admitting = True
        self.place = place  # a round's rows and lengths on the device, as its verify pass reads them
        self.decoding, self.wave = decoding, wave
        # The path is chosen once: a packed round's rows are the ones whose prompts are in, and it prefills
        # chunks; otherwise the running rows (every slot on the static path). Where each row verifies its own
        # drafts (packed verifies: eager, or the static path's chains), adaptive speculation chooses them per row,
        # and a lookup does not propose for hopeless rows.
        self._schedule = self._schedule_packed if fill_budget else self._schedule_unpacked
        self._round_rows = self.slots.every_slot if static else self.slots.active_span
        per_row_choice = self.adaptive is not None and per_row
        self._choose = self._choose_rows if per_row_choice else self._choose_round
        self._skips_hopeless = per_row_choice and life.drafter.policy.propose_first

    def stop_admitting(self) -> None:
        """Take no new rows: the ones in flight finish, then the job is done (done)."""
        self.admitting = False

    def cut_short(self) -> list[tuple[int, Result]]:
        """Every running row finished as it stands (finish_reason "length": a deadline is a limit), and no
        prompt left to bring in; a row still waiting for its first token ends with an empty completion."""
        self.fills.drop()
        return [(slot, self.outcomes.finish(slot, FINISH_LENGTH)) for slot in self.slots.active()]

    # ---- requests in --------------------------------------------------------------------------------

    def feed(self, requests: Iterable[Request]) -> None:
        self.intake_.feed(requests)

    @property
    def done(self) -> bool:
        """No request runs and none will be admitted."""
        return not self.slots.active() and (self.intake_.drained or not self.admitting)

    def intake(self) -> tuple[list[Seat], list[Result]]:
        """Rows for the free slots, pulled lazily: (seats of the new rows, Results of requests that cannot
        run). Seated rows are occupied on the host; the generator fills the device side."""
        free = self.slots.free() if self.admitting else []
        if self.decoding is not None and len(free) < self.wave and self._waiting():
            free = []  # rows wait in spare slots: the next ones are seated, and their prompts prefilled, together
        admitted, errors = self.intake_.take(len(free))
        for _ in errors:
            self.stats.error()
        seats = []
        for slot, row in zip(free, admitted):
            self.life.seat(slot, row)
            seats.append(Seat(slot, row))
        return seats, errors

    def seated(self, seated: Seated) -> list[tuple[int, Result]]:
        """Admission's device side is done (admission.py): the rows packed rounds fill in, the prompt logprobs
        and the first tokens admission decided. Returns the rows their first token finished (slot, Result)."""
        self.fills.add(seated.later)  # prefilled inside the next packed rounds
        for slot, blocks, k in seated.prompt_logprobs:
            self.outcomes.set_prompt_logprobs(slot, blocks, k)
        if seated.tokens is None:  # drawn on the device: they reach the host with the rows' first rounds
            for seat in seated.now:
                self.slots[seat.slot].first_drawn = True
            return []
        return self.outcomes.first_tokens([s.slot for s in seated.now], seated.tokens, seated.logprobs)

    def _waiting(self) -> bool:
        """Some seated row has not decided its first token yet (its prompt is being prefilled, or it waits in a
        spare slot): a decoding row that finishes now has a row to take its place."""
        return any(self.slots[slot].awaiting_first for slot in self.slots.active())

    # ---- a round ------------------------------------------------------------------------------------

    def schedule(self) -> Plan:
        """The round's plan: its rows, their lengths, room and limits (and a packed round's prompt chunks). Its
        budgets and shape come from `choose` (before drafting, or after it for a drafter that proposes first)."""
        return self._schedule()

    def _schedule_unpacked(self) -> Plan:
        """An unpacked round: its rows are every slot on the static path, else the running ones."""
        rows = self._round_rows()
        records = [self.slots[r] for r in rows]
        lengths = [r.length if r is not None else 1 for r in records]
        room = [r.room(self.max_seq_len) if r is not None else 0 for r in records]
        running = [i for i, r in enumerate(records) if r is not None]
        span = slice(rows[0], rows[-1] + 1) if rows and rows[-1] - rows[0] == len(rows) - 1 else None
        return Plan(rows=rows, span=span, lengths=lengths, running=running, room=room,
                     limits=self._limits(rows, running, room, lengths, 0),
                     **self.place(rows, lengths))

    def _schedule_packed(self) -> Plan:
        """A packed round: the chunks of new prompts it prefills, first come first served within the fill
        budget, and the rows that decide a token: every running row whose prompt is in the cache once this
        round's chunks are (a new row's first decision rides in the forward of its last chunk)."""
        fills, left = self.fills.plan(self.fill_budget)
        rows = [slot for slot in self.slots.active()
                if self.slots[slot].copies is None and left.get(slot, self.slots[slot].unfilled) == 0]
        if self.decoding is not None:
            rows = self._deciding(rows)
        records = [self.slots[r] for r in rows]
        lengths = [r.length - r.awaiting_first for r in records]  # a first decision: L = P
        room = [r.room(self.max_seq_len) for r in records]
        span = slice(rows[0], rows[-1] + 1) if rows and rows[-1] - rows[0] == len(rows) - 1 else None
        running = list(range(len(rows)))
        chunks = sum(count for _, _, count in fills)
        limits = self._limits(rows, running, room, lengths, chunks)
        # The plan books its chunks as written (the rows and limits above read the records before): the verify
        # pass only carries them out.
        fill_slots = [self.fills.samples_of(slot) for slot, _, _ in fills]
        return Plan(rows=rows, span=span, lengths=lengths, running=running, room=room, limits=limits,
                     fills=fills, fill_slots=fill_slots, copies=self.fills.book(fills), **self.place(rows, lengths))

    def _deciding(self, ready: list[int]) -> list[int]:
        """With spare slots: of the rows whose prompts are in, those that decide already, then rows waiting for
        their first decision (the longest seated first) up to `decoding` rows; the others wait, their prompts
        cached, for a decoding row to finish. Prefilling prompts in waves ahead of the rows that finish costs
        less than one at a time as each slot frees (a CPU's products over a prompt alone run 20-50% slower a
        token: docs/benchmarks.md), and the rows' pace no longer decides it."""
        going = [slot for slot in ready if not self.slots[slot].awaiting_first]
        new = sorted((slot for slot in ready if self.slots[slot].awaiting_first),
                     key=lambda slot: self.slots[slot].started)
        return sorted(going + new[: max(0, self.decoding - len(going))])

    def _limits(self, rows: list[int], running: list[int], room: list[int], lengths: list[int],
                chunk_tokens: int) -> list[int]:
        """The plan's most drafts each row may propose: its room, up to k_max; under per-row adaptive speculation
        with a drafter that proposes first (a lookup), 0 for the rows whose drafts cannot pay, so that it does
        not propose for them (AdaptiveK.hopeless: the choice is the same as if they had proposed)."""
        limits = [min(self.k_max, n) for n in room]
        if rows and self.adaptive is not None:  # once a round, before anything prices it (here, then `choose`)
            self.adaptive.costs.at_length(max(lengths) + self._widest)
        if not rows or not self._skips_hopeless:
            return limits
        if self._plain_epoch:  # nobody proposes
            hopeless = [True] * len(running)
        else:
            hopeless = self.adaptive.hopeless([rows[i] for i in running], len(running) + chunk_tokens,
                                              self.adaptive.costs)
        for i, skip in zip(running, hopeless):
            if skip:
                limits[i] = 0
        return limits

    def choose(self, plan: Plan, proposed: list[int] | None = None,
               priors: list[float | None] | None = None) -> tuple[RoundShape, list[int]]:
        """The round's shape and each row's number of drafts (the Round's `budgets`). proposed: what each row
        already proposed (a drafter that proposes first), whose longest proposal bounds a chain's width; else
        the plan's limits; priors: the drafter's own chance that each row's first draft is right (its rows'
        acceptance prior)."""
        return self._choose(plan, proposed if proposed is not None else plan.limits, priors)

    def _tree_room(self, plan: Plan) -> list[int]:
        """How deep each row's tree may go: its room, and none for a constrained row, whose grammar masks only the
        position it decides (each of a tree's nodes would need the grammar's state after its own path)."""
        constrained = set(self.grammars.constrained(plan.rows)) if self.trees else set()
        return [0 if i in constrained else r for i, r in enumerate(plan.room)] if constrained else plan.room

    def _choose_round(self, plan: Plan, offer: list[int],
                      priors: list[float | None] | None) -> tuple[RoundShape, list[int]]:
        """One shape for the whole round (adaptive's, or k_max / the first tree without it), each row's drafts up
        to its offer (a tree: as deep as its room allows)."""
        room = self._tree_room(plan)
        if self.adaptive is None:
            shape = RoundShape(tree=self.trees[0]) if self.trees else RoundShape(drafts=self.k_max)
        else:
            shape = self.adaptive.choose(plan.running_slots, [offer[i] for i in plan.running],
                                         [room[i] for i in plan.running],
                                         [priors[i] for i in plan.running] if priors is not None else None)
        if shape.tree is not None:
            return shape, list(room)  # a tree is as deep as each row's room allows
        return shape, [min(shape.drafts, n) for n in offer]

    def _choose_rows(self, plan: Plan, offer: list[int],
                     priors: list[float | None] | None) -> tuple[RoundShape, list[int]]:
        """Each row its own drafts (rows that verify per row, under adaptive speculation): the round's shape and
        each row's drafts (AdaptiveK.choose_rows) over its running rows; a static round's idle slots draft
        nothing."""
        adaptive = self.adaptive
        budgets = [0] * len(plan.rows)
        if self._plain_epoch:
            return adaptive.shapes[0], budgets
        at = plan.running
        pick = lambda values: [values[i] for i in at]  # noqa: E731
        rows = pick(plan.rows)
        lags = self.life.drafter.lags(rows, pick(plan.lengths)) if adaptive.policy.draft_forwards else None
        index, drafts = adaptive.choose_rows(rows, pick(offer), pick(self._tree_room(plan)),
                                             pick(priors) if priors is not None else None,
                                             len(at) + plan.chunk_tokens, adaptive.costs, lags)
        for i, k in zip(at, drafts):
            budgets[i] = k
        return adaptive.shapes[index], budgets

    @property
    def _plain_epoch(self) -> bool:
        """The payoff check runs an epoch without drafts (payoff.py)."""
        return self.payoff is not None and not self.payoff.drafting

    def _plain_price(self, plan: Plan) -> tuple[int, float] | None:
        """The round's rows but admission's, without drafts, as the cost model prices them (the measured round
        leaves admission out too): (their tokens, which the payoff check counts, the seconds); None before the
        costs are known and the rest of a round (host work) has been measured over 3 rounds or more."""
        costs = self.adaptive.costs
        if not isinstance(costs, PackedCosts) or not costs.known or costs.rest.n < 4:  # the weak zero and 3 rounds
            return None
        counted = sum(plan.rows[i] not in plan.admitted for i in plan.running)
        return counted, costs.prices().seconds(counted, 0, 0)

    @property
    def _widest(self) -> int:
        return max([self.k_max, *(t.nodes for t in self.trees)])

    def learn(self, round: Round, emitted: Emitted, seconds: float, cost: tuple | None = None,
              tokens: list[int] | None = None, forward: tuple[int, float] | None = None,
              ended: Sequence[int] = ()) -> None:
        """Adaptive speculation learns the round's cost and, from the same cut counts as the statistics,
        its acceptance. cost: a packed round's (forward tokens, forward seconds, drafting forwards' (tokens,
        seconds)), which price its rows' drafts apart; tokens: how many each running row emitted (the payoff
        check's); forward: the verify forward's (tokens, seconds) (Verified.forward); ended: the new tokens of
        the rows the round finished (the payoff check's)."""
        if self.adaptive is None:
            return
        if self.payoff is not None:
            self.payoff.finished(ended)
        exploring = self.adaptive.explored and not self._plain_epoch  # the round's drafts were exploration's
        if self.payoff is not None and tokens is not None:
            # Admission is the job's work whichever arm runs: its share of the forward and the admitted rows'
            # first tokens are taken out.
            plan = round.plan
            admitted = plan.admitted
            counted = sum(n for i, n in zip(plan.running, tokens) if plan.rows[i] not in admitted)
            self.payoff.observe(counted, seconds - plan.admission_seconds(forward), rows=len(plan.running),
                                plain=self._plain_price(plan),
                                learning=self.adaptive.learning and not self._plain_epoch,
                                admitting=bool(plan.fills), drafted=any(round.budgets),
                                ending=self.intake_.drained)
        drafted, accepted = [c.drafted for c in emitted.counts], [c.accepted for c in emitted.counts]
        shape = self.adaptive.shapes.index(round.shape)
        measured = (RoundCost(shape, len(emitted.slots), seconds) if cost is None else
                    RoundCost(shape, len(emitted.slots), seconds, sum(drafted), cost[0], cost[1], tuple(cost[2]),
                              prompt_tokens=round.plan.chunk_tokens, exploring=exploring))
        self.adaptive.observe(measured, emitted.slots, round.chosen_for(emitted.slots), drafted, accepted,
                              round.proposed_for(emitted.slots), emitted.tokens)
