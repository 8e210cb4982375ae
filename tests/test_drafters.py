"""The drafters on hand-made sequences."""

from __future__ import annotations

import pytest
import torch

from batchspec.engine.drafters import NGramDrafter, PromptLookupDrafter
from batchspec.engine.round import Choice, Plan, RoundBuffers
from batchspec.engine.types import TreeSpec


def context(seqs: list[list[int]], k: list[int]) -> tuple[Plan, Choice]:
    """A plan over rows 0..b-1 (slots = rows) whose rows may draft k[i] tokens, and the choice asking for them."""
    b = len(seqs)
    buffers = RoundBuffers(b, 8, 32, torch.device("cpu"), noise=False, probs=False, trees=True)
    plan = Plan(rows=list(range(b)), rows_t=torch.arange(b), span=slice(0, b), lengths=[len(s) for s in seqs],
                lengths_t=torch.tensor([len(s) for s in seqs]), running=list(range(b)), room=list(k), limits=list(k),
                buffers=buffers)
    return plan, Choice(list(k))


def proposals(draft) -> list[list[int]]:
    return [row[:n] for row, n in zip(draft.tokens.tolist(), draft.num_tokens.tolist())]


THE, CAT, SAT, ON, MAT, DOT, DOWN, AND = range(10, 18)

NGRAM_CASES = [
    # name, sequence, k, expected
    ("chains_longest_context",  [THE, CAT, SAT, ON, THE, MAT, DOT, THE, CAT, SAT], 3, [ON, THE, MAT]),
    ("most_frequent_wins", [SAT, ON, SAT, ON, SAT, DOWN, SAT], 1, [ON]),
    ("tie_goes_to_most_recent", [SAT, ON, SAT, DOWN, SAT], 1, [DOWN]),
    ("falls_back_to_shorter_context", [CAT, SAT, ON, MAT, SAT], 2, [ON, MAT]),
    ("unseen_token_proposes_nothing", [CAT, SAT, ON, AND], 4, []),
    ("k_zero", [SAT, ON, SAT], 0, []),
]


@pytest.mark.parametrize("name,seq,k,expected", NGRAM_CASES, ids=[c[0] for c in NGRAM_CASES])
def test_ngram(name, seq, k, expected):
    drafter = NGramDrafter()
    drafter.admit([0], [seq])
    assert proposals(drafter.propose(*context([seq], [k]))) == [expected]


def test_ngram_learns_committed_tokens():
    drafter = NGramDrafter()
    drafter.admit([0], [[CAT, SAT]])
    assert proposals(drafter.propose(*context([[CAT, SAT]], [2]))) == [[]]
    drafter.extend([0], [[ON, CAT, SAT]], [0])
    seq = [CAT, SAT, ON, CAT, SAT]
    assert proposals(drafter.propose(*context([seq], [2]))) == [[ON, CAT]]


LOOKUP_CASES = [
    ("most_recent_match", [1, 2, 3, 9, 1, 2, 4, 1, 2], 2, [4, 1]),
    ("longest_ngram_first", [5, 2, 7, 1, 2, 8, 5, 2], 1, [7]),
    ("continuation_stops_at_sequence_end", [1, 2, 3, 1, 2], 4, [3, 1, 2]),
    ("no_match", [1, 2, 3, 4], 3, []),
]


@pytest.mark.parametrize("name,seq,k,expected", LOOKUP_CASES, ids=[c[0] for c in LOOKUP_CASES])
def test_prompt_lookup(name, seq, k, expected):
    drafter = PromptLookupDrafter()
    drafter.admit([0], [seq])
    assert proposals(drafter.propose(*context([seq], [k]))) == [expected]


def test_prompt_lookup_batched_rows_are_independent():
    rows = [case[1] for case in LOOKUP_CASES]
    ks = [case[2] for case in LOOKUP_CASES]
    drafter = PromptLookupDrafter()
    drafter.admit(list(range(len(rows))), rows)
    assert proposals(drafter.propose(*context(rows, ks))) == [case[3] for case in LOOKUP_CASES]


def test_prompt_lookup_learns_emitted_tokens_incrementally():
    """The index grows with extend exactly as if the whole sequence had been admitted at once."""
    seq = LOOKUP_CASES[0][1]
    whole, grown = PromptLookupDrafter(), PromptLookupDrafter()
    whole.admit([0], [seq])
    grown.admit([0], [seq[:3]])
    grown.extend([0], [seq[3:6]], [0])
    grown.extend([0], [seq[6:]], [0])
    assert proposals(grown.propose(*context([seq], [2]))) == proposals(whole.propose(*context([seq], [2]))) == [[4, 1]]


LAZY_CASES = [  # drafter, a row's tokens: learning put off (lazy) proposes as learning every token at once
    ("ngram", NGramDrafter, [THE, CAT, SAT, ON, THE, MAT, DOT, THE, CAT, SAT, ON, THE, CAT, SAT, DOWN, THE, CAT]),
    ("prompt_lookup", PromptLookupDrafter, [1, 2, 3, 9, 1, 2, 4, 1, 2, 3, 9, 1, 2, 4, 5, 1, 2, 3]),
]


@pytest.mark.parametrize("name,make,seq", LAZY_CASES, ids=[c[0] for c in LAZY_CASES])
def test_lazy_learning_proposes_as_eager_learning(name, make, seq):
    """Rows 0 and 1 grow by the same chunks; row 0 proposes every step, row 1 only at some steps, with
    learn_pending (the verify pass's call while a captured verify runs) at others. At every step each row's
    proposal equals that of a drafter admitted with the row's whole sequence so far; a row that does not
    propose keeps its tokens queued."""
    lazy = make()
    lazy.admit([0, 1], [seq[:3], seq[:3]])
    at, step = 3, 0
    for chunk in (1, 2, 1, 3, 1, 1, 2, 1, 1):
        if at + chunk > len(seq):
            break
        lazy.extend([0, 1], [seq[at : at + chunk]] * 2, [0, 0])
        at, step = at + chunk, step + 1
        whole = make()
        whole.admit([0], [seq[:at]])
        want = proposals(whole.propose(*context([seq[:at]], [3])))[0]
        k1 = 3 if step % 3 == 0 else 0
        got = proposals(lazy.propose(*context([seq[:at], seq[:at]], [3, k1])))
        assert got[0] == want
        assert got[1] == (want if k1 else [])
        if k1 == 0:
            assert lazy.pending[1], "a row that did not propose learnt nonetheless"
        if step % 4 == 0:
            lazy.learn_pending()
            assert not any(lazy.pending.values())
    lazy.release([0, 1])
    assert lazy.pending == {}


# name, sequence, tree, expected (token, parent) per node: depth-major, siblings in their matches' order, the
# valid nodes first (a packed verify reads a row's first host_num node slots)
TREE_CASES = [
    # (1, 2) follows at 0 (-> 3, 9) and at 4 (-> 4, 1): the most recent match first
    ("two_matches", [1, 2, 3, 9, 1, 2, 4, 1, 2], "2x2", [(4, -1), (3, -1), (1, 0), (9, 1)]),
    # (9, 5) follows at 0 (-> 6, 7, 9) and at 4 (-> 6, 8, 9): both start with 6, one node for it
    ("shared_prefix_merged", [9, 5, 6, 7, 9, 5, 6, 8, 9, 5], "2x3", [(6, -1), (8, 0), (7, 0), (9, 1), (9, 2)]),
    ("no_match", [1, 2, 3], "2x2", []),
]


@pytest.mark.parametrize("name,seq,tree,expected", TREE_CASES, ids=[c[0] for c in TREE_CASES])
def test_prompt_lookup_trees(name, seq, tree, expected):
    drafter = PromptLookupDrafter()
    drafter.admit([0], [seq])
    draft = drafter.propose_tree(*context([seq], [4]), TreeSpec.parse(tree))
    nodes = [(t, p) for t, p, v in zip(draft.tokens[0].tolist(), draft.parents[0].tolist(), draft.valid[0].tolist()) if v]
    assert nodes == expected
    assert draft.valid[0].tolist() == [True] * len(expected) + [False] * (draft.valid.shape[1] - len(expected))
    assert draft.num_tokens.tolist() == draft.host_num == [len(expected)]
