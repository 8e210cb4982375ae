"""A constraint in llguidance's grammar format (what engine/grammar/grammar.py compiles), and a library's error as one
line."""

from __future__ import annotations

import json

from ..types import Constraint


def one_line(message: str, limit: int = 300) -> str:
    """A library's multi-line error as one line."""
    text = " ".join(message.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def grammar_text(constraint: Constraint) -> str:
    """The constraint in llguidance's grammar format."""
    import llguidance  # deferred: only a job with a constraint needs it (engine/grammar/grammar.py)

    kind, value = constraint.kind, constraint.value
    compact = {"whitespace_flexible": False}  # one way to write a JSON value: more of it is forced
    if kind == "json_schema":
        return llguidance.LLMatcher.grammar_from_json_schema(value, defaults=compact)
    if kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=compact)
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(value)
    if kind == "choice":
        # One terminal, not a rule of alternatives: the lexer takes any number of them, where a rule's
        # alternatives are parser items (llguidance stops at 2,000 in a row). Lark strings take JSON's escapes.
        return llguidance.LLMatcher.grammar_from_lark("start: CHOICE\nCHOICE: " + " | ".join(
            json.dumps(c) for c in json.loads(value)))
    if kind == "grammar":
        return llguidance.LLMatcher.grammar_from_lark(value)
    raise ValueError(f"unknown constraint kind {kind!r}")
