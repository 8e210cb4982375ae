"""Adaptive speculation in packed rounds: each row its own number of drafts (AdaptiveK holds one).

Packed rounds (eager, packed.py) price each row's drafts apart: `choose_rows` gives every row its own
number of drafts, the choice of row_drafts.py over each row's expected gains E_i(j) - E_i(j - 1) (the
acceptance model, acceptance_model.py) and the round's cost by what it computes (costs.PackedCosts: the
target forward's time against its tokens, each drafting forward's against its tokens, the rest of the
round against its drafts). The gains are scaled by their calibration, per draft position the decayed
ratio of drafts accepted there to the gains predicted for the drafts chosen there, so that a systematic
error of the acceptance model (choosing the rows whose estimates are highest picks estimates that err
high) cannot keep a job drafting at a loss. By position, because the error grows with depth (one job-wide
ratio called a head's fourth draft 0.46 where 0.28 was accepted, on SmolLM2 at batch 8). A lookup is not
asked to propose for rows that would draft nothing whatever it proposed (`hopeless`); probe rounds (`_probe`)
keep rows that draft nothing measuring their acceptance (a lookup's by proposing: hindsight.py).

Until the job has verified `explore_evidence` first drafts, its acceptance is a prior (0.5, or the
drafter's own guess), and a choice made on it can cost a short job more than drafting ever gains (an
untrained draft at batch 32 once widened a 48-round job's first drafting round to 82 tokens: 0.93x drafter
none). So while the evidence is short, drafting is exploration: a lookup's rows all propose and verify
nothing; a draft model's verify one draft on a few rows, at a bounded price (`explore`), until the first
drafts verified (a round counted as one observation) put the job's acceptance clearly below or above the
prices' break-even point (`exploring`), within EXPLORE_BUDGET of the rounds' price (`_explore`). After it,
the same budget lets a lookup's rows that the books call hopeless propose, in turns (`_sample`).
"""

from __future__ import annotations

from ..types import TreeSpec
from .acceptance_model import AcceptanceModel, acceptance_interval
from .costs import PackedCosts
from .exploration import explore
from ..drafters.base import DrafterPolicy
from .row_drafts import Prices, best_speedup, breakeven, choose_drafts, pays_at_best


EXPLORE_SHARE = 0.1  # the most a round's credit may buy over one without drafts (_accrued)
EXPLORE_BUDGET = 0.02  # what exploring may cost in all, a share of the price of the rounds' decoding meanwhile
MIN_EVIDENCE = 3  # rounds that verified first drafts before their interval may end exploration early
UPSIDE_SHARE = 0.5  # of what drafting would gain at the top of the acceptance interval: exploring's budget (_upside)


class PackedChoice:
    """The packed rounds' choice over `acceptance`, for a drafter of `policy`: chains of up to k_max drafts
    a row, or one of `trees`; every `revisit_every` rounds a probe; exploration until `explore_evidence`
    first drafts are verified. It keeps its own count of rounds and probe schedule."""

    def __init__(self, acceptance: AcceptanceModel, policy: DrafterPolicy, k_max: int, trees: tuple[TreeSpec, ...],
                 revisit_every: int, explore_evidence: int):
        self.acceptance, self.policy, self.k_max, self.trees = acceptance, policy, k_max, trees
        self.revisit_every, self.explore_evidence = revisit_every, explore_evidence
        # A lookup's proposals are judged in hindsight.py: its exploring, sampling and probing rows only propose.
        self.hindsight = policy.propose_first
        self.rounds = 0
        self.next_probe = revisit_every  # round of the next probe
        self._interval = 0  # rounds until the one after: doubles while nobody drafts
        self._idle = False  # nobody drafted at the last probe
        self.explored = False  # the last choice's drafts were exploration's (explore)
        self.learning = False  # the last choice was made while the job explored (exploring)
        self._credit = 0.0  # exploration's budget in seconds: EXPLORE_BUDGET of each round's price, less its spending
        self._seen: dict[int, int] = {}  # slot -> the last round that verified a draft of its row (sampling's order)

    def admit(self, slot: int) -> None:
        """A new request took `slot`: it has had no draft verified."""
        self._seen.pop(slot, None)

    def exploring(self, prices: Prices, rows: int, depth: int) -> bool:
        """Whether the job still learns its acceptance: fewer than `explore_evidence` first drafts verified,
        unless those verified already say whether drafting pays (`evidence_says`)."""
        return self.acceptance.evidence < self.explore_evidence and self.evidence_says(prices, rows, depth) == 0

    def evidence_says(self, prices: Prices, rows: int, depth: int) -> int:
        """What the first drafts verified say, by rounds (`evidence`'s first verdict)."""
        return self.evidence(prices, rows, depth)[0]

    def evidence(self, prices: Prices, rows: int, depth: int) -> tuple[int, int]:
        """Two verdicts on the first drafts verified, each -1 when their acceptance interval lies wholly below the
        acceptance at which drafting `depth` deep over `rows` rows breaks even at these prices in a round that
        decodes only (a round that also prefills prompt chunks makes a draft look nearly free: SmolLM2's
        break-even read 0.02 at 844 tokens against 0.6 at 8, and each admission reopened exploration, a draft
        model feeding a new row's prompt every time; 2026-12-03), +1 wholly above, 0 before
        MIN_EVIDENCE observations or between: with a round as an observation (the rate is the drafts'), which
        ends exploration early either way, and with a draft as one, which sets exploration's pace (while it lies
        above break-even every round explores). By rounds because the first drafts of one round are alike, rows
        at the same point of their output (chat rows open alike: 4 of SmolLM2's first 6 ngram drafts were
        kept, 1 in 10 afterwards, 2026-12-01; on a held-out pair at batch 32, 2 of 17 drafts one or two tokens
        into the rows' output, then 30 of 31 fifty rounds later, 2026-12-02)."""
        model = self.acceptance
        if model.evidence < MIN_EVIDENCE:  # evidence_rounds <= evidence: neither says anything yet
            return 0, 0
        run = model.run_lengths() if self.policy.bursty else None
        alpha = breakeven(prices, rows, rows, depth, bool(self.policy.draft_forwards),
                          lambda a, k: model.expected(a, k, run))

        def says(n: int) -> int:
            if n < MIN_EVIDENCE:
                return 0
            low, high = acceptance_interval(n * model.first_kept / model.evidence, n)
            return -1 if high < alpha else (1 if low > alpha else 0)

        return says(model.evidence_rounds), says(model.evidence)

    def _explore(self, drafts: list[int], prices: Prices, base_tokens: int, pays: bool,
                 lags: list[int] | None) -> list[int]:
        """A drafter with forwards (a lookup's rows explore by proposing): exploration's drafts while its budget
        is not overspent, else none: each exploring round's cost over a plain one comes out of EXPLORE_BUDGET of
        every round's price, so that a drafter whose evidence
        comes slowly does not explore at EXPLORE_SHARE over a whole job (suffix decoding on Gemma-3-270M at
        batch 8 explored one row a round for 54 rounds and ran 0.87-0.91x drafter none; 2026-12-01). While
        the drafts so far say drafting pays (`pays`), every round explores: it buys what the job will gain; so
        does every round until MIN_EVIDENCE first drafts are verified: waiting on the budget before then kept a
        draft model at batch 1 from its third first draft for 25 rounds where drafting ran 1.9x (q384, 2 CPU
        cores, 2026-12-06). Its price counts what its rows' caches lacked (lags)."""
        plain = prices.seconds(base_tokens, 0, 0)
        if self._credit < 0 and not pays and self.acceptance.evidence >= MIN_EVIDENCE:
            return [0] * len(drafts)
        n, fed = sum(drafts), sum(m for m, k in zip(lags or [], drafts) if k)
        self._credit -= prices.seconds(base_tokens + n, int(n > 0), n) + prices.fed(fed) - plain
        self.explored = n > 0
        return drafts

    def _upside(self, prices: Prices, rows: int, depth: int) -> float:
        """A drafter with forwards: what drafting would gain over plain decoding (a share of a plain round) were
        the job's first-draft acceptance at the top of its interval over the drafts verified (0 before
        MIN_EVIDENCE of them, or when even that top is below break-even). While it is above 0, a round the
        choice leaves without drafts explores, and exploring's budget is UPSIDE_SHARE of it a round where
        that is more than EXPLORE_BUDGET: not knowing costs what drafting would gain in every round that does
        not draft. At EXPLORE_BUDGET alone a draft model's exploring rounds (which feed its rows' caches) came
        every ~60 rounds, and jobs drafted nothing in 228 rounds where fixed k=2 ran 1.06x drafter none (p512,
        96 staggered rows at batch 32, 2 CPU cores, 2026-12-05)."""
        model = self.acceptance
        if model.evidence < MIN_EVIDENCE:
            return 0.0
        high = acceptance_interval(model.first_kept, model.evidence)[1]
        run = model.run_lengths() if self.policy.bursty else None
        return max(best_speedup(prices, rows, rows, depth, True, lambda k: model.expected(high, k, run)) - 1.0, 0.0)

    def hopeless(self, slots: list[int], base_tokens: int, costs: PackedCosts, young: list[bool]) -> list[bool]:
        """Before a lookup proposes in a packed round: per row, whether its first draft cannot pay at the
        round's prices whatever it proposes, so that the drafter need not propose for it (host work that
        was 3% of round time at batch 64). Exactly the rows choose_rows would give no draft: a lookup's
        drafts all cost the same (per token + per draft), and choose_drafts takes a draft only when its
        gain per cost beats the rate of the round without drafts (row_drafts.py). Nobody is hopeless in
        a probe round, while the job explores (explore drafts rows whatever the choice says), before the
        costs are known, with trees, or for a drafter whose proposals carry priors (its rows' worth is
        known only once they have proposed)."""
        policy, model = self.policy, self.acceptance
        if (self.rounds + 1 >= self.next_probe or not costs.known or self.trees or policy.draft_forwards
                or policy.priors):
            return [False] * len(slots)
        prices = costs.prices().decoding(base_tokens, len(slots))  # as choose_rows values the round
        credit = self._accrued(prices, base_tokens, False)  # what sampling will have once choose_rows accrues
        if self.exploring(prices, len(slots), self.k_max):
            return [False] * len(slots)
        if not pays_at_best(prices, len(slots), base_tokens, self.k_max, policy.draft_forwards):
            return [True] * len(slots)
        rate = len(slots) / max(prices.seconds(base_tokens, 0, 0), 1e-12)
        each = prices.cheapest_draft(base_tokens, len(slots))  # a draft at its cheapest: filling a cheap forward
        threshold = rate * each / max(model.calibration_at(0).ratio, 1e-12)
        run = model.run_lengths() if policy.bursty else None
        hopeless = [model.expected(model.alpha(s), 1, run) - 1.0 <= threshold for s in slots]
        # The rows sampling would take propose all the same (the same order and credit as _sample's).
        for i in self._sampled([i for i, h in enumerate(hopeless) if h and not young[i]], slots, prices, base_tokens,
                               credit)[0]:
            hopeless[i] = False
        return hopeless

    def choose_rows(self, slots: list[int], offers: list[int], room: list[int], priors: list[float | None] | None,
                    base_tokens: int, costs: PackedCosts, lags: list[int] | None = None,
                    young: list[bool] | None = None) -> tuple[int, list[int]]:
        """A packed round (row_drafts.py): (shape index, drafts per row). offers: the most drafts each row may
        verify (a lookup's proposal, or its budget); room: how deep its tree may go; base_tokens: the
        forward's tokens without drafts; lags: the tokens each row's draft cache lacks (a drafter with forwards:
        what exploration weighs, explore); young: rows whose drafts teach nothing yet (adaptive.YOUNG_ROUNDS:
        exploration and sampling leave them out). Until the costs are known, rounds alternate between every
        row drafting nothing and every row drafting its offer; every `revisit_every` rounds (doubling, up to
        8x, while nobody drafts) each row verifies one draft more than chosen (rows left out keep learning)."""
        model = self.acceptance
        self.rounds += 1
        self.explored = self.learning = False
        priors = priors or [None] * len(slots)
        model.offered(slots, priors, offers)
        num_shapes = self.k_max + 1 + len(self.trees)
        trees = list(range(self.k_max + 1, num_shapes)) if max(room, default=0) > 0 else []
        draws = self.policy.draft_forwards
        if draws:
            # A draft model's rows are priced as in a round that only decodes: where prompt chunks are prefilled a
            # draft looks nearly free, but drafting first feeds the rows' whole sequences to the draft model
            # (SmolLM2 with 6 of its layers: 848 and 504 tokens fed, 364 and 268 ms on ~140 ms rounds; 2026-12-02).
            base_tokens = len(slots)
        prices = costs.prices() if costs.known and (not draws or costs.step.known) else None
        if prices is not None:  # drafts save decoding, not prefill (row_drafts.Prices.decoding)
            prices = prices.decoding(base_tokens, len(slots))
            # Every round adds to exploration's and sampling's credit, whoever proposed: a share of its decoding.
            self._credit = self._accrued(prices, base_tokens, draws)
        if max(offers, default=0) == 0 and not trees:
            return 0, [0] * len(slots)
        if prices is None:  # start of the job: time both extremes
            return (0, [0] * len(slots)) if self.rounds % 2 else (max(offers), list(offers))
        if not trees and not pays_at_best(prices, len(slots), base_tokens, max(offers), draws):
            return 0, [0] * len(slots)  # not even drafts that were all accepted would pay: no probes either
        alphas = [model.alpha(s, p) for s, p in zip(slots, priors)]
        run = model.run_lengths() if self.policy.bursty else None
        gains = [[model.expected(a, j, run) - model.expected(a, j - 1, run) for j in range(1, n + 1)]
                 for a, n in zip(alphas, offers)]
        drafts, rate = choose_drafts(model.calibrated(gains), base_tokens, prices, steps=draws)
        # Past explore_evidence the job is done exploring, as when the evidence says whether drafting pays.
        says, pays = (self.evidence(prices, len(slots), max(offers))
                      if model.evidence < self.explore_evidence else (-1, 0))
        # A drafter with forwards has no sampling of the rows its choice leaves out: while the first drafts verified
        # may still say that drafting pays and the choice drafts nothing, it goes on exploring (_upside).
        idle = not any(drafts) and not trees  # the books draft nothing this round
        upside = self._upside(prices, len(slots), max(offers)) if draws and (says == 0 or idle) else 0.0
        self.learning = says == 0 or (upside > 0 and idle)
        if self.learning and pays <= 0:
            self._credit += max(UPSIDE_SHARE * upside - EXPLORE_BUDGET, 0.0) * prices.seconds(len(slots), 0, 0)
        drafted_before = [model.drafted(s) for s in slots] if draws else None  # only a draft model's order uses it
        young = young or [False] * len(slots)
        telling = [[] if y else g for g, y in zip(gains, young)]  # the rows exploration may draft
        if self.learning:  # a lookup's rows all propose (hopeless) and verify nothing: hindsight.py judges them
            drafts, trees = [0] * len(slots) if self.hindsight else self._explore(
                explore(telling, prices, base_tokens, drafted_before, lags), prices, base_tokens, pays > 0, lags), []
        shape = max(drafts, default=0)
        if trees:
            shape, drafts = self._tree_round(trees, (shape, drafts), rate, alphas, run, room, prices, base_tokens,
                                             draws)
        if self.rounds >= self.next_probe and not self.learning:  # exploring is measuring already
            shape, drafts = self._probe(shape, drafts, offers, telling, prices, base_tokens, draws, drafted_before,
                                        lags)
        elif shape <= self.k_max and not self.learning and not draws:
            self._sample(slots, drafts, [0 if y else n for n, y in zip(offers, young)], prices,
                         base_tokens + sum(drafts))
        if shape <= self.k_max:
            model.expect({s: g[:k] for s, g, k, y in zip(slots, gains, drafts, young) if k > 0 and not y})
            judged = [0 if y else n for n, y in zip(offers, young)] if self.hindsight else drafts  # hindsight.py
            self._seen.update((s, self.rounds) for s, k in zip(slots, judged) if k > 0)
        return shape, drafts

    def _tree_round(self, trees: list[int], chain: tuple[int, list[int]], rate: float, alphas: list[float], run,
                    room: list[int], prices: Prices, base_tokens: int, draws: bool) -> tuple[int, list[int]]:
        """(shape, drafts): a tree round (every row its tree) where one delivers more tokens a second than the
        chain's choice (chain: its shape and drafts; rate: its tokens a second)."""
        shape, drafts = chain
        n = len(room)
        for j in (t - self.k_max - 1 for t in trees):
            spec = self.trees[j]
            per_row = self.acceptance.tree_tokens(j, alphas, run)
            tokens = sum(min(per_row, r + 1) for r in room)
            seconds = prices.seconds(base_tokens + n * spec.nodes, spec.depth if draws else 0, n * spec.depth)
            if tokens / max(seconds, 1e-12) > rate:
                shape, rate, drafts = self.k_max + 1 + j, tokens / max(seconds, 1e-12), list(room)
        return shape, drafts

    def _probe(self, shape: int, drafts: list[int], offers: list[int], gains: list[list[float]], prices: Prices,
               base_tokens: int, draws: bool, drafted_before: list[bool] | None,
               lags: list[int] | None) -> tuple[int, list[int]]:
        """A probe round (every `revisit_every` rounds, the interval doubling up to 8x while nobody drafts):
        each row verifies one draft more than chosen; with a draft model and nobody drafting, the rows
        exploration would pick (each fed what it missed)."""
        idle = sum(drafts) == 0
        self._interval = min(2 * self._interval, 8 * self.revisit_every) if idle and self._idle else self.revisit_every
        self.next_probe, self._idle = self.rounds + self._interval, idle
        if shape > self.k_max or self.hindsight:  # a tree round probes nothing more; a lookup's rows propose
            return shape, drafts
        if draws and idle:
            drafts = explore(gains, prices, base_tokens, drafted_before, lags, wide=False)
        else:
            drafts = [min(n, k + 1) for n, k in zip(offers, drafts)]
        return max(drafts, default=0), drafts

    def _accrued(self, prices: Prices, base_tokens: int, steps: bool) -> float:
        """Exploration's and sampling's credit with EXPLORE_BUDGET of this round's price added: at most
        EXPLORE_SHARE of a round's price more than one sampled draft costs (a credit saved over a long run of
        rounds that needed none must not buy a round of many)."""
        plain = prices.seconds(base_tokens, 0, 0)
        one = prices.seconds(base_tokens + 1, int(steps), 1) - plain
        return min(self._credit + EXPLORE_BUDGET * plain, EXPLORE_SHARE * plain + one)

    def _sampled(self, idle: list[int], slots: list[int], prices: Prices, base_tokens: int,
                 credit: float) -> tuple[list[int], float]:
        """Of the rows `idle` (indices into slots), the ones sampling takes: least recently verified first, as
        many as `credit` covers at a lookup's price of their drafts in a round of base_tokens (verify tokens
        and their host work) -> (rows, their cost)."""
        if credit <= 0 or not idle:
            return [], 0.0
        count = len(idle)
        while count and prices.added(base_tokens, count) > credit:
            count -= 1
        taken = sorted(idle, key=lambda i: self._seen.get(slots[i], -1))[:count]
        return taken, max(prices.added(base_tokens, count), 0.0) if count else 0.0

    def _sample(self, slots: list[int], drafts: list[int], offers: list[int], prices: Prices,
                base_tokens: int) -> None:
        """After exploration, a lookup's rows that the choice leaves without drafts are sampled: `hopeless` lets
        the rows sampling takes propose (the least recently judged first, as many as exploration's budget,
        EXPLORE_BUDGET of every round's price, covers at what one draft each would cost), their proposals are
        judged by their next tokens (hindsight.py), and the budget pays for them here. A lookup's acceptance
        moves as a row's output grows: on a held-out pair at batch 32 (q384, 2026-12-02) the first drafts of rows
        one or two tokens into their output were 2 of 17 kept, the choice then drafted nothing, and a probe 52
        rounds later found 30 of 31 kept (fixed k=1 ran 1.15x plain decoding, adaptive 0.93x)."""
        idle = [i for i, (n, k) in enumerate(zip(offers, drafts)) if n > 0 and k == 0]
        self._credit -= self._sampled(idle, slots, prices, base_tokens, self._credit)[1]
