"""JSONL input: one JSON object per line (.gz read transparently), column types inferred from the first
rows, a line that is not an object that row's error."""

from __future__ import annotations

import codecs
import gzip
import hashlib
import json
import logging
import os
import sys
import zlib
from typing import Any, Iterator

import pyarrow as pa

from ..util.textcheck import text_problem
from ..util.textcheck import first_line
from .base import INFER_ROWS, SKIP_HINT, SourceError, BadValue, ABSENT, in_shard, Source

log = logging.getLogger("batchspec")


READ_ERRORS = (OSError, EOFError, zlib.error)  # gzip raises EOFError on a truncated file, zlib.error on bad data


def jsonl_lines(path: str) -> Iterator[bytes]:
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


def parse_json_line(line: bytes) -> Any:
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
    for line in jsonl_lines(path):
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
            for line in jsonl_lines(path):
                lines += 1
                if not line.strip():
                    continue
                self.num_rows += 1
                if len(sample) < INFER_ROWS:
                    try:
                        obj = parse_json_line(line)
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
            for number, line in enumerate(jsonl_lines(self.path), start=1):
                if not line.strip():
                    continue
                position += 1
                if limit is not None and position >= limit:
                    return
                if not in_shard(position, index, count, limit):
                    continue
                try:
                    obj = parse_json_line(line)
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
