"""drafter=eagle in the engine: exact with any head (a random one proposes nonsense, which must never change
a token), through the API's head folder, on Llama, Qwen2 and GPT-2 targets, eager and static."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM

import batchspec
from batchspec.eagle.config import HeadError
from batchspec.eagle.formats import save_head
from batchspec.training.init import head_for_target
from batchspec.engine.model.host_device import LaunchCounter
from conftest import MAX_NEW
from tiny import PROMPTS


def head_dir(path, target_dir, seed: int = 0, vocab: torch.Tensor | None = None):
    """A random head for the target, saved as an EAGLE-3 folder; the head's fc scaled down so that its
    hidden state is dominated by the token embedding (a random head that still guesses some tokens)."""
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    torch.manual_seed(seed)
    head = head_for_target(target, draft_target_ids=vocab)
    with torch.no_grad():
        head.fc.weight.mul_(0.01)
    return save_head(head, path)


@pytest.fixture(scope="module")
def heads(tmp_path_factory, pair):
    root = tmp_path_factory.mktemp(f"heads-{pair.arch}")
    reduced = torch.arange(0, pair.tokenizer.vocab_size, 2)  # a draft vocabulary of every other token
    return head_dir(root / "full", pair.target), head_dir(root / "reduced", pair.target, seed=1, vocab=reduced)


# batch, k, tree, compile, adaptive, reduced vocabulary
CASES = [(1, 3, None, "off", False, False), (3, 4, None, "static", False, True), (8, 2, None, "off", True, True),
         (3, 4, "2x3", "off", False, False), (8, 4, "3x2", "static", True, False)]


@pytest.mark.parametrize("batch_size,k,tree,compile,adaptive,reduced", CASES,
                         ids=[f"b{b}-k{k}-{t or 'chain'}-{c}-{'adaptive' if a else 'fixed'}{'-reduced' if r else ''}"
                              for b, k, t, c, a, r in CASES])
def test_greedy_parity(pair, heads, request, batch_size, k, tree, compile, adaptive, reduced):
    if adaptive:  # a head's step timed under load could read too dear to draft at all (conftest)
        request.getfixturevalue("drafting_priced_cheap")
    results = batchspec.generate(PROMPTS, target=str(pair.target), draft=str(heads[int(reduced)]), drafter="eagle",
                                 k=k, batch_size=batch_size, max_new_tokens=MAX_NEW, tree=tree, compile=compile,
                                 adaptive=adaptive)
    assert [r.completion_token_ids for r in results] == pair.reference
    assert sum(r.draft_tokens for r in results) > 0


def test_trees_of_different_widths_in_turn(monkeypatch):
    """Rounds alternate between a tree of 16 nodes and one of 4 (as adaptive speculation may choose between them),
    with the demo head, which accepts deep into the wide tree: the head reads the target's features along each
    round's accepted path within that round's width, never at a wider round's leftover positions (before, an
    index error), and the output is drafter none's."""
    from batchspec.bench.calibrate import DEMO, read_prompts
    from batchspec.engine.round import RoundShape
    from batchspec.engine.scheduler import Scheduler

    prompts = read_prompts(str(DEMO / "prompts.parquet"), 8)
    common = dict(target=str(DEMO / "target"), batch_size=4, max_new_tokens=32)
    expected = batchspec.generate(prompts, drafter="none", **common)
    turns, choose = iter(range(10**6)), Scheduler._choose_round

    def in_turn(self, plan, offer, priors):
        shape, budgets = choose(self, plan, offer, priors)
        return RoundShape(tree=self.trees[next(turns) % 2]), budgets

    monkeypatch.setattr(Scheduler, "_choose_round", in_turn)
    results = batchspec.generate(prompts, draft=str(DEMO / "eagle"), drafter="eagle", k=4, tree="2x8,2x2",
                                 adaptive=False, **common)
    assert [r.completion_token_ids for r in results] == [r.completion_token_ids for r in expected]
    assert {t for r in results for t in r.tree_per_round} == {"", "2x8", "2x2"}
    assert max(a for r in results for a in r.accepted_per_round) >= 3  # deep enough to leave wide positions


@pytest.mark.parametrize("tree", [None, "2x3"])
def test_eager_and_static_draft_the_same_with_the_demo_head(tree):
    """The captured path's head steps are the eager ones, with the shipped demo head (which guesses most
    tokens): the same text and the same acceptance within float noise. (Round boundaries differ: on the
    static path a new row learns its first token with its first round, which therefore drafts nothing.)"""
    from batchspec.bench.calibrate import DEMO, read_prompts

    prompts = read_prompts(str(DEMO / "prompts.parquet"), 16)
    runs = [batchspec.generate(prompts, target=str(DEMO / "target"), draft=str(DEMO / "eagle"), drafter="eagle", k=4,
                               batch_size=4, max_new_tokens=32, compile=c, adaptive=False, tree=tree)
            for c in ("off", "static")]
    assert [r.completion_token_ids for r in runs[0]] == [r.completion_token_ids for r in runs[1]]
    per_forward = [sum(r.completion_tokens for r in run) / sum(r.target_forwards for r in run) for run in runs]
    assert per_forward[0] > 2.5 and abs(per_forward[0] - per_forward[1]) < 0.15 * per_forward[0], per_forward


# Which rows draft nothing (by round index i and row index j in the round), and the most entries a row may
# hold before catching up (16 and 3: less than a prompt, whose entries the head then computes as it comes in;
# 4096: every prompt waits in the stash until its row first drafts).
SKIPPED = [("two of three", lambda i, j: i % 3 != 2, 16), ("runs of seven", lambda i, j: i % 9 < 7, 16),
           ("runs past the stash", lambda i, j: i % 9 < 7, 3), ("prompts wait", lambda i, j: i % 9 < 7, 4096),
           ("prompts wait, most rounds plain", lambda i, j: i % 6 != 0, 4096),
           ("some rows draft", lambda i, j: (i + j) % 3 != 0, 4096), ("some rows draft, short stash",
                                                                      lambda i, j: (i + 2 * j) % 5 < 2, 3)]


@pytest.mark.parametrize("pattern,lag", [(p, lag) for _, p, lag in SKIPPED], ids=[name for name, _, _ in SKIPPED])
def test_rounds_that_draft_nothing_skip_the_head_and_lose_nothing(monkeypatch, pattern, lag):
    """Rows that draft nothing in an eager round run no head forward; their entries wait in the stash (or,
    past LAG_MAX, are caught up anyway), as do the prompts' when they fit. The head must then draft exactly
    what a head that never skips drafts: the same tokens, and the same drafts accepted in every round of
    every request (LAG_MAX = 0 never skips). Greedy, the shipped demo head (which guesses most tokens, so a
    misaligned stash shows)."""
    from batchspec.bench.calibrate import DEMO, read_prompts
    from batchspec.engine.drafters import eagle

    prompts = read_prompts(str(DEMO / "prompts.parquet"), 8)
    propose, forwards = eagle.EagleDrafter._propose, []

    def draft_some(self, plan, choice, spec):
        budgets = [0 if pattern(len(forwards), j) else k for j, k in enumerate(choice.budgets)]
        choice = dataclasses.replace(choice, budgets=budgets)
        forwards.append(None)
        return propose(self, plan, choice, spec)

    monkeypatch.setattr(eagle.EagleDrafter, "_propose", draft_some)
    runs = []
    for lag_max in (0, lag):
        monkeypatch.setattr(eagle, "LAG_MAX", lag_max)
        forwards.clear()
        runs.append(batchspec.generate(prompts, target=str(DEMO / "target"), draft=str(DEMO / "eagle"),
                                       drafter="eagle", k=4, batch_size=4, max_new_tokens=48, adaptive=False))
    plain = batchspec.generate(prompts, target=str(DEMO / "target"), drafter="none", batch_size=4, max_new_tokens=48)
    for run in runs:
        assert [r.completion_token_ids for r in run] == [r.completion_token_ids for r in plain]
    assert [r.accepted_per_round for r in runs[1]] == [r.accepted_per_round for r in runs[0]]
    assert sum(r.accepted_tokens for r in runs[0]) > 100  # the head guesses: a misaligned stash would show


def test_coupled_sampling_is_plain_decodings(llama_pair, tmp_path):
    head = head_dir(tmp_path / "head", llama_pair.target)
    common = dict(target=str(llama_pair.target), max_new_tokens=16, temperature=0.9, top_p=0.95, seed=3)
    plain = batchspec.generate(PROMPTS, drafter="none", **common)
    for tree, compile in ((None, "off"), ("2x2", "static")):
        got = batchspec.generate(PROMPTS, draft=str(head), drafter="eagle", k=3, batch_size=5, tree=tree,
                                 compile=compile, **common)
        assert [r.completion_token_ids for r in got] == [r.completion_token_ids for r in plain]


def test_launches_are_bounded(llama_pair, tmp_path):
    head = head_dir(tmp_path / "head", llama_pair.target)
    models = batchspec.load_models(str(llama_pair.target), head=str(head))
    counter = LaunchCounter()
    generator = batchspec.build_generator(models, drafter="eagle", k=3, batch_size=4, max_new_tokens=MAX_NEW,
                                          compile="static", launches=counter, adaptive=False)
    with counter:
        list(generator.run(batchspec.Request(str(i), p) for i, p in enumerate(PROMPTS)))
    rounds = generator.stats.rounds
    assert sum(n for phase, n in counter.ops.items() if phase != "admit") / rounds <= 8, counter.ops
    assert counter.in_step == [] and counter.syncs.get("accept") == rounds


def test_a_head_for_another_target_is_one_line(pair, llama_pair, tmp_path):
    head = head_dir(tmp_path / "head", llama_pair.target)
    other = llama_pair.target.parent / "draft"  # a 1-layer, hidden-32 model: another hidden size and depth
    with pytest.raises(HeadError, match="hidden size|layer"):
        batchspec.load_models(str(other), head=str(head))
