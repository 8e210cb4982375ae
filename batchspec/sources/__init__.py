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

import glob
import logging
import os
from pathlib import Path
from typing import Mapping

from .base import FORMATS, GENERATED_ID_PREFIX, SourceError, BadValue, ABSENT, shard_from_env, Source
from .hf import HFSource
from .jsonl import JsonlSource
from .parquet import ParquetSource, parquet_files
from .rows import Row, RowSelector

__all__ = ["ABSENT", "BadValue", "FORMATS", "GENERATED_ID_PREFIX", "Row", "RowSelector", "Source", "SourceError",
           "detect_format", "input_root", "nesting_problem", "open_source", "parquet_files", "shard_from_env"]

log = logging.getLogger("batchspec")


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
