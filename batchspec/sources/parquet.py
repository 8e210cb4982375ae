"""Parquet input: a file, a folder of *.parquet (recursively) or a glob, read in chunks of the needed
columns; row counts from the footers, digests of the stored bytes for resumes with positional ids."""

from __future__ import annotations

import glob
import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..util.textcheck import first_line
from .base import CHUNK_ROWS, SKIP_HINT, SourceError, Source, take_rows

log = logging.getLogger("batchspec")


def parquet_files(path: str) -> list[str]:
    """A file, every *.parquet under a folder (recursively), or a glob; sorted, so positions are stable."""
    if glob.has_magic(path):
        files = sorted(f for f in glob.glob(path, recursive=True) if os.path.isfile(f))
    elif os.path.isdir(path):
        files = sorted(
            str(f) for f in Path(path).rglob("*.parquet")
            if not any(part.startswith((".", "_")) for part in f.relative_to(path).parts)
        )
    elif os.path.isfile(path):
        files = [path]
    else:
        raise SourceError(f"source.path={path!r} does not exist")
    if not files:
        raise SourceError(f"source.path={path!r} matches no Parquet files")
    return files


def footer_digest(path: str) -> str:
    """A digest of a Parquet file's footer (schema, row groups, their sizes and statistics): changes
    when the file's content does, and costs one small read."""
    with open(path, "rb") as f:
        f.seek(-8, os.SEEK_END)
        size = int.from_bytes(f.read(4), "little")
        f.seek(-8 - size, os.SEEK_END)
        return hashlib.sha256(f.read(size)).hexdigest()[:32]


def column_digest(path: str, columns: list[str]) -> str:
    """A digest of the bytes `columns` are stored as in a Parquet file (each row group's column chunks,
    as stored, not decoded). The footer alone misses rows swapped within a file when the pages keep
    their sizes (any file written with compression='none'); this does not. Costs one read of those
    columns' bytes, which the run reads anyway."""
    h = hashlib.sha256()
    with pq.ParquetFile(path) as pf, open(path, "rb") as f:
        meta = pf.metadata
        for r in range(meta.num_row_groups):
            group = meta.row_group(r)
            for c in range(group.num_columns):
                chunk = group.column(c)
                name = chunk.path_in_schema  # a nested column's chunks are "name.child...."
                if not any(name == c or name.startswith(f"{c}.") for c in columns):
                    continue
                offsets = [chunk.data_page_offset] + ([chunk.dictionary_page_offset] if chunk.has_dictionary_page
                                                      and chunk.dictionary_page_offset else [])
                f.seek(min(offsets))
                left = chunk.total_compressed_size
                while left > 0 and (block := f.read(min(left, 1 << 20))):
                    h.update(block)
                    left -= len(block)
    return h.hexdigest()[:32]


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()[:32]


class ParquetSource(Source):
    """Parquet files read in record batches, only the needed columns (row counts from the footers).

    Every footer is read up front: row counts (so positions of a file's rows do not depend on how
    much of the files before it could be read), the columns of each file and their types. A needed
    column whose type differs between files gets the types' common promotion (int32 + int64 -> int64)
    or else the first file's type, and is checked per row. A file whose footer cannot be read is
    reported (or skipped) when the reader gets to it.
    """

    typed = True

    def __init__(self, path: str, columns: list[str], skip_unreadable: bool = False):
        self.path, self.columns, self.skip_unreadable = path, columns, skip_unreadable
        self.files = parquet_files(path)
        self.skipped = []
        self.file_rows: dict[str, int] = {}
        self.file_schemas: dict[str, pa.Schema] = {}
        self.unreadable: dict[str, str] = {}  # file -> why its footer cannot be read
        for f in self.files:
            try:
                with pq.ParquetFile(f) as pf:
                    self.file_rows[f] = pf.metadata.num_rows
                    self.file_schemas[f] = pf.schema_arrow
            except (OSError, pa.ArrowException) as e:
                self.unreadable[f] = first_line(e)
        if not self.file_schemas:
            first = self.files[0]
            raise SourceError(f"cannot read Parquet file {first}: {self.unreadable[first]}")
        schemas = list(self.file_schemas.values())
        self.available = list(dict.fromkeys(name for schema in schemas for name in schema.names))
        self.num_rows = None if self.unreadable and not skip_unreadable else sum(self.file_rows.values())
        fields, mixed = [], set()
        for c in columns:
            types = list(dict.fromkeys(s.field(c).type for s in schemas if c in s.names))
            if not types:
                continue
            if len(types) > 1:
                mixed.add(c)
                try:
                    unified = pa.unify_schemas([pa.schema([(c, t)]) for t in types], promote_options="permissive")
                    types = [unified.field(c).type]
                except (pa.ArrowException, TypeError) as e:
                    log.warning("column %r has types %s in the files of %s (%s): values that do not fit %s "
                                "make their row an error", c, ", ".join(map(str, types)), path, first_line(e), types[0])
            fields.append(pa.field(c, types[0]))
        self.schema = pa.schema(fields)
        self.check_columns = frozenset(mixed)

    def files_without(self, column: str) -> list[str]:
        return [f for f, schema in self.file_schemas.items() if column not in schema.names]

    def layout(self) -> list[dict[str, Any]]:
        return [{"file": f, "unreadable": True} if f in self.unreadable
                else {"file": f, "rows": self.file_rows[f], "footer": footer_digest(f),
                      "columns": column_digest(f, self.columns)} for f in self.files]

    def _unreadable(self, f: str, reason: str, read: int, rows: int | None) -> None:
        where = f" after {read} of its {rows} rows" if read else ""
        if not self.skip_unreadable:
            raise SourceError(f"cannot read Parquet file {f}{where}: {reason}; {SKIP_HINT}")
        log.warning("skipping unreadable Parquet file %s%s (source.skip_unreadable): %s", f, where, reason)
        self.skipped.append({"file": f, "reason": reason, "rows_read": read, "rows": rows})

    def rows(self, index, count, limit):
        start = 0
        for f in self.files:
            if limit is not None and start >= limit:
                return
            if f in self.unreadable:
                self._unreadable(f, self.unreadable[f], 0, None)
                continue  # its row count is unknown: later files follow the rows that could be counted
            read = 0
            try:
                with pq.ParquetFile(f) as pf:
                    for batch in pf.iter_batches(batch_size=CHUNK_ROWS, columns=self.columns):
                        if limit is not None and start + read >= limit:
                            return
                        picks, values = take_rows(batch, start + read, index, count, limit)
                        yield from zip((start + read + i for i in picks), values)
                        read += batch.num_rows
            except (OSError, pa.ArrowException) as e:
                self._unreadable(f, first_line(e), read, self.file_rows[f])
            start += self.file_rows[f]  # from the footer: later files keep their positions
