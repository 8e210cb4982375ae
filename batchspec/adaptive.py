"""Adaptive speculation: choose each round's number of drafts from acceptance and the measured cost curve.

Speculation pays only when a verify pass over k+1 tokens costs little more than a 1-token step and
enough drafts are accepted; on a CPU or at a large batch the verify pass is far from free (seed 000's
"alpha-k cliff"). Every round the controller picks the k in 0..k_max (0 = plain decoding) that
maximises predicted tokens per second,

    sum over rows of E_i(min(k, budget_i))  /  T(k, b)

where E_i(k) = (1 - a_i^(k+1)) / (1 - a_i) is the expected number of tokens a row emits when its
drafts are accepted independently with probability a_i (Leviathan et al. 2023, eq. 1), and T(k, b) is
the wall time of a whole round (draft + verify + accept) measured while the job runs, at this
number of active rows b. Two signals, two estimators:

- acceptance: each row's running count of accepted drafts A and of rounds that ended in a rejection
  R (a draft refused, or the drafter had nothing to propose), decayed so that it follows the text,
  and pooled into a job-wide prior for rows that have little history: a_i = (A + w a) / (A + R + w);
- cost: an exponential moving average of round time per (k, b); a k not yet measured at this b
  borrows the shape of the curve from the nearest batch size that measured it, and is probed once
  when nothing is known. The first time of each (k, b) is replaced by the second (a cold first round
  must not steer hundreds of rounds), and a round with drafts right after a round without is not
  timed: a draft model then first catches up on the tokens it skipped, which is the cost of the
  rounds before, not of this k.

Predicting from these two instead of timing tokens per round directly matters at small batches,
where the tokens a round emits swing between 1 and k+1 per row but its time hardly varies. A k that
is never chosen is never re-measured, so every `revisit_every` rounds the controller re-times the
neighbours of its choice (two rounds each, the first of which may not be timed); when it has settled
on k = 0 that probe (k = 1) also refreshes acceptance.

The choice never changes a greedy output (speculation is exact). It does change which noise a
sampled token consumes, so with temperature > 0 the generator keeps k fixed unless told otherwise:
seeded output must not depend on machine load.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one round emits with k drafts, each accepted with probability alpha: 1 + a + ... + a^k."""
    return float(k + 1) if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


@dataclass
class RowAcceptance:
    """Decayed counts of one row's accepted drafts and rejecting rounds."""

    accepted: float = 0.0
    rejections: float = 0.0


@dataclass
class AdaptiveK:
    """Call choose(rows) before a round and observe(...) after it."""

    k_max: int
    decay: float = 0.9  # per informative round, for each row's counts (~10 rounds of memory)
    prior_weight: float = 2.0  # pseudo-observations of the job-wide acceptance in each row's estimate
    pooled_decay: float = 0.99  # per round, for the job-wide counts
    smoothing: float = 0.2  # weight of a new round time in the (k, b) average
    revisit_every: int = 48  # rounds between re-timings of the chosen k's neighbours
    costs: dict[int, dict[int, float]] = field(init=False, default_factory=dict)  # b -> k -> seconds
    samples: dict[tuple[int, int], int] = field(init=False, default_factory=dict)  # (b, k) -> rounds timed
    rows: dict[int, RowAcceptance] = field(init=False, default_factory=dict)  # slot -> counts
    pooled: RowAcceptance = field(init=False)
    _rounds: int = field(init=False, default=0)
    _probes: list[int] = field(init=False, default_factory=list)
    _last_k: int | None = field(init=False, default=None)

    def __post_init__(self):
        # A weak prior (one accepted draft, one rejection: a = 0.5) until the job has measured its own.
        self.pooled = RowAcceptance(accepted=1.0, rejections=1.0)

    # ---- acceptance ------------------------------------------------------------------------------

    @property
    def pooled_alpha(self) -> float:
        p = self.pooled
        return p.accepted / (p.accepted + p.rejections)

    def alpha(self, slot: int) -> float:
        row = self.rows.get(slot) or RowAcceptance()
        w = self.prior_weight
        return (row.accepted + w * self.pooled_alpha) / (row.accepted + row.rejections + w)

    def admit(self, slot: int) -> None:
        """A new request took `slot`: forget the previous one's history."""
        self.rows[slot] = RowAcceptance()

    # ---- cost ------------------------------------------------------------------------------------

    def cost(self, k: int, b: int) -> float | None:
        """Estimated seconds of a round with k drafts and b active rows, or None if nothing is known."""
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

    # ---- the decision ----------------------------------------------------------------------------

    def predicted_rate(self, k: int, slots: list[int], budgets: list[int],
                       alphas: list[float] | None = None) -> float | None:
        seconds = self.cost(k, len(slots))
        if seconds is None:
            return None
        alphas = alphas if alphas is not None else [self.alpha(s) for s in slots]
        tokens = sum(expected_tokens(a, min(k, budget)) for a, budget in zip(alphas, budgets))
        return tokens / seconds

    def choose(self, slots: list[int], budgets: list[int]) -> int:
        """The k for a round over `slots`, whose rows may draft at most budgets[i] tokens."""
        self._rounds += 1
        if self._probes:
            return self._probes.pop(0)
        alphas = [self.alpha(s) for s in slots]
        rates = [self.predicted_rate(k, slots, budgets, alphas) for k in range(self.k_max + 1)]
        unknown = [k for k, r in enumerate(rates) if r is None]
        if unknown:  # start of the job: time the extremes first, so a useless drafter is found out at once
            return 0 if 0 in unknown else (self.k_max if self.k_max in unknown else unknown[0])
        best = max(range(self.k_max + 1), key=lambda k: (rates[k], -k))
        if self._rounds % self.revisit_every == 0:
            self._probes = [k for k in (best + 1, best - 1) if 0 <= k <= self.k_max for _ in range(2)]
            return self._probes.pop(0)
        return best

    def observe(self, k: int, seconds: float, slots: list[int], budgets: list[int], drafted: list[int],
                accepted: list[int]) -> None:
        """After a round with k drafts over `slots`: its wall time and, per row, the drafts it was allowed
        (budgets), proposed and accepted.

        A row whose drafter proposed fewer drafts than allowed and had them all accepted (nothing more to
        say) counts as a rejection too: for throughput, a missing draft is a refused one.
        """
        after_plain = k > 0 and self._last_k == 0
        self._last_k = k
        if seconds > 0 and not after_plain:
            b = len(slots)
            table = self.costs.setdefault(b, {})
            n = self.samples[b, k] = self.samples.get((b, k), 0) + 1
            old = table.get(k)
            table[k] = seconds if n <= 2 else (1 - self.smoothing) * old + self.smoothing * seconds
        if k == 0:
            return
        pooled = self.pooled
        pooled.accepted *= self.pooled_decay
        pooled.rejections *= self.pooled_decay
        for slot, budget, n, m in zip(slots, budgets, drafted, accepted):
            if budget == 0:
                continue  # no room to draft (end of the request): nothing learned
            rejected = m < n or n < budget
            row = self.rows.setdefault(slot, RowAcceptance())
            row.accepted = self.decay * row.accepted + m
            row.rejections = self.decay * row.rejections + rejected
            pooled.accepted += m
            pooled.rejections += rejected
