"""A corpus source's rows, newest first (load.py bounds how many it reads): token ids from batchspec
output parts, texts from Parquet row groups from the last, JSONL files read backwards in blocks, saved
datasets by chunks from the end."""

from __future__ import annotations

import codecs
import os
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from ..util.textcheck import first_line, text_problem
from .base import CHUNK_ROWS, INFER_ROWS, pylist
from .jsonl import READ_ERRORS, first_char, jsonl_lines, parse_json_line

TOKEN_IDS = "completion_token_ids"
SLICE_ROWS = 256  # token-id rows converted to Python at a time
BLOCK_BYTES = 1 << 20  # a JSONL file is read backwards in blocks of this size


class CorpusError(ValueError):
    """drafter.corpus cannot be read; the message is one line naming the path and what is wrong."""


def token_id_parts(p: Path, where: str) -> list[Path]:
    """The Parquet parts to read token ids from: an output folder's data/*.parquet (or the folder's own), or
    one Parquet file, when the first has completion_token_ids; else []."""
    if p.is_dir():
        data = p / "data" if (p / "data").is_dir() else p
        parts = sorted(data.glob("*.parquet"))
    elif p.is_file() and p.name.lower().endswith(".parquet"):
        parts = [p]
    else:
        return []
    if not parts:
        return []
    try:
        names = pq.read_schema(parts[0]).names
    except (OSError, ValueError) as e:  # Arrow's errors are OSError or ValueError subclasses
        raise CorpusError(f"{where}: cannot read Parquet file {parts[0]}: {first_line(e)}") from e
    return parts if TOKEN_IDS in names else []


def token_id_rows(parts: list[Path], where: str) -> Iterator[list[int]]:
    """Each part's completion_token_ids, newest first: parts and row groups from the last, a slice at a time."""
    for part in reversed(parts):
        with parquet_file(part, where) as pf:
            names = pf.schema_arrow.names
            if TOKEN_IDS not in names:
                raise CorpusError(f"{where}: {part} has no {TOKEN_IDS} column although {parts[0].name} has; "
                                  f"its columns: {', '.join(names)}")
            columns = [TOKEN_IDS] + (["finish_reason"] if "finish_reason" in names else [])
            for group in reversed(range(pf.metadata.num_row_groups)):
                try:
                    table = pf.read_row_group(group, columns=columns)
                except (OSError, ValueError) as e:
                    raise CorpusError(f"{where}: cannot read Parquet file {part}: {first_line(e)}") from e
                for end in range(table.num_rows, 0, -SLICE_ROWS):
                    piece = table.slice(max(0, end - SLICE_ROWS), end - max(0, end - SLICE_ROWS))
                    ids = piece.column(0).to_pylist()
                    reasons = piece.column(1).to_pylist() if len(columns) > 1 else [None] * len(ids)
                    for tokens, reason in zip(reversed(ids), reversed(reasons)):
                        if tokens and reason != "error":
                            yield tokens


def parquet_file(part: Path, where: str):
    try:
        return pq.ParquetFile(part)
    except (OSError, ValueError) as e:
        raise CorpusError(f"{where}: cannot read Parquet file {part}: {first_line(e)}") from e


def no_token_rows(parts: list[Path]) -> str:
    rows = sum(pq.read_metadata(part).num_rows for part in parts)
    return f"none of the {rows} rows of its {len(parts)} Parquet file(s) has {TOKEN_IDS} (error rows are skipped)"


def parquet_texts(source, name: str, where: str) -> Iterator[str]:
    """The column's non-empty strings, newest first: files and row groups from the last."""
    for f in reversed(source.files):
        if f in source.unreadable:
            raise CorpusError(f"{where}: cannot read Parquet file {f}: {source.unreadable[f]}")
        try:
            with pq.ParquetFile(f) as pf:
                for group in reversed(range(pf.metadata.num_row_groups)):
                    values = [row[name] for row in pylist(pf.read_row_group(group, columns=[name]))]
                    yield from (v for v in reversed(values) if usable(v))
        except (OSError, pa.ArrowException) as e:
            raise CorpusError(f"{where}: cannot read Parquet file {f}: {first_line(e)}") from e


def jsonl_columns(path: str, where: str) -> list[str]:
    """The keys of the first INFER_ROWS objects of a JSONL file (as a job's JSONL input sees them)."""
    keys: dict[str, None] = {}
    objects = lines = 0
    try:
        for line in jsonl_lines(path):
            if not line.strip():
                continue
            lines += 1
            try:
                obj = parse_json_line(line)
            except ValueError:
                obj = None
            if isinstance(obj, dict):
                keys.update(dict.fromkeys(obj))
                objects += 1
            if lines >= INFER_ROWS:
                break
        if first_char(path) == b"[":
            raise CorpusError(f"{where} holds a JSON array, not JSON Lines (one object per line): convert it, "
                              f"e.g. jq -c '.[]' {path} > rows.jsonl")
    except READ_ERRORS as e:
        raise CorpusError(f"{where}: cannot read JSONL file: {first_line(e)}") from e
    if not lines:
        raise CorpusError(f"{where}: the corpus is empty: the file has no rows")
    if not objects:
        raise CorpusError(f"{where}: none of its first {lines} lines is a JSON object")
    return list(keys)


def jsonl_texts(path: str, name: str) -> Iterator[str]:
    """The column's non-empty strings, newest first: the lines from the end of the file (a .gz file is
    decompressed whole first). Lines that are no JSON object are skipped, as blank ones."""
    lines = reversed(list(jsonl_lines(path))) if path.endswith(".gz") else lines_backwards(path)
    for line in lines:
        if not line.strip():
            continue
        try:
            obj = parse_json_line(line)
        except ValueError:
            continue
        text = obj.get(name) if isinstance(obj, dict) else None
        if usable(text):
            yield text


def lines_backwards(path: str) -> Iterator[bytes]:
    """A file's lines (split at b"\\n", as reading it forwards does), last first, a block at a time; the
    first line without a UTF-8 byte order mark."""

    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        rest = b""  # the start of a line whose beginning is in an earlier block
        while end > 0:
            start = max(0, end - BLOCK_BYTES)
            f.seek(start)
            block = f.read(end - start) + rest
            end = start
            lines = block.split(b"\n")
            rest = lines.pop(0)
            for line in reversed(lines):
                yield line
        yield rest.removeprefix(codecs.BOM_UTF8)


def hf_texts(source, name: str) -> Iterator[str]:
    """A saved dataset's column from its last row backwards, a chunk at a time; a streamed one (a folder of
    JSONL files) read forwards whole, its texts then given newest first."""
    if source.typed:
        data = source.data.select_columns([name]).with_format("arrow")
        for end in range(len(data), 0, -CHUNK_ROWS):
            values = [row[name] for row in pylist(data[max(0, end - CHUNK_ROWS):end])]
            yield from (v for v in reversed(values) if usable(v))
        return
    texts = [values.get(name) for _, values in source.rows(0, 1, None) if isinstance(values, dict)]
    yield from (v for v in reversed(texts) if usable(v))


def usable(value) -> bool:
    """A text to tokenize: a non-empty string that is valid Unicode (a JSONL line's bytes that are not UTF-8
    would stop the tokenizer); other rows are skipped."""
    return isinstance(value, str) and bool(value) and text_problem(value) is None
