"""The machine's costs known before the first round (engine/control/startup_costs.py), and the rule they allow from the
first round: a drafter whose drafts could not pay even if all were accepted drafts nothing (row_drafts.py)."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest

import batchspec
from batchspec.engine.control.costs import PackedCosts, RoundCost
from batchspec.engine.control.row_drafts import Prices, choose_drafts, pays_at_best
from batchspec.engine.control.startup_costs import StartupCosts, budget, cache_key, load_or_measure, token_counts
from conftest import MAX_NEW
from tiny import PROMPTS


@pytest.mark.parametrize("prices,rows,depth,steps,pays", [
    # a flat forward (a GPU's, or a CPU's below its compute bound): any draft that is kept pays
    (Prices(fixed=0.010, per_token=0.0), 8, 4, False, True),
    # a forward exactly proportional to its tokens, plus host work per draft: a draft costs more than it can emit
    (Prices(fixed=0.0, per_token=0.001, per_draft=0.0001), 8, 4, False, False),
    (Prices(fixed=0.0, per_token=0.001), 8, 4, False, False),  # no better, no worse: plain decoding wins ties
    # a draft model whose step costs as much as the target's forward over the batch: never pays
    (Prices(fixed=0.008, per_token=0.0005, per_step=0.012), 8, 4, True, False),
    # a cheap draft model: pays at perfect acceptance
    (Prices(fixed=0.008, per_token=0.0005, per_step=0.001), 8, 4, True, True),
    (Prices(fixed=0.008, per_token=0.0005, per_step=0.001), 8, 0, True, False),  # nothing may be drafted
])
def test_pays_at_best(prices, rows, depth, steps, pays):
    assert pays_at_best(prices, rows, base_tokens=rows, depth=depth, steps=steps) is pays


@pytest.mark.parametrize("batch_size,k_max,sizes", [
    # plain, every row at k_max, one draft a row, one draft in all; then past plain and below it in turn, each
    # coarse to fine in log N (past plain: 12 halves 9..16, 20 is the widest gap left in 16..24, then 14 ...;
    # below: 1, then 3 between 1 and 8, then 5 ...)
    (8, 2, [8, 24, 16, 9, 12, 1, 20, 3, 14, 5, 10, 2, 18, 4, 11, 6, 22, 7, 13, 15, 17, 19, 21, 23]),
    (4, 3, [4, 16, 8, 5, 11, 1, 6, 2, 13, 3, 7, 9, 10, 12, 14, 15]),
    (1, 1, [1, 2]),  # one draft is the full width; no round has fewer rows
])
def test_token_counts_time_plain_full_one_draft_then_the_curve_coarse_to_fine(batch_size, k_max, sizes):
    assert token_counts(batch_size, k_max) == sizes


def test_token_counts_cover_the_curve_with_a_budget_cut_short():
    """At batch 64 (55 sizes) the first 16 span 64 .. 320 with no gap over 1.3x, and below plain 1 .. 40 (a
    budget of a few forwards prices a full batch's drafts and a job's tail)."""
    sizes = token_counts(64, 4)
    above = list(range(66, 81)) + list(range(84, 129, 4)) + list(range(144, 321, 16))
    assert sorted(sizes) == list(range(1, 9)) + [16, 24, 32, 40, 48, 56, 64, 65] + sorted(set(above) | {128})
    past = sorted(n for n in sizes[:16] if n >= 64)
    assert past[0] == 64 and past[-1] == 320 and max(b / a for a, b in zip(past, past[1:])) <= 1.3
    assert sorted(n for n in sizes[:16] if n < 64) == [1, 3, 5, 8, 24, 40]


@pytest.mark.parametrize("plain_seconds,batch_size,seconds", [
    (0.032, 64, 0.64),  # p512 at batch 64: 1,000 rounds of 32 ms, 2% of them
    (0.010, 8, 1.6),  # p512 at batch 8: 8,000 rounds of 10 ms
    (0.005, 1, 5.0),  # capped: 64,000 rounds of 5 ms would allow 6.4 s
    (0.0005, 64, 0.5),  # at least half a second (a small model's whole curve)
])
def test_the_budget_is_a_share_of_a_thousand_row_job(plain_seconds, batch_size, seconds):
    assert budget(plain_seconds, batch_size) == pytest.approx(seconds)


@pytest.mark.parametrize("budget_s,passes", [
    (1e9, [3] * 16),  # room for every pass: each size timed PASSES times
    (0.0, [1] * 4),  # none: the first four sizes, once each
    (0.033, [1] * 16),  # 2 ms a forward: the untimed one and plain (4 ms), 15 more to 34 ms, a pass
    (0.041, [2] * 4 + [1] * 12),  # a second pass cut short after 4 sizes (42 ms): a prefix of the sizes twice
])
def test_the_target_is_timed_in_passes_within_the_budget(monkeypatch, budget_s, passes):
    """measure() times each size once a pass (one untimed forward first) and takes the median of its passes; the
    drafting forward's two points and its feeding points come before the passes (REPEATS each), whatever the budget. A fake clock: a
    forward of n tokens takes 2 ms and reads n ms times 1.0, 1.1, 1.2 on its first, second and third pass."""
    from batchspec.engine.control import startup_costs

    clock, calls, steps = [0.0], [], []

    def forward(runner, rows, tokens, *, repeats, warm=True):
        assert (rows, repeats, warm) == (4, 1, False)
        clock[0] += 0.002
        calls.append(tokens)
        return tokens * 1e-3 * (1 + 0.1 * (calls.count(tokens) - 1 - (tokens == 16)))  # 16: the untimed too

    def step(rows, repeats, tokens=None):
        steps.append((rows, repeats, tokens))
        return (tokens or rows) * 1e-4

    monkeypatch.setattr(startup_costs, "time_packed", forward)
    monkeypatch.setattr(startup_costs, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: clock[0])}))
    costs = startup_costs.measure(None, step, batch_size=4, k_max=3, budget_s=budget_s)
    sizes = token_counts(4, 3)
    assert calls[0] == 16 and [calls[1:].count(n) for n in sizes[:len(passes)]] == passes
    assert [n for n, _ in costs.verify] == sizes[:len(passes)]
    medians = {1: 1.0, 2: 1.05, 3: 1.1}  # of the times 1.0, 1.1, 1.2 of its passes
    assert [t for _, t in costs.verify] == pytest.approx([n * 1e-3 * medians[p] for n, p in zip(sizes, passes)])
    assert steps[:2] == [(4, startup_costs.REPEATS, None), (1, startup_costs.REPEATS, None)]
    assert [n for n, _ in costs.step] == [4, 1] and [t for _, t in costs.step] == pytest.approx([4e-4, 1e-4])
    # Then the feeding points: the batch's rows and FEED_TOKENS more, priced over the batch's plain drafting forward.
    assert steps[2:] == [(4, startup_costs.REPEATS, 4 + n) for n in startup_costs.FEED_TOKENS]
    assert [n for n, _ in costs.feed] == list(startup_costs.FEED_TOKENS)
    assert [t for _, t in costs.feed] == pytest.approx([n * 1e-4 for n in startup_costs.FEED_TOKENS])


# The forward of a 512-wide 8-layer Llama at batch 8 on 2 CPU cores (2026-12-05), seconds by N in token_counts'
# order (plain first): below plain the medians of a job's rounds (ngram at T = 0.7, 32 rows), at and above it the
# points measured at start scaled to the job's level (x1.21). Below plain it is no line: 2 tokens 5.8 ms, 3 tokens
# 7.8, 4 tokens 7.2, 8 tokens 12.2.
ABOVE = tuple((n, 1.21 * t) for n, t in ((8, 0.01008), (40, 0.02059), (16, 0.01366), (9, 0.01043), (10, 0.01143),
                                         (12, 0.0130), (20, 0.01774), (24, 0.01844), (32, 0.02083), (36, 0.02274)))
P512 = ABOVE + ((2, 0.00584), (3, 0.00779), (4, 0.00720), (5, 0.00926), (6, 0.01175), (7, 0.01269))


def _prices(points):
    costs = PackedCosts()
    costs.start_from(StartupCosts(points, ()))
    return costs


@pytest.mark.parametrize("name,points,alpha,rows,drafts", [
    # a 2-row round (a job's tail): the line above plain priced its first draft 0.4 ms, the curve 2 ms
    ("tail, measured below plain: 0.2 does not pay", P512, 0.2, 2, [0, 0]),
    ("tail, the line's extrapolation: 0.2 looked paying", ABOVE, 0.2, 2, [1, 1]),
    ("tail, measured below plain: 0.9 pays", P512, 0.9, 2, [1, 1]),
    ("a full batch: the same choice either way", P512, 0.2, 8, None),
    ("a full batch at 0.9", P512, 0.9, 8, None),
])
def test_rounds_of_fewer_rows_than_the_batch_price_drafts_by_their_own_forwards(name, points, alpha, rows, drafts):
    """The start-up points below the batch's plain N price a part-empty round's drafts (ngram at T = 0.7 on a
    held-out pair drafted in the job's tail at acceptance 0.2 where a 2-row forward's next token cost 1.1 ms,
    2026-12-05); the verify line is fitted on plain and the larger N only, and a full round's choice is as it was."""
    from batchspec.engine.control.row_drafts import choose_drafts

    gains = [[alpha]] * rows
    chosen = choose_drafts(gains, rows, _prices(points).prices(), steps=False)[0]
    if drafts is None:
        assert chosen == choose_drafts(gains, rows, _prices(ABOVE).prices(), steps=False)[0]
    else:
        assert chosen == drafts
    assert _prices(P512).verify.anchor == _prices(ABOVE).verify.anchor
    assert _prices(P512).level == _prices(ABOVE).level == [ABOVE[0][1]] * 2


def test_costs_are_cached_by_what_they_depend_on(tmp_path):
    calls = []

    def measure():
        calls.append(1)
        return StartupCosts(((8, 0.1), (40, 0.3)), ((8, 0.01),), seconds=0.5)

    key = {"target": "abc", "batch_size": 8}
    first = load_or_measure(key, measure, tmp_path)
    again = load_or_measure(key, measure, tmp_path)
    other = load_or_measure({**key, "batch_size": 16}, measure, tmp_path)
    assert len(calls) == 2 and not first.cached and again.cached and not other.cached
    assert again.verify == first.verify and again.step == first.step and again.seconds == 0.0
    stored = [json.loads(p.read_text()) for p in (tmp_path / "costs").glob("*.json")]
    assert sorted(s["key"]["batch_size"] for s in stored) == [8, 16]
    assert not list((tmp_path / "costs").glob("*.tmp"))  # written by a rename


def test_a_disturbed_measurement_is_used_but_not_cached(tmp_path):
    noisy = StartupCosts(((8, 0.3), (40, 0.1)), (), seconds=0.5, quiet=False)
    assert load_or_measure({"k": 1}, lambda: noisy, tmp_path) is noisy
    assert not (tmp_path / "costs").exists() or not list((tmp_path / "costs").glob("*.json"))


def test_an_unreadable_cache_is_measured_around(tmp_path):
    key = {"k": 2}
    load_or_measure(key, lambda: StartupCosts(((8, 0.1),), ()), tmp_path)
    for path in (tmp_path / "costs").glob("*.json"):
        path.write_text("{not json")
    costs = load_or_measure(key, lambda: StartupCosts(((8, 0.2),), ()), tmp_path)
    assert costs.verify == ((8, 0.2),) and not costs.cached


def test_the_cost_model_starts_from_the_points():
    costs = PackedCosts()
    assert not costs.known
    costs.start_from(StartupCosts(((8, 0.010), (40, 0.026), (16, 0.014)), ((8, 0.004), (2, 0.001))))
    assert costs.known
    prices = costs.prices()
    assert prices.per_token == pytest.approx(0.0005, rel=1e-6) and prices.fixed == pytest.approx(0.006, rel=1e-6)


def test_the_cost_model_prices_the_forward_by_its_measured_curve_at_the_rounds_level():
    """Four or more sizes measured: the forward is priced by their curve (the line's slope only past its ends),
    scaled by the rounds' forwards against it; three or fewer: a line, as before."""
    points = ((8, 0.045), (24, 0.076), (16, 0.064), (9, 0.052), (12, 0.0595))
    costs = PackedCosts()
    costs.start_from(StartupCosts(points, ()))
    assert costs.curve == tuple(sorted(points))
    prices = costs.prices()
    assert prices.forward(9) == pytest.approx(0.052) and prices.forward(10) == pytest.approx(0.052 + 0.0075 / 3)
    for _ in range(200):  # the job's forwards run 1.5x the start's (longer rows, a slower machine)
        costs.observe(RoundCost(shape=1, rows=8, seconds=0.1, drafts=1, tokens=9, verify_s=1.5 * 0.052))
    assert costs.prices().forward(9) == pytest.approx(1.5 * 0.052, rel=1e-3)
    assert costs.prices().forward(16) == pytest.approx(1.5 * 0.064, rel=1e-3)
    few = PackedCosts()
    few.start_from(StartupCosts(points[:3], ()))
    assert few.curve == () and few.prices().curve == ()


PLAIN_CURVE = ((8, 0.0120), (9, 0.0120), (16, 0.0160), (24, 0.0200))  # 8 -> 9 free at start, as measured


def rounds_over_their_price(costs: PackedCosts, drafts: int, over: float, count: int, exploring: bool = False):
    """`count` rounds of 8 rows (lookups: no drafting forwards), each `over` seconds more than the prices say."""
    for _ in range(count):
        verify_s = costs.prices(per_round=False).forward(8 + drafts)
        price = costs.prices(per_round=False).seconds(8 + drafts, 0, drafts)
        costs.observe(RoundCost(shape=min(drafts, 1), rows=8, seconds=price + over, drafts=drafts, tokens=8 + drafts,
                                verify_s=verify_s, exploring=exploring))


@pytest.mark.parametrize("case,few_rounds,few_over,exploring,per_round", [
    ("before any round with a few drafts", 0, 0.0005, False, 0.0),
    ("two such rounds: not yet", 2, 0.0005, False, 0.0),
    ("three: the excess over plain rounds'", 3, 0.0005, False, 0.0005),
    ("rounds as cheap as priced", 12, 0.0, False, 0.0),
    ("cheaper than priced: never below 0", 12, -0.0003, False, 0.0),
    ("exploring rounds teach nothing", 12, 0.0005, True, 0.0),
])
def test_a_round_with_drafts_pays_what_its_few_draft_rounds_cost_over_their_price(case, few_rounds, few_over,
                                                                                 exploring, per_round):
    """Rounds with fewer drafts than a quarter of their rows (one lookup draft on 8 rows) teach what a round pays
    for drafting at all: their seconds over their price, less plain rounds' (here 0.1 ms over theirs, the prices'
    common error), once 3 are seen."""
    costs = PackedCosts()
    costs.start_from(StartupCosts(PLAIN_CURVE, ()))
    rounds_over_their_price(costs, 0, 0.0001, 20)
    rounds_over_their_price(costs, 1, 0.0001 + few_over, few_rounds, exploring)
    assert costs.per_round == pytest.approx(per_round, abs=1e-9), case
    prices = costs.prices()
    assert prices.per_round == pytest.approx(per_round, abs=1e-9)
    assert prices.seconds(9, 0, 1) - prices.seconds(8, 0, 0) == pytest.approx(
        costs.prices(per_round=False).seconds(9, 0, 1) - prices.seconds(8, 0, 0) + per_round, abs=1e-9)


def test_rounds_with_many_drafts_teach_the_rest_net_of_the_per_round_price():
    """Once a round's drafting price is known, rounds with many drafts (8 on 8 rows) teach the rest of a round its
    price per draft without it: 0.5 ms a round and 0.1 ms a draft are read apart, not 0.16 ms a draft."""
    costs = PackedCosts()
    costs.start_from(StartupCosts(PLAIN_CURVE, ()))
    rounds_over_their_price(costs, 0, 0.0, 20)
    rounds_over_their_price(costs, 1, 0.0005, 6)
    assert costs.per_round == pytest.approx(0.0005, abs=1e-9)
    rest_s = costs.rest.fit()[0]
    for _ in range(40):
        costs.observe(RoundCost(shape=1, rows=8, seconds=0.0160 + rest_s + 0.0005 + 8 * 0.0001, drafts=8, tokens=16,
                                verify_s=0.0160))
    assert costs.rest.fit()[1] == pytest.approx(0.0001, rel=1e-3)
    assert costs.per_round == pytest.approx(0.0005, abs=1e-9)


def test_rounds_with_drafting_forwards_teach_no_per_round_price():
    """A draft model's few-draft rounds (one draft on 8 rows) whose drafting forward fed 12 tokens the row's draft
    cache lacked, 5 ms where the step line prices 1 ms: that is the row's catch-up, which exploration prices apart
    (Prices.per_fed), not what a round pays for drafting at all; such rounds leave per_round at 0."""
    costs = PackedCosts()
    costs.start_from(StartupCosts(PLAIN_CURVE, ((1, 0.0010), (8, 0.0017))))
    rounds_over_their_price(costs, 0, 0.0, 20)
    for _ in range(6):
        verify_s = costs.prices(per_round=False).forward(9)
        costs.observe(RoundCost(shape=1, rows=8, seconds=verify_s + 0.005 + 0.001, drafts=1, tokens=9,
                                verify_s=verify_s, steps=((12, 0.005),)))
    assert costs.excess.n == 0 and costs.per_round == 0.0 and costs.prices().per_round == 0.0


@pytest.mark.parametrize("per_round,drafts", [(0.0, [1] + [0] * 7), (0.0005, [0] * 8)])
def test_a_lone_draft_pays_for_the_round_it_drafts_in(per_round, drafts):
    """One row at acceptance 0.3 on 8 (its draft adds 0.3 of a token to 8): free at 8 -> 9 tokens it is taken;
    at 0.5 ms for drafting at all (4% of a 12 ms round, more than the 0.3 / 8 it gains) it is not."""
    prices = Prices(0.0, 0.0005, curve=PLAIN_CURVE, per_round=per_round)
    assert choose_drafts([[0.3]] + [[0.0]] * 7, 8, prices, False)[0] == drafts


def test_a_generator_measures_once_and_a_second_reads_the_cache(llama_pair, caplog, monkeypatch, tmp_path):
    """The first run() of an adaptive generator on packed rounds measures (in the tests' own cache folder); a
    generator built again for the same model, batch size, k and drafter reads the points back; the output is
    drafter none's either way. (The suite's other worker shares the cores: its measurement is taken as quiet
    here, or it would not be cached.)"""
    from batchspec.engine.control import startup_costs

    monkeypatch.setenv("BATCHSPEC_CACHE", str(tmp_path))  # a cache of its own: other tests use the same pair
    measure = startup_costs.measure
    monkeypatch.setattr(startup_costs, "measure",
                        lambda *a, **k: dataclasses.replace(measure(*a, **k), quiet=True))
    models = batchspec.load_models(str(llama_pair.target), str(llama_pair.draft))
    requests = lambda: [batchspec.Request(id=str(i), prompt=p) for i, p in enumerate(PROMPTS[:6])]  # noqa: E731
    outputs = []
    with caplog.at_level(logging.INFO, logger="batchspec"):
        for _ in range(2):
            generator = batchspec.build_generator(models, drafter="model", k=3, batch_size=4, max_new_tokens=MAX_NEW,
                                                  adaptive=True)
            outputs.append({r.id: r.completion_token_ids for r in generator.run(requests())})
            assert generator.startup is not None and [n for n, _ in generator.startup.verify] == token_counts(4, 3)
            assert [n for n, _ in generator.startup.step] == [4, 1]
    assert outputs[0] == outputs[1] == {str(i): ref for i, ref in enumerate(llama_pair.reference[:6])}
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("costs:")]
    assert len(lines) == 2 and "measured in" in lines[0] and "from the cache" in lines[1]


def test_the_key_names_the_drafter_and_its_model(llama_pair):
    models = batchspec.load_models(str(llama_pair.target), str(llama_pair.draft))
    model_gen = batchspec.build_generator(models, drafter="model", k=3, batch_size=4)
    lookups = [batchspec.build_generator(models, drafter=d, k=3, batch_size=4) for d in ("ngram", "prompt_lookup", "suffix")]
    keys = [cache_key(models.target, g.drafter, batch_size=4, k_max=3, device=models.target.device)
            for g in (model_gen, *lookups)]
    assert keys[0]["drafter"] == "ModelDrafter" and keys[0]["draft"] is not None
    assert keys[1]["draft"] is None and keys[0]["target"] == keys[1]["target"]
    assert keys[1] == keys[2] == keys[3]  # no forwards of their own: the lookups measure the target once


@pytest.mark.parametrize("rows,tokens", [(4, 4), (4, 16), (2, 10), (4, 9), (4, 7)])
def test_the_timed_forward_computes_logits_at_every_token_as_a_verify_does(llama_pair, monkeypatch, rows, tokens):
    """A verify needs the target's logits at every draft's position, so the timed forward of `tokens` tokens
    computes them at every token: with one row's logits a model whose LM head is a large share of a token's work
    (Gemma-3-270M's 262,144-token head) had its drafts priced several times too cheap."""
    from batchspec.engine.control import startup_costs

    generator = batchspec.build_generator(batchspec.load_models(str(llama_pair.target), None), drafter="ngram", k=4,
                                          batch_size=4, adaptive=True)
    runner, shapes = generator.runner, []
    forward = runner.forward_packed
    monkeypatch.setattr(runner, "forward_packed", lambda ids, batch, *a: shapes.append(
        tuple(forward(ids, batch, *a).shape)) or None)
    startup_costs.time_packed(runner, rows, tokens, repeats=1)
    vocab = runner.model.get_output_embeddings().weight.shape[0]
    assert shapes == [(tokens, vocab)] * 2  # the untimed forward and the timed one


def test_the_key_names_the_products_the_linears_run(llama_pair):
    """Points timed under one choice of BLAS product (few_rows.py) price another forward under another: a change of
    choice is a new key, for the target's linears and the draft model's."""
    from batchspec.engine.model.few_rows import BLOCKED, CHOICE, LEFT

    models = batchspec.load_models(str(llama_pair.target), str(llama_pair.draft))
    generator = batchspec.build_generator(models, drafter="model", k=3, batch_size=4)
    key = lambda: cache_key(models.target, generator.drafter, batch_size=4, k_max=3,  # noqa: E731
                            device=models.target.device)
    first = key()
    assert first["linears"][0] is not None and first["linears"][1] is not None
    for model, index in ((models.target, 0), (generator.drafter.runner.model, 1)):
        before = getattr(model, CHOICE)
        flip = lambda chosen: {b: LEFT for b in (1, 2, 3) if b not in chosen} | {12: BLOCKED}  # noqa: E731
        setattr(model, CHOICE, {shape: flip(chosen) for shape, chosen in before.items()})
        assert key()["linears"][index] != first["linears"][index] and key()["linears"][1 - index] == first["linears"][1 - index]
        setattr(model, CHOICE, before)
    assert key() == first
