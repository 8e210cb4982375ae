"""Rows -> Requests: the prompt from a column, a sandboxed Jinja2 template or a chat template, plus the
keep columns, with everything wrong with one row becoming that row's error (see PromptBuilder).

    builder = PromptBuilder(prompt_column="text", template=None, chat=False, keep_columns=["topic"])
    requests = (builder.request(row) for row in RowSelector(...))
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import pyarrow as pa

from ..util.textcheck import text_problem
from ..util.textcheck import first_line
from ..engine.types import MAX_CHARS_PER_TOKEN, Request
from .rowparams import RowParamColumns
from .rows import POSITION_COLUMN
from . import ABSENT, BadValue, Row, SourceError


def _sandbox():
    # deferred here and in the other functions: only prompt and chat templates need jinja2
    from jinja2 import StrictUndefined
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    return ImmutableSandboxedEnvironment(undefined=StrictUndefined, keep_trailing_newline=True, autoescape=False)


def template_columns(template: str) -> list[str]:
    """The row fields a template reads (raises SourceError on a syntax error)."""
    from jinja2 import TemplateSyntaxError, meta  # deferred, as above

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
    with add_generation_prompt=True and the Request carries token ids. `keep_columns` go to `extra`, with
    the row's input position; `row_params` (RowParamColumns) read the row's own settings from columns;
    a keep value that cannot be read (invalid UTF-8) or, for `check_columns` (types inferred or differing
    between files), does not fit the column's type exactly, is dropped (null) and makes the row an error.
    Text that is not valid Unicode (lone surrogates) is the row's error wherever it is. With
    `max_seq_len`, chat messages holding more characters than that many tokens could cover are the
    row's error before the chat template tokenizes them (as the generator does for text prompts).
    """

    def __init__(self, *, prompt_column: str | None, template: str | None, chat: bool, tokenizer=None,
                 keep_columns: list[str] = (), keep_schema: pa.Schema | None = None,
                 check_columns: Iterable[str] = (), row_params: "RowParamColumns | None" = None,
                 max_seq_len: int | None = None):
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
        self.check_columns = frozenset(check_columns)
        self.row_params = row_params
        self.max_chars = None if max_seq_len is None else MAX_CHARS_PER_TOKEN * max_seq_len
        self.max_seq_len = max_seq_len

    def request(self, row: Row) -> Request:
        extra = {c: row.values.get(c) for c in self.keep_columns}
        error = row.error or self._check_keep(extra)
        extra[POSITION_COLUMN] = row.position
        params = None
        if not error and self.row_params is not None:
            params, error = self.row_params.params(row.values)
        if error:
            return Request(id=row.id, prompt=None, error=error, extra=extra)
        try:
            prompt = self.prompt(row.values)
        except PromptError as e:
            return Request(id=row.id, prompt=None, error=str(e), extra=extra)
        return Request(id=row.id, prompt=prompt, extra=extra, params=params)

    def _check_keep(self, extra: dict[str, Any]) -> str | None:
        """A keep value that cannot be written as its column's type is dropped (null) and makes the row an error."""
        error = None
        for name, value in extra.items():
            if value is ABSENT:  # a JSONL object without the key: null, as in any other column
                extra[name] = None
                continue
            if isinstance(value, BadValue):
                problem = f"the value {value.reason}"
            elif name in self.check_columns:
                problem = value_problem(value, self.keep_types[name])
            else:
                continue
            if problem:
                extra[name] = None
                error = error or f"keep column {name!r}: {problem}"
        return error

    def prompt(self, values: dict[str, Any]) -> str | list[int]:
        if self.template is not None:
            text = self._render(values)
            return self._chat([{"role": "user", "content": text}]) if self.chat else text
        value = values.get(self.prompt_column)
        name = f"source.prompt_column {self.prompt_column!r}"
        if value is None:
            raise PromptError(f"{name} is null")
        if value is ABSENT:
            raise PromptError(f"{name} is missing from this row")
        problem = value.reason if isinstance(value, BadValue) else text_problem(value)
        if problem:
            raise PromptError(f"{name} {problem}")
        if self.chat:
            return self._chat([{"role": "user", "content": value}] if isinstance(value, str) else value)
        if isinstance(value, str):
            return value
        if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
            return value  # pre-tokenized
        raise PromptError(f"{name} holds a {type(value).__name__}, not a string")

    def _render(self, values: dict[str, Any]) -> str:
        from jinja2 import TemplateError, UndefinedError  # deferred, as above

        # Null and absent fields count as missing (StrictUndefined makes them this row's error).
        context = {k: v for k, v in values.items() if v is not None and v is not ABSENT}
        for k, v in context.items():
            problem = v.reason if isinstance(v, BadValue) else text_problem(v)
            if problem:
                raise PromptError(f"source.template: field {k!r} {problem}")
        try:
            return self.template.render(context)
        except UndefinedError as e:
            raise PromptError(f"source.template: {e.message} (null or missing in this row)") from e
        except TemplateError as e:
            raise PromptError(f"source.template: {first_line(e)}") from e
        except Exception as e:  # an error inside an expression, e.g. {{ a + b }} on a str and an int
            raise PromptError(f"source.template: {type(e).__name__}: {first_line(e)}") from e

    def _chat(self, messages: Any) -> list[int]:
        problem = check_messages(messages)
        if problem:
            raise PromptError(problem)
        chars = text_chars(messages)
        if self.max_chars is not None and chars > self.max_chars:  # cheap, before tokenizing it all
            raise PromptError(f"chat messages have {chars:,} characters, far more than "
                              f"max_seq_len={self.max_seq_len} tokens hold")
        try:
            ids = self.tokenizer.apply_chat_template(
                [dict(m) for m in messages], add_generation_prompt=True, tokenize=True, return_dict=False
            )
        except Exception as e:  # chat templates raise their own errors (e.g. roles must alternate)
            raise PromptError(f"chat template: {first_line(e)}") from e
        if isinstance(ids, Mapping):
            ids = ids["input_ids"]
        return [int(t) for t in ids]


def text_chars(value: Any) -> int:
    """Characters of all the strings in `value` (chat messages: roles, contents, content parts)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, Mapping):
        return sum(text_chars(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(text_chars(v) for v in value)
    return 0


class PromptError(ValueError):
    """This row's prompt cannot be built."""


def value_problem(value: Any, type_: pa.DataType) -> str | None:
    """Why `value` cannot be stored in a column of `type_` exactly (None if it can): not valid text,
    another type, or a value Arrow would change (7.5 in an int64 column would become 7)."""
    if value is None:
        return None
    problem = text_problem(value)
    if problem:
        return f"{value!r} {problem}"
    try:
        stored = pa.array([value], type=type_).to_pylist()[0]
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return f"{value!r} is not of the column's type {type_}"
    if not _same(stored, value):
        return f"{value!r} does not fit the column's type {type_} (it would be stored as {stored!r})"
    return None


def _same(stored: Any, value: Any) -> bool:
    """`stored` (read back from Arrow) holds exactly `value`: NaN equals NaN, a struct may add null fields."""
    if isinstance(value, float) and isinstance(stored, float) and math.isnan(value):
        return math.isnan(stored)
    if isinstance(value, Mapping) and isinstance(stored, Mapping):
        return set(value) <= set(stored) and all(_same(stored[k], value.get(k)) for k in stored)
    if isinstance(value, (list, tuple)) and isinstance(stored, (list, tuple)):
        return len(value) == len(stored) and all(map(_same, stored, value))
    return stored == value
