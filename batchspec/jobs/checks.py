"""The composed config -> a checked JobConfig: contradictions between keys, the input columns a job
needs, model paths that cannot exist. Every message names the key and is one line (ConfigError)."""

from __future__ import annotations

import logging
import math
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..engine.drafters.registry import needs_draft
from ..util.paths import missing_local_path, offline_hub_id
from ..util.textcheck import first_line
from ..engine.types import CONSTRAINT_KINDS, MAX_LOGPROBS, MIN_TEMPERATURE, Constraint, TreeSpec
from .openai import batch as openai_batch
from .config import ConfigError, DrafterName, JobConfig, SourceFormat, draft_path, find_jobs, job_dirs
from ..sources.prompts import template_columns
from ..sources.rowparams import RowParamColumns
from .schema import RESULT_SCHEMA

log = logging.getLogger("batchspec")


def job_constraint(job: JobConfig):
    """The job-wide structured output (types.Constraint), None, or what is wrong (naming the setting)."""
    s = job.sampling
    return Constraint.pick(json_schema=s.json_schema, regex=s.regex, choice=s.choice, grammar=s.grammar,
                           json_object=s.json_object)


def to_job_config(cfg: DictConfig, job_name: str | None) -> JobConfig:
    """The composed config as a JobConfig dataclass, checked for contradictions between keys."""
    if job_name is None and OmegaConf.is_interpolation(cfg.output, "dir"):
        names = ", ".join(find_jobs(job_dirs(Path.cwd()))) or "none found"
        raise ConfigError(f"no job selected: pass job=NAME (jobs: {names}) or set output.dir")
    try:
        job: JobConfig = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        raise ConfigError(f"{key}: {first_line(e)}" if key else first_line(e)) from e
    validate(job)
    return job

def validate(job: JobConfig) -> None:
    """Raise ConfigError naming the key for values the schema's types cannot rule out."""
    s, src = job.sampling, job.source
    # inf passes every comparison below (temperature=inf samples uniformly at random): floats must be finite.
    floats = {"temperature": s.temperature, "top_p": s.top_p, "min_p": s.min_p,
              "repetition_penalty": s.repetition_penalty}
    for name, value in floats.items():
        if not math.isfinite(value):
            raise ConfigError(f"sampling.{name}={value}: need a finite number")
    try:  # the same parser as the Python API's tree=
        TreeSpec.parse_list(job.drafter.tree)
    except ValueError as e:
        raise ConfigError(f"drafter.{e}; several comma-separated") from None
    for ok, message in value_checks(job):
        if not ok:
            raise ConfigError(message)
    clash = [c for c in src.keep_columns if c in RESULT_SCHEMA.names]
    if clash:
        raise ConfigError(f"source.keep_columns: {clash[0]!r} is also an output column; rename it in the input")
    if job.output.format.value == "openai" and not openai_lines(job):
        raise ConfigError("output.format=openai writes answers to OpenAI batch request lines: it needs "
                          "source.format=openai")
    if openai_lines(job):
        clashing = [key for key, bad in (("source.template", src.template is not None), ("source.chat", src.chat),
                                         ("source.row_params", bool(src.row_params)),
                                         ("source.keep_columns", bool(src.keep_columns)),
                                         ("source.id_column", src.id_column not in (None, "custom_id")))
                    if bad]
        if clashing:
            raise ConfigError(f"source.format=openai reads each line's custom_id, messages or prompt and settings "
                              f"itself: unset {clashing[0]}")
    try:
        RowParamColumns(src.row_params)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    constraint = job_constraint(job)
    if isinstance(constraint, str):
        raise ConfigError(f"sampling.{constraint}" if constraint.startswith(CONSTRAINT_KINDS) else
                          f"sampling: {constraint}")
    twice = [c for i, c in enumerate(src.keep_columns) if c in src.keep_columns[:i]]
    if twice:  # Parquet would write two columns of one name, which readers refuse to open
        raise ConfigError(f"source.keep_columns lists {twice[0]!r} twice")


def value_checks(job: JobConfig) -> list[tuple[bool, str]]:
    """(holds, the message naming the key when it does not) for each value a job's keys must have."""
    s, src = job.sampling, job.source
    return [
        (job.batch_size >= 1, f"batch_size={job.batch_size}: need >= 1"),
        (job.spare_slots >= 0, f"spare_slots={job.spare_slots}: need >= 0"),
        (job.max_seq_len is None or job.max_seq_len >= 2, f"max_seq_len={job.max_seq_len}: need >= 2"),
        (job.drafter.name == DrafterName.none or job.drafter.k >= 1, f"drafter.k={job.drafter.k}: need >= 1"),
        (job.drafter.tree is None or job.drafter.name != DrafterName.none,
         "drafter.tree needs a drafter: model, ngram, prompt_lookup, suffix or eagle"),
        (job.drafter.name != DrafterName.model or job.model.draft,
         "drafter=model needs model.draft (a draft model dir or hub id)"),
        (job.drafter.name != DrafterName.eagle or job.model.draft,
         "drafter=eagle needs model.draft: an EAGLE-3 head's folder, or train to train one in the job"),
        (job.model.draft != "train" or job.drafter.name == DrafterName.eagle,
         "model.draft=train trains an EAGLE-3 head: it needs drafter=eagle"),
        (job.drafter.train_rows >= 1, f"drafter.train_rows={job.drafter.train_rows}: need >= 1"),
        (job.drafter.train_minutes is None or job.drafter.train_minutes > 0,
         f"drafter.train_minutes={job.drafter.train_minutes}: need > 0 (or null: as long as the first rows took)"),
        (not needs_draft(job.drafter.fallback.value),
         f"drafter.fallback={job.drafter.fallback.value}: need a drafter without a model (none, ngram, "
         "prompt_lookup or suffix)"),
        (job.drafter.corpus_max_tokens >= 1, f"drafter.corpus_max_tokens={job.drafter.corpus_max_tokens}: need >= 1"),
        (s.n >= 1, f"sampling.n={s.n}: need >= 1"),
        (s.n == 1 or s.temperature > 0 or "temperature" in src.row_params,
         f"sampling.n={s.n} with greedy decoding (temperature 0) gives {s.n} identical copies: set "
         "sampling.temperature > 0, or sampling.n=1"),
        (s.logprobs is None or 0 <= s.logprobs <= MAX_LOGPROBS,
         f"sampling.logprobs={s.logprobs}: need 0..{MAX_LOGPROBS} (or null: off)"),
        (s.prompt_logprobs is None or 0 <= s.prompt_logprobs <= MAX_LOGPROBS,
         f"sampling.prompt_logprobs={s.prompt_logprobs}: need 0..{MAX_LOGPROBS} (or null: off)"),
        (s.max_new_tokens >= 1, f"sampling.max_new_tokens={s.max_new_tokens}: need >= 1"),
        (s.temperature >= 0, f"sampling.temperature={s.temperature}: need >= 0"),
        # logits / T overflows float32 below this (1e-40 gave garbage text, no error): 0 is greedy
        (s.temperature == 0 or s.temperature >= MIN_TEMPERATURE, f"sampling.temperature={s.temperature}: need 0 "
         f"(greedy) or >= {MIN_TEMPERATURE}; smaller temperatures overflow the scaled logits"),
        (s.top_k >= 0, f"sampling.top_k={s.top_k}: need >= 0 (0 = off)"),
        (0 < s.top_p <= 1, f"sampling.top_p={s.top_p}: need 0 < top_p <= 1"),
        (0 <= s.min_p <= 1, f"sampling.min_p={s.min_p}: need 0 <= min_p <= 1"),
        (s.repetition_penalty > 0, f"sampling.repetition_penalty={s.repetition_penalty}: need > 0"),
        (src.template is not None or src.prompt_column or openai_lines(job),
         "set source.prompt_column or source.template"),
        (src.limit is None or src.limit >= 0, f"source.limit={src.limit}: need >= 0"),
        (job.output.rows_per_file >= 1, f"output.rows_per_file={job.output.rows_per_file}: need >= 1"),
        (job.output.flush_every_s > 0, f"output.flush_every_s={job.output.flush_every_s}: need > 0"),
        (job.progress.every_s > 0, f"progress.every_s={job.progress.every_s}: need > 0"),
        (job.threads is None or job.threads >= 1, f"threads={job.threads}: need >= 1"),
    ]


def needed_columns(job: JobConfig) -> dict[str, str]:
    """Input column -> the config key that needs it (a template's fields, else the prompt column)."""
    src = job.source
    needed: dict[str, str] = {}
    if openai_lines(job):
        return {c: "source.format=openai" for c in openai_batch.LINE_COLUMNS}
    if src.template is not None:
        for c in template_columns(src.template):
            needed[c] = "source.template"
    else:
        needed[src.prompt_column] = "source.prompt_column"
    if src.id_column is not None:
        needed.setdefault(src.id_column, "source.id_column")
    for c in src.keep_columns:
        needed.setdefault(c, "source.keep_columns")
    for setting, c in src.row_params.items():
        needed.setdefault(c, f"source.row_params.{setting}")
    return needed

def openai_lines(job: JobConfig) -> bool:
    return job.source.format == SourceFormat.openai

def check_model_paths(job: JobConfig) -> None:
    """A model path that looks local and does not exist, or a hub id while the hub is off, fails here, at once
    (not after the hub retries)."""
    draft = draft_path(job)
    for key, name in (("model.target", job.model.target), ("model.draft", draft)):
        problem = (missing_local_path(name) or offline_hub_id(name)) if name else None
        if problem:
            raise ConfigError(f"{key}: {problem}")
