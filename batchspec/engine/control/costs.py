"""What a round costs, for adaptive speculation: measured round times (eager) or timed replays (captured).

Eager forwards (CPU) are timed as whole rounds (`RoundTimes`). Captured forwards (CUDA graphs) have
steady device times that do not depend on how many slots are busy (every slot rides along), so
`StepTable` times the captured steps themselves by replays, once per attended-length bucket, and adds
the round's host overhead measured as the rest of each round's wall time; eager wall-clock on a GPU
swings 2x between runs and cannot tell k apart. Costs are indexed by shape index: chains k = 0..k_max,
then the trees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

from .line import Line
from .row_drafts import Prices, interpolate
from .startup_costs import StartupCosts


@dataclass(frozen=True, slots=True)
class RoundCost:
    """What one round cost: the record every cost model learns from (each reads the part it prices by). A
    packed round (tokens > 0) also says what its target forward computed and how long it and each drafting
    forward took, which prices its rows' drafts apart."""

    shape: int  # the round's shape index: chains k = 0..k_max, then the trees
    rows: int  # rows it verified
    seconds: float  # its wall time
    drafts: int = 0  # drafts it verified
    tokens: int = 0  # its target forward's tokens (packed rounds; 0: not known)
    verify_s: float = 0.0  # that forward's seconds
    steps: tuple[tuple[int, float], ...] = ()  # each drafting forward's (tokens, seconds)
    prompt_tokens: int = 0  # of `tokens`, prompt chunks prefilled in the same forward (admission)
    exploring: bool = False  # the controller's exploration or sampling chose its drafts (packed_choice.py)


class CostModel(Protocol):
    """What every cost model does, with the same signatures: learn from a round, and hear the length its rows
    now attend over (before the round is priced: the captured path's tables are per attended-length bucket)."""

    def observe(self, round: RoundCost) -> None: ...
    def at_length(self, kv_len: int) -> None: ...  # rows now attend over about kv_len entries


class WholeRoundCosts(CostModel, Protocol):
    """A cost model of whole rounds (RoundTimes, StepTable): what AdaptiveK.choose reads."""

    def cost(self, k: int, b: int) -> float | None: ...  # seconds of a round of shape k over b rows


CURVE_POINTS = 4  # forwards measured at start at this many N or more price N by their curve (row_drafts.Prices)
FEW_DRAFTS = 4  # a round with fewer drafts than a quarter of its rows does not price a draft's host work
EXCESS_ROUNDS = 3  # few-draft rounds seen before their excess over the prices is charged to a drafting round


def rest_of(round: RoundCost) -> float:
    """A packed round's seconds outside its target and drafting forwards (host work, acceptance, bookkeeping)."""
    return max(round.seconds - round.verify_s - sum(s for _, s in round.steps), 0.0)


@dataclass
class RoundTimes:
    """Eager forwards: an exponential moving average of whole-round wall time per (k, b). A k not yet
    measured at this b borrows the shape of the curve from the nearest batch size that measured it."""

    smoothing: float = 0.2  # weight of a new round time in the (k, b) average
    costs: dict[int, dict[int, float]] = field(default_factory=dict)  # b -> k -> seconds
    samples: dict[tuple[int, int], int] = field(default_factory=dict)  # (b, k) -> rounds timed

    def cost(self, k: int, b: int) -> float | None:
        table = self.costs.get(b, {})
        if k in table:
            return table[k]
        measured = [bb for bb, t in self.costs.items() if k in t]
        if not measured:
            return None
        near = self.costs[min(measured, key=lambda bb: (abs(bb - b), bb))]
        common = [j for j in table if j in near]
        scale = table[common[0]] / near[common[0]] if common else 1.0
        return near[k] * scale

    def observe(self, round: RoundCost) -> None:
        k, b, seconds = round.shape, round.rows, round.seconds
        table = self.costs.setdefault(b, {})
        n = self.samples[b, k] = self.samples.get((b, k), 0) + 1
        # The first time of each (k, b) is replaced by the second: a cold first round must not steer
        # hundreds of rounds.
        table[k] = seconds if n <= 2 else (1 - self.smoothing) * table[k] + self.smoothing * seconds

    def at_length(self, kv_len: int) -> None:
        pass  # whole-round times already include the attended length


@dataclass
class StepTable:
    """Captured forwards: the device time of a round's captured steps for k = 0..k_max, measured by
    timed replays once per attended-length bucket (`measure(bucket)`), plus the round's host overhead
    (sampling, bookkeeping, the host sync) per k: the average of measured round time minus the table.
    The table is a round whose every slot verifies the shape's whole width: a packed verify of fewer rows, or
    of a lookup's trees with fewer nodes, costs less, and the overhead per k averages that gap in."""

    measure: Callable[[int], list[float]]
    bucket_of: Callable[[int], int] = lambda kv_len: kv_len  # the attended-length bucket of a length
    smoothing: float = 0.1
    tables: dict[int, list[float]] = field(default_factory=dict)  # bucket -> seconds for k = 0..k_max
    overhead: dict[int, float] = field(default_factory=dict)  # k -> seconds beyond the table
    bucket: int | None = None

    def at_length(self, kv_len: int) -> None:
        """Rows grew (or shrank) into another attended-length bucket: time its steps the first time."""
        bucket = self.bucket_of(kv_len)
        if bucket not in self.tables:
            self.tables[bucket] = list(self.measure(bucket))
        self.bucket = bucket

    def cost(self, k: int, b: int) -> float | None:
        if self.bucket is None:
            return None
        known = list(self.overhead.values())
        extra = self.overhead.get(k, sum(known) / len(known) if known else 0.0)
        return self.tables[self.bucket][k] + extra

    def observe(self, round: RoundCost) -> None:
        if self.bucket is None:
            return
        k = round.shape
        residual = round.seconds - self.tables[self.bucket][k]
        old = self.overhead.get(k)
        self.overhead[k] = residual if old is None else (1 - self.smoothing) * old + self.smoothing * residual


@dataclass
class PackedCosts:
    """Eager packed rounds (packed.py): what a round costs as a function of what it computes, so that each
    row's number of drafts can be priced. Three parts, each measured as the job runs:
      verify: the target forward's seconds by its tokens N (every row's pending token and drafts, and the
        prompt chunks it prefills);
      step: one drafting forward's seconds by its tokens (a draft model's or EAGLE head's; lookups have none);
      rest: the round's other seconds (proposing on the host, acceptance, bookkeeping) by its drafted
        tokens D: checking drafts costs host time too (at batch 64 on CPU about 0.2 ms a draft, as much
        as a draft adds to the target forward), which decides whether a draft that is nearly even pays.
    The lines price drafts, a few tokens a row over the decoding rows, so they learn from forwards of that
    size only. A round that prefills prompt chunks (hundreds of tokens, attention over long queries, and
    admission's host work in its rest) and a drafting forward that feeds a row's prompt or catches it up
    cost more per token: on a held-out pair at batch 32 (2 CPU cores, 2026-11-29) the first round's
    prefill alone moved the verify line's price of a token from 0.18 ms (measured at start, and what
    decoding forwards cost) to 0.73 ms, the controller priced every draft out of the job and it ran 0.66x
    its best fixed k. `span`: the most tokens of a forward the lines learn from (None: any), set by
    `start_from` to twice the largest forward measured at start. With four or more sizes measured at start the
    verify forward is priced by their curve (`curve`, row_drafts.Prices.forward), scaled by the ratio of the rounds'
    forwards to its price of them (`level`): the line's slope then prices only forwards past the curve's ends."""

    verify: Line = field(default_factory=Line)
    step: Line = field(default_factory=Line)
    rest: Line = field(default_factory=lambda: Line(proportional=False))
    span: tuple[int, int] | None = None  # (verify tokens, drafting forward tokens) the lines learn from
    curve: tuple[tuple[int, float], ...] = ()  # the forward's (N, seconds) measured at start, N ascending
    feed: tuple[tuple[int, float], ...] = ()  # a drafting forward's seconds to feed N tokens more (start-up's)
    level: list[float] = field(default_factory=lambda: [1.0, 1.0])  # decayed sums of the rounds' forward
    #   seconds and of the curve's price of them: their ratio scales the curve (the job's attended lengths and
    #   the machine's speed move it; its shape in N is the start's)
    excess: Line = field(default_factory=lambda: Line(proportional=False))  # few-draft rounds' seconds over
    #   their price (their mean: x is always 0)
    plain_excess: Line = field(default_factory=lambda: Line(proportional=False))  # plain rounds' alike

    def observe(self, round: RoundCost) -> None:
        """A packed round: its forward's tokens and seconds, each drafting forward's, and the rest of its wall
        time by the drafts it verified (not a round that prefilled prompt chunks, nor forwards past `span`)."""
        verify_span, step_span = self.span or (None, None)
        # Only rounds without drafting forwards teach what a round pays for drafting at all (lookups): a draft
        # model's row that drafts after plain rounds first feeds what its cache lacks, which its exploration
        # prices apart (Prices.per_fed); charged to every round, it took a draft model on a held-out pair at
        # batch 32 from 1.08x drafter none to 1.02x (2 CPU cores, side by side).
        sparse = 0 < round.drafts and FEW_DRAFTS * round.drafts < round.rows  # fewer drafts than a quarter of rows
        price = (self.prices(per_round=False).seconds(round.tokens, 0, round.drafts)
                 if self.known and not (round.prompt_tokens or round.exploring or round.steps)
                 and (sparse or not round.drafts) else None)  # before this round teaches the lines
        # A drafting forward that fed prompts or caught rows up, or an exploring round (one draft on a row or
        # two: a drafting round's own host work, ~1 ms here, would be read as the price of each draft), does
        # not teach the rest of a round its price per draft.
        fed = round.exploring
        for n, seconds in round.steps:
            if step_span is None or n <= step_span:
                self.step.add(n, seconds)
            else:
                fed = True
        if round.prompt_tokens or (verify_span is not None and round.tokens > verify_span):
            return
        self.verify.add(round.tokens, round.verify_s)
        # The level from forwards inside the curve only: past its ends (a job's tail of fewer rows) the price is
        # the line's extrapolation, not a measurement.
        if self.curve and self.curve[0][0] <= round.tokens <= self.curve[-1][0]:
            priced = interpolate(self.curve, round.tokens)
            self.level = [self.verify.decay * self.level[0] + round.verify_s,
                          self.verify.decay * self.level[1] + priced]
        # Nor does a round whose drafts are few against its rows: its drafting rows' host work that is not per
        # draft (a lookup's rows first learning the tokens they queued while they drafted nothing: ~0.3 ms a
        # row on a held-out pair at batch 32, 2026-12-02) would be read as the price of each of its drafts.
        # It teaches what a round pays for drafting at all (`per_round`): its seconds over their price, against
        # plain rounds' (the prices' common error); the other rounds' rest is learnt net of it.
        if fed:
            return
        if not sparse:
            self.rest.add(round.drafts, rest_of(round) - (self.per_round if round.drafts else 0.0))
        if price is not None:
            (self.excess if round.drafts else self.plain_excess).add(0, round.seconds - price)

    @property
    def per_round(self) -> float:
        """What a round with drafts pays beyond its drafts' prices (Prices.per_round): few-draft rounds' seconds
        over their price less plain rounds', once EXCESS_ROUNDS few-draft rounds are seen (0 before)."""
        if self.excess.n < EXCESS_ROUNDS or not self.plain_excess.known:
            return 0.0
        return max(self.excess.fit()[0] - self.plain_excess.fit()[0], 0.0)

    def at_length(self, kv_len: int) -> None:
        pass  # eager packed rounds are timed as they run: their prices follow the lengths they attend

    def start_from(self, costs: StartupCosts) -> None:
        """The points measured at start (startup_costs.py): the verify and step lines are anchored on them
        (Line.measured), and the rest of a round starts from a weak zero that the first rounds replace. The
        first verify point is the batch's plain round (token_counts): the line is fitted on it and the larger N
        (what it prices is drafts over a batch, and forwards past the curve's top), the curve takes every point."""
        plain_n, plain_s = costs.verify[0] if costs.verify else (0, 0.0)
        self.verify = Line.measured([p for p in costs.verify if p[0] >= plain_n])
        self.step = Line.measured(costs.step)
        self.feed = tuple(sorted(costs.feed))
        self.rest.add(0, 0.0, weight=0.1)
        if costs.verify:
            self.span = (2 * max(n for n, _ in costs.verify), 2 * max((n for n, _ in costs.step), default=0) or None)
        if len({n for n, _ in costs.verify}) >= CURVE_POINTS:
            self.curve = tuple(sorted(costs.verify))
            self.level = [plain_s, plain_s]  # one plain round's weight at the measured level

    @property
    def known(self) -> bool:
        return (self.verify.anchor is not None or self.verify.w >= 2) and self.rest.w > 0

    def prices(self, per_round: bool = True) -> Prices:
        """The round's cost model as row_drafts.Prices (call when `known`); per_round: with what a round pays for
        drafting at all."""
        a, b = self.verify.fit()
        step, draft = self.step.fit() or (0.0, 0.0)
        rest, checking = self.rest.fit()
        extra = self.per_round if per_round else 0.0
        if self.curve:  # the measured shape at the rounds' level; the line's slope only past its ends
            scale = self.level[0] / max(self.level[1], 1e-12)
            return Prices(rest, b, step, draft + checking, tuple((n, scale * t) for n, t in self.curve), draft, extra,
                          self.feed)
        return Prices(rest + a, b, step, draft + checking, per_fed=draft, per_round=extra, feed=self.feed)


@dataclass
class StaticPackedCosts(PackedCosts):
    """The static path's packed verifies (packed_static.py), priced like eager packed rounds but without timing
    a forward by the wall clock (that would sync the device every round): per attended-length bucket, timed
    replays of the packed verify at a few token buckets give the verify line, and of one drafting step (every
    slot rides along in a captured one) the price of a step; the rest of the round (host work, acceptance) is
    its wall time less those, by its drafts, as in PackedCosts."""

    measure_verify: Callable[[int], list[tuple[int, float]]] | None = None  # bucket -> [(tokens, seconds)]
    measure_step: Callable[[int], float] | None = None  # bucket -> seconds of one drafting step
    bucket_of: Callable[[int], int] = lambda kv_len: kv_len
    tables: dict[int, tuple[Line, Line]] = field(default_factory=dict)  # bucket -> (verify line, step price)
    bucket: int | None = None

    def at_length(self, kv_len: int) -> None:
        """Rows grew (or shrank) into another attended-length bucket: time its steps the first time."""
        bucket = self.bucket_of(kv_len)
        if bucket == self.bucket:
            return
        if bucket not in self.tables:
            verify, step = Line(decay=1.0), Line(proportional=False)
            for tokens, seconds in self.measure_verify(bucket):
                verify.add(tokens, seconds)
            step.add(1, self.measure_step(bucket) if self.measure_step else 0.0)  # a price per step
            self.tables[bucket] = (verify, step)
        self.verify, self.step = self.tables[bucket]
        self.bucket = bucket

    def round_costs(self, tokens: int, steps: int) -> tuple[int, float, list[tuple[int, float]]]:
        """A round's (tokens, verify seconds, drafting steps' (tokens, seconds)) as the tables price them: what
        `observe` takes."""
        return tokens, self.verify.at(tokens) or 0.0, [(1, self.step.at(1) or 0.0)] * steps

    def observe(self, round: RoundCost) -> None:
        """The verify and step prices are the timed replays': only the rest of the round is learnt (not from a
        round that prefilled prompt chunks: admission's host work is in its rest)."""
        if not round.prompt_tokens:
            self.rest.add(round.drafts, rest_of(round))
