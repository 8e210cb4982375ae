"""OpenAI batch input lines -> batchspec, as pure functions (no torch): one input line -> a BatchLine (the
request's prompt and RowParams, or why it cannot run). The output side is response.py.

Input line:  {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {...}}

Defaults are OpenAI's: temperature 1, top_p 1, n 1; max_tokens 16 for completions and, for chat, what the
context holds (the engine's max_seq_len). A line that cannot run keeps why in BatchLine.error.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

from ...util.textcheck import text_problem
from ...engine.types import Constraint, RowParams

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
URLS = (CHAT_URL, COMPLETIONS_URL)
COMPLETIONS_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
# Body fields that change the output if set, which batchspec does not do: refused unless at their default.
UNSUPPORTED = {"presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "repetition_penalty": (1, 1.0),
               "logit_bias": ({},), "stream": (False,), "echo": (False,), "suffix": ("",), "tools": ([],),
               "functions": ([],), "tool_choice": ("none",), "function_call": ("none",), "prompt_logprobs": (),
               "guided_whitespace_pattern": (), "guided_decoding_backend": ()}
# Structured output (docs/structured.md): body field -> RowParams field, vLLM's guided_* and structured_outputs.
GUIDED = {"guided_json": "json_schema", "guided_regex": "regex", "guided_choice": "choice",
          "guided_grammar": "grammar"}
STRUCTURED_OUTPUTS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar",
                      "json_object": "json_object"}
ROW_NAMES = {"max_new_tokens": "max_tokens", "top_logprobs": "top_logprobs"}  # RowParams field -> body field


@dataclass(frozen=True, slots=True)
class BatchLine:
    """One input line: its 1-based number, custom_id and url, the prompt (chat messages, or completion
    text / token ids) and settings, or `error` (why it cannot run; then the rest may be None)."""

    number: int
    custom_id: str | None
    url: str | None = None
    messages: list[dict[str, str]] | None = None
    prompt: str | list[int] | None = None
    params: RowParams | None = None
    error: str | None = None

    @property
    def chat(self) -> bool:
        return self.url == CHAT_URL


class BadLine(ValueError):
    """A line that cannot run; the message names the field."""


def parse_line(text: str | bytes, number: int) -> BatchLine:
    """An input line -> a BatchLine; anything wrong becomes its `error`, never an exception."""
    try:
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError as e:
                raise BadLine(f"not valid UTF-8 (byte {e.start + 1})") from None
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise BadLine(f"not valid JSON: {e.msg} (column {e.colno})") from None
        except RecursionError:
            raise BadLine("not readable: JSON nested too deeply") from None
        except ValueError as e:  # e.g. an integer beyond Python's 4,300-digit conversion limit
            raise BadLine(f"not readable: {str(e).splitlines()[0]}") from None
    except BadLine as e:
        return BatchLine(number, None, error=str(e))
    return parse_request(obj, number)


def parse_request(obj: Any, number: int) -> BatchLine:
    """A parsed input line (a JSON object) -> a BatchLine; anything wrong becomes its `error`."""
    custom_id = None
    try:
        if not isinstance(obj, dict):
            raise BadLine(f"not a JSON object but a {type(obj).__name__}")
        cid = obj.get("custom_id")
        if not isinstance(cid, str) or not cid or text_problem(cid):
            raise BadLine("no custom_id" if cid is None else "custom_id must be a non-empty string of valid Unicode")
        custom_id = cid
        if obj.get("method", "POST") != "POST":
            raise BadLine(f"method {obj.get('method')!r}: only POST is supported")
        url = obj.get("url")
        if url not in URLS:
            raise BadLine(f"url {url!r}: need one of {', '.join(URLS)}")
        body = obj.get("body")
        if not isinstance(body, dict):
            raise BadLine("no body" if body is None else f"body must be an object, got {type(body).__name__}")
        problem = text_problem(body)
        if problem:
            raise BadLine(f"body {problem}")
        if url == CHAT_URL:
            return BatchLine(number, custom_id, url, messages=chat_messages(body.get("messages")),
                             params=row_params(body, chat=True))
        return BatchLine(number, custom_id, url, prompt=completion_prompt(body.get("prompt")),
                         params=row_params(body, chat=False))
    except BadLine as e:
        return BatchLine(number, custom_id, error=str(e))


def chat_messages(messages: Any) -> list[dict[str, str]]:
    """body.messages -> [{role, content}] with text content (a list of text parts is joined)."""
    if not isinstance(messages, list) or not messages:
        raise BadLine("body.messages must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadLine(f"body.messages[{i}] must be an object with a string role")
        content = m.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise BadLine(f"body.messages[{i}].content: only text parts are supported")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise BadLine(f"body.messages[{i}].content must be a string or a list of text parts")
        out.append({"role": m["role"], "content": content})
    return out


def completion_prompt(prompt: Any) -> str | list[int]:
    """body.prompt: a string or a list of token ids (or a list holding one of either)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise BadLine("body.prompt is empty")
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise BadLine("body.prompt holds several prompts: give each its own line")
    raise BadLine("body.prompt must be a string or a list of token ids")


def row_params(body: Mapping[str, Any], *, chat: bool) -> RowParams:
    """The body's settings as RowParams (max_new_tokens None: the default for the url, see with_defaults)."""
    for name, defaults in UNSUPPORTED.items():
        if body.get(name) is not None and body.get(name) not in defaults:
            raise BadLine(f"body.{name} is not supported" + (f" (only {defaults[0]!r})" if defaults else ""))
    ints = {name: integer(body, name) for name in ("max_completion_tokens", "max_tokens", "n", "seed", "top_k",
                                                   "top_logprobs", "best_of")}
    if ints["top_k"] is not None and ints["top_k"] < -1:  # vLLM: -1 (or 0) is off; other negatives are mistakes
        raise BadLine(f"body.top_k={ints['top_k']}: need -1 or 0 (off) or a positive integer")
    max_tokens = ints["max_completion_tokens"] if ints["max_completion_tokens"] is not None else ints["max_tokens"]
    n = ints["n"] if ints["n"] is not None else 1
    if ints["best_of"] is not None and ints["best_of"] != n:
        raise BadLine("body.best_of is not supported (only equal to n)")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise BadLine("body.stop must be a string or a list of strings")
    logprobs = body.get("logprobs")
    if chat:
        if logprobs is not None and not isinstance(logprobs, bool):
            raise BadLine(f"body.logprobs={logprobs!r}: need true or false (top_logprobs sets how many alternatives)")
        if ints["top_logprobs"] is not None and not logprobs:
            raise BadLine("body.top_logprobs needs body.logprobs=true")
        logprobs = (ints["top_logprobs"] or 0) if logprobs else None
    else:
        logprobs = integer(body, "logprobs")
    params = RowParams(
        max_new_tokens=max_tokens, temperature=number(body, "temperature", 1.0), top_p=number(body, "top_p", 1.0),
        top_k=ints["top_k"] if ints["top_k"] is not None and ints["top_k"] >= 0 else 0,  # vLLM: -1 is off
        min_p=number(body, "min_p", 0.0), stop=tuple(s for s in stop or () if s), seed=ints["seed"], n=n,
        logprobs=logprobs, **constraint_fields(body))
    problem = params.problem()
    if problem:
        field = problem.split("=", 1)[0]
        if field == "logprobs" and chat:
            field = "top_logprobs"
        raise BadLine(f"body.{ROW_NAMES.get(field, field)}={problem.split('=', 1)[1]}")
    if n > 1 and params.temperature == 0:
        raise BadLine(f"body.n={n} with temperature 0 (greedy) gives {n} identical copies: set a temperature > 0")
    return params


def constraint_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """The body's structured-output request as RowParams fields: response_format (json_object, or json_schema
    with its schema), vLLM's guided_json / guided_regex / guided_choice / guided_grammar, or its
    structured_outputs object. More than one, or a shape batchspec cannot read, is the line's error."""
    given: dict[str, tuple[str, Any]] = {}  # RowParams field -> (where it came from, value)
    fmt = body.get("response_format")
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind == "json_object":
            given["json_object"] = ("body.response_format", True)
        elif kind == "json_schema":
            spec = fmt.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, (dict, str)):
                raise BadLine("body.response_format.json_schema.schema: need the JSON schema (an object)")
            given["json_schema"] = ("body.response_format.json_schema.schema", schema)
        elif kind != "text":
            raise BadLine(f"body.response_format={fmt!r}: need type text, json_object or json_schema")
    for name, field_name in GUIDED.items():
        if body.get(name) is not None:
            given[field_name] = (f"body.{name}", body[name])
    outputs = body.get("structured_outputs")
    if outputs is not None:
        if not isinstance(outputs, dict):
            raise BadLine("body.structured_outputs: need an object (json, regex, choice, grammar or json_object)")
        for name, value in outputs.items():
            if name not in STRUCTURED_OUTPUTS:
                raise BadLine(f"body.structured_outputs.{name} is not supported (only "
                              f"{', '.join(STRUCTURED_OUTPUTS)})")
            if value is not None and value is not False:
                given[STRUCTURED_OUTPUTS[name]] = (f"body.structured_outputs.{name}", value)
    if len(given) > 1:
        raise BadLine(f"set at most one structured output; got {', '.join(w for w, _ in given.values())}")
    if not given:
        return {}
    (field_name, (where, value)), = given.items()
    problem = Constraint.of(field_name, value)
    if isinstance(problem, str):
        raise BadLine(f"{where}: {problem}")
    return {field_name: tuple(value) if field_name == "choice" else value}


def integer(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise BadLine(f"body.{name}={value!r}: need an integer")
    return value


def number(body: Mapping[str, Any], name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise BadLine(f"body.{name}={value!r}: need a number")
    return float(value)


def with_defaults(line: BatchLine, max_seq_len: int) -> RowParams:
    """The line's RowParams with max_new_tokens set: 16 for completions, the context (max_seq_len) for chat."""
    params = line.params or RowParams()
    if params.max_new_tokens is not None:
        return params
    return replace(params, max_new_tokens=max_seq_len if line.chat else COMPLETIONS_MAX_TOKENS)
