"""Each row's number of drafts in a round is one list per stage, each set once: the scheduler's plan
(`Plan.limits`: the most each row may propose, 0 for the rows whose drafts cannot pay so that a lookup does
not propose for them) and the choice (`Round.budgets`, never above the plan). Drafters are asked for one of them
(`Choice.budgets`: the plan's limits for a lookup, which proposes first; the choice's for the others); a chain's
draft carries exactly the chosen counts; adaptive speculation learns each row's acceptance against the chosen
count."""

from __future__ import annotations

import pytest

import batchspec
from batchspec.engine.control.adaptive import AdaptiveK
from batchspec.engine.drafting import DraftStage
from batchspec.engine.types import RowParams

PROMPTS = ["def add(a, b):", "Hello world", "import os", "x = [1, 2, 3]", "for i in range(3):", "print('a')",
           "a = a + 1", "while True:"]


@pytest.mark.parametrize("drafter", ["ngram", "suffix", "model"])
def test_the_plan_then_the_choice_each_set_once(llama_pair, drafter, monkeypatch):
    real_hopeless, real_observe, real_run = AdaptiveK.hopeless, AdaptiveK.observe, DraftStage.run
    hopeless: list[dict[int, bool]] = []  # per call: slot -> the verdict the plan got
    rounds, asked, learnt = [], [], []

    def odd_slots_hopeless(self, slots, base_tokens, costs):
        # The controller's verdict, and every odd slot besides: rows the plan must not offer to the lookup.
        verdict = [h or slot % 2 == 1 for slot, h in zip(slots, real_hopeless(self, slots, base_tokens, costs))]
        hopeless.append(dict(zip(slots, verdict)))
        return verdict

    def draft_stage(self, plan):
        verdict = hopeless.pop() if hopeless else None  # this round's plan asked the controller (or nobody)
        assert not hopeless
        out = real_run(self, plan)
        rounds.append((plan, out, verdict))
        return out

    def observe(self, cost, slots, budgets, drafted, accepted, *judged):
        learnt.append((rounds[-1][1], list(slots), list(budgets)))
        return real_observe(self, cost, slots, budgets, drafted, accepted, *judged)

    monkeypatch.setattr(AdaptiveK, "hopeless", odd_slots_hopeless)
    monkeypatch.setattr(AdaptiveK, "observe", observe)
    monkeypatch.setattr(DraftStage, "run", draft_stage)
    models = batchspec.load_models(str(llama_pair.target), draft=str(llama_pair.draft) if drafter == "model" else None)
    generator = batchspec.build_generator(models, drafter=drafter, k=3, batch_size=4, max_new_tokens=24,
                                          adaptive=True)
    propose = generator.drafter.propose

    def recorded(plan, choice):
        asked.append((list(choice.budgets), list(plan.limits)))
        return propose(plan, choice)

    generator.drafter.propose = recorded
    requests = [batchspec.Request(str(i), p, params=RowParams(max_new_tokens=8 + 4 * (i % 3)))
                for i, p in enumerate(PROMPTS)]
    assert len(list(generator.run(requests))) == len(PROMPTS)

    assert rounds and learnt
    rounds = [(plan, after, verdict) for plan, after, verdict in rounds if plan.rows]  # not the prefill-only ones
    for plan, after, _ in rounds:
        assert after.plan is plan  # the plan is read, not rewritten
        assert all(0 <= k <= n for k, n in zip(after.budgets, plan.limits)), (after.budgets, plan.limits)
        if after.shape.tree is None and after.draft.host_num is not None:
            assert after.draft.host_num == after.budgets  # the draft carries the chosen counts, no other
    for round, slots, budgets in learnt:
        assert budgets == [round.budgets[round.plan.rows.index(slot)] for slot in slots]
    if drafter == "model":  # drafts on the device after the choice: asked the chosen counts; no plan verdicts
        assert all(verdict is None for _, _, verdict in rounds)
        assert [budgets for budgets, _ in asked] == [after.budgets for _, after, _ in rounds]
        return
    # A lookup proposes first: asked the plan's limits, which are 0 for every row the controller called hopeless
    # (and for every row in the payoff check's plain epochs, when the controller is not asked).
    assert len(asked) == len(rounds) and all(budgets == limits for budgets, limits in asked)
    zeroed = 0
    for before, _, verdict in rounds:
        for i in before.running:
            if verdict is None or verdict[before.rows[i]]:
                assert before.limits[i] == 0
                zeroed += verdict is not None and before.room[i] > 0
    assert zeroed > 0  # rows with room the plan kept from proposing



def test_the_plan_books_prompt_chunks_and_the_copies_they_make_due(llama_pair, monkeypatch):
    """Packed rounds bring prompts in by chunks (fill_tokens 5: most prompts take several rounds); a request's
    other samples copy its prompt cache once its last chunk is in. The plan names both: each chunk's slots (its
    own first, then the samples that copy it) and, in the round whose chunk completes a prompt (its end is the
    prompt's P - 1), each copy due from it (source, destination, P - 1 entries) to a slot among that chunk's;
    the verify pass carries them out without asking the scheduler. Every sample's output (coupled sampling, T =
    0.7: each token the target's own draw) is the one whole prompts in a round give (fill_tokens 1024)."""
    from tiny import PROMPTS as TINY_PROMPTS
    from batchspec.engine.verify_pass import PackedPass

    real_run, rounds = PackedPass.run, []

    def run(self, round):
        rounds.append(round.plan)
        return real_run(self, round)

    monkeypatch.setattr(PackedPass, "run", run)
    models = batchspec.load_models(str(llama_pair.target))
    outputs = {}
    for fill in (1024, 5):
        rounds.clear()
        generator = batchspec.build_generator(models, drafter="none", batch_size=6, max_new_tokens=16,
                                              fill_tokens=fill, temperature=0.7, seed=3)
        requests = [batchspec.Request(str(i), p, params=RowParams(n=3)) for i, p in enumerate(TINY_PROMPTS[:6])]
        outputs[fill] = sorted((r.id, r.sample_index, tuple(r.completion_token_ids)) for r in generator.run(requests))
    assert len(outputs[5]) == 18 and all(tokens for _, _, tokens in outputs[5])
    assert outputs[5] == outputs[1024]
    assert len({tokens for _, _, tokens in outputs[5]}) > 6  # the samples differ: each drew from its own copy
    copies = 0
    for r in rounds:
        assert len(r.fills) == len(r.fill_slots) and all(slots[0] == slot for (slot, _, _), slots in
                                                          zip(r.fills, r.fill_slots))
        chunks = {slot: (start + count, slots) for (slot, start, count), slots in zip(r.fills, r.fill_slots)}
        for src, dst, entries in r.copies:
            assert chunks[src][0] == entries and dst in chunks[src][1][1:]
            copies += 1
    assert copies > 0  # samples admitted together with the one that prefills (others prefill their own)
    assert sum(len(r.fills) > 0 and not r.rows for r in rounds) > 0  # rounds that only prefilled chunks


@pytest.mark.parametrize("module,name", [
    ("round", "Plan"), ("round", "Choice"), ("round", "Round"), ("round", "RoundShape"), ("round", "Draft"),
    ("round", "Verified"),
    ("verdict", "Verdict"), ("verdict", "RoundOutcome"), ("tree", "TreeVerdict"), ("postprocess", "Emitted"),
    ("admission", "Seated"), ("control.costs", "RoundCost"), ("intake", "Seat"), ("intake", "Admission"),
])
def test_the_records_a_round_hands_on_are_frozen(module, name):
    """Each stage builds its record once; the next only reads it (a list inside may grow while its builder
    builds it: Emitted.add)."""
    import dataclasses
    import importlib

    record = getattr(importlib.import_module(f"batchspec.engine.{module}"), name)
    assert dataclasses.is_dataclass(record) and record.__dataclass_params__.frozen
