"""OpenAI batch output lines from a request's Results, as pure functions (no torch); the input side is
request.py.

Output line: {"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}

The body is a ChatCompletion or a Completion as OpenAI's API returns it (choices indexed by sample,
finish_reason, usage, logprobs), plus two extensions: each choice's `stop_reason` (the stop string or
EOS token id that ended it, as vLLM has it) and the body's `batchspec` object with the request's
drafting statistics. A line that cannot run gets status 400, an OpenAI error body and `error`
{code, message, line}.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from typing import Any, Callable, Mapping

from .request import BatchLine
from ...engine.types import FINISH_ERROR, Result


def line_key(input_sha256: str, number: int) -> str:
    """A stable id for an input line's output (the same on every rerun of the same input)."""
    return hashlib.sha256(f"{input_sha256}:{number}".encode()).hexdigest()[:24]


def error_output(line: BatchLine, message: str, *, key: str, status: int = 400) -> dict[str, Any]:
    """The output line of a line that could not run: status 400, an OpenAI error body, `error` with the line."""
    return {"id": f"batch_req_{key}", "custom_id": line.custom_id,
            "response": {"status_code": status, "request_id": f"req_{key}",
                         "body": {"error": {"message": message, "type": "invalid_request_error", "param": None,
                                            "code": None}}},
            "error": {"code": "invalid_request", "message": message, "line": line.number}}


def format_output(line: BatchLine, results: list[Result], *, key: str, model: str, created: int,
                  decode: Callable[[list[int]], str], drafter: str) -> dict[str, Any]:
    """A line's Results (its n samples) -> its output line; an error Result makes it an error line.
    decode: token ids -> text (the tokenizer's decode), for the logprobs' tokens and offsets."""
    failed = next((r for r in results if r.finish_reason == FINISH_ERROR), None)
    if failed is not None:
        return error_output(line, failed.error or "error", key=key)
    results = sorted(results, key=lambda r: r.sample_index)
    if line.chat:
        choices = [{"index": r.sample_index, "message": {"role": "assistant", "content": r.completion},
                    "logprobs": chat_logprobs(r, decode), "finish_reason": r.finish_reason,
                    "stop_reason": r.stop_reason} for r in results]
        kind, prefix = "chat.completion", "chatcmpl"
    else:
        choices = [{"index": r.sample_index, "text": r.completion, "logprobs": completion_logprobs(r, decode),
                    "finish_reason": r.finish_reason, "stop_reason": r.stop_reason} for r in results]
        kind, prefix = "text_completion", "cmpl"
    completion_tokens = sum(r.completion_tokens for r in results)
    prompt_tokens = results[0].prompt_tokens if results else 0
    body = {"id": f"{prefix}-{key}", "object": kind, "created": created, "model": model, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
            "batchspec": drafting_stats(results, drafter)}
    return {"id": f"batch_req_{key}", "custom_id": line.custom_id,
            "response": {"status_code": 200, "request_id": f"req_{key}", "body": body}, "error": None}


def drafting_stats(results: list[Result], drafter: str) -> dict[str, Any]:
    """The request's drafting statistics (totals over its samples; per sample too when n > 1)."""
    def stats(rs: list[Result]) -> dict[str, Any]:
        forwards, drafts = sum(r.target_forwards for r in rs), sum(r.draft_tokens for r in rs)
        accepted, tokens = sum(r.accepted_tokens for r in rs), sum(r.completion_tokens for r in rs)
        return {"target_forwards": forwards, "draft_tokens": drafts, "accepted_tokens": accepted,
                "acceptance_rate": accepted / drafts if drafts else None,
                "tokens_per_forward": tokens / forwards if forwards else None,
                "latency_s": round(max((r.latency_s for r in rs), default=0.0), 6)}

    out = {"drafter": drafter, **stats(results)}
    if len(results) > 1:
        out["samples"] = [stats([r]) for r in results]
    return out


def _tokens(result: Result) -> list[tuple[int, float, list[tuple[int, float]]]]:
    """(token id, logprob, [(alternative id, logprob), ...]) per completion token that has a logprob."""
    tops = result.top_logprobs or []
    top_ids = result.top_logprob_ids or []
    return [(t, lp, list(zip(top_ids[i], tops[i])) if i < len(tops) and i < len(top_ids) else [])
            for i, (t, lp) in enumerate(zip(result.completion_token_ids, result.logprobs or []))]


def chat_logprobs(result: Result, decode: Callable[[list[int]], str]) -> dict[str, Any] | None:
    if result.logprobs is None:
        return None

    def entry(token: int, logprob: float) -> dict[str, Any]:
        text = decode([token])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8", "replace"))}

    return {"content": [{**entry(t, lp), "top_logprobs": [entry(a, alp) for a, alp in alts]}
                        for t, lp, alts in _tokens(result)], "refusal": None}


def completion_logprobs(result: Result, decode: Callable[[list[int]], str]) -> dict[str, Any] | None:
    """The legacy format: tokens, token_logprobs, top_logprobs ({token: logprob}), text_offset (each token's
    start in the decoded completion: len(decode(ids[:i + 1])) less the token's own length, as a tokenizer
    may put spaces between tokens)."""
    if result.logprobs is None:
        return None
    tokens, logprobs, tops, offsets = [], [], [], []
    ids = result.completion_token_ids
    for i, (t, lp, alts) in enumerate(_tokens(result)):
        tokens.append(decode([t]))
        logprobs.append(lp)
        tops.append({decode([a]): alp for a, alp in alts})
        offsets.append(max(0, len(decode(ids[:i + 1])) - len(tokens[-1])))
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}


def token_decoder(tokenizer) -> Callable[[list[int]], str]:
    """The `decode` that format_output takes: a tokenizer's decode, single tokens cached (logprobs decode
    every alternative of every token one by one)."""
    token_text = lru_cache(maxsize=65536)(lambda t: tokenizer.decode([t]))

    def decode(ids: list[int]) -> str:
        return token_text(ids[0]) if len(ids) == 1 else tokenizer.decode(ids)

    return decode


def is_error(output: Mapping[str, Any]) -> bool:
    return output.get("error") is not None


def dumps(output: Mapping[str, Any]) -> str:
    """One JSONL line (no newline); non-ASCII text kept as is."""
    return json.dumps(output, ensure_ascii=False, separators=(",", ":"))
