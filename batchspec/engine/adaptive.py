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
is never chosen is never re-measured, so every `revisit_every` rounds (doubling, up to 8x, while the
choice holds) the controller re-times the
neighbours of its choice (two rounds each, the first of which may not be timed); when it has settled
on k = 0 that probe (k = 1) also refreshes acceptance.

Lookup drafters (n-gram, prompt lookup) propose almost for free, and their proposals are bursty: a
long match or nothing. For them (policy `propose_first`) the generator proposes k_max first and passes what each
row actually proposed as its budget, so the choice is a verify width over the drafts on the table: a
row with no proposal adds one token whatever k is, and a row that proposed less than k was not
refused anything. A match is right or wrong as a whole more often than token by token, so one
per-draft alpha would undervalue long proposals; instead a row's a_i is the chance that its FIRST
draft is accepted, and each later draft j is kept with the job-wide rate c_j at which a draft at
position j was accepted given that j - 1 were:

    E_i(n) = 1 + a_i (1 + c_2 + c_2 c_3 + ... + c_2 ... c_n)

A drafter's own prior for a proposal (suffix decoding's continuation frequency) need not match the
target: a continuation seen often in the job's earlier rows is not always the one this row takes. So
priors are scaled by their job-wide reliability, the decayed ratio of first drafts accepted to the
priors that came with them; without that, a hopeful prior kept a job drafting at a loss.

Costs come from one of two models. Eager forwards (CPU) are timed as whole rounds (`RoundTimes`,
above). Captured forwards (CUDA graphs) have steady device times that do not depend on how many
slots are busy (every slot rides along), so `StepTable` times the captured steps themselves by
replays, once per attended-length bucket, and adds the round's host overhead measured as the rest of
each round's wall time; eager wall-clock on a GPU swings 2x between runs and cannot tell k apart.

What the controller knows about a drafter is its DrafterPolicy (drafters.py): whether it proposes
before the width is chosen, whether its acceptance is bursty, whether it catches up after plain rounds.

Tree drafts (tree.py) are further choices (inside, shape index k_max + 1 + j is tree j). A tree's
acceptance is a job-wide average of the tokens a row emits per tree round (decayed like the pooled
counts; a row with less room emits at most its budget + 1), started at what a chain of the tree's depth
is predicted to emit, so that it is tried; its cost is measured like a chain's. A re-timing around a
chain also probes the tree nearest its depth, and around a tree the chain of its depth.

Packed rounds (eager, packed.py) price each row's drafts apart: `choose_rows` gives every row its own
number of drafts, the choice of row_drafts.py over each row's expected gains E_i(j) - E_i(j - 1) (the
models above) and the round's cost by what it computes (costs.PackedCosts: the target forward's time
against its tokens, each drafting forward's against its tokens, the rest of the round against its
drafts). The gains are scaled by their calibration, the decayed ratio of drafts accepted to the gains
predicted for the drafts chosen, so that a systematic error of the acceptance model (choosing the rows
whose estimates are highest picks estimates that err high) cannot keep a job drafting at a loss. A
lookup is not asked to propose for rows that would draft nothing whatever they proposed (`hopeless`).
Every `revisit_every` rounds each row verifies one draft more than chosen (the wait doubling, up to 8x,
while nobody drafts), so that rows drafting nothing keep measuring their acceptance.

The choice never changes a greedy output (speculation is exact). It does change which noise a
sampled token consumes, so with temperature > 0 the generator keeps k fixed unless told otherwise:
seeded output must not depend on machine load.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..types import TreeSpec
from .costs import CostModel, PackedCosts, RoundTimes
from .drafters.base import LOOKUP_POLICY as LOOKUP  # noqa: F401 (the tests' name for it)
from .drafters.base import MODEL_POLICY as DRAFT_MODEL
from .drafters.base import DrafterPolicy
from .round import RoundShape
from .row_drafts import choose_drafts


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one round emits with k drafts, each accepted with probability alpha: 1 + a + ... + a^k."""
    return float(k + 1) if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


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


# ---- the controller ----------------------------------------------------------------------------------


@dataclass
class AdaptiveK:
    """Call choose(rows) before a round and observe(...) after it."""

    k_max: int
    policy: DrafterPolicy = DRAFT_MODEL
    costs: CostModel = field(default_factory=RoundTimes)
    trees: tuple[TreeSpec, ...] = ()  # further choices beside the chains
    decay: float = 0.9  # per informative round, for each row's counts (~10 rounds of memory)
    prior_weight: float = 2.0  # pseudo-observations of the job-wide acceptance in each row's estimate
    pooled_decay: float = 0.99  # per round, for the job-wide counts
    revisit_every: int = 48  # rounds between re-timings of the chosen k's neighbours
    rows: dict[int, RowAcceptance] = field(init=False, default_factory=dict)  # slot -> counts
    pooled: RowAcceptance = field(init=False)
    continued: list[RowAcceptance] = field(init=False)  # [j]: drafts at position j accepted / refused, given j-1 were
    _rounds: int = field(init=False, default=0)
    _probes: list[int] = field(init=False, default_factory=list)
    _next_probe: int = field(init=False, default=0)  # round of the next re-timing
    _interval: int = field(init=False, default=0)  # rounds until the one after: doubles while the choice holds
    _probed_best: int | None = field(init=False, default=None)  # the choice the last re-timing was made around
    _last_k: int | None = field(init=False, default=None)
    tree_counts: list[RowAcceptance] = field(init=False, default_factory=list)  # [j]: tokens emitted, row-rounds
    reliability: Calibration = field(init=False, default_factory=Calibration)  # of the drafter's priors
    # Packed rounds: the drafts accepted against the gains predicted for the drafts chosen.
    calibration: Calibration = field(init=False, default_factory=Calibration)
    _gains: dict[int, float] = field(init=False, default_factory=dict)  # slot -> this round's predicted gain
    _idle: bool = field(init=False, default=False)  # packed: nobody drafted at the last re-timing
    _priors: dict[int, float] = field(init=False, default_factory=dict)  # slot -> this round's prior
    # Internally a shape is an index into `shapes`: chains k = 0..k_max, then tree j at k_max + 1 + j.
    shapes: list[RoundShape] = field(init=False, default_factory=list)

    def __post_init__(self):
        # A weak prior (one accepted draft, one rejection: a = 0.5) until the job has measured its own.
        self.pooled = RowAcceptance(accepted=1.0, rejections=1.0)
        self.continued = [RowAcceptance(accepted=1.0, rejections=1.0) for _ in range(self.k_max + 1)]
        self.tree_depths = tuple(t.depth for t in self.trees)
        self.tree_counts = [RowAcceptance() for _ in self.trees]  # accepted = tokens, rejections = row-rounds
        self.shapes = [RoundShape(drafts=k) for k in range(self.k_max + 1)] + [RoundShape(tree=t) for t in self.trees]
        self._index = {shape: i for i, shape in enumerate(self.shapes)}
        self._next_probe = self.revisit_every

    # ---- acceptance ------------------------------------------------------------------------------

    @property
    def pooled_alpha(self) -> float:
        p = self.pooled
        return p.accepted / (p.accepted + p.rejections)

    def alpha(self, slot: int, prior: float | None = None) -> float:
        """The row's acceptance: its decayed counts, pulled towards a prior (the drafter's own estimate for
        this proposal, or the job-wide rate) by prior_weight pseudo-observations."""
        row = self.rows.get(slot) or RowAcceptance()
        w = self.prior_weight
        base = self.pooled_alpha if prior is None else min(1.0, prior * self.reliability.ratio)
        return (row.accepted + w * base) / (row.accepted + row.rejections + w)

    def expected(self, alpha: float, n: int, run: list[float] | None = None) -> float:
        """Expected tokens of a row with n drafts: geometric in alpha, or for a bursty drafter
        1 + alpha * run[n] where run[n] = 1 + c_2 + c_2 c_3 + ... (see the module docstring)."""
        if n <= 0:
            return 1.0
        if not self.policy.bursty:
            return expected_tokens(alpha, n)
        return 1.0 + alpha * (run or self.run_lengths())[n]

    def run_lengths(self) -> list[float]:
        """[n] -> expected drafts kept once the first is: 0, 1, 1 + c_2, 1 + c_2 + c_2 c_3, ..."""
        out, keep = [0.0, 1.0], 1.0
        for c in self.continued[2:]:
            keep *= c.accepted / (c.accepted + c.rejections)
            out.append(out[-1] + keep)
        return out

    def admit(self, slot: int) -> None:
        """A new request took `slot`: forget the previous one's history."""
        self.rows[slot] = RowAcceptance()

    def cost(self, k: int, b: int) -> float | None:
        """Estimated seconds of a round with k drafts and b active rows, or None if nothing is known."""
        return self.costs.cost(k, b)

    # ---- the decision ----------------------------------------------------------------------------

    @property
    def num_shapes(self) -> int:
        return self.k_max + 1 + len(self.tree_depths)

    def tree_tokens(self, j: int, alphas: list[float], run: list[float] | None) -> float:
        """Tokens a row emits in a round of tree j: the measured average, or before any measurement what a
        chain of the tree's depth is predicted to emit (averaged over the rows)."""
        t = self.tree_counts[j]
        if t.rejections > 0.5:
            return t.accepted / t.rejections
        depth = min(self.tree_depths[j], self.k_max)
        return sum(self.expected(a, depth, run) for a in alphas) / max(len(alphas), 1)

    def predicted_rate(self, k: int, slots: list[int], budgets: list[int],
                       alphas: list[float] | None = None, room: list[int] | None = None) -> float | None:
        """Predicted tokens per second of shape k (a chain of k drafts, or past k_max a tree) over `slots`.
        budgets: each row's chain budget (a lookup's proposal); room: how many drafts each row has room
        for (trees), default the budgets."""
        seconds = self.cost(k, len(slots))
        if seconds is None:
            return None
        alphas = alphas if alphas is not None else [self.alpha(s) for s in slots]
        run = self.run_lengths() if self.policy.bursty else None
        if k > self.k_max:
            per_row = self.tree_tokens(k - self.k_max - 1, alphas, run)
            tokens = sum(min(per_row, r + 1) for r in (room if room is not None else budgets))
        else:
            tokens = sum(self.expected(a, min(k, budget), run) for a, budget in zip(alphas, budgets))
        return tokens / max(seconds, 1e-9)

    def choose(self, slots: list[int], budgets: list[int], room: list[int] | None = None,
               priors: list[float | None] | None = None) -> RoundShape:
        """The shape for a round over `slots` (see choose_index); priors: per row, the drafter's own chance
        that its first draft is right (None: the job-wide rate is the prior)."""
        return self.shapes[self.choose_index(slots, budgets, room, priors)]

    def observe(self, shape: RoundShape, seconds: float, slots: list[int], budgets: list[int], drafted: list[int],
                accepted: list[int]) -> None:
        """After a round of `shape` (see observe_index)."""
        self.observe_index(self._index[shape], seconds, slots, budgets, drafted, accepted)

    def choose_index(self, slots: list[int], budgets: list[int], room: list[int] | None = None,
                     priors: list[float | None] | None = None) -> int:
        """The shape for a round over `slots`, whose rows may draft at most budgets[i] tokens: a chain of
        k <= k_max drafts, or k_max + 1 + j for tree j (room: how deep each row's tree may go, default the
        budgets).

        For a drafter that proposes first the budgets are what each row actually proposed (see
        generator._schedule): a k past the longest proposal would cost a wider verify pass for nothing,
        so it is never chosen.
        """
        self._rounds += 1
        room = budgets if room is None else room
        limit = min(self.k_max, max(budgets, default=0))
        trees = list(range(self.k_max + 1, self.num_shapes)) if max(room, default=0) > 0 else []
        options = list(range(limit + 1)) + trees
        priors = priors or [None] * len(slots)
        self._priors = {s: p for s, p, n in zip(slots, priors, budgets) if p is not None and n > 0}
        if len(options) == 1:
            return 0
        alphas = [self.alpha(s, p) for s, p in zip(slots, priors)]
        return self._pick(options, limit, trees, slots, budgets, alphas, room)

    def _pick(self, options: list[int], limit: int, trees: list[int], slots: list[int], budgets: list[int],
              alphas: list[float], room: list[int]) -> int:
        if self._probes:
            probe = self._probes.pop(0)
            return probe if probe > self.k_max and trees else min(probe, limit)
        rates = {k: self.predicted_rate(k, slots, budgets, alphas, room) for k in options}
        unknown = [k for k in options if rates[k] is None]
        if unknown:  # start of the job: time the extremes first, so a useless drafter is found out at once
            return 0 if 0 in unknown else (limit if limit in unknown else unknown[0])
        best = max(options, key=lambda k: (rates[k], -k))
        if self._rounds >= self._next_probe:
            # Re-time the neighbours every revisit_every rounds; each time the choice survives its last
            # re-timing the wait doubles (to 8x), so a settled job (a useless draft at k = 0) pays ~1%.
            steady = best == self._probed_best
            self._interval = min(2 * self._interval, 8 * self.revisit_every) if steady else self.revisit_every
            self._next_probe, self._probed_best = self._rounds + self._interval, best
            self._probes = [k for k in self.neighbours(best) for _ in range(2)]
            probe = self._probes.pop(0)
            return probe if probe > self.k_max and trees else min(probe, limit)
        return best

    def neighbours(self, shape: int) -> list[int]:
        """The shapes a re-timing around `shape` probes: k +- 1 for a chain, and the tree nearest its depth;
        for a tree the chain of its depth and the trees beside it."""
        if shape <= self.k_max:
            out = [k for k in (shape + 1, shape - 1) if 0 <= k <= self.k_max]
            if self.tree_depths and shape > 0:
                j = min(range(len(self.tree_depths)), key=lambda j: abs(self.tree_depths[j] - shape))
                out.append(self.k_max + 1 + j)
            return out
        j = shape - self.k_max - 1
        return [min(self.tree_depths[j], self.k_max)] + [self.k_max + 1 + i for i in (j - 1, j + 1)
                                                        if 0 <= i < len(self.tree_depths)]

    def observe_index(self, k: int, seconds: float, slots: list[int], budgets: list[int], drafted: list[int],
                      accepted: list[int]) -> None:
        """After a round with k drafts over `slots`: its wall time and, per row, the drafts it was allowed
        (budgets), proposed and accepted.

        A row whose drafter proposed fewer drafts than allowed and had them all accepted (nothing more to
        say) counts as a rejection too: for throughput, a missing draft is a refused one.
        """
        # A draft model first catches up on the tokens it skipped in plain rounds: not a cost of this k.
        after_plain = self.policy.catches_up and k > 0 and self._last_k == 0
        self._last_k = k
        if seconds > 0 and not after_plain:
            self.costs.observe(k, len(slots), seconds)
        self.learn(k, slots, budgets, drafted, accepted)

    def learn(self, k: int, slots: list[int], budgets: list[int], drafted: list[int], accepted: list[int]) -> None:
        """Acceptance from a round of shape k: per row the drafts it was allowed (budgets), proposed and
        accepted (see observe_index)."""
        if self._gains:  # a packed round: what its drafts gained against what was predicted for them
            c = self.calibration
            c.realized, c.predicted = c.realized * self.pooled_decay, c.predicted * self.pooled_decay
            for slot, m in zip(slots, accepted):
                if slot in self._gains:
                    c.realized += m
                    c.predicted += self._gains[slot]
            self._gains = {}
        if k == 0:
            return
        if k > self.k_max:  # a tree round: the job-wide tokens per row-round of this tree
            t = self.tree_counts[k - self.k_max - 1]
            t.accepted *= self.pooled_decay
            t.rejections *= self.pooled_decay
            for budget, m in zip(budgets, accepted):
                if budget > 0:
                    t.accepted += m + 1
                    t.rejections += 1
            return
        for counts in (self.pooled, *self.continued):
            counts.accepted *= self.pooled_decay
            counts.rejections *= self.pooled_decay
        if self._priors:  # first drafts kept against the priors they came with
            reliability = self.reliability
            reliability.realized *= self.pooled_decay
            reliability.predicted *= self.pooled_decay
            for slot, budget, m in zip(slots, budgets, accepted):
                if budget > 0 and slot in self._priors:
                    reliability.realized += min(m, 1)
                    reliability.predicted += self._priors[slot]
        for slot, budget, n, m in zip(slots, budgets, drafted, accepted):
            if budget == 0:
                continue  # no room to draft (end of the request): nothing learned
            if self.policy.bursty:  # the row's count is its first draft; later positions go to the job-wide c_j
                kept, rejected = min(m, 1), m == 0
                for j in range(2, min(n, m + 1) + 1):  # positions reached: all before them were kept
                    self.continued[j].accepted += m >= j
                    self.continued[j].rejections += m < j
            else:
                kept, rejected = m, m < n or n < budget
            row = self.rows.setdefault(slot, RowAcceptance())
            row.accepted = self.decay * row.accepted + kept
            row.rejections = self.decay * row.rejections + rejected
            self.pooled.accepted += kept
            self.pooled.rejections += rejected

    # ---- packed rounds: drafts per row ----------------------------------------------------------

    def hopeless(self, slots: list[int], base_tokens: int, costs: PackedCosts) -> list[bool]:
        """Before a lookup proposes in a packed round: per row, whether its first draft cannot pay at the
        round's prices whatever it proposes, so that the drafter need not propose for it (host work that
        was 3% of round time at batch 64). Exactly the rows choose_rows would give no draft: a lookup's
        drafts all cost the same (per token + per draft), and choose_drafts takes a draft only when its
        gain per cost beats the rate of the round without drafts (row_drafts.py). Nobody is hopeless in
        a probe round, before the costs are known, with trees, or for a drafter whose proposals carry
        priors (its rows' worth is known only once they have proposed)."""
        policy = self.policy
        if (self._rounds + 1 >= self._next_probe or not costs.known or self.trees or policy.draft_forwards
                or policy.priors):
            return [False] * len(slots)
        prices = costs.prices()
        rate = len(slots) / max(prices.seconds(base_tokens, 0, 0), 1e-12)
        threshold = rate * (prices.per_token + prices.per_draft) / max(self.calibration.ratio, 1e-12)
        run = self.run_lengths() if policy.bursty else None
        return [self.expected(self.alpha(s), 1, run) - 1.0 <= threshold for s in slots]

    def choose_rows(self, slots: list[int], offers: list[int], room: list[int], priors: list[float | None] | None,
                    base_tokens: int, costs: PackedCosts) -> tuple[int, list[int]]:
        """A packed round (row_drafts.py): (shape index, drafts per row). offers: the most drafts each row may
        verify (a lookup's proposal, or its budget); room: how deep its tree may go; base_tokens: the
        forward's tokens without drafts. Until the costs are known, rounds alternate between every row
        drafting nothing and every row drafting its offer; every `revisit_every` rounds (doubling, up to 8x,
        while nobody drafts) each row verifies one draft more than chosen, so that rows drafting nothing
        keep learning their acceptance."""
        self._rounds += 1
        priors = priors or [None] * len(slots)
        self._priors = {s: p for s, p, n in zip(slots, priors, offers) if p is not None and n > 0}
        trees = list(range(self.k_max + 1, self.num_shapes)) if max(room, default=0) > 0 else []
        if max(offers, default=0) == 0 and not trees:
            return 0, [0] * len(slots)
        draws = self.policy.draft_forwards
        if not costs.known or (draws and costs.step.w == 0):  # start of the job: time both extremes
            return (0, [0] * len(slots)) if self._rounds % 2 else (max(offers), list(offers))
        alphas = [self.alpha(s, p) for s, p in zip(slots, priors)]
        run = self.run_lengths() if self.policy.bursty else None
        gains = [[self.expected(a, j, run) - self.expected(a, j - 1, run) for j in range(1, n + 1)]
                 for a, n in zip(alphas, offers)]
        prices = costs.prices()
        scale = self.calibration.ratio
        drafts, rate = choose_drafts([[g * scale for g in row] for row in gains], base_tokens, prices, steps=draws)
        shape = max(drafts, default=0)
        for j in (t - self.k_max - 1 for t in trees):  # a tree round: every row its tree
            spec, n = self.trees[j], len(slots)
            per_row = self.tree_tokens(j, alphas, run)
            tokens = sum(min(per_row, r + 1) for r in room)
            seconds = prices.seconds(base_tokens + n * spec.nodes, spec.depth if draws else 0, n * spec.depth)
            if tokens / max(seconds, 1e-12) > rate:
                shape, rate, drafts = self.k_max + 1 + j, tokens / max(seconds, 1e-12), list(room)
        if self._rounds >= self._next_probe:
            idle = sum(drafts) == 0
            self._interval = min(2 * self._interval, 8 * self.revisit_every) if idle and self._idle else self.revisit_every
            self._next_probe, self._idle = self._rounds + self._interval, idle
            if shape <= self.k_max:
                drafts = [min(n, k + 1) for n, k in zip(offers, drafts)]
                shape = max(drafts, default=0)
        if shape <= self.k_max:
            self._gains = {s: sum(g[:k]) for s, g, k in zip(slots, gains, drafts) if k > 0}
        return shape, drafts
