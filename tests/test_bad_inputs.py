"""Bad input values become error rows, never a dead job (issue 11, items 1-6): text that is not valid
Unicode, keep columns whose types differ or do not fit, unreadable files, missing columns, ids that
collide with made-up ones, and config values that pass the schema's types but cannot run."""

from __future__ import annotations

import codecs
import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchspec.jobs import status
from batchspec.jobs.layout import part_files
from batchspec.jobs.sink import ParquetSink
from batchspec.sources.prompts import PromptBuilder
from batchspec.sources import Row, RowSelector, SourceError, open_source
from batchspec.engine.types import Request, Result
from conftest_jobs import (  # noqa: F401 (fixtures)
    one_line_error as last_error_line, one_thread, read_output, run_inprocess, tiny_job, tiny_models, write_job,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def by_id(out_dir):
    return {r["id"]: r for r in read_output(out_dir)}


def summary(out_dir):
    return json.loads((out_dir / "summary.json").read_text())


# ---- 1. text that is not valid Unicode ----------------------------------------------------------


def test_jsonl_text_that_is_not_unicode_is_a_row_error(tmp_path, tiny_models, monkeypatch):
    lines = [json.dumps(r).encode() for r in [
        {"id": "ok", "text": "hello world", "k": "a"},
        {"id": "lone", "text": "hello \ud800 world", "k": "b"},  # json.dumps writes the escape \ud800
        {"id": "keep", "text": "hello world", "k": "x\ud800"},
        {"id": "\ud800", "text": "hello world", "k": "c"},
        {"id": "\x00nul", "text": "hello world", "k": "d"},
    ]] + [b'{"id": "raw", "text": "bad \xff byte", "k": "e"}', b'{"id": "raw-\xfe", "text": "hello", "k": "f"}']
    (tmp_path / "in.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    write_job(tmp_path, "u", tiny_job(tiny_models, {"path": "in.jsonl", "prompt_column": "text", "id_column": "id",
                                                   "keep_columns": ["k"]}))
    assert run_inprocess(tmp_path, "job=u", monkeypatch=monkeypatch) == 0
    rows = by_id(tmp_path / "outputs" / "u")
    assert sorted(rows) == sorted(["ok", "lone", "keep", "\x00row-3", "\x00row-4", "raw", "\x00row-6"])
    assert rows["ok"]["error"] is None and rows["ok"]["completion_tokens"] > 0
    assert rows["lone"]["error"] == ("source.prompt_column 'text' is not valid Unicode text "
                                     "(lone surrogate U+D800 at character 6)")
    assert rows["keep"]["error"].startswith("keep column 'k': 'x\\ud800' is not valid Unicode text")
    assert rows["keep"]["k"] is None and rows["lone"]["k"] == "b"
    assert rows["\x00row-3"]["error"].startswith("source.id_column 'id' is not valid Unicode text")
    assert rows["\x00row-3"]["error"].endswith("in row 3") and rows["\x00row-3"]["k"] == "c"
    assert rows["\x00row-4"]["error"].startswith("source.id_column 'id' starts with NUL")
    assert "the byte 0xFF is not UTF-8" in rows["raw"]["error"]
    assert "the byte 0xFE is not UTF-8" in rows["\x00row-6"]["error"]
    assert summary(tmp_path / "outputs" / "u")["rows_error"] == 6


def test_parquet_strings_that_are_not_utf8_are_row_errors(tmp_path, tiny_models, monkeypatch):
    def strings(values):  # Parquet does not check UTF-8 on write: build the column from raw bytes
        return pa.array(values, pa.binary()).view(pa.string())

    pq.write_table(pa.table({"qid": strings([b"q0", b"q1", b"q\xff2", b"q3"]),
                             "text": strings([b"hello world", b"bad \xff\xfe text", b"the dog", b"a cat"]),
                             "topic": strings([b"t0", b"t1", b"t2", b"t\xc3"])}), tmp_path / "in.parquet")
    write_job(tmp_path, "p", tiny_job(tiny_models, {"path": "in.parquet", "prompt_column": "text", "id_column": "qid",
                                                   "keep_columns": ["topic"]}))
    assert run_inprocess(tmp_path, "job=p", monkeypatch=monkeypatch) == 0
    rows = by_id(tmp_path / "outputs" / "p")
    assert sorted(rows) == ["\x00row-2", "q0", "q1", "q3"]
    assert rows["q0"]["error"] is None
    assert rows["q1"]["error"] == "source.prompt_column 'text' is not valid UTF-8 (byte 0xff at offset 4)"
    assert rows["\x00row-2"]["error"] == "source.id_column 'qid' is not valid UTF-8 (byte 0xff at offset 1) in row 2"
    assert rows["q3"]["error"] == "keep column 'topic': the value is not valid UTF-8 (byte 0xc3 at offset 1)"


def test_generate_reports_text_that_is_not_unicode(tiny_models):
    import batchspec

    kw = dict(target=str(tiny_models.target), max_new_tokens=3, device="cpu", dtype="float32")
    results = batchspec.generate(["hello world", "hello \ud800"], **kw)
    assert results[0].error is None and results[0].completion_tokens == 3
    assert results[1].finish_reason == "error" and "lone surrogate U+D800" in results[1].error
    results = batchspec.generate(["hello world", "the dog"], ids=["a", "b\udcff"], **kw)
    assert results[0].error is None
    assert results[1].id == "b\udcff" and results[1].error.startswith("id is not valid Unicode text")


def test_a_row_the_part_writer_cannot_store_is_written_as_an_error(tmp_path):
    good = Result(id="r0", prompt="p", completion="c", completion_token_ids=[1], finish_reason="length", error=None,
                  prompt_tokens=1, completion_tokens=1, target_forwards=1, draft_tokens=0, accepted_tokens=0,
                  acceptance_rate=None, tokens_per_forward=1.0, accepted_per_round=[0], drafts_per_round=[0], tree_per_round=[""], latency_s=0.1,
                  extra={"topic": "ok"})
    bad = Result.error_result(Request(id="r1", prompt="p", extra={"topic": "x\ud800"}), "prompt is empty")
    sink = ParquetSink(tmp_path, shard_index=0, shard_count=1, rows_per_file=10,
                       keep_schema=pa.schema([("topic", pa.string())]))
    sink.add(good)
    sink.add(bad)
    sink.flush()
    rows = {r["id"]: r for r in pq.read_table(part_files(tmp_path)[0]).to_pylist()}
    assert rows["r0"]["topic"] == "ok" and rows["r0"]["error"] is None
    assert rows["r1"]["topic"] is None and rows["r1"]["finish_reason"] == "error"
    assert rows["r1"]["error"].startswith("column 'topic' of this row could not be written")


# ---- 2. keep column types -----------------------------------------------------------------------


def test_keep_column_types_that_differ_between_files(tmp_path, tiny_models, monkeypatch):
    folder = tmp_path / "in"
    folder.mkdir()
    pq.write_table(pa.table({"text": ["hello world", "the dog"], "tag": ["a", "b"],
                             "n": pa.array([1, 2], pa.int32())}), folder / "a.parquet")
    pq.write_table(pa.table({"text": ["a cat", "the fox"], "tag": pa.array([5, 6], pa.int64()),
                             "n": pa.array([3, 2**40], pa.int64())}), folder / "b.parquet")
    write_job(tmp_path, "t", tiny_job(tiny_models, {"path": "in", "prompt_column": "text", "keep_columns": ["tag", "n"]}))
    assert run_inprocess(tmp_path, "job=t", monkeypatch=monkeypatch) == 0
    rows = by_id(tmp_path / "outputs" / "t")
    assert [rows[i]["n"] for i in "0123"] == [1, 2, 3, 2**40]  # int32 and int64 unify to int64
    assert (rows["0"]["tag"], rows["1"]["tag"]) == ("a", "b") and rows["0"]["error"] is None
    for i, value in (("2", 5), ("3", 6)):  # string and int64 do not unify: the first file's type wins
        assert rows[i]["tag"] is None and rows[i]["error"] == f"keep column 'tag': {value} is not of the column's type string"
    assert pq.read_schema(part_files(tmp_path / "outputs" / "t")[0]).field("n").type == pa.int64()


def test_jsonl_numbers_that_do_not_fit_the_column_are_row_errors(tmp_path, tiny_models, monkeypatch):
    values = [1, 2**64, 7.5, 7.0, -(2**63), None]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": "hello world", "n": v}) + "\n" for v in values))
    write_job(tmp_path, "j", tiny_job(tiny_models, {"path": "in.jsonl", "prompt_column": "text", "keep_columns": ["n"]}))
    assert run_inprocess(tmp_path, "job=j", monkeypatch=monkeypatch) == 0
    rows = by_id(tmp_path / "outputs" / "j")
    assert [rows[str(i)]["n"] for i in range(6)] == [1, None, None, 7, -(2**63), None]
    assert rows["1"]["error"] == f"keep column 'n': {2**64} is not of the column's type int64"
    assert rows["2"]["error"] == "keep column 'n': 7.5 does not fit the column's type int64 (it would be stored as 7)"
    assert [rows[str(i)]["error"] for i in (0, 3, 4, 5)] == [None] * 4


# ---- 3. unreadable files ------------------------------------------------------------------------


def test_truncated_jsonl_gz_writes_the_rows_before_then_reports_or_skips(tmp_path, tiny_models, monkeypatch, capsys):
    whole = gzip.compress("".join(json.dumps({"text": f"hello world {i}"}) + "\n" for i in range(400)).encode())
    (tmp_path / "in.jsonl.gz").write_bytes(whole[: len(whole) * 2 // 3])
    readable = 0
    try:
        with gzip.open(tmp_path / "in.jsonl.gz", "rt") as f:
            for line in f:
                readable += line.endswith("\n")
    except EOFError:
        pass
    assert 0 < readable < 400
    write_job(tmp_path, "gz", tiny_job(tiny_models, {"path": "in.jsonl.gz", "prompt_column": "text"},
                                       sampling={"max_new_tokens": 2}, batch_size=8, output={"rows_per_file": 100}))
    assert run_inprocess(tmp_path, "job=gz", monkeypatch=monkeypatch) == 2
    message = last_error_line(capsys)
    assert message.startswith(f"cannot read JSONL file in.jsonl.gz after line {readable}")
    assert "set source.skip_unreadable=true" in message
    out = tmp_path / "outputs" / "gz"
    assert sorted(by_id(out), key=int) == [str(i) for i in range(readable)]  # the rows before the break
    assert not (out / "shards").exists()  # not finished

    assert run_inprocess(tmp_path, "job=gz", "source.skip_unreadable=true", monkeypatch=monkeypatch) == 0
    skipped = summary(out)["skipped_files"]
    assert [f["file"] for f in skipped] == ["in.jsonl.gz"] and "end-of-stream" in skipped[0]["reason"]
    assert "unreadable input skipped  in.jsonl.gz" in capsys.readouterr().out
    assert status.main([str(out)]) == 0
    assert "skipped unreadable input (source.skip_unreadable): in.jsonl.gz" in capsys.readouterr().out


def test_jsonl_with_a_byte_order_mark(tmp_path):
    (tmp_path / "in.jsonl").write_bytes(codecs.BOM_UTF8 + b'{"text": "first"}\n{"text": "second"}\n')
    source = open_source(str(tmp_path / "in.jsonl"), "auto", "train", {"text": "source.prompt_column"})
    assert list(source.rows(0, 1, None)) == [(0, {"text": "first"}), (1, {"text": "second"})]


def corrupt_second_row_group(path):
    """Overwrite the page header of the file's second row group: the footer stays readable."""
    offset = pq.ParquetFile(path).metadata.row_group(1).column(0).data_page_offset
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(b"\xff" * 24)


def test_unreadable_parquet_files_in_a_folder(tmp_path, tiny_models, monkeypatch, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    texts = [f"hello world {i}" for i in range(90)]
    for name, part in (("a", texts[:30]), ("b", texts[30:60]), ("c", texts[60:])):
        pq.write_table(pa.table({"text": part}), folder / f"{name}.parquet", row_group_size=10,
                       compression="none", use_dictionary=False)
    corrupt_second_row_group(folder / "b.parquet")
    write_job(tmp_path, "pq", tiny_job(tiny_models, {"path": "in", "prompt_column": "text"},
                                       sampling={"max_new_tokens": 2}, batch_size=4, output={"rows_per_file": 7}))
    out = tmp_path / "outputs" / "pq"
    for attempt in range(2):  # a rerun stops at the same place, and adds nothing twice
        assert run_inprocess(tmp_path, "job=pq", monkeypatch=monkeypatch) == 2
        message = last_error_line(capsys)
        assert message.startswith("cannot read Parquet file in/b.parquet")
        assert "set source.skip_unreadable=true" in message
        ids = [r["id"] for r in read_output(out)]
        assert len(ids) == len(set(ids)) and set(map(str, range(30))) <= set(ids)  # every row of a.parquet
        assert set(ids) <= set(map(str, range(60)))
    assert run_inprocess(tmp_path, "job=pq", "source.skip_unreadable=true", monkeypatch=monkeypatch) == 0
    rows = by_id(out)
    assert set(map(str, range(60, 90))) <= set(rows) and rows["60"]["prompt"] == texts[60]  # c keeps its positions
    assert [f["file"] for f in summary(out)["skipped_files"]] == ["in/b.parquet"]

    # A file that is not Parquet at all: named in the error (not the folder), the files before it are run.
    (folder / "b.parquet").write_bytes(b"not parquet")
    with pytest.raises(SourceError, match="in/b.parquet"):
        list(open_source(str(folder), "auto", "train", {"text": "source.prompt_column"}).rows(0, 1, None))
    source = open_source(str(folder), "auto", "train", {"text": "source.prompt_column"}, skip_unreadable=True)
    assert [p for p, _ in source.rows(0, 1, None)] == list(range(60))  # b's row count is unknown: c follows a
    assert source.skipped[0]["file"].endswith("in/b.parquet")


# ---- 4. a column missing from some files --------------------------------------------------------


@pytest.mark.parametrize("lacking", ["a", "b"])
def test_a_needed_column_missing_from_one_file_names_the_file(tmp_path, lacking):
    folder = tmp_path / "in"
    folder.mkdir()
    for name in "abc":
        columns = {"other": [1, 2]} if name == lacking else {"text": ["x", "y"], "other": [1, 2]}
        pq.write_table(pa.table(columns), folder / f"{name}.parquet")
    with pytest.raises(SourceError) as e:
        open_source(str(folder), "auto", "train", {"text": "source.prompt_column"})
    assert str(e.value) == (f"source.prompt_column: column 'text' is missing from {folder}/{lacking}.parquet of "
                            f"{folder}; every file must have the columns the job reads")


def test_a_jsonl_object_without_the_prompt_key_says_so(tmp_path):
    (tmp_path / "in.jsonl").write_text('{"text": "hello", "id": 1}\n{"id": 2}\n{"text": null, "id": 3}\n')
    source = open_source(str(tmp_path / "in.jsonl"), "auto", "train", {"text": "source.prompt_column"})
    builder = PromptBuilder(prompt_column="text", template=None, chat=False)
    assert [builder.request(Row(str(p), p, values)).error for p, values in source.rows(0, 1, None)] == [
        None, "source.prompt_column 'text' is missing from this row", "source.prompt_column 'text' is null"]


# ---- 5. made-up ids never collide with real ones -------------------------------------------------


def test_made_up_ids_never_take_a_real_ids_place(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": ["a", "b", "c", "d"], "key": [None, "row-0", "0", "x"]}), path)
    source = open_source(str(path), "auto", "train", {"text": "source.prompt_column", "key": "source.id_column"})
    selector = RowSelector(source, id_column="key", shard_index=0, shard_count=1, limit=None, done=set())
    rows = list(selector)
    assert [r.id for r in rows] == ["\x00row-0", "row-0", "0", "x"]
    assert rows[0].error == "source.id_column 'key' is null in row 0"
    assert selector.duplicates == 0
    # ... and a resume that has the made-up id done skips only that row
    again = RowSelector(source, id_column="key", shard_index=0, shard_count=1, limit=None, done={"\x00row-0"})
    assert [r.id for r in again] == ["row-0", "0", "x"]


# ---- 6. values the schema's types allow but that cannot run -------------------------------------


@pytest.fixture
def workdir(tmp_path, tiny_models):
    pq.write_table(pa.table({"text": ["hello world", "the quick brown fox"], "topic": ["a", "b"]}),
                   tmp_path / "in.parquet")
    write_job(tmp_path, "tiny", tiny_job(tiny_models, {"path": "in.parquet", "prompt_column": "text"}))
    return tmp_path


@pytest.mark.parametrize("args, message", [
    (["sampling.temperature=inf"], "sampling.temperature=inf: need a finite number"),
    (["sampling.repetition_penalty=inf"], "sampling.repetition_penalty=inf: need a finite number"),
    (["sampling.temperature=nan"], "sampling.temperature=nan: need a finite number"),
    (["source.keep_columns=[topic,topic]"], "source.keep_columns lists 'topic' twice"),
])
def test_values_that_cannot_run_give_one_line(capsys, monkeypatch, workdir, args, message):
    assert run_inprocess(workdir, "job=tiny", *args, monkeypatch=monkeypatch) == 2
    assert last_error_line(capsys) == message
    assert not (workdir / "outputs" / "tiny" / "data").exists()


def test_progress_mode_off_in_a_job_file(capsys, monkeypatch, workdir):
    text = (workdir / "jobs" / "tiny.yaml").read_text().replace("mode: log", "mode: off")  # YAML 1.1: off is False
    assert "mode: off" in text
    (workdir / "jobs" / "quiet.yaml").write_text(text)
    assert run_inprocess(workdir, "job=quiet", monkeypatch=monkeypatch) == 0
    assert summary(workdir / "outputs" / "quiet")["config"]["progress"]["mode"] == "off"
