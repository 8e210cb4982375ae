"""A job's models and generator from its JobConfig: what the drafter needs loaded, the sampling and per-row
settings the generator must honour, and the self-training EAGLE generator for `model.draft=train`."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..engine.drafters.registry import load_paths
from ..engine.types import MAX_LOGPROBS
from .checks import job_constraint
from .config import ConfigError, JobConfig, draft_path, self_training
from ..sources.rowparams import RowParamColumns


def load_job_models(job: JobConfig):
    from ..api import load_models  # deferred: torch is only needed once there is work to do

    draft_model, head = load_paths(job.drafter.name.value, draft_path(job))
    try:
        return load_models(job.model.target, draft_model, dtype=job.model.dtype.value, device=job.model.device,
                           trust_remote_code=job.model.trust_remote_code, head=head)
    except ValueError as e:  # batchspec.engine.model.models.ModelLoadError: unloadable model or incompatible draft
        raise ConfigError(str(e).strip().splitlines()[0]) from e


def build_job_generator(job: JobConfig, models, row_params: RowParamColumns | None, out_dir: Path,
                        openai_lines: bool = False, rows_left: Callable[[], int | None] | None = None):
    """The generator for a job: its drafter, sampling and limits; with per-row settings, room for them
    (per-row sampling, the largest logprobs a row may ask for); `openai_lines`: the rows are OpenAI batch
    lines, each with its own sampling and logprobs; `rows_left`: the rows this run has to do (None: unknown),
    which a self-training job's training budget reads. Raises ConfigError for a setting the
    models cannot take (max_seq_len beyond the target's positions)."""
    from ..api import build_generator  # deferred, as in load_job_models
    from ..engine.sampling import SamplingParams

    s, d = job.sampling, job.drafter
    varied = openai_lines or (row_params is not None and row_params.varies_sampling)
    sampling = SamplingParams(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p,
                              repetition_penalty=s.repetition_penalty, seed=s.seed, verify=s.verify.value,
                              varied=varied)
    asks_logprobs = openai_lines or (row_params is not None and
                                     any(n in row_params.mapping for n in ("logprobs", "prompt_logprobs")))
    # When a column may ask for logprobs, any row may ask for up to RowParams' limit.
    max_logprobs = max([x for x in (s.logprobs, s.prompt_logprobs) if x is not None]
                       + ([MAX_LOGPROBS] if asks_logprobs else []), default=None)

    constraint = job_constraint(job)  # checked before: a Constraint or None

    def build(drafter: str, head, corpus: list[list[int]] | None = None):
        """corpus: completions that seed drafter=suffix, after drafter.corpus's."""
        if drafter == "suffix" and d.corpus and corpus is not None:
            from ..sources.corpus import load_corpus  # deferred: only a suffix job with a corpus reads one

            corpus = load_corpus(d.corpus, models.tokenizer, max_tokens=d.corpus_max_tokens) + corpus
        generator = build_generator(
            models, drafter=drafter, k=d.k, batch_size=job.batch_size, max_new_tokens=s.max_new_tokens,
            sampling=sampling, stop=tuple(s.stop), max_seq_len=job.max_seq_len, adaptive=d.adaptive,
            compile=job.model.compile.value, tree=d.tree, n=s.n, logprobs=s.logprobs,
            prompt_logprobs=s.prompt_logprobs, max_logprobs=max_logprobs, keep_stop=s.keep_stop,
            corpus=(d.corpus if corpus is None else corpus) if drafter == "suffix" else None,
            corpus_max_tokens=d.corpus_max_tokens, head=head, constraint=constraint, spare_slots=job.spare_slots,
        )
        problem = generator.grammars.problem(constraint) if constraint is not None else None
        if problem:  # one line up front, not the same error on every row
            raise ValueError(f"sampling.{problem}")
        return generator

    try:
        if self_training(job):
            from ..training.selftrain import SelfTrainingGenerator  # deferred: the trainer, for self-training only

            return SelfTrainingGenerator(models, build, out_dir=out_dir, rows=d.train_rows, minutes=d.train_minutes,
                                         fallback=d.fallback.value, corpus_max_tokens=d.corpus_max_tokens, seed=s.seed,
                                         rows_left=rows_left)
        return build(d.name.value, None)
    except ValueError as e:  # e.g. max_seq_len beyond the model's positions, n > 1 with greedy decoding
        raise ConfigError(str(e).strip().splitlines()[0]) from e
