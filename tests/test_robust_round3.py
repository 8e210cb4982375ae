"""Issue 21: no row lost, duplicated or silently wrong, round 3. Values that killed the job (deep JSON,
huge integers, dates Python cannot hold, a huge chat prompt), settings that passed silently (concurrent
shards with other settings, reordered inputs, a JSONL line extended by an append, an output inside its
input, tiny temperatures, checkpoints missing weights), setup errors that were tracebacks, and the
decisions of item 13. Each test failed on the code before its fix."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchspec.sources.prompts import PromptBuilder
from batchspec.sources import RowSelector, open_source
from conftest_jobs import (  # noqa: F401 (fixtures)
    one_line_error as last_error_line, one_thread, read_output, run_inprocess, tiny_job, tiny_models, write_job,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def by_id(out_dir):
    return {r["id"]: r for r in read_output(out_dir)}


def requests(path, needed, **builder):
    """The Requests a job would build from `path` (position ids), as {id: error}."""
    source = open_source(str(path), "auto", "train", needed)
    selector = RowSelector(source, id_column=builder.pop("id_column", None), shard_index=0, shard_count=1,
                           limit=None, done=set())
    b = PromptBuilder(prompt_column="text", template=None, chat=False, **builder,
                      keep_schema=pa.schema([source.schema.field(c) for c in builder.get("keep_columns", [])]),
                      check_columns=source.check_columns)
    return {r.id: r.error for r in map(b.request, selector)}


# ---- items 1-3: one value never stops the job -----------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000  # nested deeper than any recursion limit (inductor raises it to 2,000)
HUGE = "9" * 5000  # an integer of more than 4,300 digits


@pytest.mark.parametrize("line, needed, error", [
    ('{"text": "a", "x": %s}' % DEEP, {"text": "p"},
     "line 2 nests values too deeply for Python's JSON reader (about 1,000 levels)"),
    ('{"text": "a", "x": %s}' % HUGE, {"text": "p"}, None),  # a column the job does not read: ignored
    ('{"text": "a", "x": %s}' % HUGE, {"text": "p", "x": "k"},
     "keep column 'x': the value is an integer of 5000 digits, more than Python reads (4300)"),
    ('{"text": %s}' % HUGE, {"text": "p"},
     "source.prompt_column 'text' is an integer of 5000 digits, more than Python reads (4300)"),
    ('{"text": "a", "id": -%s}' % HUGE, {"text": "p", "id": "i"},
     "source.id_column 'id' is an integer of 5000 digits, more than Python reads (4300) in row 1"),
])
def test_jsonl_values_python_cannot_read_are_row_errors(tmp_path, line, needed, error):
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "first", "x": 1, "id": 0}\n' + line + '\n{"text": "last", "x": 2, "id": 2}\n')
    keep = [c for c, key in needed.items() if key == "k"]
    id_column = "id" if "id" in needed else None
    got = requests(path, needed, keep_columns=keep, id_column=id_column)
    assert list(got.values()) == [None, error, None]  # the rows around it are read too


@pytest.mark.parametrize("column, array", [
    ("ts", pa.array([0, 2**63 - 1, 5], pa.timestamp("ms"))),
    ("day", pa.array([0, 10**8, 5], pa.date32())),
])
@pytest.mark.parametrize("role", ["keep", "id"])
def test_parquet_dates_python_cannot_hold_are_row_errors(tmp_path, column, array, role):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": ["a", "b", "c"], column: array}), path)
    if role == "keep":
        got = requests(path, {"text": "p", column: "k"}, keep_columns=[column])
        assert got["0"] is None and got["2"] is None
        assert got["1"].startswith(f"keep column {column!r}: the value holds a {array.type} value Python cannot "
                                   "represent (")
    else:
        got = requests(path, {"text": "p", column: "i"}, id_column=column)
        assert len(got) == 3 and list(got.values())[0] is None and list(got.values())[2] is None
        assert got["\x00row-1"].startswith(f"source.id_column {column!r} holds a {array.type} value Python")
        assert got["\x00row-1"].endswith("in row 1")


def test_a_job_writes_the_rows_around_values_python_cannot_read(tmp_path, tiny_models, monkeypatch):
    lines = ['{"text": "hello world"}', '{"text": "the dog", "x": %s}' % DEEP, '{"text": "a cat", "x": %s}' % HUGE,
             '{"text": %s}' % HUGE, '{"text": "the fox"}']
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    write_job(tmp_path, "j", tiny_job(tiny_models, {"path": "in.jsonl", "prompt_column": "text"},
                                      sampling={"max_new_tokens": 2}))
    assert run_inprocess(tmp_path, "job=j", monkeypatch=monkeypatch) == 0
    rows = by_id(tmp_path / "outputs" / "j")
    assert sorted(rows) == ["0", "1", "2", "3", "4"]
    assert [rows[i]["error"] is None for i in "01234"] == [True, False, True, False, True]
    assert rows["1"]["error"].startswith("line 2 nests values too deeply")


# ---- item 4: a huge chat prompt is refused before it is tokenized ---------------------------------


@pytest.mark.parametrize("prompt", ["hello " * 30_000, [{"role": "user", "content": "hello " * 30_000}]])
def test_a_huge_chat_prompt_is_refused_before_tokenizing(prompt):
    from conftest_jobs import build_tokenizer
    from batchspec.sources import Row

    tokenizer = build_tokenizer()
    tokenized = []
    real = tokenizer.apply_chat_template
    tokenizer.apply_chat_template = lambda messages, **kw: tokenized.append(messages) or real(messages, **kw)
    builder = PromptBuilder(prompt_column="text", template=None, chat=True, tokenizer=tokenizer, max_seq_len=256)
    request = builder.request(Row("0", 0, {"text": prompt}))
    assert request.error == "chat messages have 180,004 characters, far more than max_seq_len=256 tokens hold"
    assert tokenized == []
    short = builder.request(Row("1", 1, {"text": "hello world"}))
    assert short.error is None and len(tokenized) == 1


# ---- items 9, 11, 12: settings that cannot run are one line and exit 2 ----------------------------


@pytest.fixture
def workdir(tmp_path, tiny_models):
    pq.write_table(pa.table({"text": ["hello world", "the quick brown fox"]}), tmp_path / "in.parquet")
    write_job(tmp_path, "tiny", tiny_job(tiny_models, {"path": "in.parquet", "prompt_column": "text"}))
    return tmp_path


@pytest.mark.parametrize("value", ["1e-40", "1e-38", "1e-45", "0.001"])
def test_temperatures_whose_scaled_logits_overflow_are_refused(capsys, monkeypatch, workdir, value):
    assert run_inprocess(workdir, "job=tiny", f"sampling.temperature={value}", monkeypatch=monkeypatch) == 2
    assert last_error_line(capsys) == (f"sampling.temperature={float(value)}: need 0 (greedy) or >= 0.01; "
                                       "smaller temperatures overflow the scaled logits")
    assert not (workdir / "outputs" / "tiny" / "data").exists()
    from batchspec.engine.sampling import SamplingParams

    with pytest.raises(ValueError, match="sampling.temperature"):
        SamplingParams(temperature=float(value))


def test_a_job_name_that_is_not_a_plain_name_is_refused(capsys, monkeypatch, workdir):
    (workdir / "jobs" / "...yaml").write_text((workdir / "jobs" / "tiny.yaml").read_text())
    assert run_inprocess(workdir, "job=..", monkeypatch=monkeypatch) == 2
    assert last_error_line(capsys).startswith("job=..: a job name must be a plain name")
    assert not (workdir / "data").exists() and not (workdir / "logs").exists()  # outputs/.. is the workdir


# ---- item 7: a line appended to a JSONL file whose last line had no newline -----------------------


@pytest.mark.parametrize("before, appended, joined", [
    ('{"text": "a"}\n{"text": "b"}', '{"text": "c"}\n', True),
    ('{"text": "a"}\n{"text": "b"}  ', '{"text": "c"}\n', True),
    ('{"text": "a"}\n{"text": "b"}', '\n{"text": "c"}\n', False),
    ('{"text": "a"}\n{"text": "b"}\n', '{"text": "c"}\n', False),
    ('{"text": "a"}\n  ', '{"text": "c"}\n', False),  # the old last line was blank: no row
])
def test_an_append_that_joins_the_last_line_is_a_change(tmp_path, before, appended, joined):
    path = tmp_path / "in.jsonl"
    path.write_text(before)
    stored = open_source(str(path), "jsonl", "train", {"text": "p"}).layout()
    with open(path, "a") as f:
        f.write(appended)
    source = open_source(str(path), "jsonl", "train", {"text": "p"})
    change = source.layout_change(stored, source.layout())
    assert (change is not None) == joined
    if joined:
        assert change == (f"the last line of {str(path)!r} had no newline, so what was appended joined it (its row "
                          f"changed); put a newline between the old end (byte {len(before)}) and the appended lines")


def test_a_resume_after_an_append_joined_the_last_line_is_refused(tmp_path, tiny_models, monkeypatch, capsys):
    (tmp_path / "in.jsonl").write_text('{"text": "hello world"}\n{"text": "the dog"}')
    write_job(tmp_path, "j", tiny_job(tiny_models, {"path": "in.jsonl", "prompt_column": "text"},
                                      sampling={"max_new_tokens": 2}))
    assert run_inprocess(tmp_path, "job=j", monkeypatch=monkeypatch) == 0
    with open(tmp_path / "in.jsonl", "a") as f:
        f.write('{"text": "a cat"}\n')  # echo >> in.jsonl
    assert run_inprocess(tmp_path, "job=j", monkeypatch=monkeypatch) == 2
    assert "the last line of 'in.jsonl' had no newline" in last_error_line(capsys)


# ---- item 8: an output inside its input, or an input inside its output ----------------------------


@pytest.mark.parametrize("source_path, out, message", [
    ("in", "in/out", "output.dir in/out is inside the input folder of source.path='in'"),
    ("in/**/*.parquet", "in/sub/out", "output.dir in/sub/out is inside the input folder of source.path='in/**/*.parquet'"),
    ("in", "in", "output.dir in is inside the input folder of source.path='in'"),
    ("outs/x/in.parquet", "outs/x", "source.path='outs/x/in.parquet' is inside output.dir outs/x"),
])
def test_an_output_inside_its_input_is_refused(tmp_path, tiny_models, monkeypatch, capsys, source_path, out, message):
    for folder in ("in", "outs/x"):
        (tmp_path / folder).mkdir(parents=True)
    table = pa.table({"text": ["hello world", "the dog"]})
    pq.write_table(table, tmp_path / "in" / "a.parquet")
    pq.write_table(table, tmp_path / "outs" / "x" / "in.parquet")
    write_job(tmp_path, "n", tiny_job(tiny_models, {"path": source_path, "prompt_column": "text"},
                                      sampling={"max_new_tokens": 2}, output={"dir": out}))
    assert run_inprocess(tmp_path, "job=n", monkeypatch=monkeypatch) == 2
    assert last_error_line(capsys).startswith(message)
    assert not (tmp_path / out / "data").exists()


# ---- items 10, 11: checkpoints that load wrong, and sizes that cannot fit ---------------------------


def broken_model(tiny_models, root, kind):
    """A copy of the tiny target whose weights file is broken in one way."""
    import shutil

    from safetensors.torch import load_file, save_file

    path = root / kind
    shutil.copytree(tiny_models.target, path)
    weights = path / "model.safetensors"
    tensors = load_file(weights)
    if kind == "missing-layer":
        save_file({k: v for k, v in tensors.items() if ".layers.1." not in k}, weights, metadata={"format": "pt"})
    elif kind == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif kind == "other-shapes":
        save_file({k: v.repeat(2, *[1] * (v.dim() - 1)) for k, v in tensors.items()}, weights,
                  metadata={"format": "pt"})
    elif kind == "unexpected":
        save_file({**tensors, "model.layers.7.extra.weight": tensors["model.norm.weight"].clone()}, weights,
                  metadata={"format": "pt"})
    return path


@pytest.mark.parametrize("kind, message", [
    ("missing-layer", "the checkpoint lacks 9 weight(s) the model needs (e.g. model.layers.1.input_layernorm.weight), "
                      "which would be random: is a weights file missing or cut short?"),
    ("truncated", "Error while deserializing header"),
    ("other-shapes", "21 weight(s) have other shapes than config.json says (e.g. lm_head.weight: [138, 32] in the "
                     "checkpoint, [69, 32] in the model): are these another model's weights?"),
    ("unexpected", "the checkpoint holds 1 weight(s) the model does not have (e.g. model.layers.7.extra.weight)"),
])
def test_a_checkpoint_that_does_not_load_exactly_is_one_line(tmp_path, tiny_models, monkeypatch, capsys, workdir,
                                                           kind, message):
    model = broken_model(tiny_models, tmp_path / "models", kind)
    assert run_inprocess(workdir, "job=tiny", f"model.target={model}", "drafter=none", monkeypatch=monkeypatch) == 2
    line = last_error_line(capsys)
    assert line.startswith(f"cannot load model {str(model)!r}: ") and message in line
    assert not list((workdir / "outputs" / "tiny" / "data").glob("*.parquet"))


def test_kv_caches_that_cannot_fit_are_refused_before_allocating(capsys, monkeypatch, workdir):
    assert run_inprocess(workdir, "job=tiny", "batch_size=1000000000", "drafter=none", monkeypatch=monkeypatch) == 2
    line = last_error_line(capsys)
    assert line.startswith("batch_size=1000000000 with max_seq_len=256: the KV caches need ")
    assert line.endswith("GiB of memory of cpu; lower batch_size or max_seq_len")


# ---- item 5: shards of one output dir started together with different settings --------------------


def test_a_shard_started_beside_a_running_one_with_other_settings_is_refused(tmp_path, monkeypatch, capsys,
                                                                             workdir):
    import shutil

    from batchspec.jobs.locks import ShardLock

    shard = ["shard.count=2", "drafter=none"]
    # What shard 0 has done by the time it loads its models: its lock taken, job.json written.
    assert run_inprocess(workdir, "job=tiny", "shard.index=0", *shard, "sampling.max_new_tokens=4",
                         "output.dir=first", monkeypatch=monkeypatch) == 0
    out = workdir / "outputs" / "tiny"
    out.mkdir(parents=True)
    shutil.copy(workdir / "first" / "job.json", out / "job.json")
    with ShardLock(out, 0, 2):
        assert run_inprocess(workdir, "job=tiny", "shard.index=1", *shard, "sampling.max_new_tokens=2",
                             monkeypatch=monkeypatch) == 2
        assert last_error_line(capsys).startswith(
            "output.dir outputs/tiny is being written by another run with a different sampling.max_new_tokens (4, now 2)")
        assert run_inprocess(workdir, "job=tiny", "shard.index=1", *shard, "sampling.max_new_tokens=4",
                             monkeypatch=monkeypatch) == 0  # the same settings are welcome
    # With nothing running and no parts, job.json is a leftover: a run with other settings replaces it.
    shutil.rmtree(out / "data")
    assert run_inprocess(workdir, "job=tiny", "shard.index=1", *shard, "sampling.max_new_tokens=2",
                         monkeypatch=monkeypatch) == 0


def test_status_compares_the_settings_every_part_records(tmp_path, monkeypatch, capsys, workdir):
    from batchspec.jobs import status

    shard = ["shard.count=2", "drafter=none"]
    out = workdir / "outputs" / "tiny"
    assert run_inprocess(workdir, "job=tiny", "shard.index=0", *shard, "sampling.max_new_tokens=4",
                         monkeypatch=monkeypatch) == 0
    assert status.main([str(out)]) == 1  # shard 1 is missing
    (out / "job.json").unlink()  # as if shard 1 had started beside shard 0, or the refusal was overridden
    assert run_inprocess(workdir, "job=tiny", "shard.index=1", *shard, "sampling.max_new_tokens=2",
                         "batch_size=2", monkeypatch=monkeypatch) == 0
    capsys.readouterr()
    assert status.main([str(out)]) == 1
    report = status.status(out)
    assert not report["complete"]
    assert report["problems"] == [
        "parts made with DIFFERENT SETTINGS: 1 part file(s) differ from the first (e.g. sampling.max_new_tokens is 4 "
        "in shard-00000-of-00002-part-000000.parquet but 2 in shard-00001-of-00002-part-000000.parquet); "
        "their rows do not belong in one output dir"]


# ---- item 6: rows swapped within a file that keeps its footer (or its size) ------------------------


def swap_rows(path, write):
    """Write `path` with its first two rows swapped, the same way as before."""
    rows = pq.read_table(path).to_pylist()
    rows[0], rows[1] = rows[1], rows[0]
    write(pa.Table.from_pylist(rows), path)


@pytest.mark.parametrize("options", [
    {"compression": "none"},
    {"compression": "none", "use_dictionary": False},
    {"compression": "none", "use_dictionary": False, "write_statistics": False},
])
def test_parquet_rows_swapped_under_the_same_footer_are_a_change(tmp_path, options):
    path = tmp_path / "in.parquet"

    def write(table, p):
        pq.write_table(table, p, **options)

    write(pa.table({"text": ["hello world", "the dog is", "a cat"]}), path)
    stored = open_source(str(path), "auto", "train", {"text": "p"}).layout()
    swap_rows(path, write)
    source = open_source(str(path), "auto", "train", {"text": "p"})
    current = source.layout()
    assert current[0]["footer"] == stored[0]["footer"]  # what the check compared before
    assert source.layout_change(stored, current).startswith(f"{str(path)!r} (rows 3, footer ")
    stored_before_digests = [{k: v for k, v in stored[0].items() if k != "columns"}]
    assert source.layout_change(stored_before_digests, source.layout()) is None  # an older job.json still resumes


def test_a_json_folder_read_by_datasets_with_lines_swapped_is_a_change(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.json").write_text('{"text": "hello"}\n{"text": "world"}\n')
    stored = open_source(str(folder), "hf", "train", {"text": "p"}).layout()
    (folder / "a.json").write_text('{"text": "world"}\n{"text": "hello"}\n')  # same name, same size
    source = open_source(str(folder), "hf", "train", {"text": "p"})
    assert source.layout_change(stored, source.layout()).startswith("'a.json' (bytes 36, sha256 ")


def test_a_resume_over_rows_swapped_in_a_parquet_file_is_refused(tmp_path, tiny_models, monkeypatch, capsys):
    def write(table, p):
        pq.write_table(table, p, compression="none")

    write(pa.table({"text": ["hello world", "the dog is", "a cat"]}), tmp_path / "in.parquet")
    write_job(tmp_path, "s", tiny_job(tiny_models, {"path": "in.parquet", "prompt_column": "text", "limit": 2},
                                      sampling={"max_new_tokens": 2}))
    assert run_inprocess(tmp_path, "job=s", monkeypatch=monkeypatch) == 0
    swap_rows(tmp_path / "in.parquet", write)
    assert run_inprocess(tmp_path, "job=s", "source.limit=3", monkeypatch=monkeypatch) == 2
    assert last_error_line(capsys).startswith("the input changed since the rows in outputs/s were made: 'in.parquet'")


# ---- item 13: decisions ------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    '[{"text": "a"}, {"text": "b"}]\n',
    '[\n  {"text": "a"},\n  {"text": "b"}\n]\n',
    '\n[\n{"text": "a"}\n,\n{"text": "b"}\n]\n',  # before: its objects were rows 1 and 3, the brackets row errors
])
def test_a_json_file_holding_an_array_is_refused(tmp_path, text):
    from batchspec.sources import SourceError

    path = tmp_path / "in.json"
    path.write_text(text)
    with pytest.raises(SourceError) as e:
        open_source(str(path), "auto", "train", {"text": "p"})
    assert str(e.value) == (f"{str(path)!r} holds a JSON array, not JSON Lines (one object per line): convert it, "
                            f"e.g. jq -c '.[]' {path} > rows.jsonl")


def test_jsonl_ids_are_compared_as_text(tmp_path):
    """Decided (docs/jobs.md): an id is its value as text, so 7 and "7" are one id; the later row is skipped
    and counted as a duplicate, as for any repeated id. (This test passed before: it pins the decision.)"""
    path = tmp_path / "in.jsonl"
    path.write_text('{"id": 7, "text": "a"}\n{"id": "7", "text": "b"}\n{"id": 7.0, "text": "c"}\n')
    source = open_source(str(path), "auto", "train", {"text": "p", "id": "i"})
    selector = RowSelector(source, id_column="id", shard_index=0, shard_count=1, limit=None, done=set())
    assert [(r.id, r.values["text"]) for r in selector] == [("7", "a"), ("7.0", "c")]
    assert selector.duplicates == 1
