"""End-to-end jobs on tiny random models: Parquet, saved-HF-dataset and JSONL sources, bad rows,
resume after SIGKILL / SIGTERM, shards, multirun, and the shipped demo pair."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchspec.jobs.config import ASSETS_DIR
from batchspec.engine.types import RESULT_COLUMNS
from conftest_jobs import (  # noqa: F401 (fixtures)
    WORDS, cli_env, one_thread, read_output, run_cli, run_inprocess, tiny_job, tiny_models, write_job,
)

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [" ".join(WORDS[(7 * i + j) % len(WORDS)] for j in range(3 + i % 9)) for i in range(40)]


def summary(out_dir: Path) -> dict:
    return json.loads((out_dir / "summary.json").read_text())


def by_id(rows):
    return {r["id"]: r for r in rows}


def test_parquet_job_with_bad_rows_then_noop_rerun(tmp_path, tiny_models, monkeypatch, capsys):
    prompts = PROMPTS[:12] + [None, "", " ".join(["hello"] * 40)]
    pq.write_table(pa.table({"qid": [f"q{i:02d}" for i in range(15)], "text": prompts,
                             "topic": [f"t{i % 4}" for i in range(15)], "unused": list(range(15))}),
                   tmp_path / "in.parquet")
    write_job(tmp_path, "pq", tiny_job(tiny_models, {"path": "in.parquet", "prompt_column": "text", "id_column": "qid",
                                                    "keep_columns": ["topic"]}, max_seq_len=32))
    assert run_inprocess(tmp_path, "job=pq", "drafter=model", "drafter.k=3", monkeypatch=monkeypatch) == 0
    out = tmp_path / "outputs" / "pq"
    rows = by_id(read_output(out))
    assert sorted(rows) == [f"q{i:02d}" for i in range(15)]
    assert list(read_output(out)[0]) == [c for c in RESULT_COLUMNS if c != "latency_s"] + ["position", "topic"]
    ok = [rows[f"q{i:02d}"] for i in range(12)]
    assert all(r["finish_reason"] in ("stop", "length") and r["error"] is None for r in ok)
    assert all(r["prompt"] == PROMPTS[i] and r["topic"] == f"t{i % 4}" for i, r in enumerate(ok))
    assert all(1 <= r["completion_tokens"] <= 12 and r["draft_tokens"] > 0 for r in ok)
    assert rows["q12"]["error"] == "source.prompt_column 'text' is null"
    assert rows["q13"]["error"] == "prompt is empty"
    assert "max_seq_len is 32" in rows["q14"]["error"] and rows["q14"]["topic"] == "t2"
    assert all(rows[f"q{i}"]["finish_reason"] == "error" for i in (12, 13, 14))
    assert len(list((out / "data").glob("*.parquet"))) == 3  # 15 rows, 5 per file

    s = summary(out)
    assert (s["rows"], s["rows_ok"], s["rows_error"]) == (15, 12, 3)
    assert s["completion_tokens"] == sum(r["completion_tokens"] for r in ok)
    assert s["tokens_per_target_forward"] == pytest.approx(
        s["completion_tokens"] / sum(r["target_forwards"] for r in ok))
    assert len(s["acceptance_by_position"]) == 3 and s["shards"] == {"count": 1, "finished": [0], "complete": True}
    assert s["config"]["drafter"] == {"name": "model", "k": 3, "adaptive": False, "tree": None, "corpus": None,
                                      "corpus_max_tokens": 200000, "train_rows": 512, "train_minutes": None,
                                      "fallback": "suffix"}
    assert {"torch", "transformers", "pyarrow", "hydra-core", "datasets"} <= set(s["versions"])
    io = s["io"]  # this run's time reading the input and writing parts
    assert set(io) == {"read_s", "write_s", "resume_scan_s", "wall_s", "share", "encode_write_s"}
    assert all(io[k] >= 0 for k in io) and io["wall_s"] > 0 and io["share"] <= 1
    busy = io["read_s"] + io["write_s"] + io["resume_scan_s"]
    assert io["share"] == pytest.approx(busy / io["wall_s"], abs=2e-4 / io["wall_s"])  # fields rounded to 1e-4 s
    last_run = json.loads((out / "shards" / "shard-00000-of-00001.json").read_text())["last_run"]
    assert last_run["io"] == io and io["wall_s"] >= last_run["wall_s"]
    assert set(last_run["round_phases_s"]) == {"admit", "draft", "verify", "accept", "bookkeeping"}
    assert sum(last_run["round_phases_s"].values()) <= last_run["wall_s"]
    printed = capsys.readouterr().out
    assert "rows                      15 (12 ok, 3 errors)" in printed and "tokens per target forward" in printed
    assert "IO this run               read " in printed

    # datasets.load_dataset reads the output dir
    import datasets
    ds = datasets.load_dataset("parquet", data_dir=str(out / "data"), split="train")
    assert ds.num_rows == 15 and "topic" in ds.column_names

    # Rerunning the finished job is a no-op that exits 0 and leaves the files alone.
    before = {f.name: f.stat().st_mtime_ns for f in (out / "data").iterdir()}
    started = time.perf_counter()
    assert run_inprocess(tmp_path, "job=pq", "drafter=model", "drafter.k=3", monkeypatch=monkeypatch) == 0
    assert time.perf_counter() - started < 5
    assert {f.name: f.stat().st_mtime_ns for f in (out / "data").iterdir()} == before
    assert "nothing to do" in capsys.readouterr().out
    assert summary(out)["io"] is None


def test_saved_hf_dataset_with_template_and_chat(tmp_path, tiny_models, monkeypatch):
    import datasets

    questions = [PROMPTS[i] if i % 5 else None for i in range(10)]  # rows 0 and 5: field missing
    datasets.DatasetDict({
        "test": datasets.Dataset.from_dict({"question": questions, "n": list(range(10))}),
        "train": datasets.Dataset.from_dict({"question": ["unused"], "n": [0]}),
    }).save_to_disk(tmp_path / "saved")
    write_job(tmp_path, "hf", tiny_job(tiny_models, {
        "path": "saved", "split": "test", "template": "question : {{ question }} answer :", "keep_columns": ["n"]}))
    assert run_inprocess(tmp_path, "job=hf", "drafter=ngram", monkeypatch=monkeypatch) == 0
    rows = by_id(read_output(tmp_path / "outputs" / "hf"))
    assert sorted(rows, key=int) == [str(i) for i in range(10)]  # ids are the row positions
    assert rows["3"]["prompt"] == f"question : {PROMPTS[3]} answer :" and rows["3"]["n"] == 3
    for i in (0, 5):
        assert rows[str(i)]["error"] == "source.template: 'question' is undefined (null or missing in this row)"

    # The same rows as chat: a template gives one user message, rendered with the chat template.
    assert run_inprocess(tmp_path, "job=hf", "drafter=ngram", "source.chat=true", "output.dir=outputs/hf-chat",
                         monkeypatch=monkeypatch) == 0
    chat = by_id(read_output(tmp_path / "outputs" / "hf-chat"))
    assert chat["3"]["prompt"] == f"<s> <|user|> question : {PROMPTS[3]} answer : <|assistant|>"
    assert chat["3"]["prompt_tokens"] == rows["3"]["prompt_tokens"] + 2  # <|user|>, <|assistant|>; one BOS
    assert chat["0"]["finish_reason"] == "error"


def test_jsonl_with_chat_messages_and_bad_lines(tmp_path, tiny_models, monkeypatch):
    good = [{"id": f"c{i}", "messages": [{"role": "user", "content": PROMPTS[i]}], "meta": i} for i in range(6)]
    lines = [json.dumps(r) for r in good] + [
        json.dumps({"id": "bad-list", "messages": "hello world", "meta": 6}),  # a string: one user message
        json.dumps({"id": "bad-role", "messages": [{"content": "hi"}], "meta": 7}),
        json.dumps({"id": "bad-type", "messages": 42, "meta": 8}),
        "{broken json",
        json.dumps({"id": "bad-meta", "messages": [{"role": "user", "content": "hi"}], "meta": "nine"}),
    ]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    write_job(tmp_path, "jl", tiny_job(tiny_models, {"path": "in.jsonl", "prompt_column": "messages", "chat": True,
                                                    "id_column": "id", "keep_columns": ["meta"]}))
    assert run_inprocess(tmp_path, "job=jl", "drafter=prompt_lookup", monkeypatch=monkeypatch) == 0
    rows = by_id(read_output(tmp_path / "outputs" / "jl"))
    assert sorted(rows) == sorted([f"c{i}" for i in range(6)] + ["bad-list", "bad-role", "bad-type", "\x00row-9",
                                                                 "bad-meta"])
    assert all(rows[f"c{i}"]["error"] is None and rows[f"c{i}"]["meta"] == i for i in range(6))
    assert rows["c2"]["prompt"] == f"<s> <|user|> {PROMPTS[2]} <|assistant|>"
    assert rows["bad-list"]["error"] is None
    assert rows["bad-role"]["error"] == "chat message 0 has no string 'role'"
    assert rows["bad-type"]["error"] == "chat messages must be a non-empty list, got int"
    assert rows["\x00row-9"]["error"].startswith("line 10 is not valid JSON")
    assert rows["bad-meta"]["error"] == "keep column 'meta': 'nine' is not of the column's type int64"
    assert rows["bad-meta"]["meta"] is None
    assert summary(tmp_path / "outputs" / "jl")["rows_error"] == 4


def test_two_shards_union_equals_one_run(tmp_path, tiny_models, monkeypatch):
    pq.write_table(pa.table({"text": PROMPTS[:17]}), tmp_path / "in.parquet")
    write_job(tmp_path, "sh", tiny_job(tiny_models, {"path": "in.parquet", "prompt_column": "text"}))
    args = ["job=sh", "drafter=model", "drafter.k=2"]
    assert run_inprocess(tmp_path, *args, "output.dir=single", monkeypatch=monkeypatch) == 0
    assert run_inprocess(tmp_path, *args, "output.dir=sharded", "shard.index=1", "shard.count=2",
                         monkeypatch=monkeypatch) == 0
    assert not summary(tmp_path / "sharded")["shards"]["complete"]
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")  # shard 0 from a SLURM array's environment
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "2")
    from batchspec.jobs import cli
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["batchspec", *args, "output.dir=sharded"])
    cli.main()
    files = sorted(f.name for f in (tmp_path / "sharded" / "data").iterdir())
    assert files[0].startswith("shard-00000-of-00002") and files[-1].startswith("shard-00001-of-00002")
    assert read_output(tmp_path / "sharded") == read_output(tmp_path / "single")
    s = summary(tmp_path / "sharded")
    assert s["rows"] == 17 and s["shards"] == {"count": 2, "finished": [0, 1], "complete": True}


def test_multirun_over_two_k_values(tmp_path, tiny_models, monkeypatch):
    pq.write_table(pa.table({"text": PROMPTS[:6]}), tmp_path / "in.parquet")
    write_job(tmp_path, "mr", tiny_job(tiny_models, {"path": "in.parquet", "prompt_column": "text"}))
    assert run_inprocess(tmp_path, "-m", "job=mr", "drafter=ngram", "drafter.k=1,3", monkeypatch=monkeypatch) == 0
    out = tmp_path / "outputs" / "mr"
    made = sorted(str(p.parent.relative_to(out)) for p in out.glob("**/data"))
    assert made == ["drafter.k=1/drafter=ngram", "drafter.k=3/drafter=ngram"]  # hive partitions: key=value segments
    for name, k in zip(made, (1, 3)):
        s = summary(out / name)
        assert s["rows"] == 6 and s["config"]["drafter"]["k"] == k and len(s["acceptance_by_position"]) == k
    # Greedy: K changes the drafting, never the text.
    texts = [[r["completion_token_ids"] for r in read_output(out / name)] for name in made]
    assert texts[0] == texts[1]


def start_job(workdir: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "batchspec", *args], cwd=workdir, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for_parts(data: Path, n: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while len(list(data.glob("*.parquet"))) < n:
        assert proc.poll() is None, f"job ended before writing {n} parts:\n{proc.stdout.read()}"
        assert time.time() < deadline, "job too slow"
        time.sleep(0.02)


@pytest.mark.slow
def test_sigkill_then_rerun_is_exactly_once_and_equals_uninterrupted(tmp_path, tiny_models):
    """Seeded sampling with n-gram drafts: after kill -9 mid-run, a rerun completes the output with no
    row lost or duplicated, and it equals an uninterrupted run's row for row."""
    pq.write_table(pa.table({"text": PROMPTS}), tmp_path / "in.parquet")
    write_job(tmp_path, "kill", tiny_job(tiny_models, {"path": "in.parquet", "prompt_column": "text"},
                                         output={"rows_per_file": 2}, batch_size=2,
                                         sampling={"max_new_tokens": 24, "temperature": 0.9, "seed": 7}))
    args = ["job=kill", "drafter=ngram"]
    proc = start_job(tmp_path, *args)
    data = tmp_path / "outputs" / "kill" / "data"
    wait_for_parts(data, 3, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    parts = len(list(data.glob("*.parquet")))
    assert 3 <= parts < len(PROMPTS) / 2 and not (tmp_path / "outputs" / "kill" / "summary.json").exists()

    rerun = run_cli(tmp_path, *args)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{len(PROMPTS) - 2 * parts} rows to do ({2 * parts} already done)" in rerun.stdout
    resumed = read_output(tmp_path / "outputs" / "kill")
    assert len(resumed) == len(PROMPTS) and len({r["id"] for r in resumed}) == len(PROMPTS)

    whole = run_cli(tmp_path, *args, "output.dir=uninterrupted")
    assert whole.returncode == 0, whole.stderr
    assert resumed == read_output(tmp_path / "uninterrupted")
    assert summary(tmp_path / "outputs" / "kill")["rows"] == len(PROMPTS)


@pytest.mark.slow
def test_sigterm_flushes_and_exits_then_resumes(tmp_path, tiny_models):
    pq.write_table(pa.table({"text": PROMPTS}), tmp_path / "in.parquet")
    write_job(tmp_path, "term", tiny_job(tiny_models, {"path": "in.parquet", "prompt_column": "text"},
                                         output={"rows_per_file": 4}, batch_size=2, sampling={"max_new_tokens": 24}))
    proc = start_job(tmp_path, "job=term")
    data = tmp_path / "outputs" / "term" / "data"
    wait_for_parts(data, 1, proc)
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGTERM)  # as under srun: the step's SIGTERM and srun's forwarded copy
    log = proc.communicate(timeout=60)[0]
    assert proc.returncode == 128 + signal.SIGTERM, log
    assert "SIGTERM: finishing the rows in flight" in log and "rerun the same command to resume" in log
    assert "stopping now" not in log  # a repeated SIGTERM within a second is the same request
    first = read_output(tmp_path / "outputs" / "term")
    assert 4 <= len(first) < len(PROMPTS)
    assert not list((tmp_path / "outputs" / "term" / ".tmp").iterdir())
    rerun = run_cli(tmp_path, "job=term")
    assert rerun.returncode == 0, rerun.stderr
    rows = read_output(tmp_path / "outputs" / "term")
    assert sorted(r["id"] for r in rows) == sorted(str(i) for i in range(len(PROMPTS)))
    assert by_id(rows) | by_id(first) == by_id(rows)  # rows written before the signal are kept as they were


@pytest.mark.slow
@pytest.mark.skipif(not (ASSETS_DIR / "demo" / "target").is_dir(), reason="the demo pair is not built")
def test_demo_pair_speculates(tmp_path, monkeypatch):
    """The shipped, trained pair: drafts are mostly accepted (a random pair gets ~1.0 tokens per forward)."""
    assert run_inprocess(tmp_path, "job=demo", "source.limit=12", "sampling.max_new_tokens=32",
                         "output.dir=demo-out", monkeypatch=monkeypatch) == 0
    s = summary(tmp_path / "demo-out")
    assert s["rows"] == 12 and s["rows_error"] == 0
    assert s["tokens_per_target_forward"] > 1.5
    assert s["acceptance_by_position"][0] > s["acceptance_by_position"][-1] > 0


def test_a_job_with_tree_drafts(tmp_path, tiny_models, monkeypatch):
    """drafter.tree through the job runner: the same text as chains, tree rounds in the rows and the summary."""
    pq.write_table(pa.table({"text": PROMPTS[:6]}), tmp_path / "in.parquet")
    write_job(tmp_path, "tr", tiny_job(tiny_models, {"path": "in.parquet", "prompt_column": "text"}))
    assert run_inprocess(tmp_path, "job=tr", "drafter=ngram", "output.dir=chain", monkeypatch=monkeypatch) == 0
    assert run_inprocess(tmp_path, "job=tr", "drafter=ngram", "drafter.tree=3x3", "output.dir=tree",
                         monkeypatch=monkeypatch) == 0
    chain, tree = read_output(tmp_path / "chain"), read_output(tmp_path / "tree")
    assert [r["completion_token_ids"] for r in tree] == [r["completion_token_ids"] for r in chain]
    assert all(set(r["tree_per_round"][1:]) == {"3x3"} for r in tree if r["target_forwards"] > 1)
    s = summary(tmp_path / "tree")
    assert s["rounds_by_tree"]["3x3"] > 0 and not any(s["rounds_by_k"][1:])
    # a tree drafts one position per depth: nothing is proposed at positions past 3
    assert s["acceptance_by_position"][0] is not None and all(a is None for a in s["acceptance_by_position"][3:])
    # The report predicts from tree rounds too: a 3x3 tree verifies 9 nodes (a forward of 10 tokens).
    (tmp_path / "tree" / "calibrate.json").write_text(json.dumps(
        {"drafter": "ngram", "curves": {"3": {"target_ms": [10.0 + t for t in range(12)], "draft_ms": 0.0}}}))
    from batchspec.report import build_report

    outs, _, printed = build_report([tmp_path / "tree"], tmp_path / "tree.html", plots=False)
    assert outs[0].prediction["speedup"] == pytest.approx(s["tokens_per_target_forward"] * 10.0 / 19.0)
    assert "ngram tree 3x3 fixed" in printed and f"3x3 {s['rounds_by_tree']['3x3']}" in printed
    assert run_inprocess(tmp_path, "job=tr", "drafter=none", "drafter.tree=2x2", "output.dir=bad",
                         monkeypatch=monkeypatch) == 2


def test_a_sweeps_next_job_loads_its_models_after_the_last_jobs_are_freed(tmp_path, tiny_models, monkeypatch):
    """Hydra -m runs a sweep's jobs in one process. The engine's parts refer to each other, so a finished job's
    models, KV caches and captured steps would wait for the cycle collector: the job frees them as it ends, and
    the next job loads its models with none of the last job's alive. The collector is off for the test, so that
    only the job's own collection can free them."""
    import gc
    from transformers import PreTrainedModel

    import batchspec.jobs.shard as shard

    pq.write_table(pa.table({"text": PROMPTS[:4]}), tmp_path / "in.parquet")
    write_job(tmp_path, "sw", tiny_job(tiny_models, {"path": "in.parquet", "prompt_column": "text"}))
    alive_at_load = []

    def load_job_models(*args, **kwargs):
        alive_at_load.append(sum(isinstance(o, PreTrainedModel) for o in gc.get_objects()))
        return load(*args, **kwargs)

    load = shard.load_job_models
    monkeypatch.setattr(shard, "load_job_models", load_job_models)
    gc.collect()
    before = sum(isinstance(o, PreTrainedModel) for o in gc.get_objects())
    gc.disable()
    try:
        code = run_inprocess(tmp_path, "-m", "job=sw", "drafter=model", "drafter.k=1,2", monkeypatch=monkeypatch)
    finally:
        gc.enable()
    assert code == 0 and alive_at_load == [before, before]
