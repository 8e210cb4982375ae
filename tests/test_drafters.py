"""The drafters on hand-made sequences."""

from __future__ import annotations

import pytest
import torch

from batchspec.engine.drafters import DraftContext, NGramDrafter, PromptLookupDrafter


def context(seqs: list[list[int]], k: list[int]) -> DraftContext:
    width = max(len(s) for s in seqs) + 8
    tokens = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
    return DraftContext(rows=list(range(len(seqs))), lengths=[len(s) for s in seqs], k=k, tokens=tokens,
                        presence=None, noise_keys=torch.zeros(len(seqs), dtype=torch.long))


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
    drafter = NGramDrafter(torch.device("cpu"))
    drafter.admit([0], [seq])
    assert proposals(drafter.propose(context([seq], [k]))) == [expected]


def test_ngram_learns_committed_tokens():
    drafter = NGramDrafter(torch.device("cpu"))
    drafter.admit([0], [[CAT, SAT]])
    assert proposals(drafter.propose(context([[CAT, SAT]], [2]))) == [[]]
    drafter.commit([0], [[ON, CAT, SAT]], [0])
    seq = [CAT, SAT, ON, CAT, SAT]
    assert proposals(drafter.propose(context([seq], [2]))) == [[ON, CAT]]


LOOKUP_CASES = [
    ("most_recent_match", [1, 2, 3, 9, 1, 2, 4, 1, 2], 2, [4, 1]),
    ("longest_ngram_first", [5, 2, 7, 1, 2, 8, 5, 2], 1, [7]),
    ("continuation_stops_at_sequence_end", [1, 2, 3, 1, 2], 4, [3, 1, 2]),
    ("no_match", [1, 2, 3, 4], 3, []),
]


@pytest.mark.parametrize("name,seq,k,expected", LOOKUP_CASES, ids=[c[0] for c in LOOKUP_CASES])
def test_prompt_lookup(name, seq, k, expected):
    drafter = PromptLookupDrafter(torch.device("cpu"))
    assert proposals(drafter.propose(context([seq], [k]))) == [expected]


def test_prompt_lookup_batched_rows_are_independent():
    rows = [case[1] for case in LOOKUP_CASES]
    ks = [case[2] for case in LOOKUP_CASES]
    drafter = PromptLookupDrafter(torch.device("cpu"))
    assert proposals(drafter.propose(context(rows, ks))) == [case[3] for case in LOOKUP_CASES]
