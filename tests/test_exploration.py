"""How long a job explores its acceptance, and on which rows (packed_choice.py): exploration ends as soon as the
first drafts verified, counted by the rounds that verified them, put the drafter's acceptance below or above
the break-even acceptance (row_drafts.breakeven, acceptance_model.acceptance_interval); a draft model explores
the rows whose draft cache it already fed; after exploration a lookup's rows that the choice leaves without
drafts are sampled within exploration's budget. Every case is exact arithmetic on prices and counts (no
timing)."""

from __future__ import annotations

import pytest

from batchspec.engine.control.acceptance_model import acceptance_interval, expected_tokens
from batchspec.engine.control.adaptive import LOOKUP, YOUNG_ROUNDS, AdaptiveK
from batchspec.engine.control.costs import PackedCosts
from batchspec.engine.drafters.base import MODEL_POLICY
from batchspec.engine.control.exploration import explore
from batchspec.engine.control.row_drafts import Prices, breakeven

LOOKUP_PRICES = Prices(fixed=0.010, per_token=0.001)  # one draft on 8 rows: 0.026 s against 0.018 s plain
MODEL_PRICES = Prices(fixed=0.008, per_token=0.0005, per_step=0.004)  # a draft step half a plain round
BURSTY = lambda a, k: 1.0 + a * [0.0, 1.0, 1.9][k]  # noqa: E731  (a lookup's: the second draft kept 0.9 of the time)

BREAKEVENS = [
    # name, prices, depth, drafting forwards, expected tokens -> the least first-draft acceptance that pays
    ("a lookup, one draft: 1 + a = 26/18", LOOKUP_PRICES, 1, False, expected_tokens, 8 / 18),
    ("a draft model, one draft: 1 + a = 20/12", MODEL_PRICES, 1, True, expected_tokens, 2 / 3),
    ("a draft model up to two: the first k breaks even first", MODEL_PRICES, 2, True, expected_tokens, 2 / 3),
    ("bursty, two drafts: 1 + a = 26/18 still beats 1 + 1.9 a = 34/18", LOOKUP_PRICES, 2, False, BURSTY, 8 / 18),
    ("a forward proportional to its tokens: nothing pays", Prices(0.0, 0.001), 4, False, expected_tokens, 2.0),
    ("no drafts allowed", LOOKUP_PRICES, 0, False, expected_tokens, 2.0),
]


@pytest.mark.parametrize("name,prices,depth,steps,expected,alpha", BREAKEVENS, ids=[b[0] for b in BREAKEVENS])
def test_breakeven_acceptance(name, prices, depth, steps, expected, alpha):
    """8 rows, 8 base tokens: every row drafting k at acceptance a against every row emitting one token."""
    assert breakeven(prices, 8, 8, depth, steps, expected) == pytest.approx(alpha, abs=2e-4)


@pytest.mark.parametrize("kept,n,low,high", [
    (0, 0, 0.0, 1.0),  # nothing verified: anything
    (0, 3, 0.0, 0.4727),
    (3, 3, 0.5273, 1.0),
    (0, 4, 0.0, 0.4021),
    (8, 16, 0.3103, 0.6897),
])
def test_acceptance_interval(kept, n, low, high):
    """Wilson's score interval at z = 1.64 (each side one-sided 95%), to 1e-4."""
    assert acceptance_interval(kept, n) == (pytest.approx(low, abs=1e-4), pytest.approx(high, abs=1e-4))


EXPLORING = [
    # name, policy, prices, first drafts kept, verified, rounds that verified them -> what the evidence says
    # (by rounds), still exploring
    ("2 verified: too few to decide", MODEL_POLICY, MODEL_PRICES, 0, 2, 2, 0, True),
    ("a draft model, 0 of 3 where 2/3 breaks even: done, it loses", MODEL_POLICY, MODEL_PRICES, 0, 3, 3, -1, False),
    ("a lookup, 0 of 3 where 0.44 breaks even: 0.47 is still possible", LOOKUP, LOOKUP_PRICES, 0, 3, 3, 0, True),
    ("a lookup, 0 of 4: done, it loses", LOOKUP, LOOKUP_PRICES, 0, 4, 4, -1, False),
    ("a lookup, 3 of 3 in three rounds: done, it pays", LOOKUP, LOOKUP_PRICES, 3, 3, 3, 1, False),
    ("a lookup, 6 of 6 in two rounds: a round is one observation, more evidence", LOOKUP, LOOKUP_PRICES, 6, 6, 2, 0,
     True),
    ("a lookup, 2 of 12 in two rounds: the same", LOOKUP, LOOKUP_PRICES, 2, 12, 2, 0, True),
    ("a lookup, 1 of 12 in three rounds: at most 0.55 over three", LOOKUP, LOOKUP_PRICES, 1, 12, 3, 0, True),
    ("a lookup, 0 of 12 in four rounds: done, it loses", LOOKUP, LOOKUP_PRICES, 0, 12, 4, -1, False),
    ("a draft model, 5 of 10: near break-even, more evidence", MODEL_POLICY, MODEL_PRICES, 5, 10, 10, 0, True),
    ("16 verified: done whatever they say", MODEL_POLICY, MODEL_PRICES, 10, 16, 16, 0, False),
]


@pytest.mark.parametrize("name,policy,prices,kept,verified,rounds,says,exploring", EXPLORING,
                         ids=[e[0] for e in EXPLORING])
def test_exploration_ends_when_the_evidence_says_whether_drafting_pays(name, policy, prices, kept, verified, rounds,
                                                                       says, exploring):
    """PackedChoice at batch 8, one draft deep: exploring until 16 first drafts are verified, unless 3 or more
    rounds' put the acceptance interval wholly below or above the break-even acceptance. The interval's rate is
    the drafts', its sample size the rounds' (the first drafts of one round are alike)."""
    controller = AdaptiveK(k_max=1, policy=policy)
    model = controller.acceptance
    model.evidence, model.first_kept, model.evidence_rounds = verified, kept, rounds
    assert controller.packed.evidence_says(prices, 8, 1) == says
    assert controller.packed.exploring(prices, 8, 1) is exploring


ROW_LENGTHS = [40, 90, 30, 300, 12, 80, 70, 60, 50, 20, 100, 110, 120, 130, 140, 150]


FED = (1, 3, 5, 6, 7, 8, 9)  # seven rows a draft model fed, of 16


@pytest.mark.parametrize("fed,curve,explored", [
    # a draft model: the rows it fed (whatever their length) and the two shortest new ones (an eighth of 16),
    # not rows 14-15, whose first drafts gain most: one drafting forward prices them all
    ((3, 9), (), [0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0]),
    ((3,), (), [0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0]),  # the one it fed, then the shortest two
    ((), (), [0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0]),  # none fed: the two shortest
    (FED, (), [0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0]),  # all seven fed, two new
    # a forward that costs 10x more past 18 tokens: two rows buy the most first drafts a second (the fed ones
    # whose first drafts gain most)
    (FED, ((16, 0.3), (18, 0.3002), (19, 0.31), (26, 0.317)), [0] * 8 + [1, 1] + [0] * 6),
])
def test_a_draft_model_explores_the_rows_it_fed_then_the_shortest(fed, curve, explored):
    """16 rows of ROW_LENGTHS; the gains rise with the row, so the last rows gain most."""
    gains = [[0.5 + i / 100] for i in range(16)]
    before = [i in fed for i in range(16)]
    prices = Prices(0.0, 0.0001, 0.0001, curve=curve or ((16, 0.3),))
    assert explore(gains, prices, 16, before, ROW_LENGTHS) == explored


def test_a_probe_explores_an_eighth_of_a_draft_models_rows():
    """Not wide (a probe, long after the rows drafted): of the seven fed rows, the two (an eighth of 16) whose
    first drafts gain most; with none fed, the two shortest."""
    gains = [[0.5 + i / 100] for i in range(16)]
    prices = Prices(0.0, 0.0001, 0.0001, curve=((16, 0.3),))
    fed = [i in FED for i in range(16)]
    assert explore(gains, prices, 16, fed, ROW_LENGTHS, wide=False) == [0] * 8 + [1, 1] + [0] * 6
    assert explore(gains, prices, 16, [False] * 16, ROW_LENGTHS, wide=False) == [0] * 4 + [1] + [0] * 4 + [1] + [0] * 6


@pytest.mark.parametrize("per_fed,explored", [
    (0.0, [1] * 8),  # the catch-up unpriced: one drafting forward prices all eight
    # 0.4 ms a fed token: the four least behind (0, 0, 2 and 2 tokens; 4 rows 4 / 4.4 ms, 3 rows 3 / 3.4 ms)
    (0.0004, [1, 1, 1, 1, 0, 0, 0, 0]),
])
def test_a_draft_models_exploration_prices_what_its_rows_lack(per_fed, explored):
    """Eight rows a draft model fed, which lack 0, 0, 2, 2 and 20 tokens (rounds since they drafted): each
    row's lag is priced at the drafting forward's price of a token (per_fed), so the rows 20 tokens behind
    are not worth their first drafts here (a 2 ms forward, 0.2 ms a draft)."""
    gains = [[0.5]] * 8
    prices = Prices(0.0, 0.0001, per_step=0.002, per_draft=0.0001, curve=((8, 0.01),), per_fed=per_fed)
    assert explore(gains, prices, 8, [True] * 8, [0, 0, 2, 2, 20, 20, 20, 20]) == explored


# A drafting forward over one row measured at start (q384's 2-layer draft, 2 CPU cores, 2026-12-06, rounded): it
# took 0.2 ms more to feed 16 tokens more and 1.7 ms more for 128, where its one-token forward took 1.0 ms.
FEED = ((16, 0.0002), (128, 0.0017))


@pytest.mark.parametrize("tokens,seconds", [
    (0, 0.0),
    (8, 0.0001),  # from (0, 0) to the first point
    (16, 0.0002),
    (72, 0.00095),  # between the points
    (128, 0.0017),
    (240, 0.0032),  # past the last: its segment's slope, 1.5 ms a 112 tokens
])
def test_feeding_a_draft_cache_is_priced_by_the_points_measured_at_start(tokens, seconds):
    """Prices.fed: what a drafting forward takes more to feed `tokens` that rows' caches lack, interpolated on
    the measured points; without them per_fed a token (the drafting forward's line: 1 ms a token here, where
    one point at one row makes it the whole forward's price, and a 150-token prompt 150 ms against ~2)."""
    assert Prices(0.0, 0.0001, per_fed=0.001, feed=FEED).fed(tokens) == pytest.approx(seconds)
    assert Prices(0.0, 0.0001, per_fed=0.001).fed(tokens) == pytest.approx(0.001 * tokens)


def test_a_draft_models_catch_up_is_paid_from_explorations_budget():
    """A draft model breaking even at 2/3 (as below), its drafting forward 0.002 s + 0.00025 s a token it feeds,
    rows that lack their 40-token prompt until they first draft and a token for each round since. Until 3 first
    drafts are verified every round explores, whatever the budget: with the lags priced (`lags` given) one row
    a round (each new row's prompt costs 10 ms), rounds 0-2, whose 3 refusals end it, leaving the budget 18 ms
    short; unpriced, one row then two (rounds 0 and 1), the budget then holds the third round back to round 26
    (3 rounds refused end it). Round 46 is a probe either way."""
    explored = {}
    for given in (False, True):
        costs = PackedCosts()
        for tokens in (8, 16, 24):
            costs.verify.add(tokens, 0.008 + 0.0005 * tokens)
            costs.step.add(tokens, 0.002 + 0.00025 * tokens)
        costs.rest.add(0, 0.0, weight=0.1)
        controller = AdaptiveK(k_max=2, policy=MODEL_POLICY, costs=costs)
        controller.packed.rounds = 1
        slots, last, explored[given] = list(range(8)), [None] * 8, []
        for r in range(60):
            lags = [40 if t is None else r - t for t in last]
            _, drafts = controller.choose_rows(slots, [2] * 8, [0] * 8, None, 8, costs, lags if given else None)
            if sum(drafts):
                explored[given].append(r)
                last = [r if k else t for t, k in zip(last, drafts)]
            controller.learn(1 if sum(drafts) else 0, slots, drafts, drafts, [0] * 8)
    assert explored[False] == [0, 1, 26, 46] and explored[True] == [0, 1, 2, 46]


def controller_past_its_start(policy) -> tuple[AdaptiveK, PackedCosts]:
    """A controller whose costs are MODEL_PRICES' (a draft model can pay only above 2/3 acceptance)."""
    costs = PackedCosts()
    for tokens in (8, 16, 24):
        costs.verify.add(tokens, 0.008 + 0.0005 * tokens)
    for tokens in (8, 16, 24):
        costs.step.add(tokens, 0.004)
    costs.rest.add(0, 0.0, weight=0.1)
    controller = AdaptiveK(k_max=2, policy=policy, costs=costs)
    controller.packed.rounds = 1
    return controller, costs


def test_three_rejected_first_drafts_end_a_draft_models_exploration():
    """A draft model that breaks even at 2/3: an exploring round drafts one row on the rows it fed and one new
    one (an eighth of 8), each round costing 0.004 s for the drafting forward and 0.0005 s a draft over a
    0.012 s plain round: rounds 0 (one row) and 1 (two) explore before 3 first drafts are verified, whatever
    the budget (2% of each round's price, 0.00024 s), which then holds the next back until it has earnt them
    back: round 39 (three rows); the rest draft nothing. After 3 rounds of first drafts refused the job is
    done exploring."""
    controller, costs = controller_past_its_start(MODEL_POLICY)
    slots, explored = list(range(8)), []
    for r in range(42):
        _, drafts = controller.choose_rows(slots, [2] * 8, [0] * 8, None, 8, costs)
        assert controller.packed.learning == (r <= 39), r
        if sum(drafts):
            assert drafts == [1] * len(explored) + [1] + [0] * (7 - len(explored)) and controller.packed.explored, r
            explored.append(r)
        controller.learn(1 if sum(drafts) else 0, slots, drafts, drafts, [0] * 8)
    assert explored == [0, 1, 39]
    assert controller.acceptance.evidence == 6 and not controller.packed.learning


def test_a_round_that_prefills_prompts_does_not_reopen_exploration():
    """0 of 3 first drafts kept end a draft model's exploration (break-even 2/3 in a round of 8 decoding rows).
    A round whose forward also prefills 800 prompt tokens would price a draft nearly free (one draft on 8 rows
    there breaks even at 0.05): the verdict is the decoding round's, so the job stays done exploring and that
    round drafts nothing."""
    controller, costs = controller_past_its_start(MODEL_POLICY)
    assert breakeven(costs.prices(), 8, 808, 1, True, expected_tokens) < 0.06
    model = controller.acceptance
    model.evidence, model.first_kept, model.evidence_rounds = 3, 0, 3
    controller.packed.next_probe = 10 ** 6  # no probe in these rounds
    for base in (8, 808, 8):
        _, drafts = controller.choose_rows(list(range(8)), [2] * 8, [0] * 8, None, base, costs)
        assert drafts == [0] * 8 and not controller.packed.learning, base


def test_a_probe_does_not_widen_exploration():
    """A probe round that falls while the job explores drafts what exploration drafts (one draft on one row),
    not one more draft on every row: a draft model would feed every row's prompt for it."""
    controller, costs = controller_past_its_start(MODEL_POLICY)
    controller.packed.next_probe = 2  # the next round is a probe
    _, drafts = controller.choose_rows(list(range(8)), [2] * 8, [0] * 8, None, 8, costs)
    assert drafts == [1] + [0] * 7 and controller.packed.explored


class Streams:
    """Each row's text as the target writes it (row i: i * 1000, i * 1000 + 1, ...) and a lookup whose proposals
    are always right: what a round's rows propose, and what they emit with the drafts verified."""

    def __init__(self, rows: int, width: int):
        self.at, self.width = [i * 1000 for i in range(rows)], width

    def propose(self, offers: list[int]) -> list[list[int]]:
        return [list(range(p, p + self.width)) if n else [] for p, n in zip(self.at, offers)]

    def emit(self, drafts: list[int]) -> list[list[int]]:
        out = [list(range(p, p + k + 1)) for p, k in zip(self.at, drafts)]
        self.at = [p + k + 1 for p, k in zip(self.at, drafts)]
        return out


def test_a_lookup_explores_by_proposing_and_verifies_nothing():
    """A lookup whose proposals are all right (break-even 1/3 at these prices): exploring, every row proposes and
    none drafts; its rows' next tokens judge the proposals (hindsight.py), 8 first drafts a round, and after
    round 1 the 16 first drafts end exploration: the choice drafts every row from round 2. (Exploring by
    verifying, one draft on 2 rows a round, it took 3 rounds and made each one dearer.)"""
    controller, costs = controller_past_its_start(LOOKUP)
    slots, learning, chosen, streams = list(range(8)), [], [], Streams(8, 2)
    for r in range(8):
        _, drafts = controller.choose_rows(slots, [2] * 8, [0] * 8, None, 8, costs)
        assert not controller.packed.explored
        if controller.packed.learning:
            learning.append(r)
            assert drafts == [0] * 8
        elif sum(drafts):
            chosen.append(r)
        proposed = streams.propose([2] * 8)
        controller.learn(max(drafts), slots, drafts, drafts, drafts, proposed, streams.emit(drafts))
    assert learning == [0, 1] and chosen == [2, 3, 4, 5, 6, 7]
    assert controller.acceptance.evidence == 64 and controller.acceptance.evidence_rounds == 8
    assert controller.acceptance.first_kept == 64


def test_a_lookups_rows_left_without_drafts_are_sampled_within_the_budget():
    """After exploration (16 first drafts, 1 kept: the choice drafts nothing), a lookup's rows are sampled: the
    rows least recently judged propose (`hopeless` spares them), as many as the credit covers (2% of each round's
    price, 0.00024 s, where a draft costs 0.0005 s: a row every second or third round), each row once before any
    twice; their proposals are judged in hindsight and none is verified. A draft model's rows are not sampled
    (its rows catch up on what they skipped: the probes measure it)."""
    controller, costs = controller_past_its_start(LOOKUP)
    model = controller.acceptance
    model.evidence, model.first_kept, model.evidence_rounds = 16, 1, 8
    model.pooled.accepted, model.pooled.rejections = 1.0, 15.0
    controller.packed.next_probe = 10 ** 6  # no probe in these rounds
    slots, rows = list(range(8)), []
    for r in range(24):
        offers = [0 if h else 2 for h in controller.hopeless(slots, 8, costs)]
        _, drafts = controller.choose_rows(slots, offers, [0] * 8, None, 8, costs)
        assert not controller.packed.learning and not controller.packed.explored and sum(drafts) == 0, r
        rows += [i for i, n in enumerate(offers) if n]
        controller.learn(0, slots, drafts, drafts, [0] * 8)
    assert rows == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2]

    controller, costs = controller_past_its_start(MODEL_POLICY)
    model = controller.acceptance
    model.evidence, model.first_kept, model.evidence_rounds = 16, 1, 8
    model.pooled.accepted, model.pooled.rejections = 1.0, 15.0
    controller.packed.next_probe = 10 ** 6
    for r in range(24):
        _, drafts = controller.choose_rows(slots, [2] * 8, [0] * 8, None, 8, costs)
        assert not controller.packed.learning and sum(drafts) == 0, r
        controller.learn(0, slots, drafts, drafts, [0] * 8)


def test_sampling_spares_its_rows_from_hopeless():
    """A lookup is not asked to propose for rows whose drafts cannot pay (hopeless), except the rows sampling
    would take: the least recently verified, as many as the credit covers."""
    controller, costs = controller_past_its_start(LOOKUP)
    model = controller.acceptance
    model.evidence, model.first_kept, model.evidence_rounds = 16, 1, 8
    model.pooled.accepted, model.pooled.rejections = 1.0, 15.0
    controller.packed.next_probe = 10 ** 6
    controller.packed._seen = {0: 5, 1: 3, 2: 9, 3: 1, 4: 7, 5: 2, 6: 8, 7: 4}
    assert controller.hopeless(list(range(8)), 8, costs) == [True] * 8  # no credit yet
    controller.packed._credit = 0.0011  # two drafts' worth (0.0005 s each)
    assert controller.hopeless(list(range(8)), 8, costs) == [True, True, True, False, True, False, True, True]


@pytest.mark.parametrize("policy,kept,explores", [
    # 10 of 16 first drafts kept: Wilson's top 0.80, above the 2/3 that breaks even (one draft) -> exploring goes on
    (MODEL_POLICY, 10, True),
    (MODEL_POLICY, 4, False),  # 4 of 16: at most 0.44, drafting cannot pay -> done
    (LOOKUP, 10, False),  # a lookup's left-out rows are sampled instead (test above)
], ids=["model_undecided", "model_loses", "lookup"])
def test_a_draft_model_left_drafting_nothing_explores_while_the_evidence_may_say_it_pays(policy, kept, explores):
    """Past the 16 first drafts of exploration, the books drafting nothing (every row's estimate 0.5, below 2/3):
    while the interval over the drafts verified still reaches above break-even a draft model goes on exploring,
    its budget half of what drafting would gain at the interval's top (here 0.80: 1.8 tokens for 1.67x a plain
    round's price, 8% more, so 4% of a plain round a round against 2% without) -> an exploring round (one row's
    draft, 4.5 ms over a 12 ms plain round) every 10 rounds, where 2% paid for one every ~19."""
    controller, costs = controller_past_its_start(policy)
    model = controller.acceptance
    model.evidence, model.first_kept, model.evidence_rounds = 16, kept, 8
    controller.packed.next_probe = 10 ** 6  # no probe in these rounds
    slots, explored = list(range(8)), []
    for r in range(24):
        _, drafts = controller.choose_rows(slots, [2] * 8, [0] * 8, None, 8, costs)
        assert controller.packed.learning is explores
        if sum(drafts):
            explored.append(r)
        controller.learn(0, slots, [0] * 8, [0] * 8, [0] * 8)  # nothing learnt: the interval stays as it is
    if policy is LOOKUP:
        assert len(explored) <= 12  # sampling, a draft at a time
    else:
        assert (len(explored) >= 3) is explores and max(b - a for a, b in zip([-1] + explored, explored + [24])) <= (
            10 if explores else 25), explored


@pytest.mark.parametrize("age,taught", [
    (1, False),  # its prefill's round
    (2, False),  # its first decoding round
    (YOUNG_ROUNDS, False),
    (YOUNG_ROUNDS + 1, True),
])
def test_a_rows_first_rounds_teach_the_acceptance_model_nothing(age, taught):
    """A refused first draft in the age-th round of a row's life (its prefill's the first): within YOUNG_ROUNDS
    it moves neither the job's evidence, its acceptance nor the row's; after them it does."""
    for policy in (LOOKUP, MODEL_POLICY):
        controller, _ = controller_past_its_start(policy)
        model = controller.acceptance
        controller.admit(0)
        for _ in range(age - 1):
            controller.learn(0, [0], [0], [0], [0])
        state = lambda: (model.evidence, round(model.pooled.accepted / (model.pooled.accepted + model.pooled.rejections), 9),  # noqa: E731
                         model.alpha(0))
        before = state()
        controller.learn(1, [0], [1], [1], [0])
        assert (state() != before) == taught, policy


def test_exploration_and_sampling_leave_young_rows_out():
    """Rows 0-3 admitted just now, rows 4-7 long running: a draft model explores only the rows past their first
    YOUNG_ROUNDS (the young ones' verdicts would teach nothing); a lookup's sampling spares only those from
    `hopeless`, and its young rows' proposals are not followed (test_hindsight.py)."""
    controller, costs = controller_past_its_start(MODEL_POLICY)
    for slot in range(4):
        controller.admit(slot)
    _, drafts = controller.choose_rows(list(range(8)), [2] * 8, [0] * 8, None, 8, costs)
    assert controller.packed.explored and sum(drafts) > 0 and drafts[:4] == [0] * 4
    controller, costs = controller_past_its_start(LOOKUP)
    for slot in range(4):
        controller.admit(slot)
    model = controller.acceptance
    model.evidence, model.first_kept, model.evidence_rounds = 16, 1, 8  # exploration is over: drafts refused
    model.pooled.accepted, model.pooled.rejections = 1.0, 15.0
    controller.packed.next_probe, sampled = 10 ** 6, []
    for _ in range(8):
        offers = [0 if h else 2 for h in controller.hopeless(list(range(8)), 8, costs)]
        controller.choose_rows(list(range(8)), offers, [0] * 8, None, 8, costs)
        sampled += [i for i, n in enumerate(offers) if n]
    assert sampled and min(sampled) >= 4
