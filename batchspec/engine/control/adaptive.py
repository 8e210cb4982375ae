"""Adaptive speculation: choose each round's number of drafts from acceptance and the measured cost curve.

Speculation pays only when a verify pass over k+1 tokens costs little more than a 1-token step and
enough drafts are accepted; on a CPU or at a large batch the verify pass is far from free, and a fixed k
past the acceptance that pays falls off a cliff. Every round the controller picks the k in 0..k_max (0 = plain
decoding) that
maximises predicted tokens per second,

    sum over rows of E_i(min(k, budget_i))  /  T(k, b)

where E_i(k) is the expected number of tokens a row emits with k drafts (the acceptance model,
acceptance_model.py: Leviathan et al. 2023, eq. 1, over each row's decayed acceptance pooled into a
job-wide prior), and T(k, b) is the wall time of a whole round (draft + verify + accept) measured
while the job runs, at this number of active rows b: an exponential moving average of round time per
(k, b); a k not yet measured at this b borrows the shape of the curve from the nearest batch size that
measured it, and is probed once when nothing is known. The first time of each (k, b) is replaced by the
second (a cold first round must not steer hundreds of rounds), and a round with drafts right after a
round without is not timed: a draft model then first catches up on the tokens it skipped, which is the
cost of the rounds before, not of this k.

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
refused anything (how bursty acceptance is modelled: acceptance_model.py).

Costs come from one of two models. Eager forwards (CPU) are timed as whole rounds (`RoundTimes`,
above). Captured forwards (CUDA graphs) have steady device times that do not depend on how many
slots are busy (every slot rides along), so `StepTable` times the captured steps themselves by
replays, once per attended-length bucket, and adds the round's host overhead measured as the rest of
each round's wall time; eager wall-clock on a GPU swings 2x between runs and cannot tell k apart.

What the controller knows about a drafter is its DrafterPolicy (drafters.py): whether it proposes
before the width is chosen, whether its acceptance is bursty, whether it catches up after plain rounds.

Tree drafts (tree.py) are further choices (inside, shape index k_max + 1 + j is tree j), whose
acceptance the acceptance model keeps as tokens per row-round and whose cost is measured like a
chain's. A re-timing around a chain also probes the tree nearest its depth, and around a tree the chain
of its depth.

Packed rounds (eager, packed.py) give every row its own number of drafts (`choose_rows`,
packed_choice.py).

The choice never changes a greedy output (speculation is exact). It does change which noise a
sampled token consumes, so with temperature > 0 the generator keeps k fixed unless told otherwise:
seeded output must not depend on machine load.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..types import TreeSpec
from .acceptance_model import AcceptanceModel
from .costs import PackedCosts, RoundCost, RoundTimes, WholeRoundCosts
from ..drafters.base import LOOKUP_POLICY as LOOKUP  # noqa: F401 (the tests' name for it)
from ..drafters.base import MODEL_POLICY as DRAFT_MODEL
from ..drafters.base import DrafterPolicy
from .hindsight import Hindsight
from .packed_choice import PackedChoice
from ..round import RoundShape


YOUNG_ROUNDS = 4  # a row's first rounds, whose drafts teach the acceptance model nothing (AdaptiveK.learn)


@dataclass
class AdaptiveK:
    """Call choose(rows) before a round and observe(...) after it (packed rounds: choose_rows, then learn).
    Its acceptance estimates are `acceptance`'s (acceptance_model.py), packed rounds' choice `packed`'s
    (packed_choice.py); the chain rounds' choice and its re-timings are its own."""

    k_max: int
    policy: DrafterPolicy = DRAFT_MODEL
    costs: WholeRoundCosts | PackedCosts = field(default_factory=RoundTimes)  # choose reads one, choose_rows the other
    trees: tuple[TreeSpec, ...] = ()  # further choices beside the chains
    decay: float = 0.9  # per round that verifies drafts, for each row's counts (~10 rounds of memory)
    prior_weight: float = 2.0  # pseudo-observations of the job-wide acceptance in each row's estimate
    pooled_decay: float = 0.99  # per round, for the job-wide counts
    revisit_every: int = 48  # rounds between re-timings of the chosen k's neighbours
    explore_evidence: int = 16  # packed: first drafts the job verifies before its acceptance is trusted
    acceptance: AcceptanceModel = field(init=False)
    packed: PackedChoice = field(init=False)
    hindsight: Hindsight = field(init=False, default_factory=Hindsight)  # a lookup's proposals (propose_first)
    _rounds: int = field(init=False, default=0)
    _probes: list[int] = field(init=False, default_factory=list)
    _next_probe: int = field(init=False, default=0)  # round of the next re-timing
    _interval: int = field(init=False, default=0)  # rounds until the one after: doubles while the choice holds
    _probed_best: int | None = field(init=False, default=None)  # the choice the last re-timing was made around
    _last_k: int | None = field(init=False, default=None)
    _learnt: int = field(init=False, default=0)  # rounds learnt from
    _born: dict[int, int] = field(init=False, default_factory=dict)  # slot -> _learnt when its row was admitted
    # Internally a shape is an index into `shapes`: chains k = 0..k_max, then tree j at k_max + 1 + j.
    shapes: list[RoundShape] = field(init=False, default_factory=list)

    def __post_init__(self):
        self.tree_depths = tuple(t.depth for t in self.trees)
        self.acceptance = AcceptanceModel(self.k_max, self.policy.bursty, self.tree_depths, self.decay,
                                          self.prior_weight, self.pooled_decay)
        self.packed = PackedChoice(self.acceptance, self.policy, self.k_max, self.trees, self.revisit_every,
                                   self.explore_evidence)
        self.shapes = [RoundShape(drafts=k) for k in range(self.k_max + 1)] + [RoundShape(tree=t) for t in self.trees]
        self._index = {shape: i for i, shape in enumerate(self.shapes)}
        self._next_probe = self.revisit_every
        # Chosen once, by the cost model: one that prices rounds by their forwards learns from every round; whole
        # rounds' times leave out a draft model's first round after plain ones (see _observe_round_time).
        self._observe_cost = self.costs.observe if isinstance(self.costs, PackedCosts) else self._observe_round_time

    # What the scheduler calls: a row's arrival, a packed round's choice and learning (packed_choice.py,
    # acceptance_model.py), and the chain rounds' below.
    def admit(self, slot: int) -> None:
        """A new request took `slot`: forget the previous one's history."""
        self.acceptance.admit(slot)
        self.packed.admit(slot)
        self.hindsight.forget(slot)
        self._born[slot] = self._learnt

    def hopeless(self, slots: list[int], base_tokens: int, costs: PackedCosts) -> list[bool]:
        return self.packed.hopeless(slots, base_tokens, costs, self.young(slots, ahead=1))

    @property
    def explored(self) -> bool:
        """The last packed round's drafts were exploration's or sampling's (packed_choice.py), not the choice's."""
        return self.packed.explored

    @property
    def learning(self) -> bool:
        """The last packed round was chosen while the job explored its acceptance (its drafts exploration's,
        or none while exploration's budget refills)."""
        return self.packed.learning

    def choose_rows(self, slots: list[int], offers: list[int], room: list[int], priors: list[float | None] | None,
                    base_tokens: int, costs: PackedCosts, lags: list[int] | None = None) -> tuple[int, list[int]]:
        return self.packed.choose_rows(slots, offers, room, priors, base_tokens, costs, lags,
                                       self.young(slots, ahead=1))

    def young(self, slots: list[int], ahead: int = 0) -> list[bool]:
        """Per row, whether the round `ahead` of the last one learnt is among its first YOUNG_ROUNDS (its
        prefill's included)."""
        return [self._learnt + ahead - self._born.get(s, -YOUNG_ROUNDS) <= YOUNG_ROUNDS for s in slots]

    def learn(self, k: int, slots: list[int], budgets: list[int], drafted: list[int], accepted: list[int],
              proposed: list[list[int] | None] | None = None, emitted: list[list[int]] | None = None) -> None:
        """Acceptance from a round, but not from rows in their first YOUNG_ROUNDS rounds, which exploration and
        sampling leave out too (packed_choice.py): a row's first drafts say little of its later ones. On a
        held-out pair at batch 64 (q384, ngram at fixed k=2, 2 CPU cores, 2026-12-06) the first drafts of the
        job's rounds 0-3 were 18 of 84 kept, of rounds 4-7 135 of 191, 0.8-0.9 after; learnt from, adaptive's
        first drafts of rounds 0-3 (0 of 10 kept) held it at a sampled draft a round or two until round 24
        (0.94 of fixed k=2). Chat rows open alike the other way: 4 of SmolLM2's first 6 ngram drafts were kept,
        1 in 10 afterwards (2026-12-01). proposed: a lookup's whole proposal per row (None: not one), whose drafts
        the verify pass left out the rows' emitted tokens judge (hindsight.py)."""
        self._learnt += 1
        young = self.young(slots)
        budgets = [0 if y else b for y, b in zip(young, budgets)]  # their gains: choose_rows kept them out
        judged = []
        if emitted is not None and self.policy.propose_first:
            # Every round's tokens continue the open proposals, a tree's or a grammar's round too (no new one
            # followed there: proposed is None).
            chain = proposed is not None and k <= self.k_max
            followed = [p if chain and not y else None for y, p in zip(young, proposed or [None] * len(slots))]
            judged = self.hindsight.follow(slots, followed, drafted, accepted, emitted, self.acceptance.priors)
        self.acceptance.learn(k, slots, budgets, drafted, accepted, judged)

    def cost(self, k: int, b: int) -> float | None:
        """Estimated seconds of a round with k drafts and b active rows, or None if nothing is known."""
        return self.costs.cost(k, b)

    # ---- the decision ----------------------------------------------------------------------------

    @property
    def num_shapes(self) -> int:
        return self.k_max + 1 + len(self.tree_depths)

    def predicted_rate(self, k: int, slots: list[int], budgets: list[int],
                       alphas: list[float] | None = None, room: list[int] | None = None) -> float | None:
        """Predicted tokens per second of shape k (a chain of k drafts, or past k_max a tree) over `slots`.
        budgets: each row's chain budget (a lookup's proposal); room: how many drafts each row has room
        for (trees), default the budgets."""
        seconds = self.cost(k, len(slots))
        if seconds is None:
            return None
        model = self.acceptance
        alphas = alphas if alphas is not None else [model.alpha(s) for s in slots]
        run = model.run_lengths() if self.policy.bursty else None
        if k > self.k_max:
            per_row = model.tree_tokens(k - self.k_max - 1, alphas, run)
            tokens = sum(min(per_row, r + 1) for r in (room if room is not None else budgets))
        else:
            tokens = sum(model.expected(a, min(k, budget), run) for a, budget in zip(alphas, budgets))
        return tokens / max(seconds, 1e-9)

    def choose(self, slots: list[int], budgets: list[int], room: list[int] | None = None,
               priors: list[float | None] | None = None) -> RoundShape:
        """The shape for a round over `slots` (see choose_index); priors: per row, the drafter's own chance
        that its first draft is right (None: the job-wide rate is the prior)."""
        return self.shapes[self.choose_index(slots, budgets, room, priors)]

    def choose_index(self, slots: list[int], budgets: list[int], room: list[int] | None = None,
                     priors: list[float | None] | None = None) -> int:
        """The shape for a round over `slots`, whose rows may draft at most budgets[i] tokens: a chain of
        k <= k_max drafts, or k_max + 1 + j for tree j (room: how deep each row's tree may go, default the
        budgets).

        For a drafter that proposes first the budgets are what each row actually proposed (see
        drafting.DraftStage): a k past the longest proposal would cost a wider verify pass for nothing,
        so it is never chosen.
        """
        self._rounds += 1
        room = budgets if room is None else room
        limit = min(self.k_max, max(budgets, default=0))
        trees = list(range(self.k_max + 1, self.num_shapes)) if max(room, default=0) > 0 else []
        options = list(range(limit + 1)) + trees
        priors = priors or [None] * len(slots)
        self.acceptance.offered(slots, priors, budgets)
        if len(options) == 1:
            return 0
        alphas = [self.acceptance.alpha(s, p) for s, p in zip(slots, priors)]
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
            if not self._probes:  # nothing beside it (k_max 0, no trees)
                return best
            probe = self._probes.pop(0)
            return probe if probe > self.k_max and trees else min(probe, limit)
        return best

    def neighbours(self, shape: int) -> list[int]:
        """The shapes a re-timing around `shape` probes: k +- 1 for a chain, and the tree nearest its depth;
        for a tree the chain of its depth and the trees beside it."""
        if shape <= self.k_max:
            out = [k for k in (shape + 1, shape - 1) if 0 <= k <= self.k_max]
            if self.tree_depths and (shape > 0 or not out):  # k = 0 with no chain beside it (k_max 0): a tree
                j = min(range(len(self.tree_depths)), key=lambda j: abs(self.tree_depths[j] - max(shape, 1)))
                out.append(self.k_max + 1 + j)
            return out
        j = shape - self.k_max - 1
        return [min(self.tree_depths[j], self.k_max)] + [self.k_max + 1 + i for i in (j - 1, j + 1)
                                                        if 0 <= i < len(self.tree_depths)]

    def observe(self, cost: RoundCost, slots: list[int], budgets: list[int], drafted: list[int],
                accepted: list[int], proposed: list[list[int] | None] | None = None,
                emitted: list[list[int]] | None = None) -> None:
        """After a round over `slots`: what it cost (costs.RoundCost) and, per row, the drafts it was allowed
        (budgets), proposed and accepted; a lookup's whole proposals and the rows' emitted tokens (learn).

        A row whose drafter proposed fewer drafts than allowed and had them all accepted (nothing more to
        say) counts as a rejection too: for throughput, a missing draft is a refused one.
        """
        self._observe_cost(cost)
        self.learn(cost.shape, slots, budgets, drafted, accepted, proposed, emitted)

    def _observe_round_time(self, cost: RoundCost) -> None:
        """A whole round's wall time for its shape, but a draft model's first drafted round after plain ones: it
        first catches up on the tokens it skipped, which is not a cost of this k."""
        after_plain = self.policy.catches_up and cost.shape > 0 and self._last_k == 0
        self._last_k = cost.shape
        if cost.seconds > 0 and not after_plain:
            self.costs.observe(cost)

    def observe_index(self, k: int, seconds: float, slots: list[int], budgets: list[int], drafted: list[int],
                      accepted: list[int]) -> None:
        """observe() for a round of shape index k timed as a whole (its wall time only)."""
        self.observe(RoundCost(k, len(slots), seconds), slots, budgets, drafted, accepted)
