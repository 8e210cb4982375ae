"""The engine's records, which the jobs, sources and reports share: a request in, a result out, a
structured-output constraint, a tree shape. Run-wide statistics are in runstats.py."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

FINISH_STOP = "stop"  # EOS token or stop string
FINISH_LENGTH = "length"  # max_new_tokens or max_seq_len reached
FINISH_ERROR = "error"  # the request could not run; `error` says why


# A token covers at most this many characters of text, loosely: a prompt with more characters than
# max_seq_len * MAX_CHARS_PER_TOKEN cannot fit, and is refused before it is tokenized (which would
# cost time and memory in proportion to its length: a 34 MB prompt took 6 GB).
MAX_CHARS_PER_TOKEN = 64
MAX_LOGPROBS = 20  # the most alternatives a request's logprobs / prompt_logprobs may ask for
MIN_TEMPERATURE = 1e-2  # below it logits/T overflows float32 (T = 1e-40 gives inf - inf = NaN): use 0 for greedy


CONSTRAINT_KINDS = ("json_schema", "regex", "choice", "grammar", "json_object")


@dataclass(frozen=True, slots=True)
class Constraint:
    """What a request's output must match (structured output), by content: kind is one of CONSTRAINT_KINDS;
    value is the schema as JSON text (json_schema; its properties keep their order: the output's keys follow it), the regex, the choices as a JSON list (choice),
    the Lark grammar in llguidance's dialect (grammar), or "" (json_object: any JSON object)."""

    kind: str
    value: str

    @classmethod
    def of(cls, kind: str, value) -> "Constraint | str":
        """The constraint from a user's value (a schema as a dict or JSON text, a list of choices, ...), or
        what is wrong with it, naming the field."""
        if kind == "json_schema":
            if isinstance(value, str):
                try:
                    value = json.loads(value)
                except ValueError as error:
                    return f"json_schema is not valid JSON: {error}"
            if value is True:  # the schema every JSON value matches
                value = {}
            if value is False:
                return "json_schema is false: it matches no JSON value"
            if not isinstance(value, dict):
                return f"json_schema must be a JSON object (a schema) or true, got {type(value).__name__}"
            return cls(kind, json.dumps(value, ensure_ascii=False))
        if kind in ("regex", "grammar"):
            if not isinstance(value, str) or not value:
                return f"{kind} must be a non-empty string"
            return cls(kind, value)
        if kind == "choice":
            if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
                return "choice must be a non-empty list of strings"
            if not all(isinstance(c, str) and c for c in value):
                return "choice must be a list of non-empty strings"
            return cls(kind, json.dumps(list(value), ensure_ascii=False))
        if kind == "json_object":
            if value is not True:
                return "json_object must be true (or left unset)"
            return cls(kind, "")
        return f"unknown constraint {kind!r}: use one of {', '.join(CONSTRAINT_KINDS)}"

    @classmethod
    def pick(cls, **values) -> "Constraint | str | None":
        """At most one of json_schema, regex, choice, grammar, json_object (None or False: unset) -> the
        Constraint, None, or what is wrong."""
        given = [(k, v) for k, v in values.items() if v is not None and v is not False]
        if len(given) > 1:
            return f"set at most one of {', '.join(CONSTRAINT_KINDS)}; got {', '.join(k for k, _ in given)}"
        return cls.of(*given[0]) if given else None


@dataclass(frozen=True, slots=True)
class RowParams:
    """Settings of one request that override the job's (None: the job's). temperature 0 is greedy;
    logprobs K returns each completion token's log-probability and its K best alternatives (0: the token's
    only); prompt_logprobs K the same for the prompt's tokens; n samples per prompt."""

    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    stop: tuple[str, ...] | None = None
    seed: int | None = None
    n: int | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    json_schema: dict | str | None = None  # structured output: at most one of these five (Constraint.pick)
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    # Settings a generator honours per request only when built for it (SamplingParams.varied).
    SAMPLING = ("temperature", "top_k", "top_p", "min_p")
    LIMITS = {  # field -> (type, test, what it must be)
        "max_new_tokens": (int, lambda v: v >= 1, "an integer >= 1"),
        "temperature": (float, lambda v: 0 <= v < math.inf and (v == 0 or v >= MIN_TEMPERATURE),
                        f"0 (greedy) or a finite number >= {MIN_TEMPERATURE}"),
        "top_p": (float, lambda v: 0 < v <= 1, "a number in (0, 1]"),
        "top_k": (int, lambda v: v >= 0, "an integer >= 0 (0: off)"),
        "min_p": (float, lambda v: 0 <= v <= 1, "a number in [0, 1]"),
        "seed": (int, lambda v: -(1 << 63) <= v < (1 << 63), "a 64-bit integer"),
        "n": (int, lambda v: 1 <= v <= 1024, "an integer in [1, 1024]"),
        "logprobs": (int, lambda v: 0 <= v <= MAX_LOGPROBS, f"an integer in [0, {MAX_LOGPROBS}]"),
        "prompt_logprobs": (int, lambda v: 0 <= v <= MAX_LOGPROBS, f"an integer in [0, {MAX_LOGPROBS}]"),
    }

    def problem(self) -> str | None:
        """What is wrong with these settings, naming the field, or None."""
        for name, (kind, ok, what) in self.LIMITS.items():
            value = getattr(self, name)
            if value is None:
                continue
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or (kind is int and not float(value).is_integer()) or not ok(value):
                return f"{name}={value!r}: need {what}"
        if self.stop is not None and not all(isinstance(s, str) for s in self.stop):
            return f"stop={self.stop!r}: need a list of strings"
        constraint = self.constraint()
        return constraint if isinstance(constraint, str) else None

    def constraint(self) -> "Constraint | str | None":
        """This request's own structured-output constraint, None, or what is wrong with it."""
        return Constraint.pick(json_schema=self.json_schema, regex=self.regex, choice=self.choice,
                               grammar=self.grammar, json_object=self.json_object)


@dataclass(slots=True)
class Request:
    """One prompt to complete.

    `prompt` is text (tokenized the way `tokenizer(prompt)` does by default, so special tokens such as
    BOS are added) or a list of token ids used as-is. A source that cannot build a prompt for a row
    sets `error` instead; the generator then returns an error Result without running it.
    `extra` carries pass-through columns to the output row untouched. `params` override the job's
    settings for this request; the engine gives each of a request's n samples its `sample_index`.
    """

    id: str
    prompt: str | list[int] | None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    params: RowParams | None = None
    sample_index: int = 0


def sample_count(request: Request, default: int) -> int:
    """How many Results a request gives: its own n, else the job's; a bad n gives one (an error row)."""
    n = request.params.n if request.params is not None and request.params.n is not None else default
    return n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 1024 else 1


@dataclass(slots=True)
class Result:
    """One output row: the completion plus how well drafting worked for this request.

    `completion_token_ids` are the new tokens; they end with the EOS token when the request ended on
    EOS (as Hugging Face `generate` does). `completion` is their decoded text with special tokens
    skipped, cut before a stop string when one matched. `target_forwards` counts the target forwards
    the tokens came from: the prefill, which emits the first token (as `generate` does), then every
    verify pass the request took part in; `accepted_per_round` and `drafts_per_round` have one entry per
    forward (0 for the prefill, which drafts nothing): the drafts this request had checked in that
    forward (a tree's nodes in a tree round) and how many of them were accepted (a tree round: the
    depth of the accepted path); `tree_per_round` names the tree's shape ("BxD") of each tree round, ""
    for the prefill and chain rounds.
    """

    id: str
    prompt: str
    completion: str
    completion_token_ids: list[int]
    finish_reason: str
    error: str | None
    prompt_tokens: int
    completion_tokens: int
    target_forwards: int
    draft_tokens: int
    accepted_tokens: int
    acceptance_rate: float | None
    tokens_per_forward: float | None
    accepted_per_round: list[int]
    drafts_per_round: list[int]
    tree_per_round: list[str]
    latency_s: float
    extra: dict[str, Any] = field(default_factory=dict)
    sample_index: int = 0  # which of the request's n samples this is
    stop_reason: str | int | None = None  # the stop string or the EOS token id that ended it (finish "stop")
    logprobs: list[float] | None = None  # per completion token: its log-probability (logprobs requested)
    top_logprobs: list[list[float]] | None = None  # per completion token: the K best log-probabilities...
    top_logprob_ids: list[list[int]] | None = None  # ... and their token ids, best first
    prompt_logprobs: list[float | None] | None = None  # per prompt token (None for the first)
    prompt_top_logprobs: list[list[float]] | None = None
    prompt_top_logprob_ids: list[list[int]] | None = None
    forced_tokens: int = 0  # drafts the grammar forced (structured output), counted in draft_tokens too
    forced_accepted: int = 0  # of those, the ones the target accepted (counted in accepted_tokens too)
    structured_complete: bool | None = None  # constrained rows: ended whole (False: cut by a limit, a stop string, an error)

    def to_row(self) -> dict[str, Any]:
        """The output row: every field above, with `extra` flattened in (pass-through columns)."""
        row = {name: getattr(self, name) for name in RESULT_COLUMNS if name not in ("stop_reason", "stop_token_id")}
        # One Parquet column holds one type: a stop string and an EOS token id go to two columns.
        row["stop_reason"] = self.stop_reason if isinstance(self.stop_reason, str) else None
        row["stop_token_id"] = self.stop_reason if isinstance(self.stop_reason, int) else None
        row.update(self.extra)
        return row

    @classmethod
    def error_result(cls, request: Request, error: str, prompt_tokens: int = 0) -> "Result":
        prompt = request.prompt if isinstance(request.prompt, str) else ""
        return cls(sample_index=request.sample_index,
            id=request.id, prompt=prompt, completion="", completion_token_ids=[], finish_reason=FINISH_ERROR,
            error=error, prompt_tokens=prompt_tokens, completion_tokens=0, target_forwards=0, draft_tokens=0,
            accepted_tokens=0, acceptance_rate=None, tokens_per_forward=None, accepted_per_round=[], drafts_per_round=[], tree_per_round=[],
            latency_s=0.0, extra=dict(request.extra),
        )


RESULT_COLUMNS = (
    "id", "prompt", "completion", "completion_token_ids", "finish_reason", "error", "prompt_tokens",
    "completion_tokens", "target_forwards", "draft_tokens", "accepted_tokens", "acceptance_rate",
    "tokens_per_forward", "accepted_per_round", "drafts_per_round", "tree_per_round", "latency_s",
    "sample_index", "stop_reason", "stop_token_id", "logprobs", "top_logprobs", "top_logprob_ids",
    "prompt_logprobs", "prompt_top_logprobs", "prompt_top_logprob_ids", "forced_tokens", "forced_accepted",
    "structured_complete",
)


@dataclass(frozen=True, slots=True)
class TreeSpec:
    """The shape of the trees a drafter proposes, written "BxD" (e.g. "2x4"): `depth` levels of
    `branching` nodes each. A draft model drafts its chain of `depth` tokens (the spine) and puts its
    next `branching - 1` guesses beside each spine token as leaves; lookups follow `branching` earlier
    matches `depth` tokens deep (their prefix tree). Either way at most branching x depth nodes."""

    branching: int
    depth: int

    @classmethod
    def parse(cls, text: str) -> "TreeSpec":
        m = re.fullmatch(r"\s*(\d+)x(\d+)\s*", str(text))
        if not m:
            raise ValueError(f"tree {text!r}: write BxD (branching x depth), e.g. 2x4")
        spec = cls(int(m.group(1)), int(m.group(2)))
        if spec.branching < 1 or spec.depth < 1:
            raise ValueError(f"tree {text!r}: branching and depth must be at least 1")
        return spec

    @classmethod
    def parse_list(cls, text: str | None) -> tuple["TreeSpec", ...]:
        """"2x4,2x8" -> the trees, in order (empty items skipped; None or "" -> none). Raises ValueError."""
        return tuple(cls.parse(t) for t in str(text).split(",") if t.strip()) if text else ()

    @property
    def nodes(self) -> int:
        return self.branching * self.depth

    def __str__(self) -> str:
        return f"{self.branching}x{self.depth}"

