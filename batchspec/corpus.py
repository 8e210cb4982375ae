"""Earlier outputs as a suffix drafter's warm start: `drafter.corpus=PATH`.

    tokens = load_corpus("outputs/last-week", tokenizer)   # a batchspec output folder: its completions
    tokens = load_corpus("texts.jsonl", tokenizer, column="text")

A batchspec output folder (or any Parquet with a `completion_token_ids` column) gives its rows' token ids
as they were generated (error rows skipped); other inputs any job can read (Parquet, JSONL, a saved or
hub dataset) give a text column, tokenized without special tokens (a completion carries none). Rows come
oldest first, in file order, so that when the bound is reached the suffix index evicts the oldest.
"""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedTokenizerBase

TEXT_COLUMNS = ("completion", "text")  # tried in this order when no column is named


def load_corpus(path: str, tokenizer: PreTrainedTokenizerBase, column: str | None = None,
                max_tokens: int | None = None) -> list[list[int]]:
    """The token lists of `path` (module docstring). max_tokens: keep only the newest rows up to about this
    many tokens (what the index could hold anyway). Raises ValueError naming the path and the columns."""
    folder = Path(path)
    data = folder / "data" if (folder / "data").is_dir() else folder
    parts = sorted(data.glob("*.parquet")) if data.is_dir() else []
    if parts and column is None and _has_column(parts[0], "completion_token_ids"):
        lists = _token_ids(parts)
    else:
        lists = _texts(path, tokenizer, column)
    if max_tokens is not None:
        kept, total = [], 0
        for tokens in reversed(lists):
            if total >= max_tokens:
                break
            kept.append(tokens)
            total += len(tokens)
        lists = kept[::-1]
    return lists


def _has_column(part: Path, name: str) -> bool:
    import pyarrow.parquet as pq

    return name in pq.read_schema(part).names


def _token_ids(parts: list[Path]) -> list[list[int]]:
    import pyarrow.parquet as pq

    out = []
    for part in parts:
        table = pq.read_table(part, columns=["completion_token_ids", "finish_reason"])
        for ids, reason in zip(table.column(0).to_pylist(), table.column(1).to_pylist()):
            if ids and reason != "error":
                out.append(ids)
    return out


def _texts(path: str, tokenizer: PreTrainedTokenizerBase, column: str | None) -> list[list[int]]:
    from .jobs.sources import SourceError, open_source

    candidates = [column] if column else list(TEXT_COLUMNS)
    last_error = None
    for name in candidates:
        try:
            source = open_source(path, "auto", "train", {name: "drafter.corpus"})
        except SourceError as e:
            last_error = e
            continue
        out = []
        for _, values in source.rows(0, 1, None):
            text = values.get(name) if isinstance(values, dict) else None
            if isinstance(text, str) and text:
                out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        return out
    raise ValueError(f"drafter.corpus {path}: no completion_token_ids and no text column "
                     f"({', '.join(candidates)}): {last_error}")
