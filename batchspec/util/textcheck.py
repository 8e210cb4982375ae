"""Text helpers: an error in one line, and text that cannot be stored or tokenized (lone surrogates).

A Python str may hold lone surrogates (U+D800..U+DFFF) — from a JSON "\\ud800" escape, from bytes
decoded with `surrogateescape` (how batchspec reads invalid UTF-8 in JSONL), or from a caller. UTF-8
encoders, tokenizers and Parquet reject them, so they are caught where a row enters and become that
row's error instead of a crash later (in the tokenizer, the sampling key or the part writer).
"""

from __future__ import annotations

from typing import Any, Mapping


def first_line(e: BaseException) -> str:
    """An exception's message in one line (its first), or its type's name when it has none."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def text_problem(value: Any) -> str | None:
    """Why `value` (a str, or lists / dicts holding strings) is not valid Unicode text, or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            code = ord(value[e.start])
            # U+DC80..U+DCFF is how surrogateescape carries a byte that is not UTF-8 (JSONL input)
            origin = f": the byte 0x{code - 0xDC00:02X} is not UTF-8, or a \\u{code:04x} escape" if 0xDC80 <= code <= 0xDCFF else ""
            return f"is not valid Unicode text (lone surrogate U+{code:04X} at character {e.start}{origin})"
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            problem = text_problem(key) or text_problem(item)
            if problem:
                return problem
    elif isinstance(value, (list, tuple)):
        for item in value:
            problem = text_problem(item)
            if problem:
                return problem
    return None
