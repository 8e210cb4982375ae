"""The payoff check (engine/control/payoff.py) against simulated rounds: each arm emits tokens at its own rate, each
round's time noisy (uniform +-noise, fixed seed), the machine drifting slowly; and its schedule, exactly."""

from __future__ import annotations

import math
import random

import pytest

from batchspec.engine.control.payoff import PayoffCheck


def simulate(drafting_rate, plain_rate, *, rounds=4000, noise=0.2, drift=0.2, seed=0, check=None):
    """Rounds of 32 tokens; a round takes 32 / rate seconds of its arm, times (1 +- noise), times a slow
    drift of the whole machine (a sine of amplitude `drift` over 1,000 rounds). -> (the check, tokens per
    second achieved relative to the faster arm's rate)."""
    check = check or PayoffCheck()
    rng = random.Random(seed)
    tokens = seconds = 0.0
    for r in range(rounds):
        rate = drafting_rate if check.drafting else plain_rate
        speed = 1 + drift * math.sin(2 * math.pi * r / 1000)
        s = 32 / rate * (1 + rng.uniform(-noise, noise)) / speed
        check.observe(32, s)
        tokens, seconds = tokens + 32, seconds + s * speed  # achieved at the machine's mean speed
    return check, tokens / seconds / max(drafting_rate, plain_rate)


# (name, drafting's rate, plain decoding's rate, the verdict, the least share of the better arm's rate)
CASES = [
    ("drafting pays 1.6x", 1.6, 1.0, "drafting", 0.94),
    ("drafting pays 1.1x", 1.1, 1.0, "drafting", 0.97),
    ("drafting loses 0.85x", 0.85, 1.0, "plain", 0.97),
    ("drafting loses 0.93x", 0.93, 1.0, "plain", 0.97),
    ("drafting halves the rate", 0.5, 1.0, "plain", 0.92),  # its trials cost twice: 1 epoch in 17
]


@pytest.mark.parametrize("name,on,off,winner,least", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_faster_arm_wins_and_the_trials_cost_little(name, on, off, winner, least, seed):
    """4,000 rounds (~170 epochs of 24 rounds with drafting, 8 without), 3 seeds: the verdict is the faster arm and the job runs at >= `least`
    of that arm's rate (the warm-up, the alternation and the loser's trials are the rest)."""
    check, achieved = simulate(on, off, seed=seed)
    assert check.winner == winner
    assert achieved >= least, achieved


@pytest.mark.parametrize("every,winner,plain_rounds", [
    (8, None, 0),  # drafts in 1 round of 8: its epochs measure plain decoding, nothing is compared
    (3, "plain", 48),  # 1 of 3 (more than a quarter): compared, 0.97x is a loss
    (1, "plain", 48),
])
def test_a_drafting_epoch_that_hardly_drafted_is_not_compared(every, winner, plain_rounds):
    """Epochs with drafting allowed run 0.97x plain decoding (noise-free), the controller drafting in one round of
    `every`: where that is fewer than a quarter of an epoch's rounds, the epoch is no evidence of drafting, no
    plain epoch is run and drafting stays allowed; otherwise the verdict is plain as before (400 rounds)."""
    check = PayoffCheck()
    for r in range(400):
        drafting = check.drafting
        check.observe(32, 32 / (0.97 if drafting else 1.0), drafted=drafting and r % every == 0)
    assert check.winner == winner and check.drafting is (winner is None)
    assert check.rounds[0] >= plain_rounds and (plain_rounds or check.rounds[0] == 0)


ALIKE = [64] * 40  # rows that finished at one length
STAGGERED = [8 + 56 * i // 39 for i in range(40)]  # 8..64: coefficient of variation 0.45
FEW = [8, 64] * 3  # too few rows to say


@pytest.mark.parametrize("on,lengths,winner", [
    (0.99, ALIKE, "plain"), (1.0, ALIKE, "plain"), (1.02, ALIKE, "plain"), (1.04, ALIKE, "drafting"),
    (0.99, STAGGERED, "plain"), (1.0, STAGGERED, "drafting"), (1.02, STAGGERED, "drafting"),
    (1.02, FEW, "plain"), (1.02, [60, 64, 68] * 10, "plain"),  # 8 or more rows whose lengths differ by ~5%
])
def test_a_tie_goes_to_plain_decoding_where_rows_would_finish_together(on, lengths, winner):
    """Drafting must be 3% faster than plain decoding to be kept while the finished rows' lengths are alike: rows
    that advance at different paces leave a job's last rounds part-empty, a cost no epoch sees. Where their lengths
    differ (coefficient of variation >= 0.25 over >= 8 rows) the tail is ragged anyway and a tie goes to drafting.
    Noise-free simulated rounds, the rows' lengths told before the first verdict."""
    check = PayoffCheck()
    check.finished(lengths)
    check, _ = simulate(on, 1.0, noise=0.0, drift=0.0, check=check)
    assert check.winner == winner


def test_a_change_in_the_workload_is_found():
    """Drafting pays for 2,000 rounds, then loses (its rows stop matching): plain wins within ~40 epochs."""
    check, _ = simulate(1.5, 1.0, rounds=2000)
    assert check.winner == "drafting"
    before = check.rounds[0]
    check, _ = simulate(0.8, 1.0, rounds=1000, check=check)
    assert check.winner == "plain"
    assert check.rounds[0] - before >= 600  # most of the last 1,000 rounds ran without drafts


def test_schedule_warm_up_then_alternation_then_trials():
    """Epochs of 3 rounds drafting and 1 plain, drafting twice as fast, no noise, no prices: warm-up (on), on,
    off, on, then the verdict (a gap wider than `clear`: the loser next after max_interval = 4 epochs of the
    winner)."""
    check = PayoffCheck(drafting_rounds=3, plain_rounds=1, max_interval=4)
    arms = []
    while len(arms) < 3 * 11 + 3:
        arms.append(int(check.drafting))
        check.observe(10, 0.5 if check.drafting else 1.0)
    assert "".join(map(str, arms)) == "111" "111" "0" "111" "111111111111" "0" "1111111111111"
    assert check.summary() == {"rounds_drafting": 34, "rounds_plain": 2, "winner": "drafting", "ratio": pytest.approx(2.0)}


def test_a_narrow_verdict_is_confirmed_at_doubling_intervals():
    """Drafting 1.05x (below `clear`): the verdict comes with the second comparison (warm-up, on, off, on, off);
    the drafting epoch after it closes a third, which agrees, so the loser is next tried after 4 epochs of the
    winner, then, after the winner's epoch that closes that trial's comparison, 8."""
    check = PayoffCheck(drafting_rounds=1, plain_rounds=1, max_interval=8)
    arms = []
    for _ in range(30):
        arms.append(int(check.drafting))
        check.observe(105 if check.drafting else 100, 1.0)
    trials = [i for i, a in enumerate(arms) if a == 0 and i > 4]
    assert arms[:5] == [1, 1, 0, 1, 0]
    assert trials == [10, 20]


def test_rounds_below_full_occupancy_do_not_count():
    """A job's tail (fewer rows than the most seen) runs in the current arm and counts towards no epoch: slow
    tail rounds in plain epochs would otherwise hand drafting the verdict. Same schedule as above, with 5 rounds
    of 4 rows (10x slower per token) after every plain round: the arms and the verdict are unchanged."""
    check = PayoffCheck(drafting_rounds=3, plain_rounds=1, max_interval=4)
    arms = []
    while len(arms) < 3 * 11 + 3:
        arms.append(int(check.drafting))
        drafting = check.drafting
        check.observe(10, 0.5 if drafting else 1.0, rows=32)
        if not drafting:
            for _ in range(5):
                check.observe(1, 1.0, rows=4)
    assert "".join(map(str, arms)) == "111" "111" "0" "111" "111111111111" "0" "1111111111111"
    assert check.winner == "drafting" and check.ratio == pytest.approx(2.0)
    assert check.rounds == [2, 34 + 10]  # a plain epoch is one round here: its tail rounds ran in the next (drafting)


@pytest.mark.parametrize("verdict,ending,arms", [
    ("drafting", True, "0" + "1" * 6),  # the plain trial the tail fell in gives way to the verdict's arm
    ("drafting", False, "0" * 7),  # rows may still come (a dip between admissions): the trial goes on
    ("plain", True, "0" * 7),
    (None, True, "1" * 7),  # no verdict yet: drafting, the controller's choice
], ids=["drafting_tail", "drafting_no_tail", "plain_tail", "no_verdict_tail"])
def test_the_jobs_tail_runs_the_verdicts_arm(verdict, ending, arms):
    """A job's tail (nothing left to admit, fewer rows than the most seen) counts towards no epoch, so a trial
    of the loser that it falls in would run it to the end: its rounds run the verdict's arm instead."""
    check = PayoffCheck(drafting_rounds=3, plain_rounds=4)
    check._warm, check._full = True, 32
    if verdict is not None:
        check._winner = 1 if verdict == "drafting" else 0
    check._arm = 0 if verdict is not None else 1  # a plain epoch (a trial, or the verdict's), or drafting
    seen = []
    for _ in range(7):
        seen.append(str(int(check.drafting)))
        check.observe(10, 1.0, rows=16, ending=ending)
    assert "".join(seen) == arms


def test_the_first_rounds_set_full_occupancy():
    """Full is the most rows seen so far: a job smaller than the batch counts its rounds (5 rows of 8 slots)."""
    check = PayoffCheck(drafting_rounds=2, plain_rounds=1)
    for _ in range(7):
        check.observe(5, 1.0, rows=5)
    assert check.rounds == [1, 6] and check._compared == 1


ADMISSION_CASES = [
    # name, fills (slot, start, count), forward (tokens, seconds), admission seconds
    ("no prompt chunks", [], (32, 0.024), 0.0),
    ("a chunk of 96 in a forward of 128", [(3, 0, 96)], (128, 0.040), 0.030),
    ("two chunks", [(3, 0, 32), (5, 10, 32)], (96, 0.030), 0.020),
    ("the last chunk of a deciding row (slot 0): its first decision too", [(0, 0, 63)], (128, 0.040), 0.020),
    ("untimed forward (the static path)", [(3, 0, 32)], (64, 0.0), 0.0),
    ("no forward", [(3, 0, 32)], None, 0.0),
]


@pytest.mark.parametrize("name,fills,forward,expected", ADMISSION_CASES, ids=[c[0] for c in ADMISSION_CASES])
def test_admission_share_of_a_round(name, fills, forward, expected):
    """What the scheduler takes out of a round's time before the check sees it: the forward's seconds times
    the prompt chunks' share of its tokens."""
    import torch

    from batchspec.engine.round import Plan

    plan = Plan(rows=[0], rows_t=torch.tensor([0]), span=slice(0, 1), lengths=[5], lengths_t=torch.tensor([5]),
                running=[0], room=[0], limits=[0], fills=fills)
    assert plan.admission_seconds(forward) == pytest.approx(expected)


@pytest.mark.parametrize("drafting_rate,first_verdict_at,winner", [
    (0.6, 8 + 24 + 8 + 24, "plain"),  # unpriced rounds: the first plain epoch alone does not decide; the first
    #   comparison, wide, does
    (0.95, 8 + 24 + 8 + 24 + 8, "plain"),  # within `clear`: two comparisons first
    (1.5, 8 + 24 + 8 + 24, "drafting"),  # unpriced rounds: the first comparison, wide, decides
])
def test_a_short_warm_up_and_a_wide_first_comparison_decide_early(drafting_rate, first_verdict_at, winner):
    """With the machine's costs measured at start the warm-up is 8 rounds; a first comparison 15% or more apart
    gives the verdict (noise-free rounds, not priced by the books: the round at which the verdict first exists
    is exact)."""
    check = PayoffCheck(warmup_rounds=8)
    for r in range(1, 200):
        check.observe(32, 32 / (drafting_rate if check.drafting else 1.0))
        if check.winner is not None:
            break
    assert (r, check.winner) == (first_verdict_at, winner)
    assert check.rounds == {40: [8, 32], 72: [16, 56], 64: [8, 56]}[first_verdict_at]


@pytest.mark.parametrize("drafting_rate,books,first_verdict_at,winner", [
    (1.5, 1.0, 8 + 24, "drafting"),  # the books price plain rounds `clear` below the first drafting epoch
    (1.5, 1.4, 8 + 24 + 8 + 24, "drafting"),  # the books price them near drafting's rate: the clock decides
    (1.5, None, 8 + 24 + 8 + 24, "drafting"),  # rounds not priced: the clock decides
    (1.1, 1.0, 8 + 24 + 8 + 24 + 8, "drafting"),  # not clear: two comparisons
    (0.6, 1.0, 8 + 24 + 8, "plain"),  # a loser the books see: the first plain epoch
    (0.6, 0.58, 8 + 24 + 8 + 24, "plain"),  # the books price plain rounds below drafting's: the first comparison
    (1.5, 1.0, 8 + 24 + 8 + 24, "drafting admitting"),  # every round admits: the clock decides
])
def test_a_clear_win_needs_no_plain_epoch_to_start(drafting_rate, books, first_verdict_at, winner):
    """A first drafting epoch `clear` (1.15x) ahead of the cost model's price of the same rounds without drafts
    gives a provisional verdict at once, and the clock confirms it 2 drafting epochs later; a first plain epoch
    `clear` ahead of the drafting epoch before it gives the verdict plain where the books price that epoch's
    rounds without drafts faster than they ran (noise-free rounds: the rounds are exact). Not where the epoch's
    rounds admit (its clock loses admission's share by tokens, not by what the books price)."""
    admitting = winner.endswith(" admitting")
    winner = winner.split()[0]
    check = PayoffCheck(warmup_rounds=8)
    for r in range(1, 300):
        check.observe(32, 32 / (drafting_rate if check.drafting else 1.0),
                      plain=None if books is None else (32, 32 / books), admitting=admitting)
        if check.winner is not None:
            break
    assert (r, check.winner) == (first_verdict_at, winner)
    if r == 32:
        assert check.rounds == [0, 32] and check.ratio == pytest.approx(1.5)
        arms = []
        for _ in range(2 * 24 + 8 + 24 + 16 * 24 + 1):
            arms.append(check.drafting)
            check.observe(32, 32 / (drafting_rate if check.drafting else 1.0), plain=(32, 32.0))
        # the plain trial after 2 epochs; its comparison by the clock is wide: the next one after 16
        assert arms[:48] == [True] * 48 and arms[48:56] == [False] * 8
        assert arms[56: 56 + 24 + 16 * 24] == [True] * (24 + 16 * 24) and not arms[-1]


@pytest.mark.parametrize("exploring_rounds,warm_up", [(0, 8), (20, 21), (100, 48)])
def test_the_warm_up_waits_for_the_controller_to_learn_its_acceptance(exploring_rounds, warm_up):
    """While the controller explores (one draft on a few rows) its rounds are neither drafting nor plain: the
    8-round warm-up lasts until exploring ends (the first round that does not explore is its last), 48 at most."""
    check = PayoffCheck(warmup_rounds=8)
    for r in range(1, 200):
        check.observe(32, 1.0, learning=r <= exploring_rounds)
        if check._warm:
            break
    assert r == warm_up


# (name, the first rounds of each drafting / plain epoch that admit, drafting's rate in rounds that admit nothing
#  and in those that admit (as the proportional share left it), plain's the same, the verdict)
ADMITTING_CASES = [
    # A fifth of the drafting rounds admit and look 4x faster than they are: only the rest count, where drafting
    # runs 0.9x plain (Gemma-3 with ngram: drafting spreads admissions over the job, drafter none admits in waves).
    ("a few admitting rounds that look fast", (5, 0), (0.9, 4.0), (1.0, 1.0), "plain"),
    ("the same in plain epochs", (5, 2), (0.9, 4.0), (1.0, 4.0), "plain"),
    # Most rounds of every epoch admit (large batches, staggered lengths): all of them count.
    ("most rounds admit", (20, 6), (0.9, 1.3), (1.0, 1.0), "drafting"),
]


@pytest.mark.parametrize("name,admitting,drafting,plain,winner", ADMITTING_CASES, ids=[c[0] for c in ADMITTING_CASES])
def test_an_epoch_is_measured_over_its_rounds_that_admit_nothing_when_they_are_most(name, admitting, drafting, plain,
                                                                                       winner):
    """Rounds that admit are left out of an epoch's rate when they are fewer than half of it (noise-free rounds,
    8-round warm-up, epochs of 24 rounds drafting and 8 plain)."""
    check = PayoffCheck(warmup_rounds=8)
    for _ in range(8 + 4 * (24 + 8)):
        arm = int(check.drafting)
        admits = check._warm and check._round < admitting[1 - arm]
        rate = (drafting if arm else plain)[admits]
        check.observe(32, 32 / rate, rows=8, admitting=admits)
    assert check.winner == winner


def test_the_clock_replaces_a_provisional_verdict_of_the_books():
    """The books price plain rounds 1.6x slower than they run (start-up points measured without the LM head's work
    at every draft: Gemma-3, 2026-12-02): drafting at 0.9x plain looks 1.44x, a provisional verdict. The first
    plain epoch's comparison by the clock then replaces it (averaged with it, drafting would stay at 1.07x)."""
    check = PayoffCheck(warmup_rounds=8)
    for _ in range(8 + 3 * 24 + 8 + 24):
        check.observe(32, 32 / (0.9 if check.drafting else 1.0), plain=(32, 32 * 1.6))
    assert check.winner == "plain" and check.ratio == pytest.approx(0.9)
