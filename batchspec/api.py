"""The public Python entry points, shared by the job runner and users' scripts.

    results = batchspec.generate(["def add(a, b):"], target="path/or/hub-id", drafter="ngram")

`generate` returns Results in prompt order. For streams, `load_models` + `build_generator` give a
SpecBatchGenerator whose `run(requests)` pulls requests lazily and yields Results as they finish
(`run_grouped` yields each request's n samples together).
"""

from __future__ import annotations

import logging
from typing import Iterable, Iterator, Sequence


from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .engine.drafters import Drafter, load_paths, make_drafter, needs_draft
from .engine.generator import FILL_TOKENS, FORCED_DRAFTS, SpecBatchGenerator
from .engine.model.graphs import StepGraphs, resolve_capture
from .engine.model.host_device import LaunchCounter
from .engine.intake import Defaults
from .engine.model.memory import capture_buckets, kv_problem
from .engine.model.model_check import check_model
from .engine.model.shapes import kv_capacity, spare_slots_in_use
from .engine.model.threads import guard_for
from .engine.sampling import SamplingParams
from .engine.types import TreeSpec
from .sources.corpus import load_corpus
from .engine.model.models import ModelLoadError, Models, load_models, model_max_positions
from .util.textcheck import text_problem
from .engine.types import Constraint, Request, Result, RowParams

DEFAULT_MAX_SEQ_LEN = 2048
log = logging.getLogger("batchspec")

__all__ = ["generate", "load_models", "build_generator", "run_grouped", "Models"]


def build_generator(
    models: Models,
    *,
    drafter: str | Drafter = "none",
    k: int = 4,
    batch_size: int = 8,
    max_new_tokens: int = 128,
    sampling: SamplingParams | None = None,
    stop: Iterable[str] = (),
    max_seq_len: int | None = None,
    adaptive: bool | None = None,
    profile: bool = False,
    compile: str | bool = "auto",
    tree: str | None = None,
    launches: LaunchCounter | None = None,
    graph_memory: int | None = None,
    n: int = 1,
    logprobs: int | None = None,
    prompt_logprobs: int | None = None,
    max_logprobs: int | None = None,
    keep_stop: bool = False,
    corpus: str | list[list[int]] | None = None,
    corpus_max_tokens: int = 200_000,
    head=None,
    guard_threads: bool = True,
    fill_tokens: int = FILL_TOKENS,
    constraint: Constraint | None = None,
    pack_static: bool = True,
    spare_slots: int = 0,
    **sampling_fields,
) -> SpecBatchGenerator:
    """A generator over `models` (see load_models). max_seq_len (prompt + completion tokens per slot)
    defaults to min(the model's position limit, 2048) and may not exceed the position limit.

    sampling: a SamplingParams, or its fields as keywords (temperature, top_k, top_p, min_p,
    repetition_penalty, seed, verify; engine/sampling.py). verify: how sampled drafts are verified.
    coupled (default): every token is the target's own draw with noise keyed by (seed, request id,
    position), so the output does not depend on the drafter, k, adaptive choices, batch or order;
    rejection: Leviathan's rejection sampling, the highest acceptance for a draft model, but seeded output
    then changes with the drafter and k.

    adaptive: choose each round's number of drafts (0..k) from per-row acceptance and the round cost
    measured as it runs (adaptive.py). None means on wherever it cannot change the output: greedy decoding
    and coupled sampling; off with rejection sampling, where it would make seeded output depend on load.

    compile: auto = CUDA graphs on a GPU (every step captured at start), eager on CPU; on = CUDA graphs on
    a GPU, torch.compile (inductor) of the forwards on CPU; inductor = on a GPU the forwards compiled by
    torch.compile and then captured, each shape the first time it runs (tens of seconds per shape: for
    long jobs), on CPU as on; off = eager everywhere; static = the captured path's static shapes without
    capturing (tests, launch counts).

    drafter: a name (make_drafter), or a Drafter object built by the caller (train_draft's FeatureRecorder).

    tree: tree drafts (engine/tree.py), "BxD" (branching x depth), or several comma-separated: with
    adaptive off every round drafts the first; with adaptive each round chooses between plain decoding,
    chains of up to k drafts and these trees.

    n: samples per prompt (each a Result with its sample_index; sample i keyed by (seed, id, i), sample 0
    the same as with n=1); refused with greedy decoding. logprobs: each completion token's log-probability
    under the target's distribution after the sampling transforms (greedy: after the repetition penalty),
    with its `logprobs` best alternatives; prompt_logprobs: the same for the prompt's tokens, from the raw
    logits; max_logprobs: the most a request's own RowParams may ask for (default: these). keep_stop: the
    completion text keeps the stop string that ended it. Requests override the job's settings through
    Request.params (RowParams); sampling.varied must be set for them to set their own temperature etc.

    head: drafter "eagle"'s EagleHead (default: models.head, which load_models loads for drafter "eagle").
    corpus, corpus_max_tokens: the suffix drafter's warm start (a path load_corpus reads: an earlier
    output folder, or Parquet/JSONL texts; or token lists) and the bound of its job-wide structure.

    launches: a LaunchCounter (graphs.py) to count the ops rounds dispatch outside captured steps.
    graph_memory: bytes the captured steps may take on a GPU (None: what is free after the KV caches, less
    1 GiB); fewer length buckets are captured to fit (engine/model/memory.py).
    guard_threads: on CPU, lower torch's thread count while another process competes for the cores and
    raise it again when they are free (engine/model/threads.py). fill_tokens: the most prompt tokens one packed
    round prefills (the rest of a long prompt rides in the next rounds). constraint: the structured output
    every request must match unless it sets its own (types.Constraint; RowParams' json_schema etc.).
    pack_static: on the static path (a GPU) verifies are packed, every running row computing its own tokens (a
    tree row its nodes: engine/model/packed_static.py); False: every slot the round's width (for comparisons).
    spare_slots: cache slots beyond batch_size, their prompts prefilled ahead in waves (docs/api.md)."""
    for role, model in (("target", models.target), ("draft", models.draft)):
        problem = check_model(model) if model is not None else None
        if problem:
            raise ModelLoadError(f"{role} {getattr(model, 'name_or_path', '') or ''}: {problem}".replace("  ", " "))
    limit = model_max_positions(models.target)
    if max_seq_len is None:
        max_seq_len = min(limit or DEFAULT_MAX_SEQ_LEN, DEFAULT_MAX_SEQ_LEN)
    elif limit is not None and max_seq_len > limit:
        raise ValueError(f"max_seq_len={max_seq_len} exceeds the target's {limit} positions")
    if sampling is None:
        sampling = SamplingParams(**sampling_fields)
    elif sampling_fields:
        raise TypeError("pass sampling= or its fields as keywords, not both")
    if drafter == "none":
        k = 0
    trees = TreeSpec.parse_list(tree)
    if trees and drafter == "none":
        raise ValueError("tree drafts need a drafter (model, ngram, prompt_lookup or suffix)")
    if isinstance(corpus, str):
        corpus = load_corpus(corpus, models.tokenizer, max_tokens=corpus_max_tokens)
    device = models.target.device
    graphs = StepGraphs(resolve_capture(compile, device), device, launches)
    spare_slots = spare_slots_in_use(spare_slots, static=graphs.static, drafter=drafter)
    capacity = kv_capacity(max_seq_len, k, trees)
    # Eagerly, drafts a grammar forces may ride past k (SpecBatchGenerator.forced_max): the larger cache.
    problem = kv_problem(models, num_slots=batch_size + spare_slots,
                         capacity=kv_capacity(max_seq_len, max(k, FORCED_DRAFTS), trees), max_seq_len=max_seq_len)
    if problem:  # before anything is allocated: the caches are allocated at the first forward
        raise ValueError(problem)
    buckets = capture_buckets(models, graphs.mode, capacity, batch_size=batch_size, k=k, trees=trees,
                              sampling=sampling, drafter=drafter if isinstance(drafter, str) else "custom",
                              budget=graph_memory, pack_static=pack_static)
    target_vocab = models.target.get_output_embeddings().weight.shape[0]
    draft = drafter if not isinstance(drafter, str) else make_drafter(
        drafter, graphs=graphs, num_slots=batch_size + spare_slots, capacity=capacity, max_position=max_seq_len,
        target_vocab_size=target_vocab, sampling=sampling, draft_model=models.draft, trees=trees, buckets=buckets,
        corpus=corpus or (), corpus_max_tokens=corpus_max_tokens, head=head if head is not None else models.head,
        k_max=k,
    )
    defaults = Defaults(sampling, max_new_tokens, tuple(stop), n=n, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
                        max_logprobs=max_logprobs if max_logprobs is not None else
                        max([x for x in (logprobs, prompt_logprobs) if x is not None], default=None),
                        constraint=constraint)
    return SpecBatchGenerator(
        models.target, models.tokenizer, drafter=draft, defaults=defaults, batch_size=batch_size,
        max_seq_len=max_seq_len, eos_token_ids=models.eos_token_ids, graphs=graphs, keep_stop=keep_stop,
        k_max=k, adaptive=sampling.adapts_by_default if adaptive is None else adaptive, trees=trees,
        profile=profile, buckets=buckets,
        threads=guard_for(device) if guard_threads else None, fill_tokens=fill_tokens, pack_static=pack_static,
        spare_slots=spare_slots,
    )


def checked_request(request_id: str, prompt: str | list[int]) -> Request:
    """The Request, or an error Request for text that is not valid Unicode (a lone surrogate would
    otherwise crash the tokenizer, or the noise key built from the id)."""
    for what, value in (("id", request_id), ("prompt", prompt)):
        problem = text_problem(value)
        if problem:
            return Request(id=request_id, prompt=None, error=f"{what} {problem}")
    return Request(id=request_id, prompt=prompt)


def generate(
    prompts: Sequence[str | list[int]],
    *,
    ids: Sequence[str] | None = None,
    target: str | PreTrainedModel,
    draft: str | PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    drafter: str = "none",
    k: int = 4,
    batch_size: int = 8,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    stop: Iterable[str] = (),
    seed: int = 0,
    dtype: str = "auto",
    device: str = "auto",
    max_seq_len: int | None = None,
    adaptive: bool | None = None,
    compile: str | bool = "auto",
    verify: str = "coupled",
    tree: str | None = None,
    trust_remote_code: bool = False,
    n: int = 1,
    logprobs: int | None = None,
    prompt_logprobs: int | None = None,
    keep_stop: bool = False,
    params: Sequence[RowParams | None] | None = None,
    corpus: str | list[list[int]] | None = None,
    json_schema: dict | str | None = None,
    regex: str | None = None,
    choice: Sequence[str] | None = None,
    grammar: str | None = None,
    json_object: bool = False,
) -> list[Result]:
    """Complete every prompt; Results come back in prompt order (a prompt's n samples together, by
    sample_index).

    A prompt is text (tokenized as `tokenizer(prompt)`, so the result equals the new tokens of
    `model.generate(**tokenizer(prompt, return_tensors="pt"))` under greedy decoding) or a list of
    token ids. `ids` name the requests (default: the prompt's position as a string); with sampling
    (coupled verification, the default), a request's output depends only on (seed, id, prompt), whatever
    the drafter, k or adaptive choices; with verify="rejection" only for a fixed drafter and k.
    A prompt that cannot run comes back with finish_reason "error" and an `error` message instead of
    raising (so does one that is not valid Unicode text, e.g. a lone surrogate, or whose id is not).
    n, logprobs, prompt_logprobs, keep_stop, corpus: see build_generator. params: per prompt, RowParams that
    override these settings for that prompt (None: the call's); a bad value is that prompt's error.
    json_schema (a dict or JSON text), regex, choice (a list of strings), grammar (Lark, llguidance's dialect),
    json_object (any JSON object): structured output, at most one, for every prompt whose params set none
    of their own; a constraint the grammar library refuses is that prompt's error (docs/structured.md).
    """
    constraint = Constraint.pick(json_schema=json_schema, regex=regex, choice=choice, grammar=grammar,
                                 json_object=json_object)
    if isinstance(constraint, str):
        raise ValueError(constraint)
    for name, value in (("prompts", prompts), ("ids", ids)):
        if isinstance(value, (str, bytes)):  # a str is a sequence too: one request per character
            raise TypeError(f"{name} must be a list, got a {type(value).__name__}; for one prompt pass [{name[:-1]}]")
    if ids is not None and len(ids) != len(prompts):
        raise ValueError(f"ids has {len(ids)} entries but prompts has {len(prompts)}")
    ids = [str(i) for i in (ids if ids is not None else range(len(prompts)))]
    if len(set(ids)) != len(ids):
        raise ValueError("ids must be unique")
    if needs_draft(drafter) and draft is None:
        raise ValueError(f"drafter={drafter!r} needs draft= (a path, hub id or loaded model; for eagle a head's folder)")
    draft_model, head = load_paths(drafter, draft)
    models = load_models(target, draft_model, tokenizer=tokenizer, dtype=dtype, device=device,
                         trust_remote_code=trust_remote_code, head=head)
    if params is not None and len(params) != len(prompts):
        raise ValueError(f"params has {len(params)} entries but prompts has {len(prompts)}")
    requests = [checked_request(i, p) for i, p in zip(ids, prompts)]
    for request, row in zip(requests, params or ()):
        request.params = row
    if max_seq_len is None:
        longest = max((len(r.prompt) if isinstance(r.prompt, list) else len(models.tokenizer(r.prompt)["input_ids"])
                       for r in requests if isinstance(r.prompt, (str, list))), default=1)
        limit = model_max_positions(models.target)
        most = max([max_new_tokens] + [p.max_new_tokens for p in params or () if p and isinstance(p.max_new_tokens, int)])
        max_seq_len = max(2, longest + most if limit is None else min(limit, longest + most))
    rows = [p for p in params or () if p is not None]
    varied = any(getattr(p, f) is not None for p in rows for f in RowParams.SAMPLING)
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                              repetition_penalty=repetition_penalty, seed=seed, verify=verify, varied=varied)
    asked = [x for p in rows for x in (p.logprobs, p.prompt_logprobs) if isinstance(x, int)]
    generator = build_generator(
        models, drafter=drafter, k=k, batch_size=batch_size, max_new_tokens=max_new_tokens, sampling=sampling,
        stop=stop, max_seq_len=max_seq_len, adaptive=adaptive, compile=compile, tree=tree, n=n, logprobs=logprobs,
        prompt_logprobs=prompt_logprobs, keep_stop=keep_stop, corpus=corpus, constraint=constraint,
        max_logprobs=max([x for x in (logprobs, prompt_logprobs, *asked) if x is not None], default=None),
    )
    by_id: dict[str, list[Result]] = {}
    for result in generator.run(requests):
        by_id.setdefault(result.id, []).append(result)
    return [r for i in ids for r in sorted(by_id[i], key=lambda r: r.sample_index)]


def run_grouped(generator: SpecBatchGenerator, requests: Iterable[Request]) -> Iterator[list[Result]]:
    """generator.run(requests) with each request's samples gathered: yields a request's Results (its n
    samples, by sample_index; one error Result for a request whose n is not valid) as soon as its last
    sample finishes, in completion order. Request ids must be unique."""
    default_n = generator.scheduler.intake_.defaults.n
    expected: dict[str, int] = {}

    def counted() -> Iterator[Request]:
        for request in requests:
            n = request.params.n if request.params is not None and request.params.n is not None else default_n
            expected[request.id] = n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 1024 else 1
            yield request

    gathered: dict[str, list[Result]] = {}
    for result in generator.run(counted()):
        samples = gathered.setdefault(result.id, [])
        samples.append(result)
        if len(samples) == expected[result.id]:
            del gathered[result.id]
            yield sorted(samples, key=lambda r: r.sample_index)
