"""The suffix-decoding index (engine/drafters/suffix_index.py): hand-worked proposals, the automaton's
statistics against brute-force counting, a brute-force reference of the proposal rules, eviction,
corpus seeding and tree validity."""

from __future__ import annotations

import heapq
import importlib.util
import random
from collections import Counter
from pathlib import Path

import pytest

from batchspec.engine.drafters.suffix_index import ROOT, SuffixAutomaton, SuffixIndex


def index(**kw) -> SuffixIndex:
    kw.setdefault("corpus_max_tokens", 0)  # hand-worked cases: the request's own tokens only unless asked
    return SuffixIndex(**kw)


def chain(prompt, max_tokens=4, corpus=(), extend=(), **kw):
    idx = index(**kw)
    idx.add_corpus(corpus)
    idx.start("r", prompt)
    if extend:
        idx.extend("r", extend)
    return idx.draft("r", max_tokens)


# ---- hand-worked chains ---------------------------------------------------------------------------
# Each: name, prompt, extra settings, max_tokens, expected tokens, expected probabilities, match length.
# The reasoning is in the comment above each case.
CHAIN_CASES = [
    # "1 2" occurred twice before the end, followed by 3 and by 4: 1/2 each, the tie goes to the more
    # recent (4); "1 2 4" was then followed by 1 once (1/2 * 1). A match of 2 may propose 2 tokens.
    ("tie_goes_to_most_recent", [1, 2, 3, 1, 2, 4, 1, 2], {}, 4, [4, 1], [0.5, 0.5], 2),
    # 3 followed "1 2" twice and 4 once: 2/3; then "1 2 3" -> 9 and 8 once each (2/3 * 1/2), the more
    # recent 8. No longer suffix ("7 1 2", ...) occurred before.
    ("most_frequent_wins", [1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 4, 7, 1, 2], {}, 4, [3, 8], [2 / 3, 1 / 3], 2),
    # Overlapping occurrences: the longest earlier suffix is "5 6 7 5 6" (m = 5): 7, 5, 6 with
    # probability 1, and then the text ends.
    ("periodic", [5, 6, 7, 5, 6, 7, 5, 6], {}, 8, [7, 5, 6], [1.0, 1.0, 1.0], 5),
    # "1 2 3" (m = 3) occurred once before, followed by 9 1 2 3: a match of 3 may go 3 deep ...
    ("scaled_by_match", [1, 2, 3, 9, 1, 2, 3], {}, 8, [9, 1, 2], [1.0, 1.0, 1.0], 3),
    # ... max_tokens cuts it ...
    ("max_tokens", [1, 2, 3, 9, 1, 2, 3], {}, 2, [9, 1], [1.0, 1.0], 3),
    # ... spec_factor 0.5 gives floor(1.5) = 1 ...
    ("spec_factor", [1, 2, 3, 9, 1, 2, 3], {"spec_factor": 0.5}, 8, [9], [1.0], 3),
    # ... spec_factor 2 gives 6, but the text has only 4 tokens after the earlier match ...
    ("spec_factor_2", [1, 2, 3, 9, 1, 2, 3], {"spec_factor": 2.0}, 8, [9, 1, 2, 3], [1.0] * 4, 3),
    # ... spec_offset -1 takes one off: floor(3 - 1) = 2 ...
    ("spec_offset", [1, 2, 3, 9, 1, 2, 3], {"spec_offset": -1.0}, 8, [9, 1], [1.0, 1.0], 3),
    # ... max_spec caps the depth whatever the match ...
    ("max_spec", [1, 2, 3, 9, 1, 2, 3], {"max_spec": 1}, 8, [9], [1.0], 3),
    # ... and max_match 2 matches "2 3" (the same occurrences as "1 2 3"): 2 deep.
    ("max_match", [1, 2, 3, 9, 1, 2, 3], {"max_match": 2}, 8, [9, 1], [1.0, 1.0], 2),
    # prior_count 1: one occurrence gives 1 / (1 + 1) per step: 1/2, 1/4, 1/8 ...
    ("prior_count", [1, 2, 3, 9, 1, 2, 3], {"prior_count": 1.0}, 8, [9, 1, 2], [0.5, 0.25, 0.125], 3),
    # ... and min_token_prob stops the chain under it.
    ("prior_count_floor", [1, 2, 3, 9, 1, 2, 3], {"prior_count": 1.0, "min_token_prob": 0.2}, 8, [9, 1],
     [0.5, 0.25], 3),
    # "1 2" -> 3, 4, 5 once each (1/3): under min_token_prob 0.4 nothing is proposed ...
    ("min_token_prob_stops", [1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2], {"min_token_prob": 0.4}, 4, [], [], 0),
    # ... under 0.3 the most recent (5), then "1 2 5" -> 1 (1/3 * 1).
    ("min_token_prob_keeps", [1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2], {"min_token_prob": 0.3}, 4, [5, 1],
     [1 / 3, 1 / 3], 2),
    # A long match with a weak continuation loses to a shorter one with a strong continuation: "3 1 2"
    # (m = 3) -> 8 or 9 (1/2 each: score 1/2 + 1/2 + ...), "1 2" (m = 2) -> 3 three times of four.
    # m=3: [9 (.5), 1 (.5), 2 (.5)] = 1.5; m=2: [3 (.75), 1 (.75)] = 1.5: a tie, the longer match wins.
    ("tie_keeps_longer_match", [3, 1, 2, 8, 1, 2, 3, 3, 1, 2, 9, 1, 2, 3, 1, 2], {}, 4, [9, 1, 2],
     [0.5, 0.5, 0.5], 3),
    # The last token never occurred before: nothing to propose.
    ("no_match", [1, 2, 3, 4], {}, 4, [], [], 0),
    ("empty_prompt", [], {}, 4, [], [], 0),
]


@pytest.mark.parametrize("name,prompt,kw,k,tokens,probs,match", CHAIN_CASES, ids=[c[0] for c in CHAIN_CASES])
def test_chain_hand_worked(name, prompt, kw, k, tokens, probs, match):
    draft = chain(prompt, k, **kw)
    assert draft.tokens == tokens
    assert draft.probs == pytest.approx(probs, rel=1e-12)
    assert draft.parents == list(range(-1, len(tokens) - 1))
    assert draft.match_len == match
    assert draft.source == ("request" if tokens else "")


def test_extend_is_the_same_as_a_longer_prompt():
    seq = [1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2, 3, 1, 2]
    whole = chain(seq)
    for cut in (0, 1, 5, 13):
        parts = chain(seq[:cut], extend=seq[cut:])
        assert (parts.tokens, parts.probs, parts.match_len) == (whole.tokens, whole.probs, whole.match_len)


def test_tree_hand_worked():
    # "1 2" -> 4 (more recent) and 3, 1/2 each; each then -> 1 (1/2). A match of 2 goes 2 deep. Best-first
    # with ties: depth 1 before depth 2, then the order they became candidates.
    idx = index()
    idx.start("r", [1, 2, 3, 1, 2, 4, 1, 2])
    tokens, parents, probs = idx.propose_tree("r", max_nodes=8, max_depth=4)
    assert tokens == [4, 3, 1, 1]
    assert parents == [-1, -1, 0, 1]
    assert probs == pytest.approx([0.5] * 4)
    # The node budget keeps the likeliest nodes first.
    assert idx.propose_tree("r", max_nodes=2, max_depth=4) == ([4, 3], [-1, -1], [0.5, 0.5])
    assert idx.propose_tree("r", max_nodes=8, max_depth=1) == ([4, 3], [-1, -1], [0.5, 0.5])
    assert idx.propose_tree("r", max_nodes=0, max_depth=4) == ([], [], [])


def test_tree_prefers_likelier_deep_node_over_unlikely_sibling():
    # "1 2" -> 3 three times, 4 once: 3 (.75) first, then "1 2 3" -> 9 (.75) before 4 (.25).
    idx = index()
    idx.start("r", [1, 2, 3, 9, 1, 2, 3, 9, 1, 2, 3, 9, 1, 2, 4, 1, 2])
    tokens, parents, probs = idx.propose_tree("r", max_nodes=3, max_depth=4)
    assert tokens == [3, 9, 4]
    assert parents == [-1, 0, -1]
    assert probs == pytest.approx([0.75, 0.75, 0.25])


# ---- the job-wide structure -----------------------------------------------------------------------

def test_corpus_proposes_what_followed_in_other_completions():
    # Nothing in the request repeats; the corpus saw "10 11" -> 12 three times, then 13 twice and 14 once.
    draft = chain([7, 10, 11], corpus=[[10, 11, 12, 13], [10, 11, 12, 14], [5, 10, 11, 12, 13]],
                  corpus_max_tokens=1000)
    assert (draft.tokens, draft.source, draft.match_len) == ([12, 13], "corpus", 2)
    assert draft.probs == pytest.approx([1.0, 2 / 3])


def test_request_and_corpus_take_the_better_score_ties_to_the_request():
    corpus = [[10, 11, 12, 13], [10, 11, 12, 14], [10, 11, 12, 13]]
    # Request: "10 11" -> 12 -> 14 once (score 2) beats the corpus's 12 (1), 13 (2/3) (score 5/3).
    draft = chain([7, 10, 11, 12, 14, 10, 11], corpus=corpus, corpus_max_tokens=1000)
    assert (draft.tokens, draft.source) == ([12, 14], "request")
    # A corpus with 12 -> 13 only scores 2 too: a tie, the request's own tokens win.
    draft = chain([7, 10, 11, 12, 14, 10, 11], corpus=[[10, 11, 12, 13]], corpus_max_tokens=1000)
    assert (draft.tokens, draft.source) == ([12, 14], "request")
    # A longer match in the corpus goes deeper: the request's "11" (m = 1) -> 5 scores 1, the corpus's
    # "9 10 11" (m = 3) -> 12 13 14 scores 3.
    draft = chain([0, 11, 5, 9, 10, 11], 8, corpus=[[9, 10, 11, 12, 13, 14]], corpus_max_tokens=1000)
    assert (draft.tokens, draft.source, draft.match_len) == ([12, 13, 14], "corpus", 3)


def test_finish_adds_the_completion_only_or_with_prompt_context():
    for context, expected in ((0, []), (1, [4])):
        idx = index(corpus_max_tokens=1000, prompt_context=context)
        idx.start("a", [1, 2, 3])
        idx.extend("a", [4, 5])
        idx.finish("a")
        assert idx.corpus_tokens == 2 + context
        idx.start("b", [9, 3])  # "3" ends a prompt: with one token of context the corpus knows 3 -> 4
        assert idx.propose("b", 4)[0] == expected
    idx = index(corpus_max_tokens=1000)
    idx.start("a", [1, 2])
    idx.extend("a", [3, 4])
    idx.finish("a", learn=False)
    assert idx.corpus_tokens == 0
    idx.start("a", [1])  # a finished key may start again
    idx.finish("a")
    assert idx.corpus_tokens == 0  # no completion, nothing learned


def test_a_running_request_sees_completions_that_finish_while_it_runs():
    idx = index(corpus_max_tokens=1000)
    idx.start("slow", [0, 20])
    idx.start("fast", [0, 30])
    assert idx.propose("slow", 4) == ([], [])
    idx.extend("slow", [21, 22])
    idx.extend("fast", [21, 22, 23, 24])
    assert idx.propose("slow", 4) == ([], [])  # "fast" is still running: not in the corpus yet
    idx.finish("fast")
    assert idx.propose("slow", 4)[0] == [23, 24]  # "21 22" (m = 2) -> 23 24
    idx.extend("slow", [23])
    assert idx.propose("slow", 4)[0] == [24]  # the match moved on: "21 22 23" -> 24


def test_a_match_grows_when_a_new_completion_holds_a_longer_one():
    idx = index(corpus_max_tokens=1000)
    idx.add_corpus([[3, 4, 5, 6]])
    idx.start("r", [0, 1, 2, 3, 4])
    assert idx.draft("r", 8).match_len == 2  # "3 4" -> 5 6
    idx.add_corpus([[7, 8, 9]])  # holds no n-gram of the request's tail: the match stands
    assert idx.draft("r", 8).tokens == [5, 6]
    idx.add_corpus([[2, 3, 4, 10, 11, 12]])  # "2 3 4" (m = 3) -> 10 11 12, found by re-matching
    draft = idx.draft("r", 8)
    assert (draft.tokens, draft.match_len) == ([10, 11, 12], 3)
    many = [[7, 8, 9]] * 20 + [[1, 2, 3, 4, 13, 14, 15, 16]]  # more strings than the n-grams kept
    idx.add_corpus(many)
    draft = idx.draft("r", 8)
    assert (draft.tokens, draft.match_len) == ([13, 14, 15, 16], 4)


def test_a_kept_match_follows_a_split_state():
    # The corpus "5 1 2" puts "1" and "5 1" in one state (same occurrences). The request's "9 1" matches
    # "1" (m = 1). A new string "1 3" holds no "9 1" (the match stands) but splits "1" from "5 1": the
    # match must move with "1", whose continuations are now 2 and 3 (1/2 each, 3 the more recent).
    idx = index(corpus_max_tokens=1000)
    idx.add_corpus([[5, 1, 2]])
    idx.start("r", [9, 1])
    assert idx.propose("r", 4) == ([2], [1.0])
    idx.add_corpus([[1, 3]])
    assert idx.propose("r", 4) == ([3], [0.5])


def test_rankings_of_many_children_follow_new_counts():
    # "0" is followed by 1..10 once each and 5 once more: 5 leads (2/11). Two more "0 9" make 9 lead
    # (3/13): a state with this many children keeps its ranking cached, and the cache must notice.
    idx = index(corpus_max_tokens=1000, min_token_prob=0.0)
    idx.add_corpus([[0, i, 100] for i in range(1, 11)] + [[0, 5, 100]])
    idx.start("r", [7, 0])
    tokens, probs = idx.propose("r", 1)
    assert (tokens, probs) == ([5], [pytest.approx(2 / 11)])
    idx.add_corpus([[0, 9, 100], [0, 9, 100]])
    assert idx.propose("r", 1) == ([9], [pytest.approx(3 / 13)])
    tokens, parents, probs = idx.propose_tree("r", 4, 1)
    assert tokens == [9, 5, 10, 8]  # by count, then the most recent of those seen once (10, then 8)
    assert probs == pytest.approx([3 / 13, 2 / 13, 1 / 13, 1 / 13])


def test_add_corpus_seeds_a_warm_start():
    idx = index(corpus_max_tokens=1000)
    idx.add_corpus([[1, 2, 3, 4, 5], [1, 2, 3, 4, 6]])
    idx.start("r", [0, 1, 2, 3])
    tokens, probs = idx.propose("r", 4)
    assert tokens == [4, 6]  # 4 always, then 5 and 6 once each: the more recent, 6
    assert probs == pytest.approx([1.0, 0.5])


def test_eviction_drops_the_oldest_completions_a_segment_at_a_time():
    idx = index(corpus_max_tokens=8, corpus_segments=2)  # segments of 4 tokens
    idx.add_corpus([[1, 2, 3, 4]])  # segment 0: full
    idx.add_corpus([[5, 6, 7]])  # segment 1
    assert idx.corpus_tokens == 7
    idx.start("old", [0, 1, 2])
    idx.start("new", [0, 5, 6])
    assert idx.propose("old", 4)[0] == [3, 4]
    idx.add_corpus([[8, 9]])  # does not fit segment 1: segment 2, and segment 0 goes
    assert idx.corpus_tokens == 5
    assert idx.propose("old", 4)[0] == []  # [1, 2, 3, 4] was evicted
    assert idx.propose("new", 4)[0] == [7]
    idx.add_corpus([list(range(100, 110))])  # longer than a segment: its first 4 tokens are kept
    assert idx.corpus_tokens == 6
    idx.start("long", [0, 100])
    assert idx.propose("long", 8)[0] == [101]  # a match of 1 goes 1 deep
    idx.extend("long", [101, 102])
    assert idx.propose("long", 8)[0] == [103]  # 104.. were never kept


def test_memory_stays_bounded():
    rng = random.Random(1)
    idx = SuffixIndex(corpus_max_tokens=600, corpus_segments=3)
    for i in range(200):
        idx.add_corpus([[rng.randrange(20) for _ in range(rng.randrange(1, 60))]])
        assert idx.corpus_tokens <= 600
        assert idx.corpus_states <= 2 * idx.corpus_tokens + 3  # at most two states per token, one root each
    assert idx.corpus_tokens >= 600 * 2 // 3 - 60  # once full, at least (segments - 1) / segments, less one row


def test_corpus_disabled():
    idx = SuffixIndex(corpus_max_tokens=0)
    idx.add_corpus([[1, 2, 3]])
    assert idx.corpus_tokens == 0


def test_api_errors():
    idx = index()
    idx.start("r", [1])
    with pytest.raises(ValueError):
        idx.start("r", [1])
    for call in (lambda: idx.extend("x", [1]), lambda: idx.propose("x", 4), lambda: idx.finish("x")):
        with pytest.raises(KeyError):
            call()
    for bad in ({"max_match": 0}, {"max_spec": 0}, {"corpus_segments": 0}, {"corpus_max_tokens": -1},
                {"min_token_prob": 1.5}, {"prompt_context": -1}, {"prior_count": -1.0}):
        with pytest.raises(ValueError):
            SuffixIndex(**bad)
    assert idx.propose("r", 0) == ([], [])
    assert idx.active == ["r"]


# ---- the automaton against brute force -------------------------------------------------------------

def occurrences(strings, x):
    return [(s, i) for s, seq in enumerate(strings) for i in range(len(seq) - len(x) + 1) if seq[i:i + len(x)] == x]


@pytest.mark.parametrize("seed", range(6))
def test_automaton_counts_match_brute_force(seed):
    """Every substring of at most window - 1 tokens: its count, how often it is followed, its most
    recent end, and every continuation's count up to the window, in closed strings and an open one."""
    rng = random.Random(seed)
    window = rng.randint(2, 7)
    automaton = SuffixAutomaton(window)
    strings, serial, ends = [], 0, {}
    for k in range(rng.randint(1, 4)):
        seq = [rng.randint(0, rng.choice([1, 2, 4])) for _ in range(rng.randint(0, 40))]
        strings.append(seq)
        automaton.begin()
        automaton.extend(seq)
        for i in range(len(seq)):
            ends[(k, i)] = serial + i
        serial += len(seq)
        if rng.random() < 0.7:
            automaton.close()
    substrings = {tuple(s[i:i + n]) for s in strings for n in range(1, window) for i in range(len(s) - n + 1)}
    for x in map(list, substrings):
        state, matched = automaton.match(x, window)
        assert matched == len(x) and state != ROOT
        occ = occurrences(strings, x)
        assert automaton.count[state] == len(occ)
        assert automaton.followed(state) == sum(i + len(x) < len(strings[s]) for s, i in occ)
        assert automaton.last_end[state] == max(ends[(s, i + len(x) - 1)] for s, i in occ)
        expected = Counter()
        for s, i in occ:
            for n in range(1, window - len(x) + 1):
                if i + len(x) + n <= len(strings[s]):
                    expected[tuple(strings[s][i + len(x):i + len(x) + n])] += 1
        assert automaton.continuations(state, window - len(x)) == dict(expected)


# ---- the proposal rules against a brute-force reference ---------------------------------------------

def reference(own, corpus, *, max_depth, max_nodes, max_match, max_spec, factor, offset, min_prob, prior):
    """The documented rules, on token lists: every suffix of at most max_match tokens, longest first, in
    the request's tokens, then the corpus (one string each); a better score (by more than 1e-9) replaces."""
    sources = [("request", [own])]
    if corpus:
        sources.append(("corpus", corpus))
    best, best_score = ([], [], [], 0, ""), 0.0
    for name, strings in sources:
        offsets = [sum(len(s) for s in strings[:k]) for k in range(len(strings))]  # serials of each token
        for m in range(min(max_match, len(own)), 0, -1):
            x = own[-m:]
            occ = [(s, i + m) for s, i in occurrences(strings, x)]  # (string, index after the match)
            depth = min(max_depth, max_spec, int(factor * m + offset + 1e-9))
            if depth <= 0:
                break

            def ranked(path):
                stats = {}
                for s, j in occ:
                    seq = strings[s]
                    if seq[j:j + len(path)] == path and j + len(path) < len(seq):
                        c = seq[j + len(path)]
                        n, recent = stats.get(c, (0, -1))
                        stats[c] = (n + 1, max(recent, offsets[s] + j + len(path)))
                den = sum(n for n, _ in stats.values()) + prior
                order = sorted(stats.items(), key=lambda kv: kv[1], reverse=True)
                return [(c, n / den) for c, (n, _) in order]

            tokens, parents, probs = [], [], []
            if max_nodes is None:
                path, prob = [], 1.0
                while len(path) < depth:
                    options = ranked(path)
                    if not options or prob * options[0][1] < min_prob:
                        break
                    prob *= options[0][1]
                    path.append(options[0][0])
                    tokens.append(path[-1]), parents.append(len(tokens) - 2), probs.append(prob)
            else:
                heap, order = [], 0
                for c, p in ranked([]):
                    if p < min_prob:
                        break
                    heap.append((-p, 1, order, c, [c], -1))
                    order += 1
                heapq.heapify(heap)
                while heap and len(tokens) < max_nodes:
                    neg, level, _, c, path, parent = heapq.heappop(heap)
                    tokens.append(c), parents.append(parent), probs.append(-neg)
                    if level < depth:
                        for c2, p in ranked(path):
                            if -neg * p < min_prob:
                                break
                            heapq.heappush(heap, (neg * p, level + 1, order, c2, path + [c2], len(tokens) - 1))
                            order += 1
            if sum(probs) > best_score + 1e-9:  # scores within 1e-9 tie
                best, best_score = (tokens, parents, probs, m, name), sum(probs)
    return best


@pytest.mark.parametrize("seed", range(16))
@pytest.mark.parametrize("wide", [False, True], ids=["small_alphabet", "wide_fanout"])
def test_proposals_match_the_reference(seed, wide):
    """wide: 12 tokens and long corpus strings, so that states have 8+ children (cached rankings)."""
    rng = random.Random(100 + seed + 1000 * wide)
    settings = dict(max_match=rng.randint(1, 6), max_spec=rng.randint(1, 6), factor=rng.choice([0.5, 1.0, 2.0]),
                    offset=rng.choice([0.0, 1.0, -1.0]), min_prob=rng.choice([0.0, 0.1, 0.3]),
                    prior=rng.choice([0.0, 0.0, 1.0]))
    alphabet = 12 if wide else rng.choice([2, 3, 5])
    corpus = [[rng.randrange(alphabet) for _ in range(rng.randint(1, 60 if wide else 25))]
              for _ in range(rng.randint(4 if wide else 0, 8))]
    idx = SuffixIndex(max_match=settings["max_match"], max_spec=settings["max_spec"],
                      spec_factor=settings["factor"], spec_offset=settings["offset"],
                      min_token_prob=settings["min_prob"], prior_count=settings["prior"],
                      corpus_max_tokens=10_000, corpus_segments=1)
    idx.add_corpus(corpus)
    own = [rng.randrange(alphabet) for _ in range(rng.randint(0, 5))]
    idx.start("r", own)
    for _ in range(25):
        for max_depth, max_nodes in ((rng.randint(1, 6), None), (rng.randint(1, 6), rng.randint(1, 8))):
            draft = idx.draft("r", max_depth, max_nodes)
            want = reference(own, corpus, max_depth=max_depth, max_nodes=max_nodes, **settings)
            got = (draft.tokens, draft.parents, draft.probs, draft.match_len, draft.source)
            assert got[:2] == want[:2] and got[3:] == want[3:], (own, got, want)
            assert got[2] == pytest.approx(want[2], rel=1e-12)
        # Other rows finish (the request's corpus match must catch up) before or after it extends.
        finished = rng.random() < 0.3
        before = rng.random() < 0.5
        if finished and before:
            corpus.append([rng.randrange(alphabet) for _ in range(rng.randint(1, 12))])
            idx.add_corpus(corpus[-1:])
        step = [rng.randrange(alphabet) for _ in range(rng.randint(1, 3))]
        idx.extend("r", step)
        own += step
        if finished and not before:
            corpus.append([rng.randrange(alphabet) for _ in range(rng.randint(1, 12))])
            idx.add_corpus(corpus[-1:])


# ---- trees are valid ---------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
def test_trees_are_valid(seed):
    rng = random.Random(200 + seed)
    idx = SuffixIndex(corpus_max_tokens=2000, corpus_segments=2, min_token_prob=rng.choice([0.0, 0.05, 0.2]))
    idx.add_corpus([[rng.randrange(4) for _ in range(60)] for _ in range(10)])
    idx.start("r", [rng.randrange(4) for _ in range(30)])
    for _ in range(30):
        max_nodes, max_depth = rng.randint(1, 16), rng.randint(1, 6)
        tokens, parents, probs = idx.propose_tree("r", max_nodes, max_depth)
        assert len(tokens) == len(parents) == len(probs) <= max_nodes
        depth = []
        for i, (parent, p) in enumerate(zip(parents, probs)):
            assert -1 <= parent < i  # parents precede children
            depth.append(1 if parent < 0 else depth[parent] + 1)
            assert depth[-1] <= max_depth
            assert idx.min_token_prob <= p <= 1.0
            if parent >= 0:
                assert p <= probs[parent] + 1e-12
        children = Counter((parent, token) for parent, token in zip(parents, tokens))
        assert max(children.values(), default=1) == 1  # siblings are distinct tokens
        for node in range(-1, len(tokens)):  # a node's children share at most its probability
            below = sum(p for parent, p in zip(parents, probs) if parent == node)
            assert below <= (1.0 if node < 0 else probs[node]) + 1e-9
        idx.extend("r", [rng.randrange(4) for _ in range(2)])


def test_proposals_are_deterministic():
    def run():
        rng = random.Random(7)
        idx = SuffixIndex(corpus_max_tokens=500, corpus_segments=2, min_token_prob=0.0)
        out = []
        for row in range(12):
            idx.start(row, [rng.randrange(6) for _ in range(10)])
            for _ in range(10):
                out.append(idx.propose_tree(row, 6, 3))
                out.append(idx.propose(row, 4))
                idx.extend(row, [rng.randrange(6)])
            idx.finish(row)
        return out

    assert run() == run()


def test_templated_workload_is_the_builders_output():
    """batchspec/assets/demo/templated.parquet is what tools/build_templated.py makes (no randomness)."""
    pq = pytest.importorskip("pyarrow.parquet")
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("build_templated", root / "tools" / "build_templated.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    shipped = pq.read_table(root / "batchspec" / "assets" / "demo" / "templated.parquet")
    assert shipped.equals(builder.build(60))
    prompts = shipped.column("prompt").to_pylist()
    assert len(set(prompts)) == len(prompts) == 300
    assert shipped.column("id").to_pylist()[:2] == ["templated-0000", "templated-0001"]
