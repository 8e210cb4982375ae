"""Packed rounds (engine/model/packed.py, engine/control/row_drafts.py): one forward of every row's own tokens, prompts
prefilled inside rounds, each row's own number of drafts.

The math is exact where it can be: a packed forward's logits against each row's plain forward (fp32, to
rounding); greedy output against Hugging Face `generate` token for token, with prompts cut into chunks
of every size; zero padding computed; the per-row choice against brute force."""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers import AutoModelForCausalLM

from batchspec.api import build_generator
from batchspec.engine.control.adaptive import LOOKUP, AdaptiveK
from batchspec.engine.control.costs import PackedCosts
from batchspec.engine.control.line import Line
from batchspec.engine.control.exploration import explore
from batchspec.engine.model.graphs import StepGraphs
from batchspec.engine.model.kv_cache import causal_mask
from batchspec.engine.model import packed
from batchspec.engine.model.packed import RowTokens, layout_round, pack, supports_packing
from batchspec.engine.control.row_drafts import Prices, choose_drafts
from batchspec.engine.model.runner import ModelRunner
from batchspec.engine.tree import tree_shape
from batchspec.engine.model.models import load_models
from batchspec.engine.types import Request, RowParams
from conftest import MAX_NEW
from tiny import PROMPTS


def test_packed_forward_equals_each_rows_own_forward(pair):
    """Rows of every kind in one forward: a prompt's first chunk, a prompt's last chunk with its pending
    token, decoding rows verifying 1 and 4 tokens over cached prefixes of different lengths, tree rows of their
    own node counts (one whose node 2 is a sibling of node 1, one that has only its first node of three) and a
    row whose chunk is longer than a group's 8 tokens. Each row's logits equal those of the model run on that
    row's sequence alone."""
    model = AutoModelForCausalLM.from_pretrained(pair.target, dtype=torch.float32).eval()
    runner = ModelRunner(model, num_slots=6, capacity=64, max_position=512, graphs=StepGraphs(None, torch.device("cpu")))
    assert runner.packs
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, 200, (n,), generator=gen).tolist() for n in (20, 9, 14, 30, 12, 25)]
    # A first packed forward caches each row's prefix (lengths 0 for slots 0 and 5: their prompts come now).
    cached = [0, 5, 10, 20, 8, 0]
    prefill = [RowTokens(s, 0, n) for s, n in enumerate(cached) if n]
    runner.forward_packed(torch.tensor([t for s, n in enumerate(cached) for t in seqs[s][:n]]),
                          pack(prefill, device=model.device, dtype=model.dtype, keep=[]))
    # Tree 0: nodes 0 and 1 children of the root, node 2 of node 0. Tree 1: a chain of three, of which its row
    # brings node 0 only (a tree's nodes are its first node slots); its other slots are never seen.
    tree = tree_shape(torch.tensor([[-1, -1, 0], [-1, 0, 1]]), torch.tensor([[True] * 3, [True, False, False]]))
    rows = [RowTokens(0, 0, 6), RowTokens(1, 5, 4), RowTokens(2, 10, 1), RowTokens(3, 20, 4, tree=0),
            RowTokens(4, 8, 2, tree=1), RowTokens(5, 0, 13)]
    tree_tokens = {3: [seqs[3][20], 7, 9, 11], 4: [seqs[4][8], 5]}  # root, then its nodes
    paths = {3: [[], [7], [9], [7, 11]], 4: [[], [5]]}  # each verify position's path below the root
    ids = [t for r in rows for t in (tree_tokens[r.slot] if r.tree is not None else
                                    seqs[r.slot][r.start : r.start + r.count])]
    batch = pack(rows, device=model.device, dtype=model.dtype, tree_depth=tree.depth, tree_ancestors=tree.ancestors)
    logits = runner.forward_packed(torch.tensor(ids), batch)
    with torch.no_grad():
        for row, offset in zip(rows, batch.offsets):
            got = logits[offset : offset + row.count]
            if row.tree is None:
                alone = model(torch.tensor([seqs[row.slot][: row.start + row.count]])).logits[0, row.start :]
                torch.testing.assert_close(got, alone, atol=1e-4, rtol=1e-4)
                continue
            prefix = seqs[row.slot][: row.start]
            assert len(paths[row.slot]) == row.count
            for node, path in enumerate(paths[row.slot]):
                alone = model(torch.tensor([prefix + [tree_tokens[row.slot][0]] + path])).logits[0, -1]
                torch.testing.assert_close(got[node], alone, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("drafter", ["ngram", "prompt_lookup", "suffix", "model"])
def test_a_packed_tree_round_computes_each_rows_own_nodes(pair, drafter, monkeypatch):
    """In a packed tree round each row's verify tokens are its root and its own nodes (a lookup's tree often has
    fewer than the shape's, a row at its end none), not the shape's width: every tree round's widths equal its
    rows' valid nodes plus one, and the output is HF's, token for token."""
    from batchspec.engine import verify_pass

    models = load_models(str(pair.target), str(pair.draft) if drafter == "model" else None, dtype="float32")
    generator = build_generator(models, drafter=drafter, k=3, batch_size=4, max_new_tokens=MAX_NEW, adaptive=False,
                                tree="2x3")
    widths, valid = [], []
    layout, run = verify_pass.layout_round, verify_pass.PackedPass.run

    def spy_layout(slots, lengths, row_widths, width, fills, tree):
        widths.append(row_widths if tree else None)
        return layout(slots, lengths, row_widths, width, fills, tree)

    def spy_run(self, round):
        if round.tree is not None:  # a row's nodes are its first node slots
            nodes = round.draft.valid
            first = torch.arange(nodes.shape[1])[None, :] < nodes.sum(1, keepdim=True)
            assert torch.equal(nodes, first)
        valid.append([1 + n for n in round.draft.valid.sum(1).tolist()] if round.tree is not None else None)
        return run(self, round)

    monkeypatch.setattr(verify_pass, "layout_round", spy_layout)
    monkeypatch.setattr(verify_pass.PackedPass, "run", spy_run)
    results = sorted(generator.run(Request(str(i), p) for i, p in enumerate(PROMPTS)), key=lambda r: int(r.id))
    assert [r.completion_token_ids for r in results] == pair.reference
    trees = [(w, v) for w, v in zip(widths, valid) if v]
    assert trees and all(w == v for w, v in trees)
    if drafter != "model":  # a lookup's trees: most rows have fewer nodes than the shape's 6
        assert sum(sum(w) for w, _ in trees) < 0.75 * sum(7 * len(w) for w, _ in trees)


@pytest.mark.parametrize("fill_tokens", [1, 3, 7, 1024])
@pytest.mark.parametrize("drafter", ["none", "ngram", "model"])
def test_prompts_prefilled_in_chunks_of_any_size_are_exact(pair, drafter, fill_tokens):
    """A round prefills at most fill_tokens prompt tokens (a prompt then spans several rounds, several
    prompts share one): the output is HF's, token for token, and every computed token is a row's own."""
    models = load_models(str(pair.target), str(pair.draft) if drafter == "model" else None, dtype="float32")
    generator = build_generator(models, drafter=drafter, k=3, batch_size=5, max_new_tokens=MAX_NEW,
                                adaptive=False, fill_tokens=fill_tokens)
    results = sorted(generator.run(Request(str(i), p) for i, p in enumerate(PROMPTS)), key=lambda r: int(r.id))
    assert [r.completion_token_ids for r in results] == pair.reference
    assert generator.tokens.padding == 0
    prompt_tokens = sum(len(models.tokenizer(p)["input_ids"]) - 1 for p in PROMPTS)
    assert generator.tokens.prefilled == prompt_tokens  # each prompt once (its last token is the first pending)
    for r in results:  # the round of a row's last chunk decided its first token: its first forward
        assert r.target_forwards == len(r.accepted_per_round) and r.accepted_per_round[0] == 0


def test_no_prefill_forward_of_its_own(llama_pair, monkeypatch):
    """Admission runs no target forward: every target forward is a round's packed forward."""
    models = load_models(str(llama_pair.target), str(llama_pair.draft), dtype="float32")
    generator = build_generator(models, drafter="model", k=2, batch_size=3, max_new_tokens=MAX_NEW)
    calls = []
    assert generator.runner.static_prefill is None  # the captured path's prompt chunks: none on this path
    for name in ("prefill", "forward"):
        monkeypatch.setattr(generator.runner, name, lambda *a, _n=name, **k: calls.append(_n))
    results = list(generator.run(Request(str(i), p) for i, p in enumerate(PROMPTS)))
    assert len(results) == len(PROMPTS) and calls == []


def test_samples_share_one_prefill(llama_pair):
    """n samples of a request: one row prefills the prompt, the others copy its cache; coupled sampling
    gives each sample the same tokens as without packing's chunks (fill_tokens 2 against 1024)."""
    models = load_models(str(llama_pair.target), dtype="float32")
    outputs = []
    for fill_tokens in (2, 1024):
        generator = build_generator(models, batch_size=15, max_new_tokens=12, temperature=0.9, n=3,
                                    fill_tokens=fill_tokens)
        results = list(generator.run(Request(str(i), p) for i, p in enumerate(PROMPTS[:5])))
        outputs.append({(r.id, r.sample_index): r.completion_token_ids for r in results})
        prompt_tokens = sum(len(models.tokenizer(p)["input_ids"]) - 1 for p in PROMPTS[:5])
        assert generator.tokens.prefilled == prompt_tokens  # once per request (its samples admitted together)
    assert outputs[0] == outputs[1] and len(outputs[0]) == 15
    assert len({tuple(v) for v in outputs[0].values()}) > 5  # samples differ


def test_one_token_prompts_and_their_samples(llama_pair):
    """A prompt of one token has nothing to prefill: its first round decides its first token, and its other
    samples, which copy nothing, too."""
    models = load_models(str(llama_pair.target), dtype="float32")
    generator = build_generator(models, batch_size=6, max_new_tokens=5, temperature=0.9, n=3)
    results = list(generator.run([Request("a", [5]), Request("b", [7, 8])]))
    assert sorted((r.id, r.sample_index, r.completion_tokens) for r in results) == \
        [(i, s, 5) for i in "ab" for s in range(3)]
    assert generator.tokens.prefilled == 1


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_rows_verify_only_their_own_drafts(llama_pair, drafter):
    """Adaptive speculation chooses each row's drafts: the target forwards compute each row's pending
    token and its own drafts and nothing else, and the output stays exact."""
    models = load_models(str(llama_pair.target), str(llama_pair.draft), dtype="float32")
    generator = build_generator(models, drafter=drafter, k=4, batch_size=6, max_new_tokens=MAX_NEW, adaptive=True)
    requests = [Request(str(i), p, params=RowParams(max_new_tokens=4 + 2 * (i % 10))) for i, p in enumerate(PROMPTS)]
    results = sorted(generator.run(requests), key=lambda r: int(r.id))
    for r, ref, req in zip(results, llama_pair.reference, requests):
        assert r.completion_token_ids == ref[: req.params.max_new_tokens]
    decided = sum(r.target_forwards for r in results)  # one pending token per row-round
    drafted = sum(r.draft_tokens for r in results)  # less the drafts past an EOS that ended a row
    own = generator.tokens.prefilled + decided + drafted
    assert generator.tokens.padding == 0
    assert own <= generator.tokens.computed <= own + 4 * sum(r.finish_reason == "stop" for r in results)


LAYOUTS = [
    # name, deciding rows (slot, L, width), verify width, prompt chunks (slot, start, count), tree round,
    # expected rows (slot, start, count), keep, gather
    ("decoding rows of their own widths", [(0, 10, 1), (2, 7, 3)], 3, [], False,
     [(0, 9, 1), (2, 6, 3)], [0, 1, 2, 3], [[0, 0, 0], [1, 2, 3]]),
    ("a last chunk rides with its pending token", [(1, 6, 1), (3, 20, 2)], 2, [(1, 2, 3), (4, 0, 5)], False,
     [(1, 2, 4), (3, 19, 2), (4, 0, 5)], [3, 4, 5], [[0, 0], [1, 2]]),
    ("chunks only", [], 1, [(0, 0, 4), (5, 4, 2)], False, [(0, 0, 4), (5, 4, 2)], [], []),
    ("a tree row's chunk is a row of its own", [(1, 6, 3)], 3, [(1, 2, 3)], True,
     [(1, 5, 3), (1, 2, 3)], [0, 1, 2], [[0, 1, 2]]),
    ("tree rows of their own node counts", [(1, 6, 3), (2, 9, 1), (4, 3, 2)], 3, [], True,
     [(1, 5, 3), (2, 8, 1), (4, 2, 2)], [0, 1, 2, 3, 4, 5], [[0, 1, 2], [3, 3, 3], [4, 5, 5]]),
]


@pytest.mark.parametrize("name,deciding,width,fills,tree,rows,keep,gather", LAYOUTS, ids=[x[0] for x in LAYOUTS])
def test_round_layout(name, deciding, width, fills, tree, rows, keep, gather):
    layout = layout_round([d[0] for d in deciding], [d[1] for d in deciding], [d[2] for d in deciding], width,
                          fills, tree)
    assert [(r.slot, r.start, r.count) for r in layout.rows] == rows
    assert layout.keep == keep and layout.gather == gather
    assert layout.full == all(d[2] == width for d in deciding)
    offsets = [sum(r.count for r in layout.rows[:i]) for i in range(len(layout.rows))]
    for slot, start, _ in fills:  # each chunk's first token, found where the rows put it
        row = next(i for i, r in enumerate(layout.rows) if r.slot == slot and r.start == start)
        assert layout.chunk_at[slot, start] == offsets[row]


GROUPS = [
    # name, rows (slot, start, count), read as a span of the cache (else gathered)
    ("consecutive decoding rows", [(0, 9, 1), (1, 6, 3), (2, 4, 1)], True),
    ("decoding rows, one hole a row", [(0, 9, 1), (2, 6, 3), (4, 4, 1), (6, 5, 2)], True),
    ("decoding rows among as many holes (spare slots)", [(s, 9, 2) for s in range(0, 16, 2)], True),
    ("two decoding rows, holes past 2", [(0, 9, 1), (5, 6, 1)], False),
    ("two decoding rows, 2 holes", [(0, 9, 1), (3, 6, 1)], True),
    ("prompt chunks, 2 holes", [(0, 0, 20), (3, 0, 20)], True),
    ("prompt chunks, a hole a row past 2", [(0, 0, 20), (2, 0, 20), (4, 0, 20), (6, 0, 20)], False),
]


@pytest.mark.parametrize("name,rows,span", GROUPS, ids=[g[0] for g in GROUPS])
def test_a_group_reads_a_span_of_the_cache_or_gathers_its_rows(pair, name, rows, span, monkeypatch):
    """Empty slots between a group's rows ride along (no queries) up to one a row where the rows decode (a
    hole costs a few queries' attention) and a quarter of one where they prefill (a whole chunk's padded
    attention), at least 2; more, and the rows' caches are gathered. Either way each row's logits are the
    same as the other way's (fp32, to rounding)."""
    model = AutoModelForCausalLM.from_pretrained(pair.target, dtype=torch.float32).eval()
    runner = ModelRunner(model, num_slots=16, capacity=64, max_position=512,
                         graphs=StepGraphs(None, torch.device("cpu")))
    specs = [RowTokens(*r) for r in rows]
    gen = torch.Generator().manual_seed(1)
    prefix = [RowTokens(r.slot, 0, r.start) for r in specs if r.start]
    if prefix:
        runner.forward_packed(torch.randint(3, 200, (sum(r.count for r in prefix),), generator=gen),
                              pack(prefix, device=model.device, dtype=model.dtype, keep=[]))
    ids = torch.randint(3, 200, (sum(r.count for r in specs),), generator=gen)
    batch = pack(specs, device=model.device, dtype=model.dtype)
    assert len(batch.groups) == 1 and isinstance(batch.groups[0].rows, slice) == span
    holes = rows[-1][0] - rows[0][0] + 1 - len(rows)
    for rule in ("SHORT_HOLES_PER_ROW", "HOLES_PER_ROW"):  # the other way round, where the rule can turn it
        monkeypatch.setattr(packed, rule, 0.0 if span else 10.0)
    flipped = pack(specs, device=model.device, dtype=model.dtype)
    assert isinstance(flipped.groups[0].rows, slice) == (not span or holes <= 2)
    torch.testing.assert_close(runner.forward_packed(ids, batch), runner.forward_packed(ids, flipped),
                               atol=1e-5, rtol=1e-5)


# ---- the per-row choice ---------------------------------------------------------------------------------


def rate_of(ks, gains, base, prices, steps):
    tokens = len(gains) + sum(sum(g[:k]) for g, k in zip(gains, ks))
    return tokens / prices.seconds(base + sum(ks), max(ks, default=0) if steps else 0, sum(ks))


def brute_force(gains, base, prices, steps):
    return max(rate_of(ks, gains, base, prices, steps) for ks in itertools.product(*[range(len(g) + 1) for g in gains]))


SMOLLM2 = ((8, 0.045), (9, 0.052), (10, 0.057), (12, 0.0595), (13, 0.070), (15, 0.075), (16, 0.064), (20, 0.070),
           (24, 0.076))
GEOMETRIC = lambda a, n: [a ** j for j in range(1, n + 1)]  # noqa: E731  gains of E(k) = 1 + a + .. + a^k

CHOICES = [
    # name, gains per row, base tokens, prices, drafting forwards
    ("useless drafts: none", [GEOMETRIC(0.02, 4)] * 6, 6, Prices(0.010, 0.0003), False),
    ("cheap tokens, good drafts: all", [GEOMETRIC(0.9, 4)] * 6, 6, Prices(0.010, 0.0001), False),
    ("mixed rows", [GEOMETRIC(0.9, 4), GEOMETRIC(0.05, 4), GEOMETRIC(0.6, 4), GEOMETRIC(0.3, 2)], 4,
     Prices(0.008, 0.0008), False),
    ("prompt chunk in the round", [GEOMETRIC(0.7, 4)] * 3, 200, Prices(0.010, 0.0002), False),
    ("draft steps cost", [GEOMETRIC(0.8, 4), GEOMETRIC(0.7, 4), GEOMETRIC(0.2, 4)], 3,
     Prices(0.010, 0.0004, 0.003, 0.0002), True),
    ("expensive steps: none", [GEOMETRIC(0.5, 4)] * 2, 2, Prices(0.010, 0.0004, 0.02, 0.001), True),
    ("lookup proposals of different lengths", [[0.6, 0.5], [], [0.9, 0.8, 0.7, 0.6], [0.1]], 4,
     Prices(0.010, 0.0006), False),
    # SmolLM2-135M's forward at batch 8 on 2 CPU cores (ms at N tokens): a first draft costs 7 ms, 8 cost 19
    ("a measured curve: every row or none", [GEOMETRIC(0.6, 2)] * 8, 8, Prices(0.001, 0.002, curve=SMOLLM2), False),
    ("a measured curve, rows unalike", [GEOMETRIC(a, 2) for a in (0.95, 0.9, 0.5, 0.4, 0.3, 0.3, 0.2, 0.1)], 8,
     Prices(0.001, 0.002, curve=SMOLLM2), False),
    ("a measured curve and drafting forwards", [GEOMETRIC(0.7, 2)] * 8, 8,
     Prices(0.001, 0.002, 0.004, 0.0001, curve=SMOLLM2), True),
]


@pytest.mark.parametrize("name,gains,base,prices,steps", CHOICES, ids=[c[0] for c in CHOICES])
def test_choice_matches_brute_force(name, gains, base, prices, steps):
    """The sorted-gains choice reaches the best rate over every assignment (rows alike may swap drafts)."""
    drafts, rate = choose_drafts(gains, base, prices, steps)
    assert all(0 <= k <= len(g) for k, g in zip(drafts, gains))
    assert rate_of(drafts, gains, base, prices, steps) == pytest.approx(rate, rel=1e-12)
    assert rate == pytest.approx(brute_force(gains, base, prices, steps), rel=1e-12), name
    if name.endswith(": none"):
        assert drafts == [0] * len(gains)


EXPLORATIONS = [
    # name, the choice's drafts, first-draft gains, base tokens, prices -> drafts explored (a draft model's; a
    # lookup's rows explore by proposing: test_exploration.py)
    ("an eighth of 32 rows, best first", [2] * 32, [[0.5 + i / 100] for i in range(32)], 32, Prices(0.3, 0.0001),
     [0] * 28 + [1] * 4),
    ("a draft step over 10%: the two rows an eighth allows (one step prices both)", [3] * 16, [[0.5]] * 16, 16,
     Prices(0.1, 0.001, 0.05, 0.0), [1, 1] + [0] * 14),
    ("batch 1", [4], [[0.9]], 1, Prices(0.05, 0.001), [1]),
    ("only rows with something to draft", [0] * 16, [[], [], [0.9]] + [[]] * 12 + [[0.8]], 16,
     Prices(0.1, 0.0001), [0, 0, 1] + [0] * 12 + [1]),
    ("nothing to draft: nothing explored", [0] * 8, [[]] * 8, 8, Prices(0.1, 0.0001), [0] * 8),
    ("drafts the choice refused: explored all the same", [0] * 8, [[0.3]] * 8, 8, Prices(0.1, 0.0001),
     [1] + [0] * 7),
]


@pytest.mark.parametrize("name,drafts,gains,base,prices,explored", EXPLORATIONS, ids=[e[0] for e in EXPLORATIONS])
def test_exploration_drafts_one_token_on_few_rows(name, drafts, gains, base, prices, explored):
    """While a job's acceptance is a prior (exploration.explore): a draft model's one draft on the rows whose
    first draft gains most (none of its rows drafted before here): at most an eighth of the rows."""
    assert explore(gains, prices, base) == explored


def test_the_controller_explores_until_it_has_evidence():
    """Fresh, a lookup explores without verifying a draft: its rows propose, and their next tokens judge the
    proposals (one right first draft each here); after 16 first drafts it chooses freely."""
    costs = PackedCosts()
    for tokens, seconds in ((32, 0.30), (64, 0.31), (160, 0.34)):  # verifying drafts costs little here
        costs.verify.add(tokens, seconds)
    costs.rest.add(0, 0.0, weight=0.1)
    controller = AdaptiveK(k_max=4, policy=LOOKUP)
    slots = list(range(32))
    _, drafts = controller.choose_rows(slots, [4] * 32, [0] * 32, [0.95] * 32, 32, costs)
    assert sum(drafts) == 0 and controller.packed.learning
    controller.learn(0, slots, drafts, drafts, drafts, [[7, 8, 9, 9]] * 32, [[7]] * 32)
    controller.learn(4, slots, [4] * 32, [4] * 32, [4] * 32)
    assert controller.acceptance.evidence >= 16
    _, drafts = controller.choose_rows(slots, [4] * 32, [0] * 32, [0.95] * 32, 32, costs)
    assert sum(drafts) > 32


@pytest.mark.parametrize("tokens,seconds", [
    (8, 0.045), (9, 0.052), (11, 0.05825), (16, 0.064), (18, 0.067),  # at and between the points
    (24, 0.076), (30, 0.076 + 6 * 0.002),  # past the last: per_token a token
    (6, 0.045 - 2 * 0.002), (1, 0.045 - 7 * 0.002),  # below the first (a job's tail): per_token a token
])
def test_a_curve_prices_the_forward_by_interpolation(tokens, seconds):
    prices = Prices(0.001, 0.002, curve=SMOLLM2)
    assert prices.forward(tokens) == pytest.approx(seconds, abs=1e-12)
    assert prices.seconds(tokens, 0, 0) == pytest.approx(0.001 + seconds, abs=1e-12)
    assert Prices(0.001, 0.002).forward(tokens) == pytest.approx(0.002 * tokens)  # no curve: a line


@pytest.mark.parametrize("prices,base,most,each", [
    (Prices(0.01, 0.002, per_draft=0.0005), 8, 8, 0.0025),  # a line: every draft alike
    (Prices(0.01, 0.002, per_draft=0.0005, curve=SMOLLM2), 8, 1, 0.0075),  # one draft alone: the jump
    (Prices(0.01, 0.002, per_draft=0.0005, curve=SMOLLM2), 8, 8, 0.019 / 8 + 0.0005),  # filling to 16
    (Prices(0.01, 0.002, per_draft=0.0005, curve=SMOLLM2), 15, 1, -0.011 + 0.0005),  # the 16th token: cheaper
])
def test_the_cheapest_draft(prices, base, most, each):
    assert prices.cheapest_draft(base, most) == pytest.approx(each, abs=1e-12)


def test_a_curve_drafts_rows_together_where_a_line_drafts_one():
    """Rows alike at 0.6: the curve makes a draft alone cost 7 ms and eight 19 ms; a line through the same
    points' ends prices each draft 2 ms and, with equal gains, takes them all as well; with one good row only
    the line drafts it, the curve does not (7 ms for 0.6 of a token loses to plain rounds at 5.6 ms a token, and
    filling the forward with the others' drafts at 0.02 does not pay either)."""
    line = Prices(0.045 - 8 * 0.0019, 0.0019)
    curve = Prices(0.0, 0.002, curve=SMOLLM2)
    alike = [GEOMETRIC(0.6, 1)] * 8
    assert choose_drafts(alike, 8, curve, False)[0] == [1] * 8 == choose_drafts(alike, 8, line, False)[0]
    one = [GEOMETRIC(0.6, 1)] + [GEOMETRIC(0.02, 1)] * 7
    assert choose_drafts(one, 8, line, False)[0] == [1] + [0] * 7
    assert choose_drafts(one, 8, curve, False)[0] == [0] * 8


# A forward linear in N as at batch 64 on 2 CPU cores (SmolLM2-135M: 160 ms at 64 tokens, 477 at 192), or
# SmolLM2's measured curve at batch 8: (name, gains per row, rows, prompt-chunk tokens, prices)
DECODING_CASES = [
    ("batch 64, a linear forward, acceptance 0.34", [GEOMETRIC(0.34, 2)] * 64, 64, 256, Prices(0.005, 0.0025)),
    ("batch 64, rows unalike", [GEOMETRIC(a / 64, 2) for a in range(64)], 64, 700, Prices(0.005, 0.0025)),
    ("batch 8, a line, a draft worth taking", [GEOMETRIC(0.8, 2)] * 8, 8, 200, Prices(0.01, 0.0004)),
    ("batch 8, the measured curve", [GEOMETRIC(a, 2) for a in (0.95, 0.9, 0.5, 0.4, 0.3, 0.3, 0.2, 0.1)], 8, 16,
     Prices(0.001, 0.002, curve=SMOLLM2)),
]


@pytest.mark.parametrize("name,gains,rows,chunks,prices", DECODING_CASES, ids=[c[0] for c in DECODING_CASES])
def test_a_round_that_prefills_chooses_drafts_as_one_that_only_decodes(name, gains, rows, chunks, prices):
    """Drafts save decoding rounds, never prefill work: a round that also prefills `chunks` prompt tokens,
    valued as one that only decodes (Prices.decoding), takes the drafts a decode-only round takes wherever the
    forward's price of a draft is the same at both N (a line; past the curve's last point). Priced with its
    chunks, the same round takes drafts at batch 64 that do not pay there (each draft costs a whole token)."""
    valued = prices.decoding(rows + chunks, rows)
    assert valued.seconds(rows + chunks, 0, 0) == pytest.approx(prices.seconds(rows, 0, 0), rel=1e-12)
    assert valued.added(rows + chunks, 5) == pytest.approx(prices.added(rows + chunks, 5), rel=1e-12)
    if not prices.curve:  # with a curve a draft is priced where the round's forward really is
        assert choose_drafts(gains, rows + chunks, valued, False)[0] == choose_drafts(gains, rows, prices, False)[0]
    if rows == 64 and name.endswith("0.34"):
        assert choose_drafts(gains, rows, prices, False)[0] == [0] * rows
        assert sum(choose_drafts(gains, rows + chunks, prices, False)[0]) > 0  # the bias the valuation removes
    assert prices.decoding(rows, rows) is prices


def test_a_row_whose_drafts_do_not_pay_drafts_nothing():
    drafts, _ = choose_drafts([GEOMETRIC(0.9, 4), GEOMETRIC(0.01, 4), GEOMETRIC(0.85, 4)], 3, Prices(0.01, 0.0005), False)
    assert drafts[1] == 0 and drafts[0] > 0 and drafts[2] > 0


def test_line_fit():
    """Decayed least squares: exact on a line; proportional while every x is the same."""
    line = Line()
    for x in (8, 40, 12, 64, 9):
        line.add(x, 0.01 + 0.0003 * x)
    a, b = line.fit()
    assert a == pytest.approx(0.01) and b == pytest.approx(0.0003)
    flat = Line()
    for _ in range(5):
        flat.add(10, 0.02)
    assert flat.fit() == (0.0, pytest.approx(0.002))
    rest = Line(proportional=False)  # a round's host time while nobody drafts: flat, not per draft
    for _ in range(5):
        rest.add(0, 0.003)
    assert rest.fit() == (pytest.approx(0.003), 0.0)
    assert Line().fit() is None


ANCHORED_CASES = [  # (name, samples (x, y) after the anchor's points, the slope expected, relative tolerance)
    ("no samples: the anchor itself", [], 0.0005, 1e-9),
    ("samples at one x, the level 1.5x: the anchor's slope scaled alike", [(8, 0.015)] * 40, 0.00075, 1e-9),
    # SmolLM2's case: a round's N moves by a token, its time by 10%, the slope of that noise is large
    # (unanchored, the proportional reading: 1.7 ms a token)
    ("noisy samples one token apart: the anchor's slope at their level", [(8, 0.014), (9, 0.0155), (8, 0.0125),
                                                                          (9, 0.0150), (8, 0.0135)] * 8, 0.00069, 0.05),
    ("samples spread far on a steeper line: theirs wins", [(x, 0.006 + 0.002 * x) for x in (8, 72, 24, 136)] * 10,
     0.002, 0.01),
]


@pytest.mark.parametrize("name,samples,slope,tolerance", ANCHORED_CASES, ids=[c[0] for c in ANCHORED_CASES])
def test_a_line_anchored_on_the_start_up_points(name, samples, slope, tolerance):
    """Line.measured: the start-up points (8, 16 and 40 tokens on a = 6 ms, b = 0.5 ms) anchor the slope, which
    the rounds' samples move only as far as their own spread tells; the line passes through the samples' mean."""
    line = Line.measured([(8, 0.010), (40, 0.026), (16, 0.014)])
    assert line.known and line.anchor == (pytest.approx(0.006), pytest.approx(0.0005), pytest.approx(554.67, rel=1e-3))
    for x, y in samples:
        line.add(x, y)
    a, b = line.fit()
    assert b == pytest.approx(slope, rel=tolerance)
    if samples:
        assert a + b * line.sx / line.w == pytest.approx(line.sy / line.w)  # through the samples' mean


def test_points_at_one_x_do_not_anchor_a_line():
    line = Line.measured([(8, 0.004)])
    assert line.anchor is None and line.n == 1 and line.fit() == (0.0, pytest.approx(0.0005))


def test_which_models_pack(pair):
    """Forwards pack wherever transformers dispatches the attention: Gemma 2's logit soft-capping and gpt-oss's
    sinks are applied by packed_attention itself (test below)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    assert supports_packing(AutoModelForCausalLM.from_pretrained(pair.target))
    gemma = Gemma2ForCausalLM(Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                           num_attention_heads=2, num_key_value_heads=1, head_dim=16))
    assert supports_packing(gemma)


ATTENTION_CASES = [  # (name, query heads, key heads, query tokens, soft cap, sinks)
    ("soft cap", 4, 2, 3, 5.0, False),
    ("soft cap, one head per key", 2, 2, 1, 2.0, False),
    ("sinks", 4, 2, 3, None, True),
    ("sinks, grouped 4 to 1", 4, 1, 2, None, True),
    ("plain (sdpa)", 4, 2, 3, None, False),
]


@pytest.mark.parametrize("name,heads,kv_heads,t,softcap,sinks", ATTENTION_CASES, ids=[c[0] for c in ATTENTION_CASES])
def test_packed_attention_applies_soft_caps_and_sinks_as_the_models_do(name, heads, kv_heads, t, softcap, sinks):
    """attend (grouped-query, keys not repeated) against the models' own eager attention (transformers'
    Gemma 2 and gpt-oss), on random scores large enough that the cap bites, with a causal mask over a
    cache of 7 entries: equal to fp32 rounding (1e-5)."""
    from types import SimpleNamespace

    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward as gemma2_eager
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward as gpt_oss_eager

    from batchspec.engine.model.kv_cache import attend

    torch.manual_seed(0)
    b, d, kv = 2, 8, 7
    query, key = 3 * torch.randn(b, t, heads, d), 3 * torch.randn(b, kv_heads, kv, d)
    value = torch.randn(b, kv_heads, kv, d)
    positions = torch.tensor([[kv - t + i for i in range(t)], [2 + i for i in range(t)]])
    mask = causal_mask(positions, kv, torch.float32)
    module = SimpleNamespace(num_key_value_groups=heads // kv_heads, training=False,
                             sinks=torch.randn(heads) if sinks else None)
    ours = attend(query, key, value, mask, 0.5, softcap=softcap, sinks=module.sinks)
    reference = gpt_oss_eager if sinks else gemma2_eager
    theirs, _ = reference(module, query.transpose(1, 2), key, value, mask, scaling=0.5,
                          **({"softcap": softcap} if not sinks else {}))
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()


HOPELESS_CASES = [  # (name, each row's (accepted, rejected) counts, prices of the verify forward)
    ("strong and weak rows", [(9.0, 1.0), (0.2, 9.0), (5.0, 5.0), (0.0, 12.0), (7.0, 2.0)], (0.010, 0.0004)),
    ("expensive tokens", [(9.0, 1.0), (3.0, 6.0), (1.0, 9.0)], (0.002, 0.002)),
    ("cheap tokens: everyone may pay", [(2.0, 8.0), (9.0, 1.0), (1.0, 9.0)], (0.050, 0.00001)),
]


@pytest.mark.parametrize("chunks", [0, 200], ids=["decoding", "prefilling 200 prompt tokens"])
@pytest.mark.parametrize("ratios", [None, (0.6, 1.4, 0.3, 1.0)], ids=["uncalibrated", "calibrated by position"])
@pytest.mark.parametrize("name,counts,line", HOPELESS_CASES, ids=[c[0] for c in HOPELESS_CASES])
def test_rows_not_asked_to_propose_are_those_that_would_draft_nothing(name, counts, line, ratios, chunks):
    """A lookup is not asked to propose for the rows AdaptiveK.hopeless names; the drafts chosen are the
    same as when every row proposes, for every combination of proposal lengths 0..4 (also with each draft
    position calibrated apart, and in a round that prefills prompt chunks too)."""
    import copy

    from batchspec.engine.control.acceptance_model import RowAcceptance
    from batchspec.engine.control.adaptive import AdaptiveK
    from batchspec.engine.control.costs import PackedCosts, RoundCost
    from batchspec.engine.drafters.base import LOOKUP_POLICY

    costs = PackedCosts()
    for n in (8, 40, 12, 64):  # rounds of n tokens, a forward on the line and 1 ms more
        costs.observe(RoundCost(0, 1, line[0] + line[1] * n + 0.001, tokens=n, verify_s=line[0] + line[1] * n))
    controller = AdaptiveK(k_max=4, policy=LOOKUP_POLICY, costs=costs)
    controller.packed.rounds = 1  # past the alternating start, and far from a probe
    controller.packed.next_probe = 10**6
    for c, ratio in zip(controller.acceptance.calibration, ratios or ()):
        c.realized, c.predicted = 10.0 * ratio, 10.0
    slots = list(range(len(counts)))
    for slot, (accepted, rejected) in zip(slots, counts):
        controller.acceptance.rows[slot] = RowAcceptance(accepted, rejected)
    base = len(slots) + chunks
    if chunks:  # sampling's credit spent: 2% of a round with 200 prompt tokens in it buys every weak row a draft
        controller.packed._credit = -1.0
    assert controller.hopeless(slots, base, costs) == [False] * len(slots)  # exploring: explore may draft any row
    controller.acceptance.evidence = controller.explore_evidence  # past exploration: the choice's own drafts
    hopeless = controller.hopeless(slots, base, costs)
    if ratios is None:  # the cases' own point (calibrated, the weak rows of "expensive tokens" lose their first draft too)
        if name.startswith("cheap"):
            assert not any(hopeless)
        else:
            assert any(hopeless) and not all(hopeless), hopeless
    for offers in itertools.product(range(5), repeat=len(slots)):
        asked = [0 if h else n for h, n in zip(hopeless, offers)]
        full = copy.deepcopy(controller).choose_rows(slots, list(offers), [0] * len(slots), None, base, costs)
        cut = copy.deepcopy(controller).choose_rows(slots, asked, [0] * len(slots), None, base, costs)
        assert full == cut, (offers, hopeless)
        assert all(k == 0 for k, h in zip(full[1], hopeless) if h)


CALIBRATED_CASES = [  # (name, gains per row, each position's calibration ratio, the gains choose_drafts gets)
    ("ratio 1 everywhere", [[0.5, 0.25, 0.125]], (1.0, 1.0, 1.0), [[0.5, 0.25, 0.125]]),
    ("deeper drafts accepted less than predicted", [[0.6, 0.5, 0.4, 0.3]], (1.0, 0.8, 0.5, 0.5),
     [[0.6, 0.4, 0.2, 0.15]]),
    ("a later position calibrated up stays below the one before", [[0.5, 0.45]], (0.8, 1.5), [[0.4, 0.4]]),
    ("rows of different lengths", [[0.5], [], [0.8, 0.6]], (0.5, 1.0), [[0.25], [], [0.4, 0.4]]),
]


@pytest.mark.parametrize("name,gains,ratios,expected", CALIBRATED_CASES, ids=[c[0] for c in CALIBRATED_CASES])
def test_gains_are_calibrated_by_draft_position(name, gains, ratios, expected):
    from batchspec.engine.control.adaptive import AdaptiveK

    controller = AdaptiveK(k_max=len(ratios))
    for c, ratio in zip(controller.acceptance.calibration, ratios):
        c.realized, c.predicted = 10.0 * ratio, 10.0
    assert controller.acceptance.calibrated(gains) == [pytest.approx(row) for row in expected]


def test_each_draft_position_learns_its_own_calibration():
    """A packed round's rows drafted [2, 3, 1] deep and kept [2, 1, 0]: position 1 saw 2 of 3 accepted, position
    2 one of 2, position 3 none of 1, against the gains predicted for each (after the decay of the weak start)."""
    from batchspec.engine.control.adaptive import AdaptiveK

    controller = AdaptiveK(k_max=3)
    controller.acceptance.expect({0: [0.9, 0.8], 1: [0.7, 0.5, 0.3], 2: [0.6]})
    controller.learn(3, [0, 1, 2], [3, 3, 3], [2, 3, 1], [2, 1, 0])
    d = controller.acceptance.pooled_decay
    got = [(c.realized, c.predicted) for c in controller.acceptance.calibration]
    assert got == [pytest.approx((2 * d + 2, 2 * d + 2.2)), pytest.approx((2 * d + 1, 2 * d + 1.3)),
                   pytest.approx((2 * d + 0, 2 * d + 0.3))]
    assert controller.acceptance.gains == {}


LEARNT_ROUNDS = [
    # name, the round (tokens, prompt tokens, verify seconds, drafting forwards, exploring, drafts), which lines
    # moved (verify, rest, step)
    ("a decoding round with drafts", (96, 0, 0.040, ((64, 0.012),), False, 64), (True, True, True)),
    ("a round that prefilled prompt chunks", (1200, 1100, 0.900, (), False, 64), (False, False, False)),
    ("a decoding round wider than twice the widest measured", (400, 0, 0.090, (), False, 64), (False, False, False)),
    ("a drafting forward that fed prompts", (96, 0, 0.040, ((900, 0.150),), False, 64), (True, False, False)),
    ("an exploring round", (33, 0, 0.031, ((2, 0.008),), True, 1), (True, False, True)),
    ("a round of 7 drafts over 32 rows, fewer than a quarter", (39, 0, 0.032, (), False, 7), (True, False, False)),
    ("a round of 8 drafts over 32 rows", (40, 0, 0.032, (), False, 8), (True, True, False)),
    ("a round without drafts", (32, 0, 0.030, (), False, 0), (True, True, False)),
]


@pytest.mark.parametrize("name,round,moved", LEARNT_ROUNDS, ids=[r[0] for r in LEARNT_ROUNDS])
def test_cost_lines_learn_from_forwards_the_size_of_drafting(name, round, moved):
    """Started from the machine's points at batch 32 (k 4: forwards of 32, 160 and 64 tokens; drafting forwards of
    32 and 8), the lines price a few drafts a row: a round that prefilled prompts (admission's host work in its
    rest too), a forward past twice the widest measured, a drafting forward that fed a prompt do not move them;
    nor does an exploring round (one draft or two), or a round with fewer drafts than a quarter of its rows (its
    rows' host work that is not per draft), move the rest of a round's price per draft."""
    from batchspec.engine.control.costs import RoundCost
    from batchspec.engine.control.startup_costs import StartupCosts

    costs = PackedCosts()
    costs.start_from(StartupCosts(verify=((32, 0.030), (160, 0.054), (64, 0.036)), step=((32, 0.012), (8, 0.008))))
    verify, step, rest = costs.verify.fit(), costs.step.fit(), costs.rest.fit()
    tokens, prompt, verify_s, steps, exploring, drafts = round
    costs.observe(RoundCost(4, 32, verify_s + sum(s for _, s in steps) + 0.004, drafts, tokens, verify_s, steps,
                            prompt_tokens=prompt, exploring=exploring))
    assert (costs.verify.fit() != verify, costs.rest.fit() != rest, costs.step.fit() != step) == moved
