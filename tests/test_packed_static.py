"""The static path's packed verify (engine/model/packed_static.py): each running row computes only its own tokens,
idle slots none, padding at most the rounding to a token bucket; exact against `generate` and against the
unpacked static verify (every slot the round's width), which stays for comparisons."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

import batchspec
from batchspec.engine.model.graphs import StepGraphs
from batchspec.engine.model.packed_static import host_layout
from batchspec.engine.model.runner import ModelRunner
from batchspec.engine.tree import tree_shape
from batchspec.engine.model.shapes import token_buckets
from conftest import MAX_NEW
from tiny import PROMPTS


@pytest.mark.parametrize("widths,width,n,layout,table", [
    # slot 0 verifies 2 tokens, slot 1 is idle, slot 2 one token; the bucket pads one token into the scratch slot 3
    ([2, 0, 1], 3, 4, [[0, 0, 2, 3], [0, 1, 0, 0]], [[0, 1, 1], [0, 0, 0], [2, 2, 2]]),
    ([1, 1], 1, 2, [[0, 1], [0, 0]], [[0], [1]]),
    ([3, 2], 3, 5, [[0, 0, 0, 1, 1], [0, 1, 2, 0, 1]], [[0, 1, 2], [3, 4, 4]]),
    ([0, 0, 4], 4, 4, [[2, 2, 2, 2], [0, 1, 2, 3]], [[0, 0, 0, 0], [0, 0, 0, 0], [0, 1, 2, 3]]),
])
def test_host_layout(widths, width, n, layout, table):
    got_layout, got_table = host_layout(widths, width, n, scratch=len(widths))
    assert got_layout == layout and got_table == table


@pytest.mark.parametrize("slots,width,buckets", [
    (1, 5, [1, 2, 3, 4, 5]),
    (8, 2, [1, 2, 4, 8, 12, 16]),
    (3, 2, [1, 2, 3, 4, 5, 6]),
    (64, 1, [1, 2, 4, 8, 16, 32, 64]),
    (64, 3, [1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192]),
])
def test_token_buckets(slots, width, buckets):
    assert token_buckets(slots, width) == buckets


def test_a_packed_static_tree_verify_gives_each_node_its_paths_logits(pair):
    """One packed static tree verify over four slots: slot 0 a tree whose node 2 is a sibling of node 1 (its
    three nodes), slot 1 idle, slot 2 a chain tree of which it brings only its first node, slot 3 a chain of
    three. Each verified node's logits equal the model's on that row's prefix, root and path alone. The 4 + 2 + 4
    tokens are a bucket of their own (10 of 4 x 4, in steps of 2): nothing is computed for slot 1 or past slot 2's
    node."""
    model = AutoModelForCausalLM.from_pretrained(pair.target, dtype=torch.float32).eval()
    runner = ModelRunner(model, num_slots=4, capacity=64, max_position=512, widths=(1, 2, 3, 4), packed_width=3,
                         graphs=StepGraphs("static", torch.device("cpu")))
    assert runner.packed_width == 3
    gen = torch.Generator().manual_seed(0)
    cached = [10, 0, 5, 7]
    seqs = torch.randint(3, 200, (4, 32), generator=gen)  # each slot's sequence; its pending token at cached[s]
    for slot, n in enumerate(cached):
        if n:
            runner.forward(seqs[slot : slot + 1, :n], kv_len=n, rows=torch.tensor([slot]))
        runner.set_lengths(slot, n)
    parents = torch.tensor([[-1, -1, 0], [-1, -1, -1], [-1, 0, 1], [-1, 0, 1]])
    valid = torch.tensor([[True] * 3, [False] * 3, [True, False, False], [True] * 3])
    tree = tree_shape(parents, valid)
    drafts = torch.tensor([[7, 9, 11], [0, 0, 0], [5, 6, 8], [12, 13, 14]])
    widths = [4, 0, 2, 4]
    with torch.inference_mode():  # as in a round
        logits, n = runner.static_steps.verify_packed(widths, 4, max(cached) + 4, seqs, drafts, tree)
    assert n == runner.static_steps.token_bucket(sum(widths), 4) == 10
    paths = {0: [[], [7], [9], [7, 11]], 2: [[], [5]], 3: [[], [12], [12, 13], [12, 13, 14]]}
    with torch.no_grad():
        for slot, nodes in paths.items():
            prefix = seqs[slot, : cached[slot] + 1].tolist()  # the prefix and the root (the pending token)
            for node, path in enumerate(nodes):
                alone = model(torch.tensor([prefix + path])).logits[0, -1]
                torch.testing.assert_close(logits[slot, node], alone, atol=1e-4, rtol=1e-4)


def generator_run(pair, drafter: str, batch_size: int, pack: bool, k: int = 3, **kw):
    draft = {"model-random": pair.draft, "model-identical": pair.target}.get(drafter)
    models = batchspec.load_models(str(pair.target), str(draft) if draft else None)
    generator = batchspec.build_generator(models, drafter="model" if draft else drafter, k=k, batch_size=batch_size,
                                          max_new_tokens=MAX_NEW, compile="static", pack_static=pack, **kw)
    results = sorted(generator.run(batchspec.Request(str(i), p) for i, p in enumerate(PROMPTS)),
                     key=lambda r: int(r.id))
    return [r.completion_token_ids for r in results], generator


@pytest.mark.parametrize("drafter,batch_size,adaptive,tree", [
    ("none", 8, False, None), ("ngram", 8, False, None), ("prompt_lookup", 3, True, None),
    ("model-random", 3, False, None), ("model-identical", 8, True, None), ("suffix", 3, False, None),
    ("ngram", 1, True, None),
    # Trees: a lookup's rows verify their own nodes (few: candidates share prefixes), a draft model's its whole tree
    ("prompt_lookup", 3, False, "2x3"), ("suffix", 8, False, "3x2"), ("model-random", 3, False, "2x2"),
    ("model-identical", 8, True, "2x3"),
])
def test_packed_and_unpacked_static_verifies_are_exact_and_packing_computes_less(llama_pair, drafter, batch_size,
                                                                                 adaptive, tree):
    packed, with_packing = generator_run(llama_pair, drafter, batch_size, True, adaptive=adaptive, tree=tree)
    unpacked, without = generator_run(llama_pair, drafter, batch_size, False, adaptive=adaptive, tree=tree)
    assert packed == llama_pair.reference and unpacked == llama_pair.reference
    rounds, step = with_packing.stats.rounds, max(1, batch_size // 2)
    # Padding is the rounding to a token bucket: below half the slots per round (or below the real tokens).
    assert with_packing.tokens.padding < rounds * step
    if adaptive:  # its choices follow measured times: the two runs need not draft alike
        return
    assert with_packing.tokens.computed <= without.tokens.computed
    if not drafter.startswith("model") and batch_size > 1:  # rows propose different numbers of drafts, or end apart
        assert with_packing.tokens.computed < without.tokens.computed


def test_unpacked_static_steps_are_declared_only_when_asked(llama_pair):
    _, packed = generator_run(llama_pair, "ngram", 3, True)
    _, unpacked = generator_run(llama_pair, "ngram", 3, False)
    kinds = lambda g: {key[1] for key in g.graphs.declared if key[0] == "target"}  # noqa: E731
    assert {"packed", "gather"} <= kinds(packed) and "forward" not in kinds(packed)
    assert "forward" in kinds(unpacked) and not {"packed", "gather"} & kinds(unpacked)


def test_static_packed_costs_time_each_length_bucket_once_and_price_the_rest_from_round_times():
    from batchspec.engine.control.costs import RoundCost, StaticPackedCosts
    timed = []

    def verify(bucket):  # 1 ms fixed + 0.01 ms a token at bucket 64, twice that at 128
        timed.append(bucket)
        scale = bucket // 64
        return [(n, scale * (1e-3 + 1e-5 * n)) for n in (8, 16, 32, 40)]

    costs = StaticPackedCosts(measure_verify=verify, measure_step=lambda bucket: 2e-4, bucket_of=lambda n: 64 if n <= 64 else 128)
    assert not costs.known
    costs.at_length(50)
    costs.at_length(60)
    assert timed == [64]
    tokens, verify_s, steps = costs.round_costs(16, 2)
    assert tokens == 16 and verify_s == pytest.approx(1e-3 + 16e-5) and steps == [(1, 2e-4), (1, 2e-4)]
    for drafts, rest in ((0, 1e-3), (8, 1e-3 + 8 * 5e-5), (16, 1e-3 + 16 * 5e-5), (4, 1e-3 + 4 * 5e-5)):
        tokens, verify, steps = costs.round_costs(16 + drafts, 2)
        costs.observe(RoundCost(0, 2, verify_s + 4e-4 + rest, drafts, tokens, verify, tuple(steps)))
    prices = costs.prices()
    # verify 1 ms + 0.01 ms a token, a drafting step 0.2 ms, the rest 1 ms + 0.05 ms a draft (less the verify's
    # token price: observe subtracts the verify of each round's own tokens)
    assert prices.per_token == pytest.approx(1e-5) and prices.per_step == pytest.approx(2e-4)
    assert prices.fixed == pytest.approx(2e-3, rel=1e-3)
    assert prices.per_draft == pytest.approx(5e-5 - 1e-5, rel=1e-3)
    costs.at_length(100)
    assert timed == [64, 128] and costs.prices().per_token == pytest.approx(2e-5)


@pytest.mark.parametrize("drafter", ["ngram", "model-identical"])
def test_static_rounds_give_each_row_its_own_drafts(llama_pair, monkeypatch, drafter):
    """Adaptive on the static path with packed chains: each running row gets its own number of drafts
    (Scheduler._choose_rows, priced by timed replays), idle slots none; exact."""
    from batchspec.engine.scheduler import Scheduler
    chosen = []
    original = Scheduler._choose_rows

    def spy(self, round, offer, priors):
        shape, budgets = original(self, round, offer, priors)
        chosen.append((list(budgets), set(round.running)))
        return shape, budgets

    monkeypatch.setattr(Scheduler, "_choose_rows", spy)
    outputs, generator = generator_run(llama_pair, drafter, 8, True, adaptive=True)
    assert outputs == llama_pair.reference
    assert type(generator.adaptive.costs).__name__ == "StaticPackedCosts" and generator.adaptive.costs.tables
    assert chosen and all(b == 0 for budgets, running in chosen for i, b in enumerate(budgets) if i not in running)
    assert any(sum(budgets) > 0 for budgets, _ in chosen)
    if drafter == "ngram":  # proposals differ by row: some round drafts different numbers for different rows
        assert any(len({budgets[i] for i in running}) > 1 for budgets, running in chosen)


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "unpacked"])
def test_a_draft_model_at_k_1_prices_its_one_step(llama_pair, pack):
    """k=1 with adaptive on the static path: pricing a draft model's steps timed a second drafting step that
    is never declared at k=1 and wrote past the one-column drafts buffer (found by a review)."""
    outputs, _ = generator_run(llama_pair, "model-identical", 3, pack, k=1, adaptive=True)
    assert outputs == llama_pair.reference


# a padded verify: width, each row's drafts on the host (None: not known there), running rows; computed, padding
PADDED = [
    ("a tree with idle slots", 9, [2, 0, 3, 0], [0, 2], 36, 6 + 5 + 2 * 9),
    ("a chain, every slot running", 5, [4, 1, 0, 2], [0, 1, 2, 3], 20, 0 + 3 + 4 + 2),
    ("drafts not known on the host: the full width", 5, None, [1], 10, 5),
]


@pytest.mark.parametrize("name,width,num,running,computed,padding", PADDED, ids=[p[0] for p in PADDED])
def test_a_padded_verify_counts_what_it_computed_for_nothing(name, width, num, running, computed, padding):
    """Every row computes the width: a running row's padding is what its drafts (a tree: its nodes) leave of it, an
    idle slot's is its whole row, counted once."""
    import torch

    from batchspec.engine.phases import Timers
    from batchspec.engine.round import Draft, Plan, Round, RoundShape
    from batchspec.engine.stats import Statistics
    from batchspec.engine.verify_pass import count_padded

    b = len(num) if num is not None else 2
    rows = torch.arange(b)
    plan = Plan(rows=list(range(b)), rows_t=rows, span=None, lengths=[5] * b, lengths_t=rows, running=running,
                room=[8] * b, limits=[4] * b)
    draft = Draft(tokens=torch.zeros(b, width - 1, dtype=torch.long), num_tokens=rows, host_num=num)
    stats = Statistics(4, 4, Timers())
    count_padded(stats, Round(plan, RoundShape(drafts=width - 1), [0] * b, draft))
    assert (stats.forwards.computed, stats.forwards.padding) == (computed, padding)
