"""What every input source shares: the Source interface, row values that cannot be read or are absent,
the errors, and sharding by position."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import pyarrow as pa

from ..util.textcheck import first_line

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


def pylist(table: pa.Table | pa.RecordBatch) -> list[dict[str, Any]]:
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


def take_rows(table: pa.Table | pa.RecordBatch, start: int, index: int, count: int, limit: int | None):
    """The rows of one chunk (starting at global position `start`) that belong to the shard."""
    if count == 1 and (limit is None or start + table.num_rows <= limit):
        return range(table.num_rows), pylist(table)  # the whole chunk: no index, no copy
    picks = [i for i in range(table.num_rows) if in_shard(start + i, index, count, limit)]
    return picks, (pylist(table.take(pa.array(picks, pa.int64()))) if picks else [])
