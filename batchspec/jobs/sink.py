"""Results -> Parquet part files of the output dir (layout.py), written atomically.

A part is written to .tmp/ and renamed into data/ (same filesystem, so the rename is atomic): a reader
or a resumed run never sees half a file, and data/ holds only Parquet, so
`pyarrow.dataset.dataset(out/"data")`, `pandas.read_parquet(out/"data")` and
`datasets.load_dataset("parquet", data_dir=out/"data")` read it as one table. Each part also carries,
in its Parquet key-value metadata, the drafting statistics of the rounds since the previous part
(draft position counts, wall time), so the summary covers resumed runs too, and under `batchspec.config`
the configuration that produced its rows (drafter, k, adaptive, sampling: docs/jobs.md).
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..util.files import atomic_write
from ..util.textcheck import first_line
from ..engine.types import FINISH_ERROR, Result
from .layout import shard_name
from .schema import META_KEY, output_schema


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


def write_part(table: pa.Table, tmp: Path, final: Path) -> None:
    """A part file at `final`, all or nothing: written (zstd) to `tmp` on the same filesystem, synced,
    renamed over `final`."""
    atomic_write(final, lambda path: pq.write_table(table, path, compression="zstd"), tmp=tmp)


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
