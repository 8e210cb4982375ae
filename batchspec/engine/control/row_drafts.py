"""How many drafts each row of a packed round verifies: the choice with the most predicted tokens per second.

A packed round (packed.py) costs by what it computes, so each row's drafts can be priced apart. Row i
with k_i drafts emits E_i(k_i) tokens in expectation (adaptive.py's acceptance model), and the round takes

    T(k) = fixed + forward(N) + per_step * S + per_draft * D  (+ per_round when D > 0)

seconds (`Prices`, from costs.PackedCosts; forward(N) = per_token * N, or the forward's times measured at
start, interpolated): N = base + D tokens in the target forward (base: one pending
token per deciding row, plus the prompt chunks it prefills), D = sum of k_i drafted tokens, S = the
drafting forwards (max k_i, for a drafter with forwards of its own; lookups draft on the host). The
choice maximises sum_i E_i(k_i) / T(k), with a round that prefills valued as one that only decodes
(`Prices.decoding`: drafts save decoding rounds, never prefill work).

For a fixed S and a fixed number m of drafts the round's time is fixed (whatever the forward costs at N, a
line or a measured curve: `Prices`), so the best m drafts are the m largest gains g_ij = E_i(j) - E_i(j - 1),
which fall with j, so that they are a prefix of each row's drafts: sort the gains, evaluate each prefix, keep
the best. Trying each S = 0 .. k_max finds the best overall. A row whose drafts do not pay drafts nothing and
costs its one pending token.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace
from typing import Callable


@dataclass(frozen=True, slots=True)
class Prices:
    """Seconds of a round: fixed, and per target token, per drafting forward, per drafted token. `curve`: the
    target forward's seconds measured at a few N ((N, seconds), N ascending): where given, the forward costs
    their piecewise-linear interpolation (per_token past either end) instead of per_token * N. A CPU's forward is
    not a line in N: SmolLM2-135M at batch 8 took 45 ms at 8 tokens, 52 at 9, 75 at 15 and 64 at 16 (2 cores,
    2026-12-04), so that a line through 8, 16 and 24 priced a first draft 2 ms where it cost 7. `per_fed`: a
    drafting forward's price of a token it feeds (its line's slope), for the tokens a row's draft cache lacks;
    `feed`: (tokens, seconds) measured for that (`fed`), where given.
    `per_round`: what a round pays for drafting at all, whatever its drafts (host work of a round with drafts,
    and what the forward's measured curve misses just past the batch's plain N): on a held-out pair at batch 8,
    T = 0.7, a round with one lookup draft took 0.5 ms (4%) more than a plain one where the prices said 0.1."""

    fixed: float
    per_token: float
    per_step: float = 0.0
    per_draft: float = 0.0
    curve: tuple[tuple[int, float], ...] = ()
    per_fed: float = 0.0
    per_round: float = 0.0
    feed: tuple[tuple[int, float], ...] = ()

    def seconds(self, tokens: int, steps: int, drafts: int) -> float:
        return (self.fixed + self.forward(tokens) + self.per_step * steps + self.per_draft * drafts
                + (self.per_round if drafts > 0 else 0.0))

    def fed(self, tokens: int) -> float:
        """What a drafting forward takes more to feed `tokens` tokens that rows' draft caches lack: the measured
        points' interpolation from (0, 0) (past the last, its last segment's slope), else per_fed a token."""
        if not self.feed or tokens <= 0:
            return self.per_fed * max(tokens, 0)
        points = ((0, 0.0), *self.feed)
        if tokens >= points[-1][0]:
            (n0, t0), (n1, t1) = points[-2], points[-1]
            return t1 + (t1 - t0) / max(n1 - n0, 1) * (tokens - n1)
        return interpolate(points, tokens)

    def forward(self, tokens: int) -> float:
        """The target forward's seconds at `tokens` tokens."""
        curve = self.curve
        if not curve:
            return self.per_token * tokens
        if tokens <= curve[0][0]:
            return max(curve[0][1] - self.per_token * (curve[0][0] - tokens), 0.0)
        if tokens >= curve[-1][0]:
            return curve[-1][1] + self.per_token * (tokens - curve[-1][0])
        return interpolate(curve, tokens)

    def added(self, base_tokens: int, drafts: int) -> float:
        """What `drafts` drafted tokens (no drafting forwards) add to a round of base_tokens."""
        return self.seconds(base_tokens + drafts, 0, drafts) - self.seconds(base_tokens, 0, 0)

    def decoding(self, base_tokens: int, decode_tokens: int) -> Prices:
        """These prices with a round of base_tokens valued as one of decode_tokens: a round that also
        prefills prompt chunks costs what a round that only decodes its rows costs, plus what drafts add
        at the margin of its real forward. Drafts save decoding rounds, never prefill work (a prompt is
        computed whatever its row's drafts), so a round's chunks must not lower what a draft has to gain:
        with them priced in, drafts at batch 64 looked worth taking far below the acceptance they need
        there (SmolLM2-135M, chat prompts of ~220 tokens, staggered rows: admission 64% of the forward's
        time, the forward linear in N, ngram drafted 95% of rounds at acceptance 0.34 and ran 0.95x drafter
        none; 2 CPU cores, 2026-12-04)."""
        shift = self.forward(decode_tokens) - self.forward(base_tokens)
        return self if shift == 0 else replace(self, fixed=self.fixed + shift)

    def cheapest_draft(self, base_tokens: int, most: int) -> float:
        """The least a draft costs on average, over rounds of 1 .. most drafts (no drafting forwards): with a
        line, per_token + per_draft; with a curve, a draft that fills a cheap forward costs less than one alone."""
        if not self.curve:
            return self.per_token + self.per_draft
        return min(self.added(base_tokens, n) / n for n in range(1, max(most, 1) + 1))


def interpolate(curve: tuple[tuple[int, float], ...], tokens: int) -> float:
    """The piecewise-linear value of `curve` ((N, seconds), N ascending) at curve[0][0] <= tokens <= curve[-1][0]."""
    i = min(bisect.bisect_right(curve, (tokens, math.inf)), len(curve) - 1)
    (n0, t0), (n1, t1) = curve[i - 1], curve[i]
    return t0 + (t1 - t0) * (tokens - n0) / (n1 - n0)


def choose_drafts(gains: list[list[float]], base_tokens: int, prices: Prices,
                  steps: bool) -> tuple[list[int], float]:
    """gains[i][j]: the expected tokens row i adds with its (j + 1)-th draft, non-increasing in j (its
    length is the most drafts the row may have). base_tokens: the forward's tokens with no drafts.
    steps: drafting runs forwards (S counts). -> (drafts per row, predicted tokens per second)."""
    rows = len(gains)
    depth = max((len(g) for g in gains), default=0)
    best, best_rate = [0] * rows, rows / max(prices.seconds(base_tokens, 0, 0), 1e-12)
    for s in range(1, depth + 1) if steps else ([depth] if depth else []):
        # Ties go to earlier drafts of a row, so a prefix of the order is a prefix of every row's drafts.
        order = sorted(((g, j, i) for i, row in enumerate(gains) for j, g in enumerate(row[:s])),
                       key=lambda item: (-item[0], item[1], item[2]))
        emitted, drafts, deepest = float(rows), 0, 0
        taken, rate = 0, None
        for m, (gain, j, _) in enumerate(order):
            emitted += gain
            drafts += 1
            deepest = max(deepest, j + 1)
            r = emitted / max(prices.seconds(base_tokens + drafts, deepest if steps else 0, drafts), 1e-12)
            if rate is None or r > rate:
                taken, rate = m + 1, r
        if rate is not None and rate > best_rate:
            best, best_rate = [0] * rows, rate
            for _, _, i in order[:taken]:
                best[i] += 1
    return best, best_rate


def best_speedup(prices: Prices, rows: int, base_tokens: int, depth: int, steps: bool,
                 tokens: Callable[[int], float]) -> float:
    """The best rate over plain decoding's at these prices of every row drafting k (some k in 1..depth) and
    emitting tokens(k) tokens, against every row emitting 1 (0 when depth is 0)."""
    plain = rows / max(prices.seconds(base_tokens, 0, 0), 1e-12)
    return max((rows * tokens(k) / max(prices.seconds(base_tokens + rows * k, k if steps else 0, rows * k), 1e-12)
                / plain for k in range(1, depth + 1)), default=0.0)


def beats_plain(prices: Prices, rows: int, base_tokens: int, depth: int, steps: bool,
                tokens: Callable[[int], float]) -> bool:
    """Whether some k in 1..depth, every row drafting k and emitting tokens(k) tokens, is faster than every row
    emitting 1 at these prices."""
    return best_speedup(prices, rows, base_tokens, depth, steps, tokens) > 1.0


def pays_at_best(prices: Prices, rows: int, base_tokens: int, depth: int, steps: bool) -> bool:
    """Whether drafting could beat plain decoding at these prices if every draft were accepted (k + 1 tokens
    a row with k drafts). When it is not, no acceptance can make a draft pay (with equal gains the best choice
    drafts every row alike: a round's rate moves one way as drafts of one depth are added), and the
    controller drafts nothing."""
    return beats_plain(prices, rows, base_tokens, depth, steps, lambda k: k + 1)


def breakeven(prices: Prices, rows: int, base_tokens: int, depth: int, steps: bool,
              expected: Callable[[float, int], float]) -> float:
    """The least first-draft acceptance at which drafting pays at these prices (beats_plain with each row
    emitting expected(alpha, k) tokens; > 1: no acceptance pays). expected(alpha, k) grows with alpha (the
    acceptance model's tokens with k drafts), so a bisection finds it to 1e-4."""
    def pays(alpha: float) -> bool:
        return beats_plain(prices, rows, base_tokens, depth, steps, lambda k: expected(alpha, k))

    if not pays(1.0):
        return 2.0
    low, high = 0.0, 1.0
    while high - low > 1e-4:
        middle = (low + high) / 2
        low, high = (low, middle) if pays(middle) else (middle, high)
    return high
