"""OpenAI batch files in jobs: `source.format=openai` reads the request lines of an OpenAI batch input
file (what `batchspec run-batch` reads), `output.format=openai` also writes the output file.

Each line is a row: its id is `custom_id`, its prompt the body's `messages` (through the target's chat
template) or `prompt`, its settings the body's (openai_format.row_params: OpenAI's defaults, temperature
1). A line that cannot run is that row's error. The Parquet parts stay the job's resumable store; once
every shard has finished, `results.jsonl` in the output dir is (re)written from them atomically, one
OpenAI batch output line per input line, in input order (openai_output.format_output).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from ...util.files import atomic_write_text
from .request import BatchLine, parse_request, with_defaults
from .response import dumps, error_output, format_output, line_key, token_decoder
from ...engine.types import MAX_CHARS_PER_TOKEN, Request, Result
from ..layout import part_files, read_part
from ...sources.prompts import PromptBuilder
from ...sources.rows import POSITION_COLUMN
from ...sources import ABSENT, GENERATED_ID_PREFIX, Row, RowSelector, SourceError, open_source

LINE_COLUMNS = ("custom_id", "url", "body")  # read from every line
OPTIONAL_COLUMNS = ("method",)  # read where a line has it (POST when absent; anything else is refused)
URL_COLUMN = "url"  # kept in the output rows: it tells a chat line from a completion line
CUSTOM_ID_COLUMN = "custom_id"  # kept too: a repeated custom_id's error line runs under a made-up id
RESULTS_FILE = "results.jsonl"
RESULT_FIELDS = tuple(f.name for f in fields(Result) if f.name not in ("extra", "stop_reason"))


class OpenAIRequests:
    """Rows of an OpenAI batch input file -> Requests. max_seq_len: the generator's (a chat line without
    max_tokens may use the whole context, as OpenAI's API does)."""

    def __init__(self, tokenizer, max_seq_len: int):
        self.tokenizer, self.max_seq_len = tokenizer, max_seq_len
        self._chat: PromptBuilder | None = None

    def request(self, row: Row) -> Request:
        custom_id = row.values.get(CUSTOM_ID_COLUMN)
        extra = {POSITION_COLUMN: row.position, URL_COLUMN: None,
                 CUSTOM_ID_COLUMN: custom_id if isinstance(custom_id, str) else None}
        if row.error:
            return Request(id=row.id, prompt=None, error=row.error, extra=extra)
        obj = {k: v for k, v in row.values.items() if v is not ABSENT}
        line = parse_request(obj, row.position + 1)
        extra[URL_COLUMN] = line.url
        if line.error:
            return Request(id=row.id, prompt=None, error=line.error, extra=extra)
        params = with_defaults(line, self.max_seq_len)
        if not line.chat:
            chars = len(line.prompt) if isinstance(line.prompt, str) else 0
            if chars > MAX_CHARS_PER_TOKEN * self.max_seq_len:  # cheap, before tokenizing it all
                return Request(id=row.id, prompt=None, extra=extra, error=f"body.prompt has {chars:,} characters, "
                               f"far more than max_seq_len={self.max_seq_len} tokens hold")
            return Request(id=row.id, prompt=line.prompt, extra=extra, params=params)
        if not getattr(self.tokenizer, "chat_template", None):
            return Request(id=row.id, prompt=None, error="a chat line, but the target's tokenizer has no chat template",
                           extra=extra)
        if self._chat is None:
            self._chat = PromptBuilder(prompt_column="messages", template=None, chat=True, tokenizer=self.tokenizer,
                                       max_seq_len=self.max_seq_len)  # with its size check
        try:
            prompt = self._chat.prompt({"messages": line.messages})
        except ValueError as e:  # PromptError: the chat template refused the messages
            return Request(id=row.id, prompt=None, error=str(e), extra=extra)
        return Request(id=row.id, prompt=prompt, extra=extra, params=params)


def keep_schema() -> pa.Schema:
    return pa.schema([(URL_COLUMN, pa.string()), (CUSTOM_ID_COLUMN, pa.string())])


def input_rows(path: str, limit: int | None = None) -> Iterator[tuple[str, int]]:
    """(row id, position) of each line of an OpenAI batch input file as a job's rows take them (a line without
    a usable custom_id, or repeating an earlier one, under its made-up id), in file order."""
    source = open_source(path, "jsonl", "train", {CUSTOM_ID_COLUMN: "source.format=openai"})
    selector = RowSelector(source, id_column=CUSTOM_ID_COLUMN, shard_index=0, shard_count=1, limit=limit,
                           done=set(), repeats_are_errors=True)
    for row in selector:
        yield row.id, row.position
    if selector.read_error:
        raise SourceError(selector.read_error)


def write_results(out_dir: Path, input_path: str, tokenizer, *, model: str, drafter: str,
                  limit: int | None = None) -> Path:
    """results.jsonl from the parts of `out_dir`: one output line per line of the input as it is now (the first
    `limit`), in its order. Parts may also hold rows of lines an earlier run read and the input no longer has
    (a resumed job keys rows by custom_id): those are left out, so the file always answers this input."""
    groups: dict[str, list[dict[str, Any]]] = {}
    wanted = [*RESULT_FIELDS, "stop_reason", "stop_token_id", POSITION_COLUMN, URL_COLUMN, CUSTOM_ID_COLUMN]
    parts = part_files(out_dir)
    for path in parts:
        with pq.ParquetFile(path) as f:  # parts written before CUSTOM_ID_COLUMN was kept lack it
            columns = [c for c in wanted if c in f.schema_arrow.names]
        for row in read_part(path, columns).to_pylist():
            groups.setdefault(row["id"], []).append(row)
    digest = file_digest(input_path)
    decode = token_decoder(tokenizer)
    # When the newest part was written: a rerun that adds nothing rewrites the same file, byte for byte.
    created = int(max(path.stat().st_mtime for path in parts)) if parts else int(time.time())
    lines = []
    for row_id, position in input_rows(input_path, limit):
        number, rows = position + 1, groups.get(row_id)
        key = line_key(digest, number)
        made_up = row_id.startswith(GENERATED_ID_PREFIX)
        if rows is None:  # the input changed after the run that finished every shard
            lines.append(error_output(BatchLine(number, None if made_up else row_id, None),
                                      "no result: this line is not in the job's output; run the job again", key=key))
            continue
        first = rows[0]
        custom_id = first.get(CUSTOM_ID_COLUMN, None if made_up else row_id)
        line = BatchLine(number, custom_id, first[URL_COLUMN])
        results = [as_result(r) for r in rows]
        if line.url is None:  # the line never parsed: no url to format a body for
            lines.append(error_output(line, results[0].error or "error", key=key))
        else:
            lines.append(format_output(line, results, key=key, model=model, created=created, decode=decode,
                                       drafter=drafter))
    target = out_dir / RESULTS_FILE
    atomic_write_text(target, "".join(dumps(line) + "\n" for line in lines))
    return target


def as_result(row: dict[str, Any]) -> Result:
    stop = row["stop_reason"] if row["stop_reason"] is not None else row["stop_token_id"]
    return Result(**{name: row[name] for name in RESULT_FIELDS}, stop_reason=stop)


def file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()

