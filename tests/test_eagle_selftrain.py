"""A job that trains its own EAGLE-3 head from its first rows, then drafts with it."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import batchspec
from batchspec.training import selftrain
from batchspec.training.selftrain import Phase, SelfTrainingGenerator, break_even_row, training_seconds, verdict_of
from batchspec.engine.runstats import self_training_text
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


TRAINING_SECONDS = [  # drafter.train_minutes, seconds the first rows took, rest of the job's projected s -> budget
    (2.0, 30.0, None, 120.0),  # as set
    (2.0, 30.0, 10.0, 120.0),  # as set, however short the job
    (None, 90.0, None, 90.0),  # as long as the first rows took
    (None, 5.0, None, 60.0),  # at least a minute
    (None, 3600.0, None, 600.0),  # at most ten
    (None, 35.0, 170.0, 25.5),  # a 3,000-row demo job: at most 15% of the rest
    (None, 35.0, 100000.0, 60.0),  # a long job: the share does not bind
    (None, 35.0, 60.0, 0.0),  # 9 s would be too little to train a head: none
]


@pytest.mark.parametrize("minutes,first_s,rest_s,expected", TRAINING_SECONDS)
def test_training_seconds(minutes, first_s, rest_s, expected):
    assert training_seconds(minutes, first_s, rest_s) == pytest.approx(expected)


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
    # Fixed k: whether a row drafts does not hang on how fast this machine trains a head in 3 seconds (with
    # adaptive k, a weak head's rows may draft nothing, and on a slow machine some did).
    def build(drafter, head, corpus=None):
        return batchspec.build_generator(models, drafter=drafter, head=head, k=3, batch_size=4, max_new_tokens=MAX_NEW,
                                         corpus=corpus, adaptive=False)
    return build


def test_first_rows_train_a_head_that_drafts_the_rest_and_a_resume_reuses_it(llama_pair, tmp_path, monkeypatch):
    models = batchspec.load_models(str(llama_pair.target))
    monkeypatch.setattr(selftrain, "verdict_of", lambda head_rate, first_rate, fallback: "head")
    build = _builder(models)
    ids = [str(i) for i in range(3 * len(PROMPTS))]
    requests = [batchspec.Request(i, p) for i, p in zip(ids, PROMPTS * 3)]
    generator = SelfTrainingGenerator(models, build, out_dir=tmp_path, rows=12, minutes=0.05, trial_rows=6, heldout=2)
    results = {r.id: r for r in generator.run(requests)}
    assert [results[i].completion_token_ids for i in ids] == llama_pair.reference * 3  # exact throughout
    report = generator.report()
    assert report["rows_before"] == 12 and report["rows_after"] == 24 and not report["resumed_with_saved_head"]
    assert report["fallback"] == "suffix" and report["verdict"] == "head" and report["rows_back"] == 0
    assert (tmp_path / "eagle_head" / "config.json").exists() and report["train_s"] > 0
    assert all(results[i].draft_tokens > 0 for i in ids[12:])  # the trial and the rows after it drafted by the head
    assert generator.stats.requests == 36  # one run's statistics across the phases
    assert selftrain.read_verdict(tmp_path / "eagle_head")["verdict"] == "head"
    again = SelfTrainingGenerator(models, build, out_dir=tmp_path, rows=12, minutes=0.05)
    assert again.resumed and again.report()["rows_before"] == 0
    rerun = {r.id: r for r in again.run(requests[:4])}
    assert [rerun[i].completion_token_ids for i in ids[:4]] == llama_pair.reference[:4]
    assert all(r.draft_tokens > 0 for r in rerun.values()) and again.report()["rows_after"] == 4


def test_a_stop_during_training_leaves_the_trial_to_the_resume(llama_pair, tmp_path, monkeypatch):
    models = batchspec.load_models(str(llama_pair.target))
    build = _builder(models)
    train = SelfTrainingGenerator._train

    def train_then_stop(self, samples, budget):
        head = train(self, samples, budget)
        self.stop_admitting()  # SIGTERM arrives while the head trains
        return head

    monkeypatch.setattr(SelfTrainingGenerator, "_train", train_then_stop)
    ids = [str(i) for i in range(2 * len(PROMPTS))]
    requests = [batchspec.Request(i, p) for i, p in zip(ids, PROMPTS * 2)]
    generator = SelfTrainingGenerator(models, build, out_dir=tmp_path, rows=8, minutes=0.05, trial_rows=4, heldout=2)
    assert len(list(generator.run(requests))) == 8  # no row is admitted after the stop
    record = selftrain.read_verdict(tmp_path / "eagle_head")
    assert record["verdict"] is None and record["tokens_per_s_before"] > 0
    monkeypatch.setattr(SelfTrainingGenerator, "_train", train)
    again = SelfTrainingGenerator(models, build, out_dir=tmp_path, rows=8, minutes=0.05, trial_rows=4)
    assert again.resumed and again.verdict is None and again.first_rate == record["tokens_per_s_before"]
    rerun = {r.id: r for r in again.run(requests[8:])}
    assert [rerun[i].completion_token_ids for i in ids[8:]] == (llama_pair.reference * 2)[8:]
    assert again.verdict in ("head", "suffix") and again.report()["rows_after"] >= 4  # the trial ran on resume
    assert selftrain.read_verdict(tmp_path / "eagle_head")["verdict"] == again.verdict


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
    assert report["break_even_row"] is None  # no break-even for a head that lost
    # The job wrote its rows: a resume (here with another fallback) seeds the fallback with them.
    (tmp_path / "data").mkdir()
    pq.write_table(pa.table({"completion_token_ids": llama_pair.reference, "finish_reason": ["length"] * 12}),
                   tmp_path / "data" / "part-0.parquet")
    again = SelfTrainingGenerator(models, build, out_dir=tmp_path, rows=8, minutes=0.05, fallback="ngram")
    assert again.resumed and built[-1] == ("ngram", False, 12)  # the verdict holds across a resume
    rerun = {r.id: r for r in again.run(requests[:4])}
    assert [rerun[i].completion_token_ids for i in ids[:4]] == llama_pair.reference[:4]
    assert (again.report()["rows_back"], again.report()["rows_after"]) == (4, 0)


def test_a_plain_fallback_then_a_head_share_one_runs_statistics(llama_pair, tmp_path, monkeypatch):
    """drafter none runs k = 0 rounds only: its statistics must widen for the head's drafts."""
    models = batchspec.load_models(str(llama_pair.target))
    monkeypatch.setattr(selftrain, "verdict_of", lambda head_rate, first_rate, fallback: "head")
    requests = [batchspec.Request(str(i), p) for i, p in enumerate(PROMPTS * 2)]
    generator = SelfTrainingGenerator(models, _builder(models), out_dir=tmp_path, rows=8, minutes=0.05, trial_rows=4,
                                      heldout=2, fallback="none")
    results = {r.id: r for r in generator.run(requests)}
    assert [results[str(i)].completion_token_ids for i in range(24)] == llama_pair.reference * 2
    stats = generator.stats
    assert stats.requests == 24 and len(stats.rounds_by_k) == 4 and sum(stats.proposed_by_position) > 0
    assert stats.rounds_by_k[0] > 0 and sum(stats.rounds_by_k[1:]) > 0  # the plain rounds and the drafted ones


SUMMARY_LINES = [  # a report -> its one line in summary, status and report
    ({"rows_before": 512, "tokens_per_s_before": 300.0, "train_s": 180.4, "rows_after": 2488,
      "tokens_per_s_after": 350.0, "fallback": "suffix", "verdict": "head", "break_even_row": 1400},
     "512 rows with suffix 300.0 tokens/s, trained 180 s, 2488 rows with the head 350.0 tokens/s, break-even row 1400"),
    ({"rows_before": 512, "tokens_per_s_before": 300.0, "train_s": 60.0, "rows_after": 256,
      "tokens_per_s_after": 250.0, "fallback": "suffix", "verdict": "suffix", "rows_back": 2232,
      "tokens_per_s_back": 330.0, "break_even_row": None},
     "512 rows with suffix 300.0 tokens/s, trained 60 s, 256 rows with the head 250.0 tokens/s, then 2232 rows with "
     "suffix again 330.0 tokens/s (the head ran slower than suffix in its trial)"),
    ({"rows_before": 0, "tokens_per_s_before": None, "train_s": 0.0, "rows_after": 40, "tokens_per_s_after": 310.0,
      "resumed_with_saved_head": True, "verdict": "head"},
     "resumed with the saved head, 40 rows with it 310.0 tokens/s"),
    ({"rows_before": 100, "tokens_per_s_before": None, "train_s": 0.0, "rows_after": 0, "tokens_per_s_after": None},
     "100 rows with ngram - tokens/s, trained 0 s, 0 rows with the head - tokens/s"),  # a report before fallbacks
    ({"rows_before": 512, "tokens_per_s_before": 900.0, "train_s": 0.0, "rows_after": 0, "tokens_per_s_after": None,
      "fallback": "suffix", "verdict": "not trained", "rows_back": 40, "tokens_per_s_back": 950.0,
      "not_trained": "the rest of this run (about 3 s at the first rows' rate) is too short for a head to pay back "
                     "its training"},
     "512 rows with suffix 900.0 tokens/s, then 40 more 950.0 tokens/s; no head trained: the rest of this run "
     "(about 3 s at the first rows' rate) is too short for a head to pay back its training"),
    ({"rows_before": 0, "tokens_per_s_before": None, "train_s": 0.0, "rows_after": 0, "tokens_per_s_after": None,
      "fallback": "suffix", "verdict": "not trained", "rows_back": 40, "tokens_per_s_back": 950.0,
      "not_trained": "its training diverged (...)"},
     "40 rows with suffix 950.0 tokens/s; no head trained (an earlier run): its training diverged (...)"),
]


@pytest.mark.parametrize("report,line", SUMMARY_LINES)
def test_self_training_text(report, line):
    assert self_training_text(report) == line


def test_no_head_is_trained_when_the_first_rows_are_all_the_rows(llama_pair, tmp_path):
    models = batchspec.load_models(str(llama_pair.target))
    requests = [batchspec.Request(str(i), p) for i, p in enumerate(PROMPTS)]
    generator = SelfTrainingGenerator(models, _builder(models), out_dir=tmp_path, rows=len(PROMPTS), minutes=0.05)
    results = {r.id: r for r in generator.run(requests)}
    assert [results[str(i)].completion_token_ids for i in range(len(PROMPTS))] == llama_pair.reference
    assert generator.head is None and not (tmp_path / "eagle_head").exists()


def test_a_job_too_short_for_a_head_to_pay_back_trains_none(llama_pair, tmp_path):
    models = batchspec.load_models(str(llama_pair.target))
    ids = [str(i) for i in range(2 * len(PROMPTS))]
    requests = [batchspec.Request(i, p) for i, p in zip(ids, PROMPTS * 2)]
    # The job says one row is left after the first phase: its projected time is a twelfth of the first phase's.
    generator = SelfTrainingGenerator(models, _builder(models), out_dir=tmp_path, rows=len(PROMPTS),
                                      rows_left=lambda: len(PROMPTS) + 1)
    results = {r.id: r for r in generator.run(requests)}
    assert [results[i].completion_token_ids for i in ids] == llama_pair.reference * 2  # exact throughout
    report = generator.report()
    assert generator.head is None and not (tmp_path / "eagle_head" / "config.json").exists()
    assert report["verdict"] == "not trained" and "too short" in report["not_trained"] and report["head"] is None
    assert report["rows_before"] == len(PROMPTS) and report["rows_back"] == len(PROMPTS) and report["train_s"] == 0
    assert 0 < generator.rest_s < 10 and report["projected_rest_s"] == round(generator.rest_s, 1)
    assert generator.stats.requests == len(ids)


def test_a_diverged_training_hands_every_row_to_the_fallback_and_a_resume_keeps_it(llama_pair, tmp_path,
                                                                                  monkeypatch):
    from batchspec.training.loop import NonFiniteLoss

    def diverge(*args, **kwargs):
        raise NonFiniteLoss("the training loss was not finite in 20 steps in a row (step 20, peak learning rate 0.003)")

    from batchspec.training import job_head

    monkeypatch.setattr(job_head, "train_loop", diverge)
    models = batchspec.load_models(str(llama_pair.target))
    ids = [str(i) for i in range(2 * len(PROMPTS))]
    requests = [batchspec.Request(i, p) for i, p in zip(ids, PROMPTS * 2)]
    generator = SelfTrainingGenerator(models, _builder(models), out_dir=tmp_path, rows=len(PROMPTS), minutes=0.05)
    results = {r.id: r for r in generator.run(requests)}
    assert [results[i].completion_token_ids for i in ids] == llama_pair.reference * 2
    report = generator.report()
    assert report["verdict"] == "not trained" and report["not_trained"].startswith("its training diverged (")
    assert report["rows_back"] == len(PROMPTS) and generator.train_s > 0  # the features were computed
    assert selftrain.read_verdict(tmp_path / "eagle_head")["verdict"] == "not trained"
    again = SelfTrainingGenerator(models, _builder(models), out_dir=tmp_path, rows=len(PROMPTS), minutes=0.05)
    assert again.resumed and again.head is None and again.verdict == "not trained"
    rerun = {r.id: r for r in again.run(requests[:4])}  # no first phase, no training: the fallback drafts them
    assert [rerun[i].completion_token_ids for i in ids[:4]] == llama_pair.reference[:4]
    text = self_training_text(again.report())
    assert again.report()["rows_before"] == 0 and text.startswith("4 rows with suffix") and "(an earlier run)" in text


def test_a_zero_training_budget_is_refused(llama_pair, tmp_path):
    models = batchspec.load_models(str(llama_pair.target))
    with pytest.raises(ValueError, match="minutes=0: the training budget must be > 0"):
        SelfTrainingGenerator(models, _builder(models), out_dir=tmp_path, minutes=0)


@pytest.mark.parametrize("max_tokens,expected", [
    (None, [[1, 2, 3], [4, 5], [6, 7, 8, 9]]),
    (4, [[6, 7, 8, 9]]),  # the newest rows up to the bound: what the suffix index would keep
    (5, [[4, 5], [6, 7, 8, 9]]),
])
def test_written_completions_reads_back_the_newest_rows(tmp_path, max_tokens, expected):
    from batchspec.training.selftrain import written_completions

    assert written_completions(tmp_path, tokenizer=None) is None  # nothing written yet
    (tmp_path / "data").mkdir()
    pq.write_table(pa.table({"completion_token_ids": [[1, 2, 3], [4, 5], [], [6, 7, 8, 9]],
                             "finish_reason": ["stop", "length", "error", "stop"]}), tmp_path / "data" / "part-0.parquet")
    assert written_completions(tmp_path, None, max_tokens) == expected
