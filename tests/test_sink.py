"""Sink: atomic Parquet parts of rows_per_file rows, resume numbering, done ids, summary, readers."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from batchspec.jobs.layout import done_ids, part_files, summarize

from batchspec.jobs.schema import output_schema, RESULT_SCHEMA

from batchspec.jobs.sink import ParquetSink
from batchspec.engine.types import RESULT_COLUMNS, Request, Result


def result(i: int, error: bool = False) -> Result:
    extra = {"topic": f"t{i % 3}", "score": float(i)}
    if error:
        return Result.error_result(Request(id=f"r{i}", prompt=None, extra=extra), "prompt is null")
    return Result(
        id=f"r{i}", prompt=f"p{i}", completion=f"c{i}", completion_token_ids=[1, 2, 3], finish_reason="length",
        error=None, prompt_tokens=4, completion_tokens=3, target_forwards=2, draft_tokens=4, accepted_tokens=1,
        acceptance_rate=0.25, tokens_per_forward=1.5, accepted_per_round=[1, 0], drafts_per_round=[2, 0], tree_per_round=["", ""], latency_s=0.1, extra=extra,
    )


KEEP = pa.schema([("topic", pa.string()), ("score", pa.float64())])


def test_schema_is_the_result_fields_plus_keep_columns():
    assert tuple(RESULT_SCHEMA.names) == (*RESULT_COLUMNS, "position")
    assert output_schema(KEEP).names == [*RESULT_COLUMNS, "position", "topic", "score"]
    with pytest.raises(ValueError, match="'prompt' is also an output column"):
        output_schema(pa.schema([("prompt", pa.string())]))


def test_parts_of_rows_per_file_and_resume_numbering(tmp_path):
    sink = ParquetSink(tmp_path, shard_index=0, shard_count=1, rows_per_file=4, keep_schema=KEEP)
    for i in range(10):
        sink.add(result(i, error=(i == 7)))
        if sink.full:
            sink.flush({"wall_s": 1.0, "proposed_by_position": [4, 2], "accepted_by_position": [2, 1]})
    sink.flush({"wall_s": 0.5, "proposed_by_position": [1], "accepted_by_position": [1]})
    assert sink.flush() is None  # nothing buffered
    names = [f.name for f in part_files(tmp_path)]
    assert names == [f"shard-00000-of-00001-part-{i:06d}.parquet" for i in range(3)]
    assert [pq.read_metadata(f).num_rows for f in part_files(tmp_path)] == [4, 4, 2]
    assert list((tmp_path / ".tmp").iterdir()) == []  # temp files renamed away
    table = pads.dataset(tmp_path / "data", format="parquet").to_table()
    assert table.schema.names == [*RESULT_COLUMNS, "position", "topic", "score"]
    rows = {r["id"]: r for r in table.to_pylist()}
    assert rows["r3"]["topic"] == "t0" and rows["r3"]["completion_token_ids"] == [1, 2, 3]
    assert rows["r7"]["finish_reason"] == "error" and rows["r7"]["error"] == "prompt is null"
    assert done_ids(tmp_path) == {f"r{i}" for i in range(10)}

    # A resumed run (a killed one left a temp file behind) adds parts after the existing ones.
    (tmp_path / ".tmp" / "shard-00000-of-00001-part-000003.parquet").write_bytes(b"half a file")
    other_shard_tmp = tmp_path / ".tmp" / "shard-00001-of-00002-part-000000.parquet"
    other_shard_tmp.write_bytes(b"another shard's file in progress")
    again = ParquetSink(tmp_path, shard_index=0, shard_count=1, rows_per_file=4, keep_schema=KEEP)
    assert sorted(p.name for p in (tmp_path / ".tmp").iterdir()) == [other_shard_tmp.name]
    again.add(result(10))
    assert again.flush().name == "shard-00000-of-00001-part-000003.parquet"

    s = summarize(tmp_path)
    assert (s["rows"], s["rows_ok"], s["rows_error"], s["files"]) == (11, 10, 1, 4)
    assert s["finish_reasons"] == {"error": 1, "length": 10} and s["errors"] == {"prompt is null": 1}
    assert (s["completion_tokens"], s["target_forwards"], s["draft_tokens"], s["accepted_tokens"]) == (30, 20, 40, 10)
    assert s["tokens_per_target_forward"] == 1.5 and s["acceptance_rate"] == 0.25
    assert s["acceptance_by_position"] == [5 / 9, 2 / 4]  # (2+2+1)/(4+4+1), (1+1)/(2+2); the last part had no stats
    assert s["wall_s"] == 2.5 and s["tokens_per_s"] == 30 / 2.5


def test_shards_write_their_own_files(tmp_path):
    for index in range(2):
        sink = ParquetSink(tmp_path, shard_index=index, shard_count=2, rows_per_file=10)
        for i in range(index, 6, 2):
            sink.add(result(i))
        sink.flush()
    assert [f.name for f in part_files(tmp_path)] == [
        "shard-00000-of-00002-part-000000.parquet", "shard-00001-of-00002-part-000000.parquet"]
    assert done_ids(tmp_path) == {f"r{i}" for i in range(6)}


def test_output_dir_reads_with_pandas_and_datasets(tmp_path):
    import datasets
    import pandas as pd

    sink = ParquetSink(tmp_path, shard_index=0, shard_count=1, rows_per_file=3, keep_schema=KEEP)
    for i in range(7):
        sink.add(result(i, error=(i == 2)))
        if sink.full:
            sink.flush()
    sink.flush()
    (tmp_path / "summary.json").write_text(json.dumps(summarize(tmp_path)))  # beside data/, not in it
    df = pd.read_parquet(tmp_path / "data")
    assert sorted(df["id"]) == [f"r{i}" for i in range(7)]
    ds = datasets.load_dataset("parquet", data_dir=str(tmp_path / "data"), split="train")
    assert ds.num_rows == 7 and ds.column_names == [*RESULT_COLUMNS, "position", "topic", "score"]
    assert sorted(ds["id"]) == [f"r{i}" for i in range(7)]


def test_unreadable_part_is_reported(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "shard-00000-of-00001-part-000000.parquet").write_bytes(b"garbage")
    with pytest.raises(OSError, match="cannot read output part .*move it away and rerun"):
        done_ids(tmp_path)


def test_background_writer_writes_the_same_parts_and_times_them(tmp_path):
    def write(out, background):
        sink = ParquetSink(out, shard_index=0, shard_count=1, rows_per_file=3, keep_schema=KEEP, background=background)
        for i in range(8):
            sink.add(result(i, error=(i == 4)))
            if sink.full:
                sink.flush({"wall_s": 1.0})
        sink.flush({"wall_s": 0.5})
        sink.close()
        assert (sink.rows_written, sink.parts_written) == (8, 3)
        assert sink.write_s >= 0 and sink.encode_write_s > 0
        return [(f.name, pq.read_table(f).drop_columns(["latency_s"]), pq.read_schema(f).metadata)
                for f in part_files(out)]

    assert write(tmp_path / "bg", True) == write(tmp_path / "sync", False)
    assert list((tmp_path / "bg" / ".tmp").iterdir()) == []


def test_background_write_error_is_raised(tmp_path):
    sink = ParquetSink(tmp_path, shard_index=0, shard_count=1, rows_per_file=2, background=True)
    (tmp_path / ".tmp").rmdir()  # the writer thread cannot create its temp file
    sink.add(result(0))
    sink.flush()
    with pytest.raises(FileNotFoundError):
        sink.close()
    assert part_files(tmp_path) == []


def test_rows_waiting_longer_than_flush_every_s_make_the_sink_full(tmp_path):
    import time

    sink = ParquetSink(tmp_path, shard_index=0, shard_count=1, rows_per_file=100, keep_schema=KEEP, flush_every_s=0.2)
    assert not sink.full  # nothing buffered: never full
    time.sleep(0.25)
    sink.add(result(0))
    assert not sink.full  # the clock starts with the oldest buffered row, not the last part
    time.sleep(0.25)
    sink.add(result(1))
    assert sink.full  # row 0 has waited over 0.2 s
    sink.flush()
    sink.add(result(2))
    assert not sink.full
    time.sleep(0.25)
    assert sink.full
    assert not ParquetSink(tmp_path, shard_index=0, shard_count=1, rows_per_file=100, keep_schema=KEEP).full
