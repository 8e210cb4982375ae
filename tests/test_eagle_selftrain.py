"""A job that trains its own EAGLE-3 head from its first rows, then drafts with it."""

from __future__ import annotations

import pytest

import batchspec
from batchspec.eagle import selftrain
from batchspec.eagle.selftrain import Phase, SelfTrainingGenerator, break_even_row, verdict_of
from conftest import MAX_NEW
from tiny import PROMPTS

# before (rows, tokens, seconds), training seconds, after, expected break-even row
BREAK_EVEN = [
    ((100, 6400, 20.0), 30.0, (100, 6400, 10.0), 100 + 300 + 1),  # 0.2 s/row plain, 0.1 drafted: 30 s back in 300 rows
    ((100, 6400, 20.0), 30.0, (100, 6400, 20.0), None),  # drafting no faster: never
    ((0, 0, 0.0), 30.0, (100, 6400, 10.0), None),  # nothing measured before
]


@pytest.mark.parametrize("before,train_s,after,expected", BREAK_EVEN)
def test_break_even_row(before, train_s, after, expected):
    assert break_even_row(Phase(*before), train_s, Phase(*after)) == expected


VERDICTS = [  # head tokens/s in its trial, the fallback's in the first rows -> who drafts the rest
    (120.0, 100.0, "head"),
    (100.0, 100.0, "head"),  # a tie goes to the head (the fallback's first rows are its slowest)
    (90.0, 100.0, "suffix"),
    (None, 100.0, "head"),  # nothing measured: keep the head
    (90.0, None, "head"),
]


@pytest.mark.parametrize("head_rate,first_rate,expected", VERDICTS)
def test_verdict_of(head_rate, first_rate, expected):
    assert verdict_of(head_rate, first_rate, "suffix") == expected


def _builder(models):
    def build(drafter, head, corpus=None):
        return batchspec.build_generator(models, drafter=drafter, head=head, k=3, batch_size=4, max_new_tokens=MAX_NEW,
                                         corpus=corpus)
    return build


def test_first_rows_train_a_head_that_drafts_the_rest_and_a_resume_reuses_it(llama_pair, tmp_path):
    models = batchspec.load_models(str(llama_pair.target))
    build = _builder(models)
    ids = [str(i) for i in range(2 * len(PROMPTS))]
    requests = [batchspec.Request(i, p) for i, p in zip(ids, PROMPTS * 2)]
    generator = SelfTrainingGenerator(models, build, out_dir=tmp_path, rows=12, minutes=0.05, trial_rows=12, heldout=2)
    results = {r.id: r for r in generator.run(requests)}
    assert [results[i].completion_token_ids for i in ids] == llama_pair.reference * 2  # exact throughout
    report = generator.report()
    assert report["rows_before"] == 12 and report["rows_after"] == 12 and not report["resumed_with_saved_head"]
    assert report["fallback"] == "suffix" and report["verdict"] in ("head", "suffix") and report["rows_back"] == 0
    assert (tmp_path / "eagle_head" / "config.json").exists() and report["train_s"] > 0
    assert all(results[i].draft_tokens > 0 for i in ids[12:])  # the second half drafted with the head
    assert generator.stats.requests == 24  # one run's statistics across both phases
    again = SelfTrainingGenerator(models, build, out_dir=tmp_path, rows=12, minutes=0.05)
    assert again.resumed and again.report()["rows_before"] == 0
    rerun = {r.id: r for r in again.run(requests[:4])}
    assert [rerun[i].completion_token_ids for i in ids[:4]] == llama_pair.reference[:4]
    assert all(r.draft_tokens > 0 for r in rerun.values())


def test_a_head_that_loses_its_trial_hands_the_rest_back_and_a_resume_keeps_the_verdict(llama_pair, tmp_path,
                                                                                         monkeypatch):
    models = batchspec.load_models(str(llama_pair.target))
    monkeypatch.setattr(selftrain, "verdict_of", lambda head_rate, first_rate, fallback: fallback)
    built = []

    def build(drafter, head, corpus=None):
        built.append((drafter, head is not None, None if corpus is None else len(corpus)))
        return _builder(models)(drafter, head, corpus)

    ids = [str(i) for i in range(2 * len(PROMPTS))]
    requests = [batchspec.Request(i, p) for i, p in zip(ids, PROMPTS * 2)]
    generator = SelfTrainingGenerator(models, build, out_dir=tmp_path, rows=8, minutes=0.05, trial_rows=4, heldout=2)
    results = {r.id: r for r in generator.run(requests)}
    assert [results[i].completion_token_ids for i in ids] == llama_pair.reference * 2  # exact throughout
    # the fallback, the head for its trial, then the fallback seeded with the 12 completions so far
    assert built == [("suffix", False, None), ("eagle", True, None), ("suffix", False, 12)]
    report = generator.report()
    assert (report["rows_before"], report["rows_after"], report["rows_back"]) == (8, 4, 12)
    assert report["verdict"] == "suffix" and generator.stats.requests == 24
    again = SelfTrainingGenerator(models, build, out_dir=tmp_path, rows=8, minutes=0.05)
    assert again.resumed and built[-1] == ("suffix", False, None)  # the verdict holds across a resume
    rerun = {r.id: r for r in again.run(requests[:4])}
    assert [rerun[i].completion_token_ids for i in ids[:4]] == llama_pair.reference[:4]
    assert again.report()["rows_back"] == 4


def test_no_head_is_trained_when_the_first_rows_are_all_the_rows(llama_pair, tmp_path):
    models = batchspec.load_models(str(llama_pair.target))
    requests = [batchspec.Request(str(i), p) for i, p in enumerate(PROMPTS)]
    generator = SelfTrainingGenerator(models, _builder(models), out_dir=tmp_path, rows=len(PROMPTS), minutes=0.05)
    results = {r.id: r for r in generator.run(requests)}
    assert [results[str(i)].completion_token_ids for i in range(len(PROMPTS))] == llama_pair.reference
    assert generator.head is None and not (tmp_path / "eagle_head").exists()
