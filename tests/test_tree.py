"""Tree drafts: geometry, the tree mask and compaction against fresh forwards, greedy acceptance, and
multi-draft rejection sampling against p (statistical: stated n and threshold, shown to fail on a
mutated residual update)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from batchspec.engine import tree as tree_module
from batchspec.engine.model.graphs import StepGraphs
from batchspec.engine.model.runner import ModelRunner
from batchspec.engine.tree import compaction, follow, follow_rejection, tree_mask, tree_shape

#        root
#       /    \
#     n0      n1
#    /  \       \
#  n2    n3      n4
#  |
#  n5
PARENTS = [-1, -1, 0, 0, 1, 2]
DEPTHS = [0, 1, 1, 2, 2, 2, 3]  # by verify position t (0 = root)
RANKS = [0, 1, 0, 1, 0, 0]


def shape_of(parents, valid=None):
    p = torch.tensor([parents])
    return tree_shape(p, torch.ones_like(p, dtype=torch.bool) if valid is None else torch.tensor([valid]))


def test_geometry():
    shape = shape_of(PARENTS)
    assert shape.depth[0].tolist() == DEPTHS
    assert shape.rank[0].tolist() == RANKS
    anc = shape.ancestors[0]
    assert [u for u in range(7) if anc[6, u]] == [0, 1, 3, 6]  # n5: root, n0, n2, itself
    assert [u for u in range(7) if anc[5, u]] == [0, 2, 5]  # n4: root, n1, itself
    assert [u for u in range(7) if anc[0, u]] == [0]


def test_mask_sees_the_prefix_and_the_ancestors_only():
    shape = shape_of(PARENTS)
    mask = tree_mask(torch.tensor([3]), shape.ancestors, 12, torch.float32)[0, 0] == 0  # [T, kv]
    assert mask[:, :3].all()  # the prefix
    assert mask[6, 3:10].tolist() == [True, True, False, True, False, False, True]  # root n0 n1 n2 n3 n4 n5
    assert not mask[:, 10:].any()


@pytest.fixture(scope="module")
def model(llama_pair):
    return AutoModelForCausalLM.from_pretrained(llama_pair.target, dtype=torch.float32).eval()


def fresh(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1]


@pytest.mark.parametrize("capture", [None, "static"], ids=["eager_rows", "static"])
def test_tree_forward_and_compaction_equal_fresh_computations(model, capture):
    """Each node's logits equal a fresh forward of prefix + its path; after compacting an accepted path
    the next step sees exactly prefix + path."""
    prefix = [[5, 6, 7, 8, 9], [10, 11, 12]]
    runner = ModelRunner(model, num_slots=2, capacity=32, max_position=32, graphs=StepGraphs(capture, model.device),
                         widths=range(1, 8), name="t")
    runner.prefill([0, 1], torch.tensor([prefix[0], prefix[1] + [0, 0]]), [0, 0], [5, 3])
    roots = [20, 21]
    nodes = [[30, 31, 32, 33, 34, 35], [40, 41, 42, 43, 44, 45]]
    parents = torch.tensor([PARENTS, [-1, 0, 1, -1, 3, 2]])
    shape = tree_shape(parents, torch.ones_like(parents, dtype=torch.bool))
    tokens = torch.tensor([[roots[i]] + nodes[i] for i in range(2)])
    rows = None if capture else torch.tensor([0, 1])
    logits = runner.forward(tokens, kv_len=5 + 7, rows=rows, tree=shape)
    for i in range(2):
        for t in range(7):
            path = [nodes[i][u - 1] for u in range(1, 7) if shape.ancestors[i, t, u]]
            torch.testing.assert_close(logits[i, t], fresh(model, prefix[i] + [roots[i]] + path), atol=1e-4, rtol=1e-4)
    # Accept n0 -> n2 -> n5 in row 0 (positions 1, 3, 6) and one node in row 1 (position 4: the second root child).
    chain = torch.tensor([[0, 1, 3, 6, 6, 6, 6], [0, 4, 4, 4, 4, 4, 4]])
    num = torch.tensor([3, 1])
    src, dst = compaction(runner.lengths[:2].clone(), chain, num)
    runner.compact(torch.tensor([0, 1]), src, dst)
    runner.set_lengths(slice(0, 2), runner.lengths[:2] + 1 + num)
    accepted = [[nodes[0][0], nodes[0][2], nodes[0][5]], [nodes[1][3]]]
    nxt = runner.forward(torch.tensor([[50], [51]]), kv_len=12, rows=rows)
    for i in range(2):
        torch.testing.assert_close(nxt[i, 0], fresh(model, prefix[i] + [roots[i]] + accepted[i] + [50 + i]),
                                   atol=1e-4, rtol=1e-4)


FOLLOW_CASES = [
    # name, node tokens, target token after each position t = 0..6, accepted depth, emitted
    ("second_branch", [1, 2, 3, 4, 5, 6], [2, 9, 5, 9, 9, 8, 9], 2, [2, 5, 8]),
    ("deepest", [1, 2, 3, 4, 5, 6], [1, 3, 9, 6, 9, 9, 7], 3, [1, 3, 6, 7]),
    ("sibling_after_a_miss", [1, 2, 3, 4, 5, 6], [1, 4, 9, 9, 8, 9, 9], 2, [1, 4, 8]),
    ("nothing", [1, 2, 3, 4, 5, 6], [7, 9, 9, 9, 9, 9, 9], 0, [7]),
]


@pytest.mark.parametrize("name,drafts,target,depth,emitted", FOLLOW_CASES, ids=[c[0] for c in FOLLOW_CASES])
def test_follow_takes_the_child_the_target_would_emit(name, drafts, target, depth, emitted):
    verdict = follow(torch.tensor([target]), torch.tensor([drafts]), shape_of(PARENTS))
    assert verdict.num_accepted.tolist() == [depth]
    assert verdict.tokens[0, : depth + 1].tolist() == emitted


def test_invalid_nodes_are_never_accepted():
    verdict = follow(torch.tensor([[1, 3, 9, 6, 9, 9, 7]]), torch.tensor([[1, 2, 3, 4, 5, 6]]),
                     shape_of(PARENTS, [True, True, False, True, True, True]))  # n2 invalid
    assert verdict.num_accepted.tolist() == [1]


# ---- multi-draft rejection sampling ------------------------------------------------------------------

N = 120_000  # rows per case, each its own draws
ALPHA_Z = 3.09  # one-sided normal quantile for alpha = 0.001
V = 6
P_ROOT = torch.tensor([0.30, 0.25, 0.20, 0.12, 0.08, 0.05])
Q_ROOT = torch.tensor([0.05, 0.10, 0.15, 0.20, 0.25, 0.25])  # far from p: many rejections
P_CHILD = torch.tensor([0.10, 0.40, 0.05, 0.05, 0.20, 0.20])
Q_CHILD = torch.tensor([0.30, 0.10, 0.30, 0.10, 0.10, 0.10])


def chi2_critical(df: int) -> float:
    return df * (1 - 2 / (9 * df) + ALPHA_Z * math.sqrt(2 / (9 * df))) ** 3


def two_level(iid: bool, seed: int = 0):
    """N rows of the tree root -> 3 children (c0 c1 c2), c0 -> 2 children. iid: children drawn i.i.d.
    from q (with repeats); else deterministic, distinct (q one-hot). Returns the first two emitted tokens."""
    g = torch.Generator().manual_seed(seed)
    parents = torch.tensor([-1, -1, -1, 0, 0]).expand(N, 5)
    shape = tree_shape(parents, torch.ones(N, 5, dtype=torch.bool))
    if iid:
        top = torch.multinomial(Q_ROOT.expand(N, V), 3, replacement=True, generator=g)
        low = torch.multinomial(Q_CHILD.expand(N, V), 2, replacement=True, generator=g)
        # what the children of each verify position were drawn from: the root's, then c0's (position 1)
        q = torch.cat([Q_ROOT.expand(N, 1, V), Q_CHILD.expand(N, 5, V)], dim=1)
    else:
        top, low = torch.tensor([5, 4, 3]).expand(N, 3), torch.tensor([0, 2]).expand(N, 2)
        q = None
    drafts = torch.cat([top, low], dim=1)
    # p after each position: root, c0 (whose children were drafted), c1, c2, leaves: P_CHILD everywhere below
    p = torch.cat([P_ROOT.expand(N, 1, V), P_CHILD.expand(N, 5, V)], dim=1)
    u_accept = torch.rand(N, 5, generator=g, dtype=torch.float64)
    u_final = torch.rand(N, 6, generator=g, dtype=torch.float64)
    verdict = follow_rejection(p, drafts, q, shape, u_accept, u_final, max_children=3)
    # A row that accepted nothing emitted one token; its second comes from the next round: a draw from p there.
    next_round = torch.multinomial(P_CHILD.expand(N, V), 1, generator=g)[:, 0]
    second = torch.where(verdict.num_accepted >= 1, verdict.tokens[:, 1], next_round)
    return verdict.tokens[:, 0], second, verdict.num_accepted


def chi2(first: torch.Tensor, second: torch.Tensor) -> tuple[float, float]:
    """The joint (first, second) token counts against P_ROOT x P_CHILD (the second token follows P_CHILD
    after any first token in this tree: every position below the root has it)."""
    expected = (P_ROOT[:, None] * P_CHILD[None, :]).flatten().double() * N
    counts = torch.bincount(first * V + second, minlength=V * V).double()
    stat = ((counts - expected) ** 2 / expected).sum().item()
    return stat, chi2_critical(V * V - 1)


@pytest.mark.parametrize("iid", [True, False], ids=["iid_children", "one_hot_children"])
def test_multi_draft_rejection_follows_p(iid):
    """N rows: the first two emitted tokens' joint distribution equals p's (chi-square < its alpha = 0.001
    quantile), while drafts are accepted (so the test exercises acceptance and residuals)."""
    first, second, accepted = two_level(iid)
    stat, critical = chi2(first, second)
    assert stat < critical, (stat, critical)
    assert (accepted >= 1).float().mean() > 0.2 and (accepted == 2).any()


@pytest.mark.parametrize("iid", [True, False], ids=["iid_children", "one_hot_children"])
def test_a_mutated_residual_update_fails_the_same_test(iid, monkeypatch):
    """After a rejection the residual must become max(0, p' - q): leaving p' as it was (no update) skews
    the output, and the test above catches it."""
    monkeypatch.setattr(tree_module, "residual_after_rejection", lambda residual, q, mass: residual)
    first, second, _ = two_level(iid)
    stat, critical = chi2(first, second)
    assert stat > critical, (stat, critical)


def test_a_tree_wider_than_the_draft_vocabulary_is_refused(llama_pair):
    """B guesses per depth must be distinct tokens: a branching past the vocabulary is a clear error, not a
    top-k failure inside the first round."""
    import batchspec

    models = batchspec.load_models(str(llama_pair.target), str(llama_pair.draft))
    with pytest.raises(ValueError, match=r"tree 400x1: branching 400 exceeds the draft's vocabulary"):
        batchspec.build_generator(models, drafter="model", k=2, tree="400x1")
