"""Input rows -> Requests, streamed: Parquet, Hugging Face datasets and JSONL, never loaded whole.

    source = open_source("data/*.parquet", "auto", "train", needed={"text": "source.prompt_column"})
    rows = RowSelector(source, id_column=None, shard_index=0, shard_count=1, limit=None, done=set())
    requests = (builder.request(row) for row in rows)      # builder: prompts.PromptBuilder

A source reads only the needed columns, in chunks of CHUNK_ROWS. Every row has a global position
(its index in the input, counted from 0 over all files) which is its id unless `id_column` is set.
Sharding is round-robin on that position: shard i of n takes the rows with position % n == i, so
the split depends only on the input and the union of all shards is every row exactly once.
`limit` keeps the first `limit` positions of the input, before sharding.

Anything wrong with a single row (a JSONL line that is not JSON or nests too deeply, a value that is
not valid UTF-8, an integer Python cannot read, a date Python cannot hold, an id that cannot be one;
and in prompts.py null or non-string prompts, template fields missing in that row, malformed chat
messages, text that is not valid Unicode) becomes that row's error; problems with the input as a whole (unreadable path, missing column) raise SourceError.
A file that becomes unreadable part-way (a corrupt Parquet page, a truncated .gz) raises SourceError
when the reader reaches it, so the rows before it are still run and written; with
`skip_unreadable` it is skipped instead and listed in `Source.skipped`.
"""

from __future__ import annotations

import codecs
import glob
import gzip
import hashlib
import json
import logging
import os
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from ..textcheck import text_problem
from .sink import first_line

log = logging.getLogger("batchspec")

CHUNK_ROWS = 1024
INFER_ROWS = 1000  # rows sampled to infer column types where the input declares none (JSONL, streams)
FORMATS = ("parquet", "hf", "jsonl")
# Ids the runner makes up (for a row whose id is null, missing or not text) start with NUL; an input
# id that starts with NUL is refused the same way, so a made-up id never equals a real one.
GENERATED_ID_PREFIX = "\x00"
DUPLICATES_LISTED = 20
SKIP_HINT = "set source.skip_unreadable=true to skip unreadable files"


class SourceError(ValueError):
    """The input as a whole cannot be read as configured; the message is one line."""


@dataclass(frozen=True, slots=True)
class BadValue:
    """A value the input holds but that cannot be read (invalid UTF-8 in a Parquet string); `reason`
    completes "column 'x' ...", e.g. "is not valid UTF-8 (byte 0xff at offset 3)"."""

    reason: str


class _Absent:
    """The value of a column that a JSONL object does not have (null is a value; absent is not)."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()


def shard_from_env(index: int | None, count: int | None, environ: Mapping[str, str]) -> tuple[int, int]:
    """(index, count) from the config, else from a SLURM array (task ids need not start at 0)."""
    if count is None:
        count = int(environ.get("SLURM_ARRAY_TASK_COUNT", 1))
    if index is None:
        task = environ.get("SLURM_ARRAY_TASK_ID")
        index = int(task) - int(environ.get("SLURM_ARRAY_TASK_MIN", 0)) if task is not None else 0
    if count < 1 or not 0 <= index < count:
        raise SourceError(f"shard.index={index} shard.count={count}: need count >= 1 and 0 <= index < count")
    return index, count


def in_shard(position: int, index: int, count: int, limit: int | None) -> bool:
    return position % count == index and (limit is None or position < limit)


# ---- the three kinds of input ------------------------------------------------------------------


def detect_format(path: str) -> str:
    """parquet for *.parquet files, folders of them and globs; hf for a saved dataset or any other
    folder or name (load_dataset); jsonl for *.jsonl / *.json / *.jsonl.gz."""
    lower = path.lower()
    if lower.endswith((".jsonl", ".jsonl.gz", ".json", ".ndjson")):
        return "jsonl"
    if lower.endswith(".parquet") or glob.has_magic(path):
        return "parquet"
    p = Path(path)
    if p.is_dir() and not (p / "dataset_info.json").exists() and not (p / "dataset_dict.json").exists():
        if any(p.rglob("*.parquet")):
            return "parquet"
    return "hf"


def input_root(path: str) -> Path | None:
    """The local file or folder an input path reads (for a glob, the folder before its first wildcard),
    resolved; None for a name that is not a local path (a dataset on the hub)."""
    if glob.has_magic(path):
        parts = Path(path).parts
        fixed = parts[:next(i for i, p in enumerate(parts) if glob.has_magic(p))]
        return Path(*fixed).resolve() if fixed else Path.cwd()
    return Path(path).resolve() if os.path.exists(path) else None


def nesting_problem(path: str, out_dir: Path) -> str | None:
    """Why an output dir and an input may not be used together: an output inside the input folder is
    read back as input by the next run (its parts are Parquet files), an input inside the output dir
    sits among the job's own files. None if neither holds the other."""
    root = input_root(path)
    if root is None:
        return None
    out = Path(out_dir).resolve()
    if root.is_dir() and (out == root or root in out.parents):
        return (f"output.dir {out_dir} is inside the input folder of source.path={path!r}: every run would read "
                "its own part files back as input rows; choose an output.dir outside the input folder")
    if out in root.parents:
        return (f"source.path={path!r} is inside output.dir {out_dir}: the input would sit among the job's own "
                "files; move the input or choose another output.dir")
    return None


def open_source(path: str, fmt: str, split: str, needed: Mapping[str, str], *,
                skip_unreadable: bool = False, optional: tuple[str, ...] = ()) -> "Source":
    """Open `path` and check that every needed column exists (in every file of a Parquet input).
    `optional` (JSONL only): columns read too where a row has them (ABSENT where not), never required.

    `needed` maps each column to the config key that asks for it, for the error message.
    `skip_unreadable`: skip files that cannot be read (listed in `source.skipped`) instead of stopping.
    """
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt == "parquet":
        source: Source = ParquetSource(path, list(needed), skip_unreadable=skip_unreadable)
    elif fmt == "jsonl":
        source = JsonlSource(path, list(needed) + [c for c in optional if c not in needed],
                             skip_unreadable=skip_unreadable)
    elif fmt == "hf":
        source = HFSource(path, split, list(needed))
    else:
        raise SourceError(f"source.format={fmt!r} is not one of auto, {', '.join(FORMATS)}")
    for column, key in needed.items():
        if column not in source.available:
            raise SourceError(
                f"{key}: column {column!r} is not in {path}; available columns: {', '.join(source.available)}"
            )
        lacking = source.files_without(column)
        if lacking:
            others = f" and {len(lacking) - 1} other file(s)" if len(lacking) > 1 else ""
            raise SourceError(f"{key}: column {column!r} is missing from {lacking[0]}{others} of {path}; "
                              "every file must have the columns the job reads")
    return source


class Source:
    """A readable input. `available`: its column names; `schema`: Arrow types of the needed columns;
    `num_rows`: row count when known without a full read; `typed`: whether `schema` is declared by the
    input (Parquet, a saved dataset) rather than inferred from its first rows; `check_columns`: needed columns whose values
    may not fit `schema` (types inferred from the first rows, or differing between files), so a keep
    column value is checked per row; `skipped`: unreadable files skipped so far (skip_unreadable)."""

    available: list[str]
    schema: pa.Schema
    num_rows: int | None
    typed: bool
    check_columns: frozenset[str] = frozenset()
    skipped: list[dict[str, Any]]

    def rows(self, index: int, count: int, limit: int | None) -> Iterator[tuple[int, dict[str, Any] | str]]:
        """(position, values of the needed columns) for the rows of this shard, in input order; a row
        that cannot be read at all comes as (position, error message)."""
        raise NotImplementedError

    def files_without(self, column: str) -> list[str]:
        """Files of the input that lack `column` although others have it."""
        return []

    def layout(self) -> list[dict[str, Any]] | None:
        """What fixes the positions of the input's rows (files, row counts, content digests), stored with
        the output so that a resume with positional ids can tell that the input changed; None if unknown."""
        return None

    def layout_change(self, stored: list[dict[str, Any]], current: list[dict[str, Any]] | None) -> str | None:
        """How the input changed since `stored` (an earlier layout(); `current` is this one) in a way that
        moves rows to other positions, or None. Entries added at the end (rows after the old ones) are fine."""
        if current is None:
            return None
        for i, old in enumerate(stored):
            if i >= len(current):
                return f"{describe(old)} is gone"
            # Only what was recorded is compared: a job.json from before a digest was added still resumes.
            if {key: current[i].get(key) for key in old} != old:
                return f"{describe(old)} is now {describe(current[i])}"
        return None


def describe(entry: dict[str, Any]) -> str:
    name = entry.get("file") or entry.get("dataset")
    details = ", ".join(f"{k} {v}" for k, v in entry.items() if k not in ("file", "dataset"))
    return f"{name!r} ({details})"


# Values Arrow holds but Python cannot: invalid UTF-8, a timestamp or date beyond Python's datetime
# range (timestamp('ms') of 2**63-1, date32 of 10**8 days) raise OverflowError or ValueError.
CONVERT_ERRORS = (UnicodeDecodeError, OverflowError, ValueError)


def _value(column, i: int) -> Any:
    try:
        return column[i].as_py()
    except UnicodeDecodeError as e:
        return BadValue(f"is not valid UTF-8 (byte 0x{e.object[e.start]:02x} at offset {e.start})")
    except (OverflowError, ValueError) as e:
        return BadValue(f"holds a {column.type} value Python cannot represent ({first_line(e)})")


def _pylist(table: pa.Table | pa.RecordBatch) -> list[dict[str, Any]]:
    """Rows as dicts; a value that cannot be converted (invalid UTF-8, a date out of Python's range)
    becomes a BadValue (that row's error) instead of failing the whole chunk."""
    try:
        return table.to_pylist()
    except CONVERT_ERRORS:
        columns = []
        for name in table.column_names:
            column = table.column(name)
            try:
                columns.append(column.to_pylist())
            except CONVERT_ERRORS:
                columns.append([_value(column, i) for i in range(len(column))])
        return [dict(zip(table.column_names, values)) for values in zip(*columns)]


def _take(table: pa.Table | pa.RecordBatch, start: int, index: int, count: int, limit: int | None):
    """The rows of one chunk (starting at global position `start`) that belong to the shard."""
    if count == 1 and (limit is None or start + table.num_rows <= limit):
        return range(table.num_rows), _pylist(table)  # the whole chunk: no index, no copy
    picks = [i for i in range(table.num_rows) if in_shard(start + i, index, count, limit)]
    return picks, (_pylist(table.take(pa.array(picks, pa.int64()))) if picks else [])


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
                        picks, values = _take(batch, start + read, index, count, limit)
                        yield from zip((start + read + i for i in picks), values)
                        read += batch.num_rows
            except (OSError, pa.ArrowException) as e:
                self._unreadable(f, first_line(e), read, self.file_rows[f])
            start += self.file_rows[f]  # from the footer: later files keep their positions


READ_ERRORS = (OSError, EOFError, zlib.error)  # gzip raises EOFError on a truncated file, zlib.error on bad data


def _lines(path: str) -> Iterator[bytes]:
    """The lines of a file as bytes (.gz decompressed), without a UTF-8 byte order mark."""
    with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
        first = True
        for line in f:
            if first:
                line, first = line.removeprefix(codecs.BOM_UTF8), False
            yield line


class LineError(ValueError):
    """A JSONL line that is valid JSON but cannot be read (nested too deeply); completes "line N ..."."""


def _big_int(digits: str) -> Any:
    """An integer literal; one longer than Python converts (sys.get_int_max_str_digits) is a BadValue,
    so it is that row's error where the job reads it and ignored where it does not."""
    try:
        return int(digits)
    except ValueError:
        return BadValue(f"is an integer of {len(digits.lstrip('-'))} digits, more than Python reads "
                        f"({sys.get_int_max_str_digits()})")


def _parse(line: bytes) -> Any:
    """One JSONL line; bytes that are not UTF-8 become lone surrogates (surrogateescape), which the
    value checks then report as that row's error, so the rest of the row (its id) is still read.
    Raises json.JSONDecodeError (not JSON) or LineError (JSON nested deeper than the reader recurses)."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        text = line.decode("utf-8", "surrogateescape")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise LineError("nests values too deeply for Python's JSON reader (about 1,000 levels)") from None
    except ValueError:  # an integer of more than 4,300 digits: read again, that integer as a BadValue
        return json.loads(text, parse_int=_big_int)


def first_char(path: str) -> bytes:
    """The first byte of a JSONL file that is not white space or a byte order mark (b"" if none)."""
    for line in _lines(path):
        if line.strip():
            return line.strip()[:1]
    return b""


def infer_type(values: list[Any]) -> pa.DataType:
    """The Arrow type all `values` share, else the first convertible value's type; string if none
    (null, absent and invalid-text values are left out; ints beyond int64 do not decide it)."""
    values = [v for v in values if v is not None and v is not ABSENT and not isinstance(v, BadValue)
              and text_problem(v) is None]
    for candidate in [values] + [[v] for v in values]:
        try:
            return pa.array(candidate).type if candidate else pa.string()
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            continue
    return pa.string()


def infer_schema(sample: list[dict[str, Any]], columns: list[str]) -> pa.Schema:
    """Arrow types of `columns` from sample rows (see infer_type); a column with only nulls is a string."""
    return pa.schema([pa.field(c, infer_type([r.get(c) for r in sample])) for c in columns])


class JsonlSource(Source):
    """One JSON object per line (blank lines skipped; .gz read transparently; a UTF-8 BOM ignored).
    Column names and types come from the first INFER_ROWS objects; a line that is not a JSON object
    is that row's error, a value that is not valid UTF-8 that value's. A file that ends early (a
    truncated .gz) is read up to the break, then reported (or skipped with skip_unreadable)."""

    typed = False

    def __init__(self, path: str, columns: list[str], skip_unreadable: bool = False):
        self.path, self.columns, self.skip_unreadable = path, columns, skip_unreadable
        self.skipped = []
        if not os.path.isfile(path):
            raise SourceError(f"source.path={path!r} does not exist or is not a file")
        sample: list[dict] = []
        self.num_rows = 0
        lines = 0
        try:
            for line in _lines(path):
                lines += 1
                if not line.strip():
                    continue
                self.num_rows += 1
                if len(sample) < INFER_ROWS:
                    try:
                        obj = _parse(line)
                    except ValueError:  # not JSON, or nested too deeply: that row's error in rows()
                        continue
                    if isinstance(obj, dict):
                        sample.append(obj)
        except READ_ERRORS as e:
            if not lines:  # nothing readable at all: the input as a whole is unreadable
                raise SourceError(f"cannot read JSONL input {path!r}: {first_line(e)}") from e
            # Read up to the break now; rows() reports it (or skips the rest) once the rows before it are run.
        if first_char(path) == b"[":  # a .json file holding one array: its lines are no rows (or wrong ones)
            raise SourceError(f"{path!r} holds a JSON array, not JSON Lines (one object per line): convert it, "
                              f"e.g. jq -c '.[]' {path} > rows.jsonl")
        if self.num_rows and not sample:
            raise SourceError(f"cannot read JSONL input {path!r}: none of its first lines is a JSON object")
        self.available = list(dict.fromkeys(k for row in sample for k in row))
        self.schema = infer_schema(sample, [c for c in columns if c in self.available])
        self.check_columns = frozenset(columns)

    def layout(self) -> list[dict[str, Any]]:
        size = os.path.getsize(self.path)
        return [{"file": self.path, "rows": self.num_rows, "bytes": size, "sha256": self._digest(size)}]

    def layout_change(self, stored: list[dict[str, Any]], current: list[dict[str, Any]] | None) -> str | None:
        # Lines appended at the end keep every earlier row's position: only the old bytes must be unchanged.
        old, new = (stored or [None])[0], (current or [None])[0]
        if old is None or new is None or "bytes" not in old:
            return None
        if new["bytes"] < old["bytes"]:
            return f"{self.path!r} is shorter ({new['bytes']} bytes, was {old['bytes']})"
        digest = new["sha256"] if new["bytes"] == old["bytes"] else self._digest(old["bytes"])
        if digest != old["sha256"]:
            return f"the first {old['bytes']} bytes of {self.path!r} changed"
        if new["bytes"] > old["bytes"] and self._joined_last_line(old["bytes"]):
            return (f"the last line of {self.path!r} had no newline, so what was appended joined it (its row "
                    f"changed); put a newline between the old end (byte {old['bytes']}) and the appended lines")
        return None

    def _joined_last_line(self, old_size: int) -> bool:
        """Bytes appended after a last line that had no newline extend that line: the row at its position
        is another row now. (A last line of only spaces was no row; a .gz file's bytes are compressed: not
        checked.)"""
        if self.path.endswith(".gz"):
            return False
        with open(self.path, "rb") as f:
            f.seek(old_size)
            if f.read(1) in (b"\n", b"\r"):  # the appended bytes start a new line
                return False
            end = old_size
            while end > 0:  # back from the old end, past trailing spaces: a newline (blank line) or text?
                start = max(0, end - 4096)
                f.seek(start)
                tail = f.read(end - start).rstrip(b" \t")
                if tail:
                    return tail[-1:] not in (b"\n", b"\r")
                end = start
        return False

    def _digest(self, nbytes: int) -> str:
        h, left = hashlib.sha256(), nbytes
        with open(self.path, "rb") as f:
            while left > 0 and (chunk := f.read(min(left, 1 << 20))):
                h.update(chunk)
                left -= len(chunk)
        return h.hexdigest()[:32]

    def rows(self, index, count, limit):
        position = -1
        number = 0
        try:
            for number, line in enumerate(_lines(self.path), start=1):
                if not line.strip():
                    continue
                position += 1
                if limit is not None and position >= limit:
                    return
                if not in_shard(position, index, count, limit):
                    continue
                try:
                    obj = _parse(line)
                except json.JSONDecodeError as e:
                    yield position, f"line {number} is not valid JSON: {e}"
                    continue
                except LineError as e:
                    yield position, f"line {number} {e}"
                    continue
                if not isinstance(obj, dict):
                    yield position, f"line {number} is a JSON {type(obj).__name__}, not an object"
                    continue
                yield position, {c: obj.get(c, ABSENT) for c in self.columns}
        except READ_ERRORS as e:
            where = f"{self.path} after line {number}"
            if not self.skip_unreadable:
                raise SourceError(f"cannot read JSONL file {where}: {first_line(e)}; {SKIP_HINT}") from e
            log.warning("skipping the rest of %s (source.skip_unreadable): %s", where, first_line(e))
            self.skipped.append({"file": self.path, "reason": first_line(e), "rows_read": position + 1, "rows": None})


class HFSource(Source):
    """A dataset saved with `save_to_disk` (memory-mapped Arrow, read in chunks), or anything
    `datasets.load_dataset(path, split=split, streaming=True)` can open locally."""

    def __init__(self, path: str, split: str, columns: list[str]):
        import datasets  # deferred: importing datasets costs a second

        self.path, self.split, self.columns = path, split, columns
        self.skipped = []
        p = Path(path)
        try:
            if (p / "dataset_dict.json").exists() or (p / "state.json").exists():
                data = datasets.load_from_disk(path)
                if isinstance(data, datasets.DatasetDict):
                    if split not in data:
                        raise SourceError(f"source.split={split!r} is not a split of {path}; splits: {', '.join(data)}")
                    data = data[split]
            else:
                data = datasets.load_dataset(path, split=split, streaming=True)
        except SourceError:
            raise
        except Exception as e:  # datasets raises many kinds (FileNotFoundError, DatasetNotFoundError, ValueError)
            raise SourceError(f"cannot open {path!r} as a Hugging Face dataset: {first_line(e)}") from e
        self.data = data
        self.typed = isinstance(data, datasets.Dataset)
        if self.typed:
            self.num_rows = len(data)
            self.available = list(data.column_names)
            arrow = data.features.arrow_schema
            self.schema = pa.schema([arrow.field(c) for c in columns if c in self.available])
        else:
            self.num_rows = None
            sample = list(data.take(INFER_ROWS))
            names = data.column_names or list(dict.fromkeys(k for row in sample for k in row))
            self.available = list(names)
            self.schema = infer_schema(sample, [c for c in columns if c in self.available])
            self.check_columns = frozenset(columns)

    def layout(self) -> list[dict[str, Any]] | None:
        if self.typed:  # a saved dataset: its fingerprint changes with its content
            return [{"dataset": self.path, "split": self.split, "rows": self.num_rows,
                     "fingerprint": getattr(self.data, "_fingerprint", None)}]
        if os.path.isdir(self.path):  # local files streamed by load_dataset: names, sizes and contents
            return [{"file": str(f.relative_to(self.path)), "bytes": f.stat().st_size, "sha256": file_digest(f)}
                    for f in sorted(Path(self.path).rglob("*")) if f.is_file()
                    and not any(part.startswith(".") for part in f.relative_to(self.path).parts)]
        return None  # a dataset from the hub cache: nothing cheap to compare

    def rows(self, index, count, limit):
        data = self.data.select_columns(self.columns)
        if self.typed:
            end = len(data) if limit is None else min(limit, len(data))
            arrow = data.with_format("arrow")
            for start in range(0, end, CHUNK_ROWS):
                chunk = arrow[start:min(start + CHUNK_ROWS, end)]
                picks, values = _take(chunk, start, index, count, limit)
                yield from zip((start + i for i in picks), values)
            return
        position = -1
        try:
            for position, row in enumerate(data):
                if limit is not None and position >= limit:
                    return
                if in_shard(position, index, count, limit):
                    yield position, row
        except Exception as e:  # a stream cannot skip ahead past a bad file, so this always stops the run
            raise SourceError(f"cannot read {self.path} after row {position}: {first_line(e)}") from e


# ---- which rows to run -------------------------------------------------------------------------


@dataclass(slots=True)
class Row:
    """One input row of this shard: its id, position, and needed column values (or an error)."""

    id: str
    position: int
    values: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


class RowSelector:
    """Iterates the shard's rows that still need a result: rows whose id is in `done` (finished part
    files) are skipped, as are later rows repeating an id seen before (counted in `duplicates`), or, with
    `repeats_are_errors` (OpenAI batch lines: each line gets an output line), yielded as error rows under
    a made-up id that name the first line of the id.

    Only ids from `id_column` can repeat, so only they are remembered (memory grows with the rows read).
    Position ids cannot: a source yields strictly increasing positions (checked), and distinct
    positions have distinct decimal strings, so a fresh run over any input length keeps no per-row state.
    A row whose id_column value is null, absent, not valid text or starts with NUL gets the id
    GENERATED_ID_PREFIX + "row-<position>" and an error naming the row: no real id starts with NUL, so
    a made-up id never takes a real one's place.

    `total` is the shard's row count when the input knows its length; `skipped` grows as done rows
    go by, so `total - skipped` is what is left of this run. When the input stops being readable
    part-way (SourceError), iteration ends and `read_error` holds the message: the rows already
    yielded are still run and written, and the caller reports the error afterwards.
    """

    def __init__(self, source: Source, *, id_column: str | None, shard_index: int, shard_count: int,
                 limit: int | None, done: set[str], repeats_are_errors: bool = False):
        self.source, self.id_column = source, id_column
        self.repeats_are_errors = repeats_are_errors
        self.shard_index, self.shard_count, self.limit = shard_index, shard_count, limit
        self.done = done
        self.skipped = 0
        self.duplicates = 0
        self.duplicate_ids: list[str] = []  # the first DUPLICATES_LISTED of them, for the warning and status
        self.read_error: str | None = None
        n = source.num_rows if limit is None or source.num_rows is None else min(limit, source.num_rows)
        self.total = None if n is None else len(range(shard_index, n, shard_count))

    def row_id(self, position: int, values: dict[str, Any] | str) -> tuple[str, str | None]:
        if self.id_column is None:
            return str(position), None
        generated = f"{GENERATED_ID_PREFIX}row-{position}"
        if isinstance(values, str):
            return generated, None
        value = values.get(self.id_column)
        name = f"source.id_column {self.id_column!r}"
        if value is None:
            return generated, f"{name} is null in row {position}"
        if value is ABSENT:
            return generated, f"{name} is missing in row {position}"
        if isinstance(value, BadValue):
            return generated, f"{name} {value.reason} in row {position}"
        text = value if isinstance(value, str) else str(value)
        problem = text_problem(text)
        if problem:
            return generated, f"{name} {problem} in row {position}"
        if text.startswith(GENERATED_ID_PREFIX):
            return generated, f"{name} starts with NUL (U+0000), which marks made-up ids, in row {position}"
        return text, None

    def __iter__(self) -> Iterator[Row]:
        # Position ids cannot repeat, so only ids from id_column are remembered (done ones too, so that a
        # repeat of a row finished by an earlier run is still a repeat): id -> its first position.
        seen: dict[str, int] | None = {} if self.id_column is not None else None
        last = -1
        rows = self.source.rows(self.shard_index, self.shard_count, self.limit)
        while True:
            try:
                position, values = next(rows)
            except StopIteration:
                return
            except SourceError as e:
                self.read_error = str(e)
                return
            if position <= last:
                raise RuntimeError(f"source yielded position {position} after {last}; positions must increase")
            last = position
            row_id, id_error = self.row_id(position, values)
            if seen is not None and id_error is None and not isinstance(values, str):
                first = seen.setdefault(row_id, position)
                if first != position and self.repeats_are_errors:
                    id_error = f"duplicate {self.id_column} {row_id!r} (first on line {first + 1})"
                    row_id = f"{GENERATED_ID_PREFIX}row-{position}"
                elif first != position:
                    self.duplicates += 1
                    if len(self.duplicate_ids) < DUPLICATES_LISTED:
                        self.duplicate_ids.append(row_id)
                    self.skipped += 1
                    continue
            if row_id in self.done:
                self.skipped += 1
                continue
            if isinstance(values, str):
                yield Row(row_id, position, error=values)
            else:
                yield Row(row_id, position, values, id_error)
