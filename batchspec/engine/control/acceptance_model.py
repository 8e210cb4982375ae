"""Adaptive speculation's acceptance model: the tokens a row is expected to emit with n drafts, learned
from the rounds' cut counts (adaptive.py chooses with it).

A row's drafts are accepted independently with probability a_i, so with k drafts it emits
E_i(k) = (1 - a_i^(k+1)) / (1 - a_i) tokens in expectation (Leviathan et al. 2023, eq. 1). a_i comes
from the row's running count of accepted drafts A and of rounds that ended in a rejection R (a draft
refused, or the drafter had nothing to propose), decayed so that it follows the text, and pooled into a
job-wide prior for rows that have little history: a_i = (A + w a) / (A + R + w).

Lookup drafters' proposals are bursty: a long match or nothing. A match is right or wrong as a whole
more often than token by token, so one per-draft alpha would undervalue long proposals; instead (policy
`bursty`) a row's a_i is the chance that its FIRST draft is accepted, and each later draft j is kept
with the job-wide rate c_j at which a draft at position j was accepted given that j - 1 were:

    E_i(n) = 1 + a_i (1 + c_2 + c_2 c_3 + ... + c_2 ... c_n)

A drafter's own prior for a proposal (suffix decoding's continuation frequency) need not match the
target: a continuation seen often in the job's earlier rows is not always the one this row takes. So
priors are scaled by their job-wide reliability, the decayed ratio of first drafts accepted to the
priors that came with them; without that, a hopeful prior kept a job drafting at a loss.

A tree's acceptance is a job-wide average of the tokens a row emits per tree round (decayed like the
pooled counts; a row with less room emits at most its budget + 1), started at what a chain of the
tree's depth is predicted to emit, so that it is tried. Packed rounds also keep a calibration of the
gains predicted for the drafts chosen against the drafts accepted (packed_choice.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate

from .hindsight import Judged


def acceptance_interval(kept: int, n: int, z: float = 1.64) -> tuple[float, float]:
    """Wilson's score interval for a rate of kept / n (z = 1.64: each bound one-sided at 95%); (0, 1) when
    n = 0. Wilson's, not the normal approximation, because exploration decides on a handful of drafts: with
    none of 3 kept the bounds are (0, 0.47), with 3 of 3 (0.53, 1)."""
    if n <= 0:
        return 0.0, 1.0
    p, z2 = kept / n, z * z
    centre, spread = p + z2 / (2 * n), z * (p * (1 - p) / n + z2 / (4 * n * n)) ** 0.5
    return max(0.0, (centre - spread) / (1 + z2 / n)), min(1.0, (centre + spread) / (1 + z2 / n))


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one round emits with k drafts, each accepted with probability alpha: 1 + a + ... + a^k."""
    return float(k + 1) if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


MAX_WEIGHT = 20.0  # pseudo-observations at most: about twice a row's decayed memory (rows read as the job)


def shrinkage(rows: list[RowAcceptance], pooled: float, least: float) -> float:
    """How many pseudo-observations of the job's rate a row's estimate takes (least .. MAX_WEIGHT): how much the
    rows' rates differ beyond what their counts' chance explains, by the method of moments on a beta prior.
    With n_i = accepted + refused and r_i = accepted / n_i, sum n_i (r_i - p)^2 has expectation
    tau^2 sum n_i + m p (1 - p) over m rows; the prior's weight is then p (1 - p) / tau^2 - 1 (empirical Bayes).
    Rows whose drafts are alike read as the job (a weight of least, 2, let one refusal put a row of a draft
    model below break-even, and the choice drafted 24 of 32 rows in rounds where every row at k = 1 or 2 ran
    faster: p512 at batch 32, 2026-12-05, where the rows' k = 1 acceptance varied 3.3x as much as chance
    explains, a weight of ~9); rows that differ (a lookup's, or a job of mixed texts) keep their own. Fewer
    than 4 rows with counts: `least`."""
    counted = [(r.accepted + r.rejections, r.accepted) for r in rows if r.accepted + r.rejections >= 1.0]
    spread = pooled * (1.0 - pooled)
    if len(counted) < 4 or spread <= 0.0:
        return least
    total = sum(n for n, _ in counted)
    tau2 = (sum(n * (a / n - pooled) ** 2 for n, a in counted) - len(counted) * spread) / total
    return MAX_WEIGHT if tau2 <= spread / (MAX_WEIGHT + 1) else max(least, spread / tau2 - 1.0)


@dataclass
class Calibration:
    """Decayed sums, over chain rounds, of the first drafts the rows kept and of the priors they came with."""

    realized: float = 2.0  # a weak start at ratio 1
    predicted: float = 2.0

    @property
    def ratio(self) -> float:
        return self.realized / max(self.predicted, 1e-9)


@dataclass
class RowAcceptance:
    """Decayed counts of one row's accepted drafts and rejecting rounds."""

    accepted: float = 0.0
    rejections: float = 0.0


@dataclass
class AcceptanceModel:
    """Each row's and the job's acceptance, learnt from the rounds' cut counts. k_max: the most drafts a chain
    round has; bursty: the drafter's proposals are a long match or nothing (lookups); tree_depths: the depths
    of the trees rounds may draft. decay: per round that verifies drafts, for each row's counts (~10 rounds of
    memory; a lookup's per round of its own drafts); prior_weight: pseudo-observations of the job-wide
    acceptance in each row's estimate;
    pooled_decay: per round, for the job-wide counts."""

    k_max: int
    bursty: bool = False
    tree_depths: tuple[int, ...] = ()
    decay: float = 0.9
    prior_weight: float = 2.0
    pooled_decay: float = 0.99
    rows: dict[int, RowAcceptance] = field(init=False, default_factory=dict)  # slot -> counts
    # A weak prior (one accepted draft, one rejection: a = 0.5) until the job has measured its own.
    pooled: RowAcceptance = field(init=False, default_factory=lambda: RowAcceptance(1.0, 1.0))
    continued: list[RowAcceptance] = field(init=False)  # [j]: drafts at position j accepted / refused, given j-1 were
    tree_counts: list[RowAcceptance] = field(init=False)  # [j]: tokens emitted, row-rounds
    reliability: Calibration = field(init=False, default_factory=Calibration)  # of the drafter's priors
    # Packed rounds, per draft position j: the drafts accepted there against the gains predicted for them.
    calibration: list[Calibration] = field(init=False)
    weight: float = field(init=False, default=0.0)  # the prior's weight in each row's estimate (see shrinkage)
    evidence: int = field(init=False, default=0)  # first drafts verified in this job (not decayed)
    first_kept: int = field(init=False, default=0)  # of which accepted
    evidence_rounds: int = field(init=False, default=0)  # rounds that verified any of them
    # The round in flight: each proposing row's prior (slot -> prior), and a packed round's predicted gain
    # per chosen draft (slot -> gains): what `learn` checks the verdict against.
    priors: dict[int, float] = field(init=False, default_factory=dict)
    gains: dict[int, list[float]] = field(init=False, default_factory=dict)

    def __post_init__(self):
        self.continued = [RowAcceptance(accepted=1.0, rejections=1.0) for _ in range(self.k_max + 1)]
        self.tree_counts = [RowAcceptance() for _ in self.tree_depths]  # accepted = tokens, rejections = row-rounds
        self.calibration = [Calibration() for _ in range(max(self.k_max, 1))]
        self.weight = self.prior_weight

    def offered(self, slots: list[int], priors: list[float | None], counts: list[int]) -> None:
        """The round in flight's rows offered drafts (counts > 0) with their drafter's priors (None: none)."""
        self.priors = {s: p for s, p, n in zip(slots, priors, counts) if p is not None and n > 0}

    def expect(self, gains: dict[int, list[float]]) -> None:
        """A packed round's predicted gain per chosen draft, by slot (what `learn` calibrates against)."""
        self.gains = gains

    def admit(self, slot: int) -> None:
        """A new request took `slot`: forget the previous one's history."""
        self.rows[slot] = RowAcceptance()

    def drafted(self, slot: int) -> bool:
        """Whether the row in `slot` has had a draft verified (a draft model's cache then lacks only the
        tokens since, not its prompt)."""
        row = self.rows.get(slot)
        return row is not None and row.accepted + row.rejections > 0

    @property
    def pooled_alpha(self) -> float:
        p = self.pooled
        return p.accepted / (p.accepted + p.rejections)

    def alpha(self, slot: int, prior: float | None = None) -> float:
        """The row's acceptance: its decayed counts, pulled towards a prior (the drafter's own estimate for
        this proposal, or the job-wide rate) by `weight` pseudo-observations (shrinkage)."""
        row = self.rows.get(slot) or RowAcceptance()
        w = self.weight
        base = self.pooled_alpha if prior is None else min(1.0, prior * self.reliability.ratio)
        return (row.accepted + w * base) / (row.accepted + row.rejections + w)

    def expected(self, alpha: float, n: int, run: list[float] | None = None) -> float:
        """Expected tokens of a row with n drafts: geometric in alpha, or for a bursty drafter
        1 + alpha * run[n] where run[n] = 1 + c_2 + c_2 c_3 + ... (see the module docstring)."""
        if n <= 0:
            return 1.0
        if not self.bursty:
            return expected_tokens(alpha, n)
        return 1.0 + alpha * (run or self.run_lengths())[n]

    def run_lengths(self) -> list[float]:
        """[n] -> expected drafts kept once the first is: 0, 1, 1 + c_2, 1 + c_2 + c_2 c_3, ..."""
        out, keep = [0.0, 1.0], 1.0
        for c in self.continued[2:]:
            keep *= c.accepted / (c.accepted + c.rejections)
            out.append(out[-1] + keep)
        return out

    def tree_tokens(self, j: int, alphas: list[float], run: list[float] | None) -> float:
        """Tokens a row emits in a round of tree j: the measured average, or before any measurement what a
        chain of the tree's depth is predicted to emit (averaged over the rows)."""
        t = self.tree_counts[j]
        if t.rejections > 0.5:
            return t.accepted / t.rejections
        depth = min(self.tree_depths[j], self.k_max)
        return sum(self.expected(a, depth, run) for a in alphas) / max(len(alphas), 1)

    def calibrated(self, gains: list[list[float]]) -> list[list[float]]:
        """Each row's gains scaled by their position's calibration, kept non-increasing along the row (what
        choose_drafts needs: a later draft never gains more than an earlier one)."""
        return [list(accumulate((g * self.calibration_at(j).ratio for j, g in enumerate(row)), min))
                for row in gains]

    def calibration_at(self, j: int) -> Calibration:
        """Packed rounds: the calibration of draft position j (from 0); a position past k_max shares the last."""
        return self.calibration[min(j, len(self.calibration) - 1)]

    def learn(self, k: int, slots: list[int], budgets: list[int], drafted: list[int], accepted: list[int],
              judged: list[Judged] = ()) -> None:
        """Acceptance from a round of shape k: per row the drafts it was allowed (budgets), proposed and
        accepted (see observe_index); judged: a lookup's unverified drafts that this round's tokens judged
        (hindsight.py). The job's counts age once a round that verified a chain or judged a draft, and such a
        round counts once in evidence_rounds."""
        if self.gains:  # a packed round: what its drafts gained against what was predicted, by position
            for c in self.calibration:
                c.realized, c.predicted = c.realized * self.pooled_decay, c.predicted * self.pooled_decay
            for slot, m in zip(slots, accepted):
                for j, gain in enumerate(self.gains.get(slot, ())):
                    c = self.calibration_at(j)
                    c.realized += m > j
                    c.predicted += gain
            self.gains = {}
        if k > self.k_max:  # a tree round: the job-wide tokens per row-round of this tree
            t = self.tree_counts[k - self.k_max - 1]
            t.accepted *= self.pooled_decay
            t.rejections *= self.pooled_decay
            for budget, m in zip(budgets, accepted):
                if budget > 0:
                    t.accepted += m + 1
                    t.rejections += 1
        chain = 0 < k <= self.k_max
        if chain or judged:
            self._age_job()
        verified = self._learn_chain(slots, budgets, drafted, accepted) if chain else 0
        self._learn_judged(judged, verified > 0)

    def _learn_chain(self, slots: list[int], budgets: list[int], drafted: list[int], accepted: list[int]) -> int:
        """A chain round's verified drafts into the counts -> how many first drafts it verified."""
        if self.priors:  # first drafts kept against the priors they came with
            reliability = self.reliability
            for slot, budget, m in zip(slots, budgets, accepted):
                if budget > 0 and slot in self.priors:
                    reliability.realized += min(m, 1)
                    reliability.predicted += self.priors[slot]
        verified = sum(1 for budget, n in zip(budgets, drafted) if budget > 0 and n > 0)
        self.evidence += verified
        self.evidence_rounds += verified > 0
        self.first_kept += sum(1 for budget, n, m in zip(budgets, drafted, accepted) if budget > 0 and n > 0 and m > 0)
        for slot, budget, n, m in zip(slots, budgets, drafted, accepted):
            if budget == 0:
                if not self.bursty and slot in self.rows:  # a row the choice left out ages (see _age)
                    self._age(self.rows[slot])
                continue  # nothing learned of this row
            if self.bursty:  # the row's count is its first draft; later positions go to the job-wide c_j
                kept, rejected = min(m, 1), m == 0
                for j in range(2, min(n, m + 1) + 1):  # positions reached: all before them were kept
                    self.continued[j].accepted += m >= j
                    self.continued[j].rejections += m < j
            else:
                kept, rejected = m, m < n or n < budget
            row = self._age(self.rows.setdefault(slot, RowAcceptance()))
            row.accepted += kept
            row.rejections += rejected
            self.pooled.accepted += kept
            self.pooled.rejections += rejected
        if not self.bursty:
            self.weight = shrinkage(list(self.rows.values()), self.pooled_alpha, self.prior_weight)
        return verified

    def _learn_judged(self, drafts: list[Judged], counted: bool) -> None:
        """A lookup's unverified drafts judged by the rows' later tokens, counted as the verify pass counts a
        bursty drafter's (a first draft in its row's, the job's and the evidence, a later one in the c_j);
        counted: the round is in evidence_rounds already."""
        firsts = [d for d in drafts if d.position == 1]
        self.evidence += len(firsts)
        self.evidence_rounds += bool(firsts) and not counted
        self.first_kept += sum(d.kept for d in firsts)
        for d in drafts:
            first = d.position == 1
            for counts in ((self._age(self.rows.setdefault(d.slot, RowAcceptance())), self.pooled) if first
                           else (self.continued[d.position],)):
                counts.accepted += d.kept
                counts.rejections += not d.kept
            if first and d.prior is not None:
                self.reliability.realized += d.kept
                self.reliability.predicted += d.prior

    def _age_job(self) -> None:
        """One round of `pooled_decay` on the job-wide counts: the pooled rate, the c_j and the priors'
        reliability (where the round's rows came with priors)."""
        for counts in (self.pooled, *self.continued):
            counts.accepted *= self.pooled_decay
            counts.rejections *= self.pooled_decay
        if self.priors:
            self.reliability.realized *= self.pooled_decay
            self.reliability.predicted *= self.pooled_decay

    def _age(self, row: RowAcceptance) -> RowAcceptance:
        """One round of `decay` on a row's counts: in every round that verifies drafts, whether or not it
        drafted. A drafter with forwards has no sampling of the rows its choice leaves out (packed_choice.py),
        so a row whose estimate one early refusal put below break-even (with prior weight 2, one kept and one
        refused read 0.66 where the job's rate was 0.84) would draft nothing again until a probe; aged, it
        drifts back to the job's rate and is tried again. Lookups' proposals are sampled instead, and their
        rows' counts age only with their own drafts. On a held-out pair at batch 32 (p512, 96 staggered rows,
        draft model, 2 CPU cores, 2026-12-05) the choice left 8 of 32 rows out of its drafting rounds."""
        row.accepted, row.rejections = self.decay * row.accepted, self.decay * row.rejections
        return row
