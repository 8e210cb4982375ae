"""Requests in: tokenize, check, resolve each request's settings against the job's, and expand a request
of n samples into n rows. Host only, lazy: a request is pulled when a slot is free for it."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Iterable, Iterator

from transformers import PreTrainedTokenizerBase

from .types import MAX_CHARS_PER_TOKEN, Constraint, Request, Result, RowParams, sample_count
from .noise import sample_key
from .sampling import RowSampling, SamplingParams


@dataclass(frozen=True, slots=True)
class Defaults:
    """The job's settings, which a request's RowParams may override. max_logprobs: the most alternatives a
    request may ask for (None: logprobs are off for every request); row_sampling: requests may set their
    own temperature, top_k, top_p, min_p (the generator's SamplingParams.varied)."""

    sampling: SamplingParams
    max_new_tokens: int
    stop: tuple[str, ...] = ()
    n: int = 1
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    max_logprobs: int | None = None
    constraint: Constraint | None = None  # structured output of every request that sets none of its own

    def __post_init__(self):
        if self.n > 1 and self.sampling.greedy:
            raise ValueError(f"n={self.n} with greedy decoding (temperature 0) gives {self.n} identical copies: "
                             "set a temperature > 0, or n=1")


@dataclass(frozen=True, slots=True)
class Admission:
    """One row ready to take a slot: a request (one of its samples), its prompt ids and settings."""

    request: Request
    prompt_ids: list[int]
    max_new_tokens: int
    stop: tuple[str, ...]
    logprobs: int | None
    prompt_logprobs: int | None
    sampling: tuple  # RowSampling.values
    key: int  # noise key
    group: int  # the request it samples: rows of one group share a prompt (and, admitted together, its prefill)
    constraint: Constraint | None = None  # what its output must match (structured output)


@dataclass(frozen=True, slots=True)
class Seat:
    """A row taking a slot: the slot and what intake admitted (its request, prompt ids and settings)."""

    slot: int
    admission: Admission

    @property
    def prompt_ids(self) -> list[int]:
        return self.admission.prompt_ids


def prompt_ids(request: Request, tokenizer: PreTrainedTokenizerBase, vocab_size: int,
               max_seq_len: int) -> list[int] | str:
    """Token ids for a request, or an error message. Text far longer than max_seq_len tokens could be is
    refused before it is tokenized (a byte-level token covers at most ~16 characters here; the bound is
    loose on purpose)."""
    if request.error:
        return request.error
    prompt = request.prompt
    if prompt is None:
        return "prompt is null"
    if isinstance(prompt, str):
        if not prompt.strip():
            return "prompt is empty"
        if len(prompt) > MAX_CHARS_PER_TOKEN * max_seq_len:
            return f"prompt has {len(prompt):,} characters, far more than max_seq_len={max_seq_len} tokens hold"
        ids = tokenizer(prompt)["input_ids"]
    elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            return f"prompt token id {bad[0]} is outside the model's vocabulary [0, {vocab_size})"
    else:
        return f"prompt must be a string or a list of token ids, got {type(prompt).__name__}"
    if not ids:
        return "prompt is empty after tokenization"
    if len(ids) >= max_seq_len:
        return f"prompt has {len(ids)} tokens but max_seq_len is {max_seq_len}: no room for a new token"
    return ids


class Intake:
    """grammars: checks (and compiles) structured-output constraints (engine/grammar/grammar.py; None: constraints are
    refused)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, *, vocab_size: int, max_seq_len: int, defaults: Defaults,
                 grammars=None):
        self.tokenizer, self.vocab_size, self.max_seq_len, self.defaults = tokenizer, vocab_size, max_seq_len, defaults
        self.grammars = grammars
        self._pending: Iterator[Request] = iter(())
        self._queue: deque[Admission] = deque()  # samples of a request not seated yet
        self._groups = 0
        self.exhausted = False

    def feed(self, requests: Iterable[Request]) -> None:
        self._pending, self.exhausted = iter(requests), False

    @property
    def waiting(self) -> bool:
        return bool(self._queue)

    @property
    def drained(self) -> bool:
        """Nothing is left to admit: the requests ran out and no sample of one waits for a slot."""
        return self.exhausted and not self.waiting

    def take(self, free: int) -> tuple[list[Admission], list[Result]]:
        """Up to `free` rows to seat, and the Results of requests that cannot run (pulled on the way)."""
        rows: list[Admission] = []
        errors: list[Result] = []
        while len(rows) < free:
            if not self._queue:
                request = next(self._pending, None)
                if request is None:
                    self.exhausted = True
                    break
                admitted = self._expand(request)
                if isinstance(admitted, list):
                    errors += admitted
                    continue
            rows.append(self._queue.popleft())
        return rows, errors

    def _expand(self, request: Request) -> list[Result] | None:
        """Queue the request's samples, or return its error Results (one per sample when n is valid)."""
        d, p = self.defaults, request.params or RowParams()
        problem = request.error or p.problem() or self._unsupported(p)
        constraint = None
        if problem is None:
            constraint = p.constraint() or d.constraint
            problem = self._constraint_problem(constraint)
        n = sample_count(request, d.n)
        ids = prompt_ids(request, self.tokenizer, self.vocab_size, self.max_seq_len) if problem is None else problem
        if isinstance(ids, str):
            return [Result.error_result(replace(request, sample_index=i), ids) for i in range(n)]
        s = d.sampling
        temperature = p.temperature if p.temperature is not None else s.temperature
        values = RowSampling.values(float(temperature), int(p.top_k if p.top_k is not None else s.top_k),
                                    float(p.top_p if p.top_p is not None else s.top_p),
                                    float(p.min_p if p.min_p is not None else s.min_p))
        seed = int(p.seed) if p.seed is not None else s.seed
        group, self._groups = self._groups, self._groups + 1
        for i in range(n):
            self._queue.append(Admission(
                request=replace(request, sample_index=i), prompt_ids=ids,
                max_new_tokens=int(p.max_new_tokens if p.max_new_tokens is not None else d.max_new_tokens),
                stop=tuple(x for x in (p.stop if p.stop is not None else d.stop) if x),
                logprobs=p.logprobs if p.logprobs is not None else d.logprobs,
                prompt_logprobs=p.prompt_logprobs if p.prompt_logprobs is not None else d.prompt_logprobs,
                sampling=values, key=sample_key(seed, request.id, i), group=group, constraint=constraint))
        return None

    def _constraint_problem(self, constraint: Constraint | None) -> str | None:
        if constraint is None:
            return None
        if self.grammars is None:
            return "structured output is not available in this generator"
        try:
            return self.grammars.problem(constraint)
        except ValueError as error:  # the tokenizer cannot be read by the grammar library
            return str(error)

    def _unsupported(self, p: RowParams) -> str | None:
        """Settings the job was not built to honour, or that make no sense together."""
        d = self.defaults
        for name in RowParams.SAMPLING:
            if getattr(p, name) is not None and not d.sampling.varied:
                return f"{name} is set per request, but the generator takes the job's sampling for every request"
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(p, name)
            if k is not None and (d.max_logprobs is None or k > d.max_logprobs):
                return f"{name}={k} is more than the job allows ({d.max_logprobs})"
        temperature = p.temperature if p.temperature is not None else d.sampling.temperature
        if (p.n or d.n) > 1 and temperature == 0:
            return f"n={p.n or d.n} with greedy decoding (temperature 0) gives identical copies: set a temperature > 0"
        return None
