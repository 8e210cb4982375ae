"""Results -> Parquet part files, written atomically, plus the summary of an output dir.

Layout of an output dir:

    data/shard-00000-of-00001-part-000000.parquet   rows_per_file rows each (the last may be short)
    shards/shard-00000-of-00001.json                 written when that shard has finished
    summary.json                                     totals over every part file and finished shard
    job.json                                         the config that decides the output (resume guard)
    logs/                                            Hydra's log and composed config of each run
    .tmp/                                            parts being written; renamed into data/ when complete

A part is written to .tmp/ and renamed into data/ (same filesystem, so the rename is atomic): a reader
or a resumed run never sees half a file, and data/ holds only Parquet, so
`pyarrow.dataset.dataset(out/"data")`, `pandas.read_parquet(out/"data")` and
`datasets.load_dataset("parquet", data_dir=out/"data")` read it as one table. Each part also carries,
in its Parquet key-value metadata, the drafting statistics of the rounds since the previous part
(draft position counts, wall time), so the summary covers resumed runs too, and under `batchspec.config`
the configuration that produced its rows (drafter, k, adaptive, sampling: docs/jobs.md).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..types import FINISH_ERROR, RESULT_COLUMNS, Result

COLUMN_TYPES = {
    "id": pa.string(),
    "prompt": pa.string(),
    "completion": pa.string(),
    "completion_token_ids": pa.list_(pa.int32()),
    "finish_reason": pa.string(),
    "error": pa.string(),
    "prompt_tokens": pa.int64(),
    "completion_tokens": pa.int64(),
    "target_forwards": pa.int64(),
    "draft_tokens": pa.int64(),
    "accepted_tokens": pa.int64(),
    "acceptance_rate": pa.float64(),
    "tokens_per_forward": pa.float64(),
    "accepted_per_round": pa.list_(pa.int32()),
    "drafts_per_round": pa.list_(pa.int32()),
    "tree_per_round": pa.list_(pa.string()),
    "latency_s": pa.float64(),
    "sample_index": pa.int32(),  # which of the row's n samples (sampling.n)
    "stop_reason": pa.string(),  # the stop string that ended the row (finish "stop"), else null
    "stop_token_id": pa.int64(),  # the EOS token that ended it, else null
    "logprobs": pa.list_(pa.float32()),  # sampling.logprobs: per completion token (null when not asked)
    "top_logprobs": pa.list_(pa.list_(pa.float32())),
    "top_logprob_ids": pa.list_(pa.list_(pa.int32())),
    "prompt_logprobs": pa.list_(pa.float32()),  # sampling.prompt_logprobs: per prompt token, the first null
    "prompt_top_logprobs": pa.list_(pa.list_(pa.float32())),
    "prompt_top_logprob_ids": pa.list_(pa.list_(pa.int32())),
    "forced_tokens": pa.int64(),  # structured output: drafts the grammar forced (in draft_tokens too)
    "structured_complete": pa.bool_(),  # constrained rows: the output matches whole (false: cut short); else null
}
POSITION_COLUMN = "position"  # the row's index in the input (from 0): sorting by it gives input order
# Result fields in their order, then the input position (a job's rows carry it in Result.extra).
RESULT_SCHEMA = pa.schema([(name, COLUMN_TYPES[name]) for name in RESULT_COLUMNS] + [(POSITION_COLUMN, pa.int64())])

META_KEY = b"batchspec"
CONFIG_KEY = b"batchspec.config"  # JSON: the configuration that produced a part's rows (shard.output_config)
FINGERPRINT_KEY = b"batchspec.fingerprint"  # JSON: job.json's fingerprint, the keys that decide the rows
# The job's own part files. Anything else in data/ (a backup copy, a file dropped there by hand) is
# "foreign": resume and the summary never read it, batchspec.status reports it.
PART_NAME = re.compile(r"^shard-(\d+)-of-(\d+)-part-(\d+)\.parquet$")
FAILED_LISTED = 20
TOTAL_COLUMNS = ("prompt_tokens", "completion_tokens", "target_forwards", "draft_tokens", "accepted_tokens")


def output_schema(keep: pa.Schema | None = None) -> pa.Schema:
    """The Result columns, then the keep columns with their input types."""
    fields = list(RESULT_SCHEMA)
    for f in keep or []:
        if f.name in RESULT_SCHEMA.names:
            raise ValueError(f"source.keep_columns: {f.name!r} is also an output column; rename it in the input")
        fields.append(pa.field(f.name, f.type))
    return pa.schema(fields)


def shard_name(index: int, count: int) -> str:
    return f"shard-{index:05d}-of-{count:05d}"


def part_files(out_dir: Path) -> list[Path]:
    """The job's part files in data/ (named shard-I-of-N-part-P.parquet), sorted."""
    return sorted(f for f in (out_dir / "data").glob("shard-*.parquet") if PART_NAME.match(f.name))


def foreign_files(out_dir: Path) -> list[Path]:
    """Entries of data/ that are not part files. Names starting with . or _ are left out: Parquet
    readers (pyarrow, pandas, datasets) skip them too."""
    data = out_dir / "data"
    if not data.is_dir():
        return []
    return sorted(f for f in data.iterdir() if not PART_NAME.match(f.name) and not f.name.startswith((".", "_")))


def part_problem(schema: pa.Schema) -> str | None:
    """Why a file named like a part is not one of this runner's parts (a column missing or of another type)."""
    for field in RESULT_SCHEMA:
        if field.name not in schema.names:
            return f"it has no {field.name!r} column"
        if schema.field(field.name).type != field.type:
            return f"its {field.name!r} column is {schema.field(field.name).type}, not {field.type}"
    return None


def shard_rows(out_dir: Path, index: int, count: int) -> int:
    """Input rows done in the part files of shard `index` of `count`: their rows of sample 0 (an input row
    of sampling.n samples has n output rows)."""
    prefix = shard_name(index, count) + "-part-"
    return sum(pc.sum(pc.equal(read_part(f, ["sample_index"]).column("sample_index"), 0)).as_py() or 0
               for f in part_files(out_dir) if f.name.startswith(prefix))


def read_part(path: Path, columns: list[str]) -> pa.Table:
    """Some columns of one part file (with the file's schema metadata). ParquetFile.read rather than
    pq.read_table: over a thousand parts read_table's dataset machinery grew RSS by ~45 MiB and took
    3x as long (pyarrow 26, mimalloc)."""
    with pq.ParquetFile(path) as f:
        return f.read(columns=columns, use_threads=False)


def done_ids(out_dir: Path) -> set[str]:
    """Ids of every row in the finished part files of any shard (only the id column is read). A part
    that cannot be read, or a file named like one that is not one, raises OSError naming it."""
    ids: set[str] = set()
    for f in part_files(out_dir):
        try:
            with pq.ParquetFile(f) as pf:
                problem = part_problem(pf.schema_arrow)
                if problem is None:
                    ids.update(pf.read(columns=["id"], use_threads=False).column("id").to_pylist())
        except (OSError, pa.ArrowException) as e:
            raise OSError(f"cannot read output part {f}: {first_line(e)}; move it away and rerun to redo its rows") from e
        if problem:
            raise OSError(f"{f} is not a batchspec part file ({problem}); move it out of {f.parent} and rerun")
    return ids


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def read_json(path: Path, hint: str = "") -> dict[str, Any]:
    """The JSON object in `path` (job.json, a shard marker); OSError naming the file if it is not one."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise OSError(f"{path} is not valid JSON ({e})" + (f"; {hint}" if hint else "")) from None
    if not isinstance(value, dict):
        raise OSError(f"{path} does not hold a JSON object" + (f"; {hint}" if hint else ""))
    return value


def check_output_dir(out_dir: Path) -> None:
    """Create data/ and .tmp/ and move a probe file from .tmp/ into data/, as every part will be moved:
    a read-only dir, a full disk or a data/ on another filesystem (rename fails across filesystems)
    fail here, in one line, before any work instead of at the first part."""
    data, tmp = out_dir / "data", out_dir / ".tmp"
    probe = tmp / f".probe-{os.getpid()}"
    try:
        data.mkdir(parents=True, exist_ok=True)
        tmp.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"batchspec write probe\n")
        os.replace(probe, data / probe.name)
        (data / probe.name).unlink()
    except OSError as e:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)
        if e.errno == errno.EXDEV:
            raise OSError(f"output.dir {out_dir}: data/ and .tmp/ are on different filesystems, so parts cannot "
                          "be moved into data/ atomically; make data/ a plain folder of output.dir") from e
        raise OSError(f"output.dir {out_dir} is not writable: {e.strerror or e}"
                      + (f" ({e.filename})" if e.filename else "")) from e


def rows_table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """The rows as a table of `schema`. A value that cannot be stored (text that is not valid Unicode, a
    value of another type that got this far) is nulled and its row marked as an error naming the
    column, so one bad row never costs the part it is in, nor the job."""
    try:
        return pa.Table.from_pylist(rows, schema=schema)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return pa.Table.from_pylist([storable_row(row, schema) for row in rows], schema=schema)


def storable_row(row: dict[str, Any], schema: pa.Schema) -> dict[str, Any]:
    bad: dict[str, str] = {}
    for field in schema:
        try:
            pa.array([row.get(field.name)], type=field.type)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
            bad[field.name] = first_line(e)
    if not bad:
        return row
    fixed = {**row, **dict.fromkeys(bad)}
    name, why = next(iter(bad.items()))
    fixed["finish_reason"] = FINISH_ERROR
    fixed["error"] = f"column {name!r} of this row could not be written ({why}); written as null"
    return fixed


def atomic_write_text(path: Path, text: str) -> None:
    """`text` (UTF-8) at `path`, all or nothing: written beside it, synced, renamed over it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_part(table: pa.Table, tmp: Path, final: Path) -> None:
    """A part file at `final`, all or nothing: written (zstd) to `tmp` on the same filesystem, synced,
    renamed over `final`."""
    with open(tmp, "wb") as f:
        pq.write_table(table, f, compression="zstd")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)


class ParquetSink:
    """Buffers Results of one shard and writes them as parts of `rows_per_file` rows.

    Parts are numbered after the shard's existing ones, so a resumed run only adds files; leftover
    temp files of this shard (from a killed run) are removed on start.

    With `background=True` a flush builds the part's Arrow table and hands the encode, write, fsync
    and rename to one writer thread, so the disk works while the caller generates; at most one part
    is in flight (a flush first waits for the previous one). `close()` waits for it and re-raises a
    write error (a later flush does too). A part still becomes visible in data/ only by the atomic
    rename, so a killed run loses at most the buffered and in-flight rows, which the next run redoes.
    """

    def __init__(self, out_dir: Path, *, shard_index: int, shard_count: int, rows_per_file: int,
                 keep_schema: pa.Schema | None = None, background: bool = False,
                 flush_every_s: float | None = None, file_metadata: dict[bytes, bytes | str] | None = None):
        if rows_per_file < 1:
            raise ValueError(f"output.rows_per_file={rows_per_file}: need at least 1")
        self.out_dir, self.rows_per_file = Path(out_dir), rows_per_file
        self.flush_every_s = flush_every_s
        self.oldest = 0.0  # time.monotonic() when the oldest buffered row arrived
        self.schema = output_schema(keep_schema)
        self.file_metadata = dict(file_metadata or {})  # Parquet key-value metadata of every part
        self.prefix = shard_name(shard_index, shard_count)
        self.data_dir, self.tmp_dir = self.out_dir / "data", self.out_dir / ".tmp"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.tmp_dir.glob(f"{self.prefix}-*"):
            stale.unlink()
        numbers = [int(m.group(1)) for f in self.data_dir.glob(f"{self.prefix}-part-*.parquet")
                   if (m := re.search(r"-part-(\d+)\.parquet$", f.name))]
        self.next_part = max(numbers, default=-1) + 1
        self.buffer: list[Result] = []
        self.rows_written = 0  # rows of the parts flushed (in background mode: handed to the writer)
        self.parts_written = 0
        self.write_s = 0.0  # seconds the caller spent in flush() and close()
        self.encode_write_s = 0.0  # seconds of Parquet encode + write + fsync + rename (in the writer thread if background)
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="batchspec-sink") if background else None
        self._pending: Future | None = None

    @property
    def full(self) -> bool:
        """Time to write a part: rows_per_file rows buffered, or the oldest has waited flush_every_s seconds
        (checked as results arrive)."""
        if len(self.buffer) >= self.rows_per_file:
            return True
        return (self.flush_every_s is not None and bool(self.buffer)
                and time.monotonic() - self.oldest >= self.flush_every_s)

    def add(self, result: Result) -> None:
        if not self.buffer:
            self.oldest = time.monotonic()
        self.buffer.append(result)  # made a row at flush, where the write time is measured

    def flush(self, metadata: dict[str, Any] | None = None) -> Path | None:
        """Write the buffered rows as one part (temp file, fsync, rename); None if nothing is buffered.
        In background mode the part is in data/ once the next flush or close() returns."""
        if not self.buffer:
            return None
        started = time.perf_counter()
        try:
            schema = self.schema.with_metadata({**self.file_metadata, META_KEY: json.dumps(metadata or {})})
            table = rows_table([r.to_row() for r in self.buffer], schema)
            name = f"{self.prefix}-part-{self.next_part:06d}.parquet"
            if self._writer is None:
                final = self._write(table, name)
            else:
                self._wait()
                self._pending = self._writer.submit(self._write, table, name)
                final = self.data_dir / name
            self.next_part += 1
            self.rows_written += len(self.buffer)
            self.parts_written += 1
            self.buffer = []
            return final
        finally:
            self.write_s += time.perf_counter() - started

    def close(self) -> None:
        """Wait until every flushed part is in data/ (re-raising a write error); stop the writer thread."""
        started = time.perf_counter()
        try:
            self._wait()
        finally:
            if self._writer is not None:
                self._writer.shutdown(wait=True)
                self._writer = None
            self.write_s += time.perf_counter() - started

    def _wait(self) -> None:
        pending = self._pending
        if pending is not None:
            try:
                pending.result()
            finally:
                if pending.done():
                    self._pending = None

    def _write(self, table: pa.Table, name: str) -> Path:
        started = time.perf_counter()
        final = self.data_dir / name
        write_part(table, self.tmp_dir / name, final)
        self.encode_write_s += time.perf_counter() - started
        return final


def summarize(out_dir: Path) -> dict[str, Any]:
    """Totals over every part file in `out_dir` (all shards, all runs), reading only counter columns."""
    reasons: Counter = Counter()
    errors: Counter = Counter()
    failed: list[dict[str, str]] = []  # the first FAILED_LISTED failed rows: id and error
    totals = dict.fromkeys(TOTAL_COLUMNS, 0)
    proposed: list[int] = []
    accepted: list[int] = []
    by_k: list[int] = []
    by_tree: Counter = Counter()
    wall = 0.0
    files = part_files(out_dir)
    for f in files:
        table = read_part(f, ["finish_reason", "error", *TOTAL_COLUMNS])
        reasons.update(table.column("finish_reason").to_pylist())
        messages = table.column("error").to_pylist()
        errors.update(e for e in messages if e is not None)
        if len(failed) < FAILED_LISTED and any(e is not None for e in messages):  # ids only where rows failed
            ids = read_part(f, ["id"]).column("id").to_pylist()
            failed += [{"id": i, "error": e} for i, e in zip(ids, messages) if e is not None][: FAILED_LISTED - len(failed)]
        for c in TOTAL_COLUMNS:
            totals[c] += int(pc.sum(table.column(c)).as_py() or 0)
        meta = json.loads((table.schema.metadata or {}).get(META_KEY, b"{}"))
        wall += float(meta.get("wall_s", 0.0))
        for mine, theirs in ((proposed, meta.get("proposed_by_position", [])),
                             (accepted, meta.get("accepted_by_position", [])),
                             (by_k, meta.get("rounds_by_k", []))):
            mine.extend([0] * (len(theirs) - len(mine)))
            for i, v in enumerate(theirs):
                mine[i] += v
        by_tree.update(meta.get("rounds_by_tree", {}))
    rows = sum(reasons.values())
    completion, forwards = totals["completion_tokens"], totals["target_forwards"]
    return {
        "rows": rows,
        "rows_ok": rows - reasons.get(FINISH_ERROR, 0),
        "rows_error": reasons.get(FINISH_ERROR, 0),
        "finish_reasons": dict(sorted(reasons.items())),
        "errors": dict(errors.most_common(10)),  # the most frequent error messages, with counts
        "failed": failed,  # the first failed rows (retry_errors=true runs them again)
        **totals,
        "wall_s": round(wall, 3),  # generation time summed over runs and shards
        "tokens_per_s": completion / wall if wall else None,
        "acceptance_rate": totals["accepted_tokens"] / totals["draft_tokens"] if totals["draft_tokens"] else None,
        "acceptance_by_position": [a / p if p else None for a, p in zip(accepted, proposed)],
        "rounds_by_k": by_k,  # verify passes by drafts checked (index 0: plain rounds): what adaptive chose
        "rounds_by_tree": dict(sorted(by_tree.items())),  # tree verify passes by tree shape ("BxD")
        "tokens_per_target_forward": completion / forwards if forwards else None,
        "mean_accepted_length": totals["accepted_tokens"] / forwards if forwards else None,
        "files": len(files),
    }
