"""Hugging Face datasets: one saved with save_to_disk (memory-mapped Arrow) or anything
datasets.load_dataset can open locally, streamed."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..util.textcheck import first_line
from .base import CHUNK_ROWS, INFER_ROWS, SourceError, in_shard, Source, take_rows
from .jsonl import infer_schema
from .parquet import file_digest

log = logging.getLogger("batchspec")


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
                picks, values = take_rows(chunk, start, index, count, limit)
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
