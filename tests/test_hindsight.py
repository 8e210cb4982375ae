"""A lookup's proposals judged by the tokens its rows go on to emit (engine/control/hindsight.py): what is open,
what is judged and with what count, and that the acceptance model counts a judged proposal as a round that had
verified it whole would. Exact: the judging is bookkeeping over token lists."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from batchspec.engine.control.acceptance_model import AcceptanceModel
from batchspec.engine.control.adaptive import LOOKUP, AdaptiveK
from batchspec.engine.control.hindsight import Hindsight, Judged
from batchspec.engine.types import TreeSpec

# One row (slot 3) over rounds: (proposal, drafts verified, drafts kept, tokens emitted) per round, then the drafts
# judged after each round as (position, kept).
T, F = True, False
CASES = {
    "nothing drafted, the next token refutes it": (
        [([5, 6], 0, 0, [4])], [[(1, F)]]),
    "nothing drafted, matched over three rounds, then refuted": (
        [([5, 6, 7, 8], 0, 0, [5]), (None, 0, 0, [6]), (None, 0, 0, [7]), (None, 0, 0, [9])],
        [[(1, T)], [(2, T)], [(3, T)], [(4, F)]]),
    "one of four verified and kept: the bonus token judges the second": (
        [([5, 6, 7, 8], 1, 1, [5, 6]), (None, 0, 0, [1])], [[(2, T)], [(3, F)]]),
    "the tail kept whole inside one round's tokens": (
        [([5, 6, 7], 0, 0, [5]), ([6, 7], 2, 2, [6, 7, 2])], [[(1, T)], [(2, T), (3, T)]]),
    "a verified draft refused: the verify pass judged it all": (
        [([5, 6, 7], 2, 1, [5, 9])], [[]]),
    "the whole proposal verified and kept": (
        [([5, 6], 2, 2, [5, 6, 1])], [[]]),
    "no proposal": (
        [([], 0, 0, [5])], [[]]),
    "a proposal made while one is open is followed too": (
        [([5, 6, 7], 0, 0, [5]), ([6, 7, 8], 0, 0, [6]), (None, 0, 0, [7]), (None, 0, 0, [1])],
        [[(1, T)], [(2, T), (1, T)], [(3, T), (2, T)], [(3, F)]]),
}


@pytest.mark.parametrize("rounds,judged", CASES.values(), ids=CASES.keys())
def test_each_unverified_draft_is_judged_when_its_token_comes(rounds, judged):
    hindsight = Hindsight()
    for (proposal, drafted, kept, tokens), want in zip(rounds, judged):
        got = hindsight.follow([3], [proposal], [drafted], [kept], [tokens], {3: 0.4})
        assert got == [Judged(3, position, ok, 0.4) for position, ok in want]
    assert not hindsight.open


def test_rows_are_followed_apart_and_a_new_request_forgets_its_slot():
    hindsight = Hindsight()
    got = hindsight.follow([0, 1], [[5, 6], [7, 8]], [0, 0], [0, 0], [[5], [1]], {})
    assert got == [Judged(0, 1, True), Judged(1, 1, False)] and list(hindsight.open) == [0]
    hindsight.forget(0)
    assert hindsight.follow([0], [None], [0], [0], [[6]], {}) == [] and not hindsight.open


def judged_model(m: int, n: int) -> AcceptanceModel:
    """A bursty model that saw a proposal of n drafts, none verified, whose first m the row's tokens kept."""
    model = AcceptanceModel(k_max=4, bursty=True, pooled_decay=1.0)
    hindsight, proposal = Hindsight(), list(range(10, 10 + n))
    tokens = proposal[:m] + [99] + [98] * n
    for i, token in enumerate(tokens[:n + 1]):
        model.learn(0, [2], [0], [0], [0], hindsight.follow([2], [proposal if i == 0 else None], [0], [0], [[token]], {}))
    return model


def verified_model(m: int, n: int) -> AcceptanceModel:
    """The same proposal verified whole in one round."""
    model = AcceptanceModel(k_max=4, bursty=True, pooled_decay=1.0)
    model.learn(n, [2], [n], [n], [m])
    return model


@pytest.mark.parametrize("kept,proposed", [(0, 1), (0, 4), (1, 4), (3, 4), (4, 4), (2, 2)])
def test_a_judged_proposal_counts_as_one_verified_whole(kept, proposed):
    judged, verified = judged_model(kept, proposed), verified_model(kept, proposed)
    assert asdict(judged.rows[2]) == asdict(verified.rows[2])
    assert asdict(judged.pooled) == asdict(verified.pooled)
    assert [asdict(c) for c in judged.continued] == [asdict(c) for c in verified.continued]
    assert (judged.evidence, judged.first_kept, judged.evidence_rounds) == (
        verified.evidence, verified.first_kept, verified.evidence_rounds)


def test_the_controller_learns_from_proposals_it_did_not_draft():
    """Rows past their first rounds propose 4 drafts and draft none; row 0's next tokens keep 3 of them, row 1's
    refute its first. The books then hold evidence of first drafts the job never verified, counted in the round
    whose token judged them (no decay here: pooled_decay 1)."""
    adaptive = AdaptiveK(4, policy=LOOKUP, pooled_decay=1.0)
    slots = [0, 1]
    for slot in slots:
        adaptive.admit(slot)
    for _ in range(6):  # past YOUNG_ROUNDS
        adaptive.learn(0, slots, [0, 0], [0, 0], [0, 0])
    model = adaptive.acceptance
    assert model.evidence == 0
    adaptive.learn(0, slots, [0, 0], [0, 0], [0, 0], [[5, 6, 7, 8], [9, 9, 9, 9]], [[5], [1]])
    assert (model.evidence, model.first_kept, model.evidence_rounds) == (2, 1, 1)
    for token in (6, 7, 0):
        adaptive.learn(0, slots, [0, 0], [0, 0], [0, 0], [None, None], [[token], [2]])
    assert (model.evidence, model.first_kept, model.evidence_rounds) == (2, 1, 1)
    assert [(c.accepted, c.rejections) for c in model.continued[2:]] == [(2.0, 1.0), (2.0, 1.0), (1.0, 2.0)]
    assert model.rows[0].accepted == 1.0 and model.rows[1].rejections == 1.0


def past_young(adaptive: AdaptiveK, slots: list[int]) -> AdaptiveK:
    for slot in slots:
        adaptive.admit(slot)
    for _ in range(6):  # past YOUNG_ROUNDS
        adaptive.learn(0, slots, [0] * len(slots), [0] * len(slots), [0] * len(slots))
    return adaptive


def test_a_tree_or_grammar_round_continues_the_open_proposals():
    """A round that follows no new proposal (a tree round, shape k_max + 1; or a grammar's, proposed None) still
    emits the rows' tokens: the open proposal is judged against them, not against the next chain round's."""
    adaptive = past_young(AdaptiveK(4, policy=LOOKUP, pooled_decay=1.0, trees=(TreeSpec(2, 2),)), [0])
    judged: list = []
    real = adaptive.acceptance.learn
    adaptive.acceptance.learn = lambda *args: (judged.extend(args[5]), real(*args))
    adaptive.learn(0, [0], [0], [0], [0], [[5, 6, 7, 8]], [[5]])
    adaptive.learn(5, [0], [2], [2], [1], None, [[6, 7]])  # a tree round: two tokens
    adaptive.learn(0, [0], [0], [0], [0], [None], [[8]])
    assert judged == [Judged(0, 1, True), Judged(0, 2, True), Judged(0, 3, True), Judged(0, 4, True)]


def test_a_round_without_a_chain_ages_the_jobs_counts_once():
    """The job-wide counts decay once a round, in rounds that verify nothing too (pooled_decay 0.99): a first
    draft judged in a plain round leaves the pooled counts where a round that verified it would."""
    judged, verified = past_young(AdaptiveK(4, policy=LOOKUP), [0]), past_young(AdaptiveK(4, policy=LOOKUP), [0])
    judged.learn(0, [0], [0], [0], [0], [[5]], [[5]])
    verified.learn(1, [0], [1], [1], [1], [[5]], [[5, 9]])
    assert asdict(judged.acceptance.pooled) == pytest.approx(asdict(verified.acceptance.pooled))
    assert judged.acceptance.pooled.accepted == pytest.approx(1.0 * 0.99 + 1.0)


def test_a_round_counts_once_in_the_evidence_whoever_judged_its_first_drafts():
    """Row 0's first draft verified, row 1's judged in hindsight, in one round: 2 first drafts, 1 round."""
    adaptive = past_young(AdaptiveK(4, policy=LOOKUP), [0, 1])
    adaptive.learn(1, [0, 1], [1, 0], [1, 0], [1, 0], [[5], [7, 8]], [[5, 6], [7]])
    assert (adaptive.acceptance.evidence, adaptive.acceptance.evidence_rounds) == (2, 1)


def test_a_young_rows_proposals_are_not_followed():
    adaptive = AdaptiveK(4, policy=LOOKUP)
    adaptive.admit(0)
    adaptive.learn(0, [0], [0], [0], [0], [[5, 6]], [[1]])
    assert adaptive.acceptance.evidence == 0 and not adaptive.hindsight.open


@pytest.mark.parametrize("drafter", ["ngram", "suffix"])
def test_a_job_judges_the_proposals_it_did_not_verify(llama_pair, drafting_priced_cheap, monkeypatch, drafter):
    """A whole job (tiny Llama, lookups adaptive, 4 proposals a row at most, batch 4): the acceptance model is
    handed drafts the verify pass did not judge, each within its proposal, and the
    greedy outputs are drafter none's token for token (hindsight changes choices, never tokens)."""
    import batchspec

    judged: list[Judged] = []
    real = AcceptanceModel.learn

    def spy(self, k, slots, budgets, drafted, accepted, proposals=()):
        judged.extend(proposals)
        return real(self, k, slots, budgets, drafted, accepted, proposals)

    monkeypatch.setattr(AcceptanceModel, "learn", spy)
    prompts = ["the cat sat on the mat and the cat sat on the mat and the", "one two three one two three one two",
               "a b a b a b a b a b", "red green blue red green blue red", "x y z x y z x y z x"] * 2
    models = batchspec.load_models(str(llama_pair.target))
    outputs = {}
    for name in ("none", drafter):
        generator = batchspec.build_generator(models, drafter=name, k=4, batch_size=4, max_new_tokens=24,
                                              adaptive=name != "none")
        results = generator.run([batchspec.Request(str(i), p) for i, p in enumerate(prompts)])
        outputs[name] = {r.id: r.completion_token_ids for r in results}
    assert outputs[drafter] == outputs["none"]
    assert judged and all(1 <= j.position <= 4 for j in judged)
