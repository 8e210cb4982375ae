"""Earlier outputs as a suffix drafter's warm start: `drafter.corpus=PATH`.

    tokens = load_corpus("outputs/last-week", tokenizer)   # a batchspec output folder: its completions
    tokens = load_corpus("texts.jsonl", tokenizer, column="text")

A batchspec output folder (or any Parquet with a `completion_token_ids` column) gives its rows' token ids
as they were generated (error rows skipped); other inputs (a Parquet or JSONL file, a folder or glob of
Parquet files, a folder of JSONL files, a dataset saved with `save_to_disk`) give a text column, tokenized
without special tokens (a completion carries none). Rows come oldest first, in file order, so that when
the bound is reached the suffix index evicts the oldest.

With `max_tokens`, rows are read and tokenized from the newest backwards, in chunks sized from the tokens
still wanted, and reading stops once the rows kept hold max_tokens tokens: the work is bounded by the
bound, not by the corpus (a folder of JSONL files, read as a stream, is read whole, but only the newest
rows are tokenized). Anything wrong with the path as a whole raises CorpusError (a ValueError), one line
that names the path and the problem.
"""

from __future__ import annotations

import glob
from collections import Counter
from pathlib import Path
from typing import Callable, Iterator

from transformers import PreTrainedTokenizerBase

from .corpus_read import (TOKEN_IDS, CorpusError, hf_texts, jsonl_columns, jsonl_texts, no_token_rows,  # noqa: F401
                          parquet_texts, token_id_parts, token_id_rows)  # CorpusError: raised from here too
from ..util.textcheck import first_line
from . import detect_format
from .hf import HFSource
from .parquet import ParquetSource

TEXT_COLUMNS = ("completion", "text")  # tried in this order when no column is named
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".ndjson")
KINDS = "Parquet (.parquet) or JSONL (.jsonl, .jsonl.gz, .json, .ndjson)"
FIRST_CHUNK = 16  # rows tokenized before the tokens per row are known
MAX_CHUNK = 2048


def load_corpus(path: str, tokenizer: PreTrainedTokenizerBase, column: str | None = None,
                max_tokens: int | None = None) -> list[list[int]]:
    """The token lists of `path` (module docstring), oldest first. max_tokens: keep only the newest rows
    while fewer than max_tokens tokens are kept (the last one kept may pass it; what the index could hold
    anyway). Raises CorpusError: the path does not exist, is a file of another kind or a folder without
    Parquet or JSONL files, has no usable column (the message names the columns it has), holds no usable
    rows, or cannot be read."""
    where = f"drafter.corpus={path}"
    try:
        newest, tokenize, empty = _reader(path, where, tokenizer, column)
        lists = _newest_rows(newest, tokenize, max_tokens)
    except CorpusError:
        raise
    except ValueError as e:  # SourceError and Arrow's errors: already about the input, made one line
        message = first_line(e)
        raise CorpusError(message if message.startswith(where) else f"{where}: {message}") from e
    except OSError as e:
        raise CorpusError(f"{where}: cannot be read: {first_line(e)}") from e
    if not lists and (max_tokens is None or max_tokens > 0):  # no usable row at all
        raise CorpusError(f"{where}: the corpus is empty: {empty()}")
    return lists


# ---- newest rows first, tokenized in chunks, until the bound ---------------------------------------


def _newest_rows(newest: Iterator, tokenize: Callable[[list], list[list[int]]] | None,
                 max_tokens: int | None) -> list[list[int]]:
    """The kept token lists, oldest first. `newest` yields the rows newest
    first: token lists, or texts that `tokenize` turns into token lists (a list at a time). The rows kept are
    exactly those of "tokenize every row, then keep the newest while fewer than max_tokens are kept"."""
    kept: list[list[int]] = []
    total, rows_done = 0, 0
    while max_tokens is None or total < max_tokens:
        if tokenize is None:
            chunk = [next(newest, None)]
            if chunk[0] is None:
                break
        else:
            if max_tokens is None or not rows_done:
                size = MAX_CHUNK if max_tokens is None else FIRST_CHUNK
            else:  # the rows still wanted at the mean tokens per row so far, and a few more
                wanted = (max_tokens - total) * rows_done / max(total, 1)
                size = min(MAX_CHUNK, max(FIRST_CHUNK, int(wanted * 1.1) + 1))
            texts = [text for _, text in zip(range(size), newest)]
            if not texts:
                break
            chunk = tokenize(texts)
            rows_done += len(chunk)
        for tokens in chunk:
            if max_tokens is not None and total >= max_tokens:
                break
            kept.append(tokens)
            total += len(tokens)
    return kept[::-1]


def _reader(path: str, where: str, tokenizer, column: str | None):
    """(rows newest first, a tokenize function or None for token ids, a function saying why nothing was usable)."""
    def tokenize(texts: list[str]) -> list[list[int]]:
        return tokenizer(texts, add_special_tokens=False)["input_ids"]

    p = Path(path)
    if glob.has_magic(path):
        if not glob.glob(path, recursive=True):
            raise CorpusError(f"{where} matches no files")
    elif not p.exists():
        raise CorpusError(f"{where} does not exist (no such file or folder)")
    if p.is_file() and not path.lower().endswith((".parquet",) + JSONL_SUFFIXES):
        suffix = "".join(p.suffixes[-1:]) or "no suffix"
        raise CorpusError(f"{where} is a file of an unsupported kind ({suffix}): the corpus is read from {KINDS} "
                          "files, a folder of them or a batchspec output folder")
    if p.is_dir():
        _check_folder(p, where)
    if column is None:
        parts = token_id_parts(p, where)
        if parts:
            return token_id_rows(parts, where), None, lambda: no_token_rows(parts)
    if p.is_file() and path.lower().endswith(JSONL_SUFFIXES):
        name = _pick_column(where, column, jsonl_columns(path, where), {})
        return jsonl_texts(path, name), tokenize, lambda: f"no row has a non-empty text in column {name!r}"
    if detect_format(path) == "parquet":
        source = ParquetSource(path, [])
        name = _pick_column(where, column, source.available, {c: source.files_without(c) for c in source.available})
        rows = sum(source.file_rows.values())
        return (parquet_texts(source, name, where), tokenize,
                lambda: f"none of its {rows} rows has a non-empty text in column {name!r}")
    source = HFSource(path, "train", [])
    name = _pick_column(where, column, source.available, {})
    source.columns = [name]
    return hf_texts(source, name), tokenize, lambda: f"no row has a non-empty text in column {name!r}"


def _check_folder(folder: Path, where: str) -> None:
    """A folder must hold Parquet or JSONL files (or be a saved dataset); else say what it holds."""
    if any((folder / marker).exists() for marker in ("dataset_info.json", "dataset_dict.json", "state.json")):
        return
    if (folder / "job.json").is_file() and not any(folder.rglob("*.parquet")):
        raise CorpusError(f"{where} is a batchspec output folder without output rows (no Parquet parts in "
                          f"{folder / 'data'})")
    files = [f for f in folder.rglob("*") if f.is_file()
             and not any(part.startswith(".") for part in f.relative_to(folder).parts)]
    if any(f.name.lower().endswith((".parquet",) + JSONL_SUFFIXES) for f in files):
        return
    if not files:
        raise CorpusError(f"{where} is an empty folder: the corpus is read from {KINDS} files or a batchspec "
                          "output folder")
    kinds = Counter("".join(f.suffixes[-1:]).lower() or "suffix-less" for f in files)
    held = ", ".join(f"{n} {kind} file{'s' if n > 1 else ''}" for kind, n in kinds.most_common(5))
    more = f" and {len(kinds) - 5} other kinds" if len(kinds) > 5 else ""
    raise CorpusError(f"{where} is a folder with no Parquet or JSONL files (it holds {held}{more}): the corpus "
                      f"is read from {KINDS} files or a batchspec output folder")


def _pick_column(where: str, column: str | None, available: list[str], lacking: dict[str, list[str]]) -> str:
    """The text column: `column`, else the first of TEXT_COLUMNS that every file has."""
    candidates = [column] if column else list(TEXT_COLUMNS)
    for name in candidates:
        if name in available and not lacking.get(name):
            return name
    for name in candidates:
        if lacking.get(name) and name in available:
            files = lacking[name]
            others = f" and {len(files) - 1} other file(s)" if len(files) > 1 else ""
            raise CorpusError(f"{where}: column {name!r} is missing from {files[0]}{others}; every file must "
                              "have the column the corpus reads")
    has = ", ".join(available) if available else "none"
    looks = f"the column {column!r}" if column else f"{TOKEN_IDS} or a text column ({', '.join(TEXT_COLUMNS)})"
    raise CorpusError(f"{where}: no completion_token_ids and no text column to read: it has the columns {has}; "
                      f"the corpus reads {looks}")


# ---- token ids: a batchspec output folder, or Parquet with completion_token_ids -----------------------------


# ---- texts ---------------------------------------------------------------------------------------------


