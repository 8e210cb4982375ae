"""Dataset-job features through the job runner (issue 20): n samples per row, logprobs, per-row settings from
columns, retrying failed rows, duplicate-id warnings, the position column and input order, a resume
fingerprint that lets greedy / coupled jobs switch drafter, and the suffix / eagle drafters in jobs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchspec.jobs.grouping import RowGroups
from batchspec.sources.rowparams import RowParamColumns
from batchspec.engine.types import Request, Result, RowParams
from conftest_jobs import (  # noqa: F401 (fixtures)
    WORDS, one_line_error, one_thread, read_output, run_inprocess, tiny_job, tiny_models, write_job,
)

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [" ".join(WORDS[(5 * i + j) % len(WORDS)] for j in range(3 + i % 5)) for i in range(8)]
SAMPLED = {"temperature": 1.0, "seed": 3}


def write_prompts(tmp_path: Path, **columns) -> None:
    pq.write_table(pa.table({"text": PROMPTS, **columns}), tmp_path / "in.parquet")


def job(tiny_models, name: str, tmp_path: Path, source: dict | None = None, **extra) -> None:
    write_job(tmp_path, name, tiny_job(tiny_models, {"path": "in.parquet", "prompt_column": "text", **(source or {})},
                                       **extra))


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


# ---- n samples ----------------------------------------------------------------------------------


def test_n_samples_per_row_and_sample_zero_is_n1(tmp_path, tiny_models, monkeypatch):
    """sampling.n=3: three rows per input row by sample_index; sample 0 equals the n=1 run's row (coupled
    sampling keys sample i by (seed, id, i)); a drafter change does not change any sample."""
    write_prompts(tmp_path)
    job(tiny_models, "n", tmp_path, sampling=SAMPLED)
    assert run_inprocess(tmp_path, "job=n", "sampling.n=3", "drafter=ngram", monkeypatch=monkeypatch) == 0
    assert run_inprocess(tmp_path, "job=n", "output.dir=one", monkeypatch=monkeypatch) == 0
    assert run_inprocess(tmp_path, "job=n", "sampling.n=3", "drafter=model", "output.dir=three-model",
                         monkeypatch=monkeypatch) == 0
    rows = read_output(tmp_path / "outputs" / "n")
    assert len(rows) == 3 * len(PROMPTS)
    by_key = {(r["id"], r["sample_index"]): r for r in rows}
    assert set(by_key) == {(str(i), j) for i in range(len(PROMPTS)) for j in range(3)}
    one = {r["id"]: r for r in read_output(tmp_path / "one")}
    assert all(by_key[i, 0]["completion_token_ids"] == one[i]["completion_token_ids"] for i in one)
    assert any(by_key[i, 0]["completion_token_ids"] != by_key[i, 1]["completion_token_ids"] for i in one)
    other = {(r["id"], r["sample_index"]): r["completion_token_ids"] for r in read_output(tmp_path / "three-model")}
    assert other == {key: r["completion_token_ids"] for key, r in by_key.items()}
    assert summary(tmp_path / "outputs" / "n")["rows"] == 3 * len(PROMPTS)


def test_n_with_greedy_is_refused_in_one_line(tmp_path, tiny_models, monkeypatch, capsys):
    write_prompts(tmp_path)
    job(tiny_models, "greedy", tmp_path)
    assert run_inprocess(tmp_path, "job=greedy", "sampling.n=2", monkeypatch=monkeypatch) == 2
    assert "identical copies" in one_line_error(capsys)
    assert not (tmp_path / "outputs" / "greedy").exists()  # a run failing at setup leaves no output dir


@pytest.mark.parametrize("case", ["all complete", "one missing", "in order"])
def test_row_groups_release_whole_requests(case):
    """A request's samples leave together (a part never holds some of an id's samples, so resume keeps n
    rows per id); in input order, a finished request waits for the ones read before it."""
    groups = RowGroups(2, in_order=case == "in order")
    requests = [Request(id=i, prompt="p") for i in "abc"]
    list(groups.track(requests))

    def result(i, j):
        return Result(id=i, prompt="p", completion="", completion_token_ids=[], finish_reason="stop", error=None,
                      prompt_tokens=1, completion_tokens=0, target_forwards=0, draft_tokens=0, accepted_tokens=0,
                      acceptance_rate=None, tokens_per_forward=None, accepted_per_round=[], drafts_per_round=[],
                      tree_per_round=[], latency_s=0.0, sample_index=j)

    out = []
    order = [("b", 1), ("b", 0), ("a", 0), ("c", 0), ("c", 1)] + ([("a", 1)] if case != "one missing" else [])
    for i, j in order:
        out.append([(r.id, r.sample_index) for r in groups.add(result(i, j))])
    if case == "all complete":
        assert out == [[], [("b", 0), ("b", 1)], [], [], [("c", 0), ("c", 1)], [("a", 0), ("a", 1)]]
    elif case == "one missing":
        assert out == [[], [("b", 0), ("b", 1)], [], [], [("c", 0), ("c", 1)]]
        assert groups.drain() == [] and groups.held == 1  # a's lone sample is dropped: resume reruns a
    else:
        assert out == [[], [], [], [], [], [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("c", 0), ("c", 1)]]


def test_row_groups_count_a_rows_own_n():
    groups = RowGroups(1)
    list(groups.track([Request(id="x", prompt="p", params=RowParams(n=2)), Request(id="y", prompt="p")]))
    assert groups._open["x"][0] == 2 and groups._open["y"][0] == 1


# ---- logprobs -----------------------------------------------------------------------------------


def test_logprobs_columns(tmp_path, tiny_models, monkeypatch):
    """sampling.logprobs=2 / prompt_logprobs=1: list columns, one entry per completion / prompt token; the
    chosen token's logprob is at most the best alternative's."""
    write_prompts(tmp_path)
    job(tiny_models, "lp", tmp_path)
    assert run_inprocess(tmp_path, "job=lp", "sampling.logprobs=2", "sampling.prompt_logprobs=1", "drafter=ngram",
                         monkeypatch=monkeypatch) == 0
    for r in read_output(tmp_path / "outputs" / "lp"):
        n = r["completion_tokens"]
        assert len(r["logprobs"]) == len(r["top_logprobs"]) == len(r["top_logprob_ids"]) == n
        assert all(len(t) == 2 and t[0] >= t[1] for t in r["top_logprobs"])
        assert all(lp <= top[0] + 1e-5 for lp, top in zip(r["logprobs"], r["top_logprobs"]))
        # greedy: the chosen token is the best one
        assert [ids[0] for ids in r["top_logprob_ids"]] == r["completion_token_ids"]
        assert r["prompt_logprobs"][0] is None and len(r["prompt_logprobs"]) == r["prompt_tokens"]
        assert all(math.isfinite(x) and x <= 0 for x in r["prompt_logprobs"][1:])


# ---- per-row settings ---------------------------------------------------------------------------


def test_row_params_from_columns(tmp_path, tiny_models, monkeypatch):
    """max_new_tokens and stop per row from columns; null means the job's; a bad value is that row's error
    naming the column; the other rows run in the same batch."""
    limits = [2, 5, None, 3, "many", 1, 4, -1]
    as_text = pa.array([None if x is None else str(x) for x in limits], pa.string())
    pq.write_table(pa.table({"text": PROMPTS, "max_tokens": as_text}), tmp_path / "strings.parquet")
    write_prompts(tmp_path, max_tokens=pa.array([x if isinstance(x, int) else None for x in limits], pa.int64()))
    job(tiny_models, "rp", tmp_path, {"row_params": {"max_new_tokens": "max_tokens"}},
        sampling={"max_new_tokens": 6, "stop": []})
    assert run_inprocess(tmp_path, "job=rp", "drafter=ngram", monkeypatch=monkeypatch) == 0
    rows = {int(r["id"]): r for r in read_output(tmp_path / "outputs" / "rp")}
    for i, limit in enumerate(limits):
        r = rows[i]
        if isinstance(limit, int) and limit < 1:
            assert r["finish_reason"] == "error" and "'max_tokens'" in r["error"] and "max_new_tokens" in r["error"]
        elif isinstance(limit, int):
            assert r["completion_tokens"] <= limit and (r["completion_tokens"] == limit or r["finish_reason"] == "stop")
        else:  # null: the job's 6
            assert r["completion_tokens"] <= 6
    assert run_inprocess(tmp_path, "job=rp", "source.path=strings.parquet", "output.dir=str",
                         monkeypatch=monkeypatch) == 0
    bad = {int(r["id"]): r for r in read_output(tmp_path / "str")}
    # numbers as text are not numbers: every row that sets one is an error naming the column
    assert all((bad[i]["finish_reason"] == "error" and "'max_tokens'" in bad[i]["error"]) == (limits[i] is not None)
               for i in range(len(limits)))


def test_row_params_column_missing_or_setting_unknown_is_a_setup_error(tmp_path, tiny_models, monkeypatch, capsys):
    write_prompts(tmp_path)
    job(tiny_models, "rp", tmp_path)
    assert run_inprocess(tmp_path, "job=rp", "+source.row_params.max_new_tokens=nope", monkeypatch=monkeypatch) == 2
    assert "nope" in one_line_error(capsys)
    assert run_inprocess(tmp_path, "job=rp", "+source.row_params.colour=text", monkeypatch=monkeypatch) == 2
    assert "'colour' is not a per-row setting" in one_line_error(capsys)


@pytest.mark.parametrize("values,expected", [
    ({"t": 0.5, "n": 2.0}, RowParams(temperature=0.5, n=2)),
    ({"t": None, "n": None}, None),
    ({"s": "###"}, RowParams(stop=("###",))),
    ({"s": ["a", "b"]}, RowParams(stop=("a", "b"))),
    ({"t": "hot"}, "column 't': temperature='hot'"),
    ({"t": 1e-40}, "column 't': temperature=1e-40"),
    ({"n": 0}, "column 'n': n=0"),
    ({"s": [1]}, "column 's' (stop)"),
])
def test_row_param_values(values, expected):
    columns = RowParamColumns({"temperature": "t", "n": "n", "stop": "s"})
    params, error = columns.params(values)
    if isinstance(expected, str):
        assert params is None and expected in error
    else:
        assert error is None and params == expected


# ---- retrying failed rows, duplicate ids --------------------------------------------------------


def test_retry_errors_replaces_failed_rows(tmp_path, tiny_models, monkeypatch, capsys):
    """A row that failed stays failed on a plain rerun ("nothing to do"); retry_errors=true runs it again,
    replacing the error row, never duplicating it; status lists the failed ids before."""
    from batchspec.jobs.status import format_status, status

    rows = [{"qid": f"q{i}", "text": p} for i, p in enumerate(PROMPTS)]
    rows[3]["text"] = None
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_job(tmp_path, "re", tiny_job(tiny_models, {"path": "in.jsonl", "prompt_column": "text", "id_column": "qid"}))
    assert run_inprocess(tmp_path, "job=re", monkeypatch=monkeypatch) == 0
    out = tmp_path / "outputs" / "re"
    report = status(out)
    assert report["failed"] == [{"id": "q3", "error": "source.prompt_column 'text' is null"}]
    assert "failed ids: 'q3'" in format_status(report)
    rows[3]["text"] = PROMPTS[3]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert run_inprocess(tmp_path, "job=re", monkeypatch=monkeypatch) == 0
    assert [r["id"] for r in read_output(out) if r["error"]] == ["q3"]
    assert run_inprocess(tmp_path, "job=re", "retry_errors=true", monkeypatch=monkeypatch) == 0
    after = read_output(out)
    assert sorted(r["id"] for r in after) == sorted(f"q{i}" for i in range(len(PROMPTS)))
    assert all(r["error"] is None for r in after)
    assert status(out)["complete"] and summary(out)["rows_error"] == 0


def test_duplicate_ids_warn_with_the_ids(tmp_path, tiny_models, monkeypatch, capsys):
    from batchspec.jobs.status import format_status, status

    write_prompts(tmp_path, qid=["a", "b", "a", "c", "b", "d", "e", "f"])
    job(tiny_models, "dup", tmp_path, {"id_column": "qid"})
    assert run_inprocess(tmp_path, "job=dup", monkeypatch=monkeypatch) == 0
    captured = capsys.readouterr()
    assert "2 row(s) dropped: their id repeats an earlier row's (ids 'a', 'b')" in captured.out + captured.err
    assert "input rows dropped as repeated ids: 'a', 'b'" in format_status(status(tmp_path / "outputs" / "dup"))


# ---- position and order -------------------------------------------------------------------------


def test_position_column_and_input_order(tmp_path, tiny_models, monkeypatch):
    """Every row carries its input position; output.order=input writes the parts' rows in input order
    (rows finish out of order: their lengths differ)."""
    write_prompts(tmp_path, qid=[f"z{9 - i}" for i in range(len(PROMPTS))],
                  max_tokens=pa.array([12 if i % 3 == 0 else 1 for i in range(len(PROMPTS))]))
    job(tiny_models, "ord", tmp_path, {"id_column": "qid", "row_params": {"max_new_tokens": "max_tokens"}})
    for order in ("finish", "input"):
        assert run_inprocess(tmp_path, "job=ord", f"output.order={order}", f"output.dir={order}",
                             monkeypatch=monkeypatch) == 0
        parts = sorted((tmp_path / order / "data").glob("*.parquet"))
        positions = [p for f in parts for p in pq.read_table(f).column("position").to_pylist()]
        assert sorted(positions) == list(range(len(PROMPTS)))
        assert (positions == sorted(positions)) == (order == "input")
        ids = {r["id"]: r["position"] for r in read_output(tmp_path / order)}
        assert all(ids[f"z{9 - i}"] == i for i in range(len(PROMPTS)))


# ---- what decides a resume ----------------------------------------------------------------------


@pytest.mark.parametrize("sampling,change,refused", [
    ({}, "drafter.k=2", False),
    ({}, "drafter=ngram", False),
    ({}, "batch_size=5", False),
    ({}, "drafter.adaptive=true", False),
    ({}, "sampling.max_new_tokens=4", True),
    (SAMPLED, "drafter=prompt_lookup", False),  # coupled sampling: the target's own draws
    ({**SAMPLED, "verify": "rejection"}, "drafter.k=2", True),
])
def test_resume_fingerprint_ignores_what_cannot_change_rows(tmp_path, tiny_models, monkeypatch, capsys,
                                                            sampling, change, refused):
    write_prompts(tmp_path)
    job(tiny_models, "fp", tmp_path, source={"limit": 4}, sampling=sampling)
    assert run_inprocess(tmp_path, "job=fp", "drafter=model", monkeypatch=monkeypatch) == 0
    code = run_inprocess(tmp_path, "job=fp", "drafter=model", change, "source.limit=8", monkeypatch=monkeypatch)
    if refused:
        assert code == 2 and "holds rows made with a different" in one_line_error(capsys)
    else:
        assert code == 0 and len(read_output(tmp_path / "outputs" / "fp")) == 8


# ---- setup errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("path,message", [
    ("./data/conversations", "source.path: no such local directory './data/conversations'"),
    ("data/more/conversations", "source.path: no such local directory"),
    ("data/rows.jsonl", "source.path='data/rows.jsonl' does not exist"),
    ("shards/*.parquet", "shards/*.parquet"),
])
def test_a_missing_local_source_fails_at_once(tmp_path, tiny_models, monkeypatch, capsys, path, message):
    """A local-looking source path that does not exist is one line at once, never a hub lookup (offline
    here, so a lookup would fail with the hub's own error instead)."""
    job(tiny_models, "miss", tmp_path, {"path": path})
    assert run_inprocess(tmp_path, "job=miss", monkeypatch=monkeypatch) == 2
    assert message in one_line_error(capsys)
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").iterdir())


def test_a_failed_setup_keeps_an_existing_output(tmp_path, tiny_models, monkeypatch, capsys):
    write_prompts(tmp_path)
    job(tiny_models, "keep", tmp_path, source={"limit": 2})
    assert run_inprocess(tmp_path, "job=keep", monkeypatch=monkeypatch) == 0
    assert run_inprocess(tmp_path, "job=keep", "model.target=./gone", monkeypatch=monkeypatch) == 2
    assert len(read_output(tmp_path / "outputs" / "keep")) == 2


# ---- the suffix and eagle drafters in jobs ------------------------------------------------------


def test_suffix_drafter_job_matches_plain(tmp_path, tiny_models, monkeypatch):
    write_prompts(tmp_path)
    job(tiny_models, "sx", tmp_path)
    assert run_inprocess(tmp_path, "job=sx", "drafter=suffix", monkeypatch=monkeypatch) == 0
    assert run_inprocess(tmp_path, "job=sx", "drafter=none", "output.dir=plain", monkeypatch=monkeypatch) == 0
    # a warm start from the finished output
    assert run_inprocess(tmp_path, "job=sx", "drafter=suffix", "drafter.corpus=outputs/sx", "output.dir=warm",
                         monkeypatch=monkeypatch) == 0
    plain = [r["completion_token_ids"] for r in read_output(tmp_path / "plain")]
    assert [r["completion_token_ids"] for r in read_output(tmp_path / "outputs" / "sx")] == plain
    warm = read_output(tmp_path / "warm")
    assert [r["completion_token_ids"] for r in warm] == plain
    assert sum(r["accepted_tokens"] for r in warm) > 0


def test_eagle_needs_a_head_or_train(tmp_path, tiny_models, monkeypatch, capsys):
    write_prompts(tmp_path)
    job(tiny_models, "eg", tmp_path, model={"draft": None})
    assert run_inprocess(tmp_path, "job=eg", "drafter=eagle", monkeypatch=monkeypatch) == 2
    assert "drafter=eagle needs model.draft" in one_line_error(capsys)
    assert run_inprocess(tmp_path, "job=eg", "model.draft=train", monkeypatch=monkeypatch) == 2
    assert "model.draft=train trains an EAGLE-3 head: it needs drafter=eagle" in one_line_error(capsys)
    assert run_inprocess(tmp_path, "job=eg", "drafter=eagle", "model.draft=train", "drafter.fallback=model",
                         monkeypatch=monkeypatch) == 2
    assert "drafter.fallback=model: need a drafter without a model" in one_line_error(capsys)


@pytest.mark.slow
def test_self_training_eagle_job(tmp_path, tiny_models, monkeypatch):
    """model.draft=train: the first rows decode with the fallback drafter and train a head, which drafts its
    trial rows and then the rest (or hands them back to the fallback); greedy output equals plain decoding;
    summary.json reports the self-training; a rerun reuses the head."""
    pq.write_table(pa.table({"text": PROMPTS * 5}), tmp_path / "in.parquet")
    job(tiny_models, "st", tmp_path)
    assert run_inprocess(tmp_path, "job=st", "drafter=eagle", "model.draft=train", "drafter.train_rows=24",
                         "drafter.train_minutes=0.05", monkeypatch=monkeypatch) == 0
    out = tmp_path / "outputs" / "st"
    marker = json.loads(next((out / "shards").glob("*.json")).read_text())
    report = marker["last_run"]["self_training"]
    assert report["rows_before"] == 24 and report["rows_after"] + report["rows_back"] == len(PROMPTS) * 5 - 24
    assert report["rows_after"] >= 12 and report["verdict"] in ("head", "suffix")  # a trial of train_rows // 2 rows
    # the trial's rows are the head's; after them, whoever the verdict names drafts (timing decides it here)
    assert report["rows_after"] == (len(PROMPTS) * 5 - 24 if report["verdict"] == "head" else 12)
    assert (Path(report["head"]) / "config.json").exists()
    assert summary(out)["self_training"]["0"]["rows_before"] == 24  # summary.json, status and the report show it
    from batchspec.report.data import load_output
    from batchspec.report.page import output_section, terminal_summary
    from batchspec.jobs.status import format_status, status

    assert "self-trained head:" in format_status(status(out))
    loaded = load_output(out)
    assert "Self-trained EAGLE head" in output_section(loaded, several=False)
    assert "self-trained head" in terminal_summary([loaded], out / "report.html", 0)
    assert run_inprocess(tmp_path, "job=st", "drafter=none", "output.dir=plain", monkeypatch=monkeypatch) == 0
    assert [r["completion_token_ids"] for r in read_output(out)] == \
        [r["completion_token_ids"] for r in read_output(tmp_path / "plain")]
