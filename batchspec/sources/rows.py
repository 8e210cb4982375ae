"""Which rows to run: the shard's rows in input order with their ids, less those already done and
repeats of an id."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Iterator

from ..util.textcheck import text_problem
from .base import GENERATED_ID_PREFIX, DUPLICATES_LISTED, SourceError, BadValue, ABSENT, Source

POSITION_COLUMN = "position"  # the row's index in the input (from 0): sorting by it gives input order

log = logging.getLogger("batchspec")


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
