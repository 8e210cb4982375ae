"""Config: every job and group composes; typos and wrong types fail in Hydra; each setup error gives
its one promised line and exit status 2 before (or instead of) generating anything."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from batchspec.jobs.config import SHIPPED_JOBS_DIR
from conftest_jobs import one_thread, run_inprocess, tiny_job, tiny_models, write_job  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("one_thread")

SHIPPED_JOBS = sorted(p.stem for p in SHIPPED_JOBS_DIR.glob("*.yaml"))


@pytest.fixture
def workdir(tmp_path, tiny_models):
    pq.write_table(pa.table({"text": ["hello world", "the quick brown fox"], "topic": ["a", "b"]}),
                   tmp_path / "in.parquet")
    write_job(tmp_path, "tiny", tiny_job(tiny_models, {"path": "in.parquet", "prompt_column": "text"}))
    return tmp_path


def composed(capsys, monkeypatch, workdir, *args) -> dict:
    assert run_inprocess(workdir, *args, "--cfg", "job", "--resolve", monkeypatch=monkeypatch) == 0
    return yaml.safe_load(capsys.readouterr().out)


def test_shipped_jobs_exist_and_compose(capsys, monkeypatch, tmp_path):
    assert "demo" in SHIPPED_JOBS
    for name in SHIPPED_JOBS:
        cfg = composed(capsys, monkeypatch, tmp_path, f"job={name}")
        assert cfg["model"]["target"] and cfg["source"]["path"], name
    demo = composed(capsys, monkeypatch, tmp_path, "job=demo")
    assert demo["drafter"]["name"] == "model" and demo["batch_size"] == 8
    assert demo["model"]["target"].endswith("batchspec/assets/demo/target")
    assert demo["source"]["path"].endswith("batchspec/assets/demo/prompts.parquet")
    assert demo["output"]["dir"] == "outputs/demo"


@pytest.mark.parametrize("drafter", ["none", "model", "ngram", "prompt_lookup"])
@pytest.mark.parametrize("sampling", ["greedy", "nucleus", "min_p"])
def test_groups_compose_and_job_values_win(capsys, monkeypatch, workdir, drafter, sampling):
    cfg = composed(capsys, monkeypatch, workdir, "job=tiny", f"drafter={drafter}", f"sampling={sampling}",
                   "drafter.k=2")
    assert cfg["drafter"]["name"] == drafter and cfg["drafter"]["k"] == 2
    assert cfg["sampling"]["max_new_tokens"] == 12  # from the job file, over the preset
    assert (cfg["sampling"]["temperature"] == 0.0) == (sampling == "greedy")
    assert set(cfg) == {"model", "drafter", "sampling", "source", "output", "shard", "progress", "batch_size",
                        "spare_slots", "max_seq_len", "threads", "retry_errors"}


@pytest.mark.parametrize("args, message", [
    (["drafter.kk=3"], "batchspec: error: unknown key 'drafter.kk' (did you mean drafter.k?)"),
    (["sampling.temprature=0.7"], "batchspec: error: unknown key 'sampling.temprature' (did you mean sampling.temperature?)"),
    # '+' adds a key to Hydra's config, and OmegaConf.to_object dropped it without a word (issue 11, item 13)
    (["+sampling.temprature=0.7"], "unknown key 'sampling.temprature' (did you mean sampling.temperature?)"),
    (["++sampling.temprature=0.7"], "unknown key 'sampling.temprature' (did you mean sampling.temperature?)"),
    (["+sampling.temprature=0.7", "--cfg", "job"], "unknown key 'sampling.temprature'"),
    (["+nonsense=1"], "unknown key 'nonsense'; the top-level keys are model, drafter, sampling"),
    (["batch_size=eight"], "Value 'eight' of type 'str' could not be converted to Integer"),
    (["model.dtype=float23"], "Invalid value 'float23', expected one of [auto, float32, bfloat16, float16]"),
    (["source.format=csv"], "Invalid value 'csv', expected one of [auto, parquet, hf, jsonl, openai]"),
    (["drafter=medusa"], "Could not find 'drafter/medusa'"),
])
def test_hydra_rejects_typos_and_wrong_types(capsys, monkeypatch, workdir, args, message):
    assert run_inprocess(workdir, "job=tiny", *args, monkeypatch=monkeypatch) == 1
    assert message in capsys.readouterr().err
    assert not (workdir / "outputs" / "tiny" / "data").exists()


def test_unknown_job_lists_the_jobs(capsys, monkeypatch, workdir):
    assert run_inprocess(workdir, "job=tinyy", monkeypatch=monkeypatch) == 1
    err = capsys.readouterr().err
    assert "Could not find 'job/tinyy'" in err and "tiny" in err and "demo" in err


@pytest.mark.parametrize("body, message", [
    ({"model": {"target": "x"}, "sourc": {"path": "in.parquet"}}, "unknown key 'sourc' (did you mean source?)"),
    # issue 58 item 4: Hydra's ConfigKeyError took several lines for what the command line says in one
    ({"model": {"target": "x"}, "source": {"path": "in.parquet", "row_param": {"a": "b"}}},
     "unknown key 'source.row_param' (did you mean source.row_params?)"),
    ({"sampling": {"max_new_token": 3}}, "unknown key 'sampling.max_new_token' (did you mean sampling.max_new_tokens?)"),
])
def test_typo_inside_a_job_file(capsys, monkeypatch, workdir, body, message):
    """The same one line as for the same typo on the command line, naming the file."""
    write_job(workdir, "typo", body)
    assert run_inprocess(workdir, "job=typo", monkeypatch=monkeypatch) == 1
    line = one_line_error(capsys)
    assert message in line and "typo.yaml" in line


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("batchspec: error: ")
    return err[0].removeprefix("batchspec: error: ")


@pytest.mark.parametrize("args, message", [
    ([], "no job selected: pass job=NAME (jobs: "),
    (["job=tiny", "drafter=model", "model.draft=null"], "drafter=model needs model.draft"),
    (["job=tiny", "sampling.top_p=0"], "sampling.top_p=0.0: need 0 < top_p <= 1"),
    (["job=tiny", "batch_size=0"], "batch_size=0: need >= 1"),
    (["job=tiny", "drafter=ngram", "drafter.tree=2X3"], "drafter.tree '2X3': write BxD (branching x depth), e.g. 2x4"),
    (["job=tiny", "drafter=ngram", "drafter.tree='2x3,0x1'"], "drafter.tree '0x1': branching and depth must be at least 1"),
    (["job=tiny", "drafter=none", "drafter.tree=2x2"], "drafter.tree needs a drafter: model, ngram, prompt_lookup, suffix or eagle"),
    (["job=tiny", "source.keep_columns=[prompt]"], "source.keep_columns: 'prompt' is also an output column"),
    (["job=tiny", "source.template='{{ text '"], "source.template: unexpected end of template"),
    (["job=tiny", "source.prompt_column=question"],
     "source.prompt_column: column 'question' is not in in.parquet; available columns: text, topic"),
    (["job=tiny", "source.template='Q: {{ question }}'"],
     "source.template: column 'question' is not in in.parquet; available columns: text, topic"),
    (["job=tiny", "source.path=missing.parquet"], "source.path='missing.parquet' does not exist"),
    (["job=tiny", "source.path=in.jsonl"], "source.path='in.jsonl' does not exist or is not a file"),
    (["job=tiny", "shard.index=3", "shard.count=2"], "shard.index=3 shard.count=2: need count >= 1"),
    (["job=tiny", "model.target=model/that/is/not/here"], "model.target: no such local directory 'model/that/is/not/here'"),
    (["job=tiny", "max_seq_len=100000"], "max_seq_len=100000 exceeds the target's 256 positions"),
])
def test_setup_errors_give_one_line(capsys, monkeypatch, workdir, args, message):
    assert run_inprocess(workdir, *args, monkeypatch=monkeypatch) == 2
    assert message in one_line_error(capsys)
    assert not list((workdir / "outputs").glob("*/data/*.parquet"))


def test_model_errors_give_one_line(capsys, monkeypatch, workdir, tiny_models):
    assert run_inprocess(workdir, "job=tiny", f"model.target={tiny_models.not_a_model}", monkeypatch=monkeypatch) == 2
    assert f"cannot load model '{tiny_models.not_a_model}'" in one_line_error(capsys)
    assert run_inprocess(workdir, "job=tiny", "drafter=model", f"model.draft={tiny_models.incompatible_draft}",
                         monkeypatch=monkeypatch) == 2
    assert "is incompatible with target" in one_line_error(capsys)


def test_resuming_under_another_config_is_refused(capsys, monkeypatch, workdir):
    assert run_inprocess(workdir, "job=tiny", monkeypatch=monkeypatch) == 0
    capsys.readouterr()
    assert run_inprocess(workdir, "job=tiny", "sampling.max_new_tokens=5", monkeypatch=monkeypatch) == 2
    message = one_line_error(capsys)
    assert message.startswith("output.dir outputs/tiny holds rows made with a different sampling")
    assert "choose another output.dir, or delete outputs/tiny/job.json" in message
    # Keys that do not change the rows may change between runs.
    assert run_inprocess(workdir, "job=tiny", "batch_size=1", "output.rows_per_file=2",
                         monkeypatch=monkeypatch) == 0
