"""Whether drafting pays, measured by the wall clock: epochs of rounds with drafting and without, compared.

Adaptive speculation chooses drafts from its books: an acceptance model and a cost model fitted to the
rounds it ran (adaptive.py, packed_choice.py). Costs the books do not see can make a drafter that they
call profitable slower than plain decoding (on 2 CPU cores ngram at batch 32 ran 0.85-0.93x drafter none
while its calibration said its drafts paid: docs/benchmarks.md). So
per-row rounds (packed, or the captured path's) run in epochs, each with drafting allowed (the
controller chooses as before; `drafting_rounds` rounds) or not (every row drafts nothing;
`plain_rounds`, fewer, since in a job of a few hundred rounds that drafts well its first plain epochs
are a cost), and the tokens the rounds emit per second of their wall time are compared:

    warm-up (drafting; not counted) | on | off | on | off | the winner ... | the loser | the winner ...

What an epoch measures: the tokens its rounds emit over their wall time, over the rounds with as many
rows as the job has had at most, and of those only the rounds that admit nothing (no prompt chunk in
their forward) when they are at least half of the epoch. Admission is the job's work whichever arm runs,
and a round that prefills several prompts takes 2-4x a decoding round; rounds at the job's tail run fewer
rows. Counted in full, both made one epoch's rate differ from the next by 12-23% (ngram at batch 32, 2 CPU
cores), so that the verdict followed the admission waves (1.11-1.15x drafting over plain where the arms'
totals said 0.89-0.91x). Taking admission's share of a forward out in proportion to its tokens is not enough
where a verified token costs more than a prompt token (Gemma-3's 262,144-token LM head: ~2.7x): with ngram
at batch 8 a fifth of the drafting rounds admitted (drafting spreads admissions; drafter none admits in
waves), and the check said 1.33-1.38x where the rounds that admitted nothing ran 0.87-0.94x (2026-12-02).
An epoch whose rounds mostly admit (large batches, staggered lengths) falls back to all its rounds with
admission's share taken out that way (the admitted rows' first tokens not counted either). Rounds below
full occupancy count towards no epoch; in the job's tail they run the verdict's arm (`_settle`).

An epoch is only ever compared with the two epochs of the other arm around it (the geometric mean of
their rates), so that a machine whose speed drifts over minutes (this project's 2-core VMs move by
10-20%) does not decide; the log-ratios of those comparisons are averaged with a decay. The loser is
tried again after `interval` drafting epochs' worth of rounds of the winner, an interval that doubles
while the verdict holds (up to `max_interval`; straight there when one arm is `clear` times the other)
and starts over at 2 when it flips or the last comparison doubts it, so that a job whose workload
changes finds out, at a cost of about one epoch in max_interval + 1 at the loser's rate. A tie goes to
plain decoding (drafting must gain `margin`) where rows would otherwise finish together: rows that advance at
different paces finish at different rounds, so a job's last rounds run part-empty, a cost no epoch sees.
Gemma-3-270M with ngram on 32 rows of 48 tokens at batch 8 (2 CPU cores, 2026-12-04): its epochs compared
1.00x, the verdict (ties then went to drafting) kept drafting, and the job's last 38 rounds ran 3.7 of 8 rows
(drafter none: 1 such round), 0.92x drafter none; where the verdict was plain, 1.02x. Where the finished
rows' lengths differ (stop tokens, per-row budgets; coefficient of variation >= `ragged`) a tie goes to the
controller's choice: the tail is ragged anyway, and the rounds no epoch counts gain most from drafts (p512,
96 staggered rows, batch 32, draft model, 2 CPU cores, 2026-12-05: fixed k=2 +4-9% in full rounds that
admitted nothing, +23% in admitting ones, +12-14% at 16-31 rows; epochs compared 1.00-1.01, and the verdict
plain held the job to 0.91 of fixed k=2).

A job's first verdict comes after two comparisons (warm-up, on, off, on, off: 72 rounds with an 8-round
warm-up), or after the first (64) when that one is `clear`-wide; the warm-up is 8 rounds instead of 24 when the controller starts
from the machine's measured costs (startup_costs.py), longer while it still explores its acceptance (up to
`max_warmup`: exploring rounds are neither kind of epoch). A short job cannot wait that long, so two verdicts
come sooner, each on a gap of `clear`:
  - a drafter that wins clearly: the first drafting epoch against the books' price of its own rounds
    without drafts (`observe`'s `plain`: the cost model's, the measured forward and the measured rest of
    a round), after 32 rounds and no plain epoch. Provisional: the first plain trial comes after 2
    drafting epochs and its comparison, made by the clock, takes over. A held-out pair whose drafts were
    0.94 right ran 0.66-0.86 of its best fixed k in jobs of 40-100 rounds, 16 of them plain (2026-11-29);
  - a drafter that loses clearly: the first plain epoch against the drafting epoch just before it, after
    40 rounds of which 32 drafted (as many as before this order), where the books agree (their price of the
    drafting epoch's rounds without drafts is faster than those rounds ran). One 8-round epoch against
    one 24-round one is noisy: on SmolLM2-135M with ngram (batch 8, 2026-12-03) a plain epoch 1.16x the
    drafting one before it gave the verdict plain where the books priced plain rounds 0.88x that epoch and
    fixed k=2 ran 1.05x drafter none. A drafter that loses by as much as the books see still stops at once.

The check changes which rounds draft, never a greedy output (speculation is exact); like the rest of adaptive
speculation it makes a sampled output depend on timing, which is why sampling keeps k fixed unless told otherwise.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

log = logging.getLogger("batchspec")

OFF, ON = 0, 1
IDLE = 4  # a drafting epoch that drafted in fewer than 1 / IDLE of its rounds is not compared (_idle)


@dataclass
class _Sums:
    """An epoch's rounds summed: tokens, seconds, and the books' plain price of them (tokens, seconds)."""

    rounds: int = 0
    tokens: float = 0.0
    seconds: float = 0.0
    books: list[float] = field(default_factory=lambda: [0.0, 0.0])
    drafted: int = 0  # rounds with drafts

    def add(self, tokens: int, seconds: float, plain: tuple[int, float] | None, drafted: bool = True) -> None:
        self.rounds, self.tokens, self.seconds = self.rounds + 1, self.tokens + tokens, self.seconds + seconds
        self.drafted += drafted
        if plain is not None:
            self.books = [self.books[0] + plain[0], self.books[1] + plain[1]]


@dataclass
class PayoffCheck:
    """Call `drafting` before a round (may its rows draft?) and `observe(tokens, seconds)` after it."""

    drafting_rounds: int = 24  # rounds in an epoch with drafting allowed
    plain_rounds: int = 8  # rounds in an epoch without: shorter, since a short job that drafts well pays for them
    margin: float = 0.03  # drafting must be this much faster than plain decoding to be preferred, unless
    ragged: float = 0.25  # the finished rows' lengths vary this much (coefficient of variation): ties go to drafting
    clear: float = 1.15  # a gap this wide needs no confirming: the loser is next tried after max_interval
    decay: float = 0.5  # per comparison
    max_interval: int = 16  # epochs of the winner between trials of the loser, at most
    warmup_rounds: int | None = None  # the warm-up epoch's rounds (None: drafting_rounds); shorter when the
    #   controller starts from the machine's measured costs, which is what the warm-up otherwise learns
    max_warmup: int = 48  # the warm-up's rounds at most while the controller explores its acceptance
    rounds: list[int] = field(default_factory=lambda: [0, 0])  # rounds run per arm, warm-up included
    _arm: int = ON  # the current epoch's arm (the first epoch: the controller's warm-up)
    _round: int = 0  # rounds into the current epoch
    _warm: bool = False  # the warm-up epoch (the controller learning its costs) is over; it is not compared
    _epoch: list[_Sums] = field(default_factory=lambda: [_Sums(), _Sums()])  # the current epoch's: all its
    #   counted rounds, and those of them that admitted nothing
    _last: list[tuple[int, float]] = field(default_factory=list)  # the last three counted epochs: (arm, rate)
    _score: float = 0.0  # decayed sum of log(drafting's rate / plain's rate) over the comparisons
    _weight: float = 0.0
    _compared: int = 0
    _winner: int | None = None
    _interval: int = 2
    _since: int = 0  # rounds of the winner since the comparison that closed the loser's last trial
    _rates: list[float] = field(default_factory=lambda: [0.0, 0.0])  # each arm's rate in its last comparison
    _full: int = 0  # the most rows a round has had: rounds with fewer (a job's tail) are not counted
    _provisional: bool = False  # the verdict is the books' (_clear_early): the first comparison replaces it
    _books_plain: float | None = None  # the books' plain rate over the last drafting epoch's rounds (None: unpriced)
    _lengths: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # finished rows: count, sum, squares

    @property
    def drafting(self) -> bool:
        return self._arm == ON

    @property
    def winner(self) -> str | None:
        """'drafting', 'plain' or None before the first two comparisons."""
        return None if self._winner is None else ("drafting" if self._winner == ON else "plain")

    @property
    def ratio(self) -> float:
        """Drafting's tokens per second over plain decoding's, as the comparisons average it (1.0 before)."""
        return math.exp(self._score / self._weight) if self._weight else 1.0

    def finished(self, lengths: list[int]) -> None:
        """Rows ended with these numbers of new tokens (whether a tie goes to drafting: `_margin`)."""
        for n in lengths:
            self._lengths = [self._lengths[0] + 1, self._lengths[1] + n, self._lengths[2] + n * n]

    @property
    def _margin(self) -> float:
        """What drafting must gain to be preferred: 0 once 8 or more finished rows' lengths differ (the module's)."""
        count, total, squares = self._lengths
        mean = total / max(count, 1)
        ragged = count >= 8 and mean > 0 and math.sqrt(max(squares / count - mean * mean, 0.0)) >= self.ragged * mean
        return 0.0 if ragged else self.margin

    def observe(self, tokens: int, seconds: float, rows: int | None = None,
                plain: tuple[int, float] | None = None, learning: bool = False, admitting: bool = False,
                drafted: bool = True, ending: bool = False) -> None:
        """A round ended: it emitted `tokens` over its `rows` in `seconds` of wall time (admission's share
        taken out; admitting: it prefilled prompt chunks). A round with fewer rows than the most seen (a job's
        tail) is not counted. plain: the tokens the same rows would emit without drafts and the seconds the
        cost model prices that round at (None: not priced). learning: the controller still explores its
        acceptance, which the warm-up waits for (up to `max_warmup` rounds): exploring rounds, compared with a
        plain epoch, gave a drafter that ran 1.45x plain at fixed k the verdict plain (2026-11-29). drafted:
        the round had drafts (see _idle). ending: nothing is left to admit (see _settle)."""
        self.rounds[self._arm] += 1
        if rows is not None:
            self._full = max(self._full, rows)
            if rows < self._full:
                if ending:
                    self._settle()
                return
        for sums in self._epoch[:1] if admitting else self._epoch:
            sums.add(tokens, seconds, plain, drafted)
        self._round += 1
        length = self.drafting_rounds if self._arm == ON else self.plain_rounds
        if not self._warm and self.warmup_rounds is not None:
            length = self.warmup_rounds
        if not self._warm and learning:
            length = max(length, min(self._round + 1, self.max_warmup))
        if self._round >= length:
            self._end_epoch()

    def _settle(self) -> None:
        """The job's tail (nothing left to admit, fewer rows than the most seen) counts towards no epoch: its rounds
        run the verdict's arm (drafting before one), not the epoch they fell in, which ran a 96-row job's last 80
        of 198 rounds plain (q384, batch 32, suffix: 0.88 of fixed k=2, 2 CPU cores, 2026-12-06)."""
        if (arm := ON if self._winner is None else self._winner) != self._arm:
            self._arm, self._round, self._epoch = arm, 0, [_Sums(), _Sums()]

    def _end_epoch(self) -> None:
        every, clean = self._epoch
        sums = clean if 2 * clean.rounds >= every.rounds else every
        (tokens, seconds), ended, books = (sums.tokens, sums.seconds), self._arm, sums.books
        self._round, self._epoch = 0, [_Sums(), _Sums()]
        if self._warm and ended == ON and IDLE * sums.drafted < sums.rounds:
            self._idle()
            return
        if self._warm:
            self._last = (self._last + [(ended, tokens / max(seconds, 1e-12))])[-3:]
        if ended == ON:  # the books against the clock only on rounds that admitted nothing (see _clear_early)
            self._books_plain = books[0] / books[1] if books[1] > 0 and sums is clean else None
        if self._winner is None and self._compared == 0 and self._clear_early(ended):
            return
        compared = self._warm and len(self._last) == 3 and self._last[0][0] == self._last[2][0] != self._last[1][0]
        if compared:
            self._compare()
        # Alternate until two comparisons (on first, after the warm-up), unless the first is already wide:
        # one epoch's noise is 4-6%, a gap of `clear` (15%) is not noise, and a short job cannot wait.
        decided = self._compared == 1 and compared and max(self.ratio, 1 / self.ratio) >= self.clear
        if self._winner is None and self._compared < 2 and not decided:
            self._arm = OFF if self._warm and self._last[-1][0] == ON else ON
            self._warm = True
            return
        self._arm = self._next(ended, compared)

    def _idle(self) -> None:
        """A drafting epoch in which the controller drafted in fewer than 1 / IDLE of its rounds: it measured
        plain decoding, not drafting, so it is compared with nothing and the epochs on either side of it are not
        compared across it. Drafting stays allowed (the controller that drafts nothing decodes plainly already),
        unless plain decoding is the verdict, whose trial this was: the verdict stands until the next. Compared,
        such epochs read 0.97-0.98 of the plain epochs around them and gave the verdict plain, which then kept the
        controller from drafting (and from learning its acceptance) for the rest of the job: a draft model whose
        choice ran 1.10-1.16x plain decoding wherever it drafted, at 0.98-0.99x drafter none in those jobs (p512,
        96 staggered rows at batch 32, 2 CPU cores, 2026-12-05). A controller that drafts in fewer than a quarter
        of its rounds at a loss loses at most that share of its loss per round unchecked."""
        self._last = []
        if self._winner == OFF:
            self._arm, self._since = OFF, 0

    def _clear_early(self, ended: int) -> bool:
        """The verdicts a short job cannot wait for (the module's docstring): the first drafting epoch `clear`
        times the books' plain price of its rounds, or the first plain epoch `clear` times the drafting epoch
        before it while the books' price of that epoch's rounds without drafts is faster than they ran too. Sets
        the verdict and the next arm; False when neither holds. The books are read only where the epoch counted
        the rounds that admitted nothing: an admitting round's clock loses admission's share in proportion to
        its tokens, which takes out too much where a verified token costs more than a prompt token, so that
        there the clock reads fast against the books (SmolLM2-135M with ngram at batch 64, chat prompts of ~220
        tokens, staggered rows, 2 CPU cores, 2026-12-04: the first drafting epoch read 1.29x the books' plain
        price of its own rounds, a provisional verdict of drafting, in a job whose drafts added 5% to the
        tokens of a forward and which ran 0.99x drafter none)."""
        if len(self._last) == 1 and ended == ON and self._books_plain is not None:
            plain, drafting = self._books_plain, self._last[0][1]
            if drafting < self.clear * plain:
                return False
            interval = 2  # provisional: a plain trial soon, whose comparison the clock makes
            self._provisional = True
        elif len(self._last) == 2 and ended == OFF:
            (_, drafting), (_, plain) = self._last
            if plain < self.clear * drafting or self._books_plain is None or self._books_plain <= drafting:
                return False
            interval = None
        else:
            return False
        self._rates = [plain, drafting]
        self._score, self._weight, self._compared = math.log(max(drafting, 1e-12) / max(plain, 1e-12)), 1.0, 1
        self._arm = self._next(ended, compared=True)
        self._interval = interval or self._interval
        return True

    def _compare(self) -> None:
        """The last three epochs are a, b, a: b's rate against the geometric mean of the a's."""
        (a, first), (b, middle), (_, last) = self._last
        around = math.sqrt(first * last)
        self._rates[a], self._rates[b] = around, middle
        r = math.log(max(self._rates[ON], 1e-12) / max(self._rates[OFF], 1e-12))
        if self._provisional:  # the books priced plain rounds; the clock measured them: its word replaces theirs
            self._score, self._weight, self._provisional = 0.0, 0.0, False
        self._score, self._weight = self.decay * self._score + r, self.decay * self._weight + 1
        self._compared += 1

    def _next(self, ended: int, compared: bool) -> int:
        """The arm of the next epoch, once two comparisons were made (compared: the epoch that ended closed one)."""
        if compared:  # (the first verdict comes with the second comparison, or a wide first one)
            margin = self._margin
            verdict = ON if self.ratio >= 1 + margin else OFF
            latest = self._rates[ON] / max(self._rates[OFF], 1e-12)  # the last comparison's
            agrees = (latest >= 1 + margin) == (verdict == ON)
            wide = agrees and min(max(self.ratio, 1 / self.ratio), max(latest, 1 / latest)) >= self.clear
            if verdict != self._winner or not agrees:  # a new verdict, or one the last comparison doubts: soon again
                if verdict != self._winner:
                    log.info("speculation: %s (%.1f tokens/s drafting, %.1f without, in the last comparison)",
                             "drafting pays" if verdict == ON else "drafting does not pay; plain decoding until the next trial",
                             self._rates[ON], self._rates[OFF])
                self._interval = self.max_interval if wide else 2
            else:
                self._interval = self.max_interval if wide else min(2 * self._interval, self.max_interval)
            self._winner, self._since = verdict, 0
            return verdict
        if ended != self._winner:  # the loser's trial: the winner again, which closes the comparison
            return self._winner
        # The interval counts drafting epochs' worth of rounds, so that plain decoding's shorter epochs do not
        # bring drafting's trials round sooner.
        self._since += self.drafting_rounds if ended == ON else self.plain_rounds
        return (1 - self._winner) if self._since >= self._interval * self.drafting_rounds else self._winner

    def summary(self) -> dict:
        """Rounds per arm, the verdict and drafting's rate over plain decoding's (for logs and statistics)."""
        return {"rounds_drafting": self.rounds[ON], "rounds_plain": self.rounds[OFF], "winner": self.winner,
                "ratio": self.ratio}
