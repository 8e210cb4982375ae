"""Input rows -> Requests, streamed: Parquet, Hugging Face datasets and JSONL, never loaded whole.

    source = open_source("data/*.parquet", "auto", "train", needed={"text": "source.prompt_column"})
    rows = RowSelector(source, id_column=None, shard_index=0, shard_count=1, limit=None, done=set())
    requests = (builder.request(row) for row in rows)

A source reads only the needed columns, in chunks of CHUNK_ROWS. Every row has a global position
(its index in the input, counted from 0 over all files) which is its id unless `id_column` is set.
Sharding is round-robin on that position: shard i of n takes the rows with position % n == i, so
the split depends only on the input and the union of all shards is every row exactly once.
`limit` keeps the first `limit` positions of the input, before sharding.

Anything wrong with a single row (null or non-string prompt, a template field missing in that row,
malformed chat messages, a JSONL line that is not JSON) becomes that row's error; only problems
with the input as a whole (unreadable path, missing column) raise SourceError.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from ..types import Request

CHUNK_ROWS = 1024
INFER_ROWS = 1000  # rows sampled to infer column types where the input declares none (JSONL, streams)
FORMATS = ("parquet", "hf", "jsonl")


class SourceError(ValueError):
    """The input as a whole cannot be read as configured; the message is one line."""


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


def open_source(path: str, fmt: str, split: str, needed: Mapping[str, str]) -> "Source":
    """Open `path` and check that every needed column exists.

    `needed` maps each column to the config key that asks for it, for the error message.
    """
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt == "parquet":
        source: Source = ParquetSource(path, list(needed))
    elif fmt == "jsonl":
        source = JsonlSource(path, list(needed))
    elif fmt == "hf":
        source = HFSource(path, split, list(needed))
    else:
        raise SourceError(f"source.format={fmt!r} is not one of auto, {', '.join(FORMATS)}")
    for column, key in needed.items():
        if column not in source.available:
            raise SourceError(
                f"{key}: column {column!r} is not in {path}; available columns: {', '.join(source.available)}"
            )
    return source


class Source:
    """A readable input. `available`: its column names; `schema`: Arrow types of the needed columns;
    `num_rows`: row count when known without a full read; `typed`: whether `schema` is declared by the
    input (Parquet, a saved dataset) rather than inferred from its first rows (JSONL, a stream)."""

    available: list[str]
    schema: pa.Schema
    num_rows: int | None
    typed: bool

    def rows(self, index: int, count: int, limit: int | None) -> Iterator[tuple[int, dict[str, Any] | str]]:
        """(position, values of the needed columns) for the rows of this shard, in input order; a row
        that cannot be read at all comes as (position, error message)."""
        raise NotImplementedError


def _take(table: pa.Table | pa.RecordBatch, start: int, index: int, count: int, limit: int | None):
    """The rows of one chunk (starting at global position `start`) that belong to the shard."""
    if count == 1 and (limit is None or start + table.num_rows <= limit):
        return range(table.num_rows), table.to_pylist()  # the whole chunk: no index, no copy
    picks = [i for i in range(table.num_rows) if in_shard(start + i, index, count, limit)]
    return picks, (table.take(pa.array(picks, pa.int64())).to_pylist() if picks else [])


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


class ParquetSource(Source):
    """Parquet files read in record batches, only the needed columns (row counts from the footers)."""

    typed = True

    def __init__(self, path: str, columns: list[str]):
        self.path, self.columns = path, columns
        self.files = parquet_files(path)
        try:
            first = pq.ParquetFile(self.files[0])
            self.num_rows = sum(pq.ParquetFile(f).metadata.num_rows for f in self.files)
        except (OSError, pa.ArrowException) as e:
            raise SourceError(f"cannot read Parquet input {path!r}: {one_line(e)}") from e
        file_schema = first.schema_arrow
        self.available = file_schema.names
        self.schema = pa.schema([file_schema.field(c) for c in columns if c in self.available])

    def rows(self, index, count, limit):
        start = 0
        for f in self.files:
            if limit is not None and start >= limit:
                return
            try:
                batches = pq.ParquetFile(f).iter_batches(batch_size=CHUNK_ROWS, columns=self.columns)
                for batch in batches:
                    if limit is not None and start >= limit:
                        return
                    picks, values = _take(batch, start, index, count, limit)
                    yield from zip((start + i for i in picks), values)
                    start += batch.num_rows
            except (OSError, pa.ArrowException) as e:
                raise SourceError(f"cannot read Parquet file {f}: {one_line(e)}") from e


def _open_text(path: str) -> io.TextIOBase:
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def infer_schema(sample: list[dict[str, Any]], columns: list[str]) -> pa.Schema:
    """Arrow types of `columns` from sample rows: the type all sampled values share, else the first
    non-null value's type; a column with only nulls is a string."""
    fields = []
    for c in columns:
        values = [r.get(c) for r in sample if r.get(c) is not None]
        t = pa.string()
        for candidate in (values, values[:1]):
            try:
                t = pa.array(candidate).type if candidate else pa.string()
                break
            except (pa.ArrowException, TypeError, ValueError):
                continue
        fields.append(pa.field(c, t))
    return pa.schema(fields)


class JsonlSource(Source):
    """One JSON object per line (blank lines skipped; .gz read transparently). Column names and
    types come from the first INFER_ROWS objects; a line that is not a JSON object is that row's error."""

    typed = False

    def __init__(self, path: str, columns: list[str]):
        self.path, self.columns = path, columns
        if not os.path.isfile(path):
            raise SourceError(f"source.path={path!r} does not exist or is not a file")
        sample: list[dict] = []
        try:
            with _open_text(path) as f:
                self.num_rows = 0
                for line in f:
                    if not line.strip():
                        continue
                    self.num_rows += 1
                    if len(sample) < INFER_ROWS:
                        try:
                            obj = json.loads(line)
                        except json.JSONDecodeError:
                            continue
                        if isinstance(obj, dict):
                            sample.append(obj)
        except (OSError, UnicodeDecodeError) as e:
            raise SourceError(f"cannot read JSONL input {path!r}: {one_line(e)}") from e
        if self.num_rows and not sample:
            raise SourceError(f"cannot read JSONL input {path!r}: none of its first lines is a JSON object")
        self.available = list(dict.fromkeys(k for row in sample for k in row))
        self.schema = infer_schema(sample, [c for c in columns if c in self.available])

    def rows(self, index, count, limit):
        position = -1
        with _open_text(self.path) as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                position += 1
                if limit is not None and position >= limit:
                    return
                if not in_shard(position, index, count, limit):
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    yield position, f"line {number} is not valid JSON: {e}"
                    continue
                if not isinstance(obj, dict):
                    yield position, f"line {number} is a JSON {type(obj).__name__}, not an object"
                    continue
                yield position, {c: obj.get(c) for c in self.columns}


class HFSource(Source):
    """A dataset saved with `save_to_disk` (memory-mapped Arrow, read in chunks), or anything
    `datasets.load_dataset(path, split=split, streaming=True)` can open locally."""

    def __init__(self, path: str, split: str, columns: list[str]):
        import datasets  # deferred: importing datasets costs a second

        self.path, self.columns = path, columns
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
            raise SourceError(f"cannot open {path!r} as a Hugging Face dataset: {one_line(e)}") from e
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
        for position, row in enumerate(data):
            if limit is not None and position >= limit:
                return
            if in_shard(position, index, count, limit):
                yield position, row


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
    files) are skipped, as are later rows repeating an id seen before (counted in `duplicates`).

    Only ids from `id_column` can repeat, so only they are remembered (memory grows with the rows read).
    Position ids cannot: a source yields strictly increasing positions (checked), and distinct
    positions have distinct decimal strings, so a fresh run over any input length keeps no per-row state.

    `total` is the shard's row count when the input knows its length; `skipped` grows as done rows
    go by, so `total - skipped` is what is left of this run.
    """

    def __init__(self, source: Source, *, id_column: str | None, shard_index: int, shard_count: int,
                 limit: int | None, done: set[str]):
        self.source, self.id_column = source, id_column
        self.shard_index, self.shard_count, self.limit = shard_index, shard_count, limit
        self.done = done
        self.skipped = 0
        self.duplicates = 0
        n = source.num_rows if limit is None or source.num_rows is None else min(limit, source.num_rows)
        self.total = None if n is None else len(range(shard_index, n, shard_count))

    def row_id(self, position: int, values: dict[str, Any] | str) -> tuple[str, str | None]:
        if self.id_column is None:
            return str(position), None
        if isinstance(values, str):
            return f"row-{position}", None
        value = values.get(self.id_column)
        if value is None:
            return f"row-{position}", f"source.id_column {self.id_column!r} is null in row {position}"
        return str(value), None

    def __iter__(self) -> Iterator[Row]:
        # Position ids cannot repeat, so only ids from id_column are remembered.
        seen: set[str] | None = set() if self.id_column is not None else None
        last = -1
        for position, values in self.source.rows(self.shard_index, self.shard_count, self.limit):
            if position <= last:
                raise RuntimeError(f"source yielded position {position} after {last}; positions must increase")
            last = position
            row_id, id_error = self.row_id(position, values)
            if row_id in self.done:
                self.skipped += 1
                continue
            if seen is not None:
                if row_id in seen:
                    self.duplicates += 1
                    self.skipped += 1
                    continue
                seen.add(row_id)
            if isinstance(values, str):
                yield Row(row_id, position, error=values)
            else:
                yield Row(row_id, position, values, id_error)


# ---- prompts -----------------------------------------------------------------------------------


def one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _sandbox():
    from jinja2 import StrictUndefined
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    return ImmutableSandboxedEnvironment(undefined=StrictUndefined, keep_trailing_newline=True, autoescape=False)


def template_columns(template: str) -> list[str]:
    """The row fields a template reads (raises SourceError on a syntax error)."""
    from jinja2 import TemplateSyntaxError, meta

    try:
        return sorted(meta.find_undeclared_variables(_sandbox().parse(template)))
    except TemplateSyntaxError as e:
        raise SourceError(f"source.template: {e.message} (line {e.lineno})") from e


def check_messages(messages: Any) -> str | None:
    """Why `messages` is not a chat (a list of {"role": str, "content": str | list}), or None."""
    if not isinstance(messages, (list, tuple)) or not messages:
        return f"chat messages must be a non-empty list, got {type(messages).__name__}"
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            return f"chat message {i} is a {type(m).__name__}, not a {{role, content}} object"
        if not isinstance(m.get("role"), str):
            return f"chat message {i} has no string 'role'"
        if not isinstance(m.get("content"), (str, list)):
            return f"chat message {i} has no string 'content'"
    return None


class PromptBuilder:
    """Turns a Row into a Request: the prompt from `prompt_column`, or a sandboxed Jinja2 `template`
    over the row's columns (a null or missing field is an error for that row); with `chat`, the text
    (as one user message) or the column's message list goes through the tokenizer's chat template
    with add_generation_prompt=True and the Request carries token ids. `keep_columns` go to `extra`;
    `check_types` (for inputs with inferred types) makes a keep value of another type that row's error.
    """

    def __init__(self, *, prompt_column: str | None, template: str | None, chat: bool, tokenizer=None,
                 keep_columns: list[str] = (), keep_schema: pa.Schema | None = None, check_types: bool = False):
        if template is None and prompt_column is None:
            raise SourceError("set source.prompt_column or source.template")
        if chat and tokenizer is None:
            raise SourceError("source.chat=true needs a tokenizer")
        if chat and not getattr(tokenizer, "chat_template", None):
            raise SourceError("source.chat=true but the target's tokenizer has no chat template")
        self.prompt_column, self.chat, self.tokenizer = prompt_column, chat, tokenizer
        self.template = _sandbox().from_string(template) if template is not None else None
        self.keep_columns = list(keep_columns)
        self.keep_types = {f.name: f.type for f in keep_schema} if keep_schema is not None else {}
        self.check_types = check_types

    def request(self, row: Row) -> Request:
        extra = {c: row.values.get(c) for c in self.keep_columns}
        error = row.error or self._check_keep(extra)
        if error:
            return Request(id=row.id, prompt=None, error=error, extra=extra)
        try:
            prompt = self.prompt(row.values)
        except PromptError as e:
            return Request(id=row.id, prompt=None, error=str(e), extra=extra)
        return Request(id=row.id, prompt=prompt, extra=extra)

    def _check_keep(self, extra: dict[str, Any]) -> str | None:
        """For inferred types: a value that does not fit its column is dropped (null) and makes the row an error."""
        if not self.check_types:
            return None
        error = None
        for name, value in extra.items():
            try:
                pa.array([value], type=self.keep_types[name])
            except (pa.ArrowException, TypeError, ValueError):
                extra[name] = None
                error = error or f"keep column {name!r}: {value!r} is not of the column's type {self.keep_types[name]}"
        return error

    def prompt(self, values: dict[str, Any]) -> str | list[int]:
        if self.template is not None:
            text = self._render(values)
            return self._chat([{"role": "user", "content": text}]) if self.chat else text
        value = values.get(self.prompt_column)
        name = f"source.prompt_column {self.prompt_column!r}"
        if value is None:
            raise PromptError(f"{name} is null")
        if self.chat:
            return self._chat([{"role": "user", "content": value}] if isinstance(value, str) else value)
        if isinstance(value, str):
            return value
        if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
            return value  # pre-tokenized
        raise PromptError(f"{name} holds a {type(value).__name__}, not a string")

    def _render(self, values: dict[str, Any]) -> str:
        from jinja2 import TemplateError, UndefinedError

        context = {k: v for k, v in values.items() if v is not None}  # null fields count as missing
        try:
            return self.template.render(context)
        except UndefinedError as e:
            raise PromptError(f"source.template: {e.message} (null or missing in this row)") from e
        except TemplateError as e:
            raise PromptError(f"source.template: {one_line(e)}") from e
        except Exception as e:  # an error inside an expression, e.g. {{ a + b }} on a str and an int
            raise PromptError(f"source.template: {type(e).__name__}: {one_line(e)}") from e

    def _chat(self, messages: Any) -> list[int]:
        problem = check_messages(messages)
        if problem:
            raise PromptError(problem)
        try:
            ids = self.tokenizer.apply_chat_template(
                [dict(m) for m in messages], add_generation_prompt=True, tokenize=True, return_dict=False
            )
        except Exception as e:  # chat templates raise their own errors (e.g. roles must alternate)
            raise PromptError(f"chat template: {one_line(e)}") from e
        if isinstance(ids, Mapping):
            ids = ids["input_ids"]
        return [int(t) for t in ids]


class PromptError(ValueError):
    """This row's prompt cannot be built."""
