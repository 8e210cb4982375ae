"""Greedy output with speculation equals Hugging Face `generate(do_sample=False)` on each prompt alone,
token for token: every drafter x {Llama, Qwen2, GPT-2} x batch {1, 3, 8} x K {1, 4}, on 12 prompts of
different lengths (slots refill mid-run) ending on EOS (two EOS ids) and on max_new_tokens; with the
eager engine (CPU default), the static shapes of the captured path (every slot in every round), and
captured by torch.compile."""

from __future__ import annotations

import pytest

import batchspec
from conftest import MAX_NEW
from tiny import PROMPTS

DRAFTERS = ["none", "ngram", "prompt_lookup", "model-random", "model-identical"]


def run(pair, drafter: str, batch_size: int, k: int, adaptive: bool = False, **kw):
    draft = {"model-random": pair.draft, "model-identical": pair.target}.get(drafter)
    return batchspec.generate(
        PROMPTS, target=str(pair.target), draft=str(draft) if draft else None,
        drafter="model" if draft else drafter, batch_size=batch_size, k=k, max_new_tokens=MAX_NEW,
        adaptive=adaptive, **kw,
    )


def test_references_cover_eos_and_length(pair):
    """The fixture is only a strong test if some prompts stop on EOS and some run to the length limit."""
    ends_on_eos = [ref[-1] in pair.eos_ids for ref in pair.reference]
    assert 1 <= sum(ends_on_eos) < len(PROMPTS), ends_on_eos
    assert any(len(ref) == MAX_NEW for ref in pair.reference)


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("batch_size", [1, 3, 8])
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_greedy_parity(pair, drafter, batch_size, k):
    results = run(pair, drafter, batch_size, k)
    for prompt, result, expected in zip(PROMPTS, results, pair.reference):
        assert result.completion_token_ids == expected, (prompt, result)
        ended_on_eos = expected[-1] in pair.eos_ids
        assert result.finish_reason == ("stop" if ended_on_eos else "length")
        assert result.completion == pair.tokenizer.decode(expected, skip_special_tokens=True)
        assert result.completion_tokens == len(expected)
        # the prefill is the first target forward (it emits the first token, drafts nothing), then verify passes
        assert result.target_forwards == len(result.accepted_per_round) >= 1
        assert result.accepted_per_round[0] == 0
        assert sum(result.accepted_per_round) == result.accepted_tokens <= result.draft_tokens
        assert len(result.drafts_per_round) == result.target_forwards and sum(result.drafts_per_round) == result.draft_tokens
        assert all(a <= d <= k for a, d in zip(result.accepted_per_round, result.drafts_per_round))
    proposed = sum(r.draft_tokens for r in results)
    accepted = sum(r.accepted_tokens for r in results)
    if drafter == "none":
        assert proposed == 0 and all(r.target_forwards == r.completion_tokens for r in results)
    elif drafter == "model-identical":
        assert proposed > 0 and accepted == proposed  # the target drafting for itself: every draft accepted
        # K+1 tokens per verify pass (the forwards after the prefill, which emitted one token) except where
        # a stop or the length limit cut the round short
        verify_passes = sum(r.target_forwards - 1 for r in results)
        assert sum(r.completion_tokens - 1 for r in results) / verify_passes > 0.8 * (k + 1)
    elif drafter == "model-random":
        assert proposed > 0 and accepted / proposed < 0.35
    else:
        assert proposed > 0 and accepted > 0


@pytest.mark.parametrize("drafter", DRAFTERS[1:])
def test_greedy_parity_with_adaptive_k(pair, drafter):
    """Adaptive speculation picks each round's k from timing; the output must not move."""
    results = run(pair, drafter, batch_size=8, k=4, adaptive=True)
    assert [r.completion_token_ids for r in results] == pair.reference


def assert_counts_add_up(r):
    """A request's statistics against its tokens: every round emits its accepted drafts and then one token of
    the target's own, except a last round cut short by an EOS or a stop string, which may end on a draft."""
    assert r.accepted_tokens == sum(r.accepted_per_round) and r.draft_tokens == sum(r.drafts_per_round)
    assert r.target_forwards == len(r.accepted_per_round)
    assert r.target_forwards - 1 <= r.completion_tokens - r.accepted_tokens <= r.target_forwards, r


STOP_CASES = [("none", None), ("ngram", None), ("model-random", None), ("model-identical", None),
              ("model-identical", "2x3"), ("ngram", "2x2")]


@pytest.mark.parametrize("drafter,tree", STOP_CASES, ids=[f"{d}-{t or 'chain'}" for d, t in STOP_CASES])
def test_stop_string_cuts_completion(pair, drafter, tree):
    """A stop string ends the request on accepted text; the completion is cut before it, and the drafts
    of the tokens cut away are counted neither accepted nor checked (model-identical: the stop string
    lands among accepted drafts)."""
    def visible_pair(text):  # a 2-character visible substring in the second half of the text
        return next((text[i : i + 2] for i in range(len(text) // 2, len(text) - 1) if text[i : i + 2].strip()
                     and "\ufffd" not in text[i : i + 2]), None)

    texts = [pair.tokenizer.decode(ref, skip_special_tokens=True) for ref in pair.reference]
    index = next(i for i, text in enumerate(texts) if visible_pair(text))
    stop = visible_pair(texts[index])
    results = run(pair, drafter, batch_size=3, k=4, stop=[stop], tree=tree)
    for result, expected in zip(results, pair.reference):
        assert_counts_add_up(result)
        text = pair.tokenizer.decode(expected, skip_special_tokens=True)
        if stop in text:
            assert result.finish_reason == "stop"
            assert result.completion == text[: text.index(stop)]
            # the kept tokens are a prefix of the reference that contains the stop string
            assert result.completion_token_ids == expected[: len(result.completion_token_ids)]
            assert stop in pair.tokenizer.decode(result.completion_token_ids, skip_special_tokens=True)
        else:
            assert result.completion_token_ids == expected
    assert results[index].finish_reason == "stop"


@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed_k", "adaptive"])
def test_run_aggregates(llama_pair, adaptive):
    models = batchspec.load_models(str(llama_pair.target))
    generator = batchspec.build_generator(models, drafter="ngram", k=3, batch_size=4, max_new_tokens=MAX_NEW,
                                          adaptive=adaptive)
    results = list(generator.run(batchspec.Request(id=str(i), prompt=p) for i, p in enumerate(PROMPTS)))
    stats = generator.stats
    assert stats.requests == len(PROMPTS) and stats.errors == 0
    assert stats.completion_tokens == sum(r.completion_tokens for r in results)
    assert stats.target_forwards == sum(r.target_forwards for r in results)
    assert stats.accepted_tokens == sum(r.accepted_tokens for r in results)
    assert sum(stats.proposed_by_position) == stats.draft_tokens
    assert sum(stats.accepted_by_position) == stats.accepted_tokens
    assert stats.draft_tokens > 0 and stats.draft_tokens == sum(r.draft_tokens for r in results)
    assert len(stats.rounds_by_k) == 4 and sum(stats.rounds_by_k) == stats.rounds
    # a round that verified k drafts had a row proposing k: k-th position proposals >= rounds with k
    assert all(stats.proposed_by_position[k - 1] >= sum(stats.rounds_by_k[k:]) for k in range(1, 4))
    # acceptance can only fall with draft position: accepting position i requires accepting i-1
    assert all(a >= b for a, b in zip(stats.accepted_by_position, stats.accepted_by_position[1:]))
    assert stats.tokens_per_forward == pytest.approx(stats.completion_tokens / stats.target_forwards)


@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed_k", "adaptive"])
@pytest.mark.parametrize("batch_size", [1, 3, 8])
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_greedy_parity_with_static_shapes(pair, drafter, batch_size, adaptive):
    """compile="static": every round's steps take every slot, the chain verify packed (each running row its own
    tokens, rounded up to a token bucket), over length buckets, positions and masks from the device lengths:
    the captured path, uncaptured (tests/test_packed_static.py has the unpacked verify beside it)."""
    results = run(pair, drafter, batch_size, k=3, adaptive=adaptive, compile="static")
    assert [r.completion_token_ids for r in results] == pair.reference
    assert all(r.target_forwards == len(r.accepted_per_round) for r in results)


# Inductor's compiled kernels are cached on disk (torch's FX graph cache): on one worker, the tests that compile
# the tiny Llama's steps find what the first compiled (on a cold cache: 107 s, then 18 s for the next cell, where
# the two workers compiled the same kernels side by side in 88 and 79 s). The cache key holds torch's thread count,
# which the thread guard moves with the load (13.6 s in one warm run, 78.5 s in the next): these cells keep the
# worker's threads, so that a machine that has run them before finds its kernels.
@pytest.mark.slow
@pytest.mark.xdist_group("inductor")
@pytest.mark.parametrize("drafter", ["model-random", "ngram"])
def test_greedy_parity_captured_by_torch_compile(llama_pair, drafter):
    """compile="on" on CPU: the target's verify steps and the draft's steps compiled (inductor), once per
    shape, adaptive choosing among them."""
    draft = str(llama_pair.draft) if drafter == "model-random" else None
    models = batchspec.load_models(str(llama_pair.target), draft)
    generator = batchspec.build_generator(models, drafter="model" if draft else drafter, k=2, batch_size=3,
                                          max_new_tokens=MAX_NEW, adaptive=True, compile="on", guard_threads=False)
    results = sorted(generator.run(batchspec.Request(id=str(i), prompt=p) for i, p in enumerate(PROMPTS)),
                     key=lambda r: int(r.id))  # run() yields in the order requests finish
    assert [r.completion_token_ids for r in results] == llama_pair.reference


# drafter, batch size, tree ("branching x depth"), compile
TREE_CASES = [(d, b, t, "auto") for d in DRAFTERS[1:] for b, t in ((1, "2x3"), (3, "3x2"), (8, "2x4"))]
TREE_CASES += [("model-identical", 3, "2x3", "static"), ("prompt_lookup", 8, "3x3", "static")]


@pytest.mark.parametrize("drafter,batch_size,tree,compile", TREE_CASES,
                         ids=[f"{d}-b{b}-{t}-{c}" for d, b, t, c in TREE_CASES])
def test_greedy_parity_with_trees(pair, drafter, batch_size, tree, compile):
    """Tree drafts (engine/tree.py): every drafter, several shapes and node budgets; one verify forward
    per round for every row's tree, the accepted path compacted into place."""
    results = run(pair, drafter, batch_size, k=4, tree=tree, compile=compile)
    assert [r.completion_token_ids for r in results] == pair.reference
    for r in results:
        assert_counts_add_up(r)
        assert r.target_forwards == len(r.accepted_per_round) == len(r.drafts_per_round) == len(r.tree_per_round)
        assert all(a <= d for a, d in zip(r.accepted_per_round, r.drafts_per_round))
        assert r.tree_per_round[0] == "" and set(r.tree_per_round[1:]) <= {tree}
    if drafter == "model-identical":  # the target drafting for itself: every round as deep as the tree
        depth = int(tree.split("x")[1])
        rounds = [a for r in results for a in r.accepted_per_round[1:]]
        assert sum(a == depth for a in rounds) / len(rounds) > 0.6


@pytest.mark.parametrize("tree", ["2x3", "3x2"])
def test_acceptance_by_position_counts_a_tree_by_depth(pair, tree):
    """A tree proposes one draft position per depth (its B x D nodes are not B x D positions): with the
    target drafting for itself every position it reached is accepted."""
    models = batchspec.load_models(str(pair.target), str(pair.target))
    generator = batchspec.build_generator(models, drafter="model", k=3, batch_size=4, max_new_tokens=MAX_NEW,
                                          tree=tree, adaptive=False)
    results = generator.run(batchspec.Request(id=str(i), prompt=p) for i, p in enumerate(PROMPTS))
    results = sorted(results, key=lambda r: int(r.id))  # run() yields in the order requests finish
    assert [r.completion_token_ids for r in results] == pair.reference
    depth = int(tree.split("x")[1])
    by_position = generator.stats.acceptance_by_position
    assert by_position[:depth] == [1.0] * depth and all(a is None for a in by_position[depth:]), by_position
    assert sum(generator.stats.accepted_by_position) == generator.stats.accepted_tokens


@pytest.mark.parametrize("drafter", ["model-identical", "ngram"])
def test_greedy_parity_with_adaptive_trees(pair, drafter):
    """Adaptive speculation choosing each round between plain decoding, chains and two trees."""
    results = run(pair, drafter, batch_size=8, k=3, adaptive=True, tree="2x3,2x5")
    assert [r.completion_token_ids for r in results] == pair.reference
