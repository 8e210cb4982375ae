"""`python -m batchspec job=NAME [key=value ...]`: the only place that reads the Hydra config.

    python -m batchspec job=demo                        # run (or resume) the demo job
    python -m batchspec job=demo --cfg job              # show the composed config
    python -m batchspec job=demo -m drafter.k=2,4,8     # a sweep: one output dir per K

The composed config is checked against the schema (config.py) by Hydra, then turned into a plain
JobConfig; from there on every module gets plain arguments. Exit status: 0 on success (row errors
are counted in summary.json), 1 when the config does not compose (an unknown key, with or without
'+', is caught here before Hydra sees it: cmdline.py), 2 with one line on stderr for
a config that cannot run, an unreadable input, a missing column or an unloadable model, 128+N when
signal N stopped the run (rerun to resume).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import shutil
import signal
import sys
import time
from dataclasses import asdict
from importlib import metadata
from itertools import chain
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import quote

import hydra
import pyarrow as pa
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .cmdline import split_argv, unknown_key
from .build import build_job_generator, draft_path, load_job_models, self_training
from .config import (CONF_DIR, ConfigError, DrafterName, JobConfig, OutputFormat, OutputOrder, SourceFormat, Verify,
                     find_jobs, job_dirs, plain_job_name, register_configs)
from .iostats import TimedStream, io_summary
from .job import Progress, pass_on_signal, resolve_progress_mode, run_job
from .locks import DirLock, ShardLock, other_runs
from .sink import (CONFIG_KEY, FINGERPRINT_KEY, RESULT_SCHEMA, ParquetSink, atomic_write_text, check_output_dir, done_ids,
                   foreign_files, part_files, read_json, shard_name, shard_rows, summarize)
from . import openai_batch
from .grouping import RowGroups
from .prompts import PromptBuilder, template_columns
from .retry import drop_error_rows
from .rowparams import RowParamColumns
from .sources import RowSelector, SourceError, nesting_problem, open_source, shard_from_env
from ..paths import missing_local_path, missing_source_path
from ..types import MIN_TEMPERATURE, TreeSpec, rounds_by_k_text

log = logging.getLogger("batchspec")

EXIT_CONFIG_ERROR = 1  # as Hydra exits when the config does not compose
EXIT_SETUP_ERROR = 2
# Keys whose values decide what the output rows contain: a resumed run must agree on them.
FINGERPRINT_KEYS = ("drafter", "model.target", "model.draft", "model.dtype", "sampling", "source.path",
                    "source.format", "source.split", "source.prompt_column", "source.id_column",
                    "source.template", "source.chat", "source.keep_columns", "source.row_params", "max_seq_len")
LIBRARIES = ("batchspec", "torch", "transformers", "tokenizers", "datasets", "pyarrow", "hydra-core", "omegaconf")


def main() -> None:
    """Register the schema and the job files, check the overrides' keys, then hand over to Hydra."""
    if sys.argv[1:2] == ["run-batch"]:  # OpenAI batch files in and out: batchspec/run_batch.py
        from ..run_batch import main as run_batch
        sys.exit(run_batch(sys.argv[2:]))
    try:
        try:
            register_configs(find_jobs(job_dirs(Path.cwd())))
        except (ConfigError, OmegaConfBaseException, OSError) as e:
            fail(f"cannot register the job files: {first_line(e)}")
        flags, overrides = split_argv(sys.argv[1:])
        sys.argv[1:] = flags + overrides  # flags may follow the overrides: job=demo -m drafter.k=2,4
        problem = unknown_key(overrides)
        if problem:
            fail(problem, code=EXIT_CONFIG_ERROR)
        bad = [name for name in job_choices(overrides) if not plain_job_name(name)]
        if bad:  # before Hydra, whose callback would create outputs/<name> (outputs/.. is the current dir)
            fail(f"job={bad[0]}: a job name must be a plain name (no '/', not starting with '.'), since the "
                 "default output.dir is outputs/NAME; rename the job file")
        hydra_main()
    except KeyboardInterrupt:
        # Ctrl-C outside the job loop (which handles it itself): while starting or loading the models.
        fail("interrupted (SIGINT); the rows already in the output dir are kept: rerun the same command to resume",
             code=128 + signal.SIGINT)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def hydra_main(cfg: DictConfig) -> None:
    hc = HydraConfig.get()
    job_name = hc.runtime.choices.get("job")
    subdir = (sweep_subdir(hc.overrides.task, hc.job.config.override_dirname.exclude_keys)
              if hc.mode == RunMode.MULTIRUN else "")
    try:
        job = to_job_config(cfg, job_name)
        out_dir = Path(job.output.dir) / subdir if subdir else Path(job.output.dir)
        composed = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
        environ: Mapping[str, str] = os.environ
        if "submitit" in str(OmegaConf.select(hc.launcher, "_target_", default="")):
            # Hydra's submitit launcher submits a sweep as one SLURM array: its array variables number
            # the sweep's jobs, not shards of this job. Shard with shard.count=N shard.index=0,...,N-1.
            environ = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_ARRAY_")}
        code = run(job, out_dir=out_dir, composed=composed, job_name=job_name or "", environ=environ)
    except (ConfigError, SourceError, OSError) as e:
        if hc.mode == RunMode.RUN:
            discard_fresh_output(Path(hc.runtime.output_dir))
        fail(first_line(e))
    if code:
        if code > 128:
            pass_on_signal(code - 128)  # under submitit: checkpoint, requeue and exit
        sys.exit(code)


# What a run that failed at setup may have made in a new output dir: its Hydra log dir, the lock files, the
# job.json it wrote under the dir lock, and empty data/ and .tmp/ (the output dir check's probe).
SETUP_LEFTOVERS = {"logs", ".locks", "job.json", "data", ".tmp"}


def discard_fresh_output(run_dir: Path) -> None:
    """A run that failed at setup leaves no trace in an output dir it created: its log dir goes, and the
    output dir too when nothing else is in it and no other run is writing it (a dir with parts, another
    run's logs or anything else stays)."""
    logs = run_dir.parent
    out = logs.parent
    if logs.name != "logs" or not run_dir.is_dir() or set(p.name for p in out.iterdir()) - SETUP_LEFTOVERS:
        return
    if any(d.is_dir() and any(d.iterdir()) for d in (out / "data", out / ".tmp")):
        return
    locks = out / ".locks"
    if locks.is_dir() and (any(not p.name.endswith(".lock") for p in locks.iterdir()) or other_runs(out, -1, 0)):
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    if logs.is_dir() and not any(logs.iterdir()):
        for leftover in (locks, out / "data", out / ".tmp"):
            shutil.rmtree(leftover, ignore_errors=True)
        (out / "job.json").unlink(missing_ok=True)
        logs.rmdir()
        with contextlib.suppress(OSError):
            out.rmdir()


class OutputDirCheck(Callback):
    """Hydra creates its log folder inside output.dir before any batchspec code runs, so a read-only
    output.dir (or a file in its place) ended in Hydra's traceback and exit 1. This callback
    (conf/config.yaml: hydra.callbacks) checks the dir first and fails in one line, exit 2."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.runtime.choices.get("job") is None and OmegaConf.is_interpolation(config.output, "dir"):
            return  # no job selected: to_job_config says so
        HydraConfig.instance().set_config(config)  # output.dir may name the job: ${hydra:runtime.choices.job}
        out = Path(str(OmegaConf.select(config, "output.dir")))
        if out.exists() and not out.is_dir():
            fail(f"output.dir {out} is a file, not a folder")
        probe = out / f".batchspec-probe-{os.getpid()}"
        try:
            out.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            fail(f"output.dir {out} is not writable: {e.strerror or e}" + (f" ({e.filename})" if e.filename else ""))


# ---- config -> plain objects -------------------------------------------------------------------


def job_choices(overrides: list[str]) -> list[str]:
    """The job names that `job=NAME` overrides select (several in a sweep: job=a,b)."""
    names: list[str] = []
    for override in overrides:
        key, sep, value = override.partition("=")
        if sep and key.lstrip("+~") == "job":
            names += [v.strip().strip("'\"") for v in value.split(",")]
    return names


def sweep_subdir(overrides: list[str], exclude_keys: list[str]) -> str:
    """A sweep member's folder below output.dir: one `key=value` path segment per override that names it
    (its text as Hydra's override_dirname has it, sorted, the excluded keys of conf/config.yaml left out),
    values percent-encoded (a `/` in a path is `%2F`), so that hive partitioning (pyarrow, duckdb) reads
    the keys back as columns: `-m drafter=ngram drafter.k=2,4` -> `drafter.k=2/drafter=ngram/`."""
    kept = [o for o in OverridesParser.create().parse_overrides(overrides) if o.key_or_group not in exclude_keys]
    lines = sorted(o.input_line for o in kept if o.input_line)
    return "/".join("=".join((key, quote(value, safe=""))) if sep else key
                    for key, sep, value in (line.partition("=") for line in lines))


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def fail(message: str, code: int = EXIT_SETUP_ERROR) -> None:
    print(f"batchspec: error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


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
    checks = [
        (job.batch_size >= 1, f"batch_size={job.batch_size}: need >= 1"),
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
        (job.drafter.train_minutes > 0, f"drafter.train_minutes={job.drafter.train_minutes}: need > 0"),
        (job.drafter.corpus_max_tokens >= 1, f"drafter.corpus_max_tokens={job.drafter.corpus_max_tokens}: need >= 1"),
        (s.n >= 1, f"sampling.n={s.n}: need >= 1"),
        (s.n == 1 or s.temperature > 0 or "temperature" in src.row_params,
         f"sampling.n={s.n} with greedy decoding (temperature 0) gives {s.n} identical copies: set "
         "sampling.temperature > 0, or sampling.n=1"),
        (s.logprobs is None or 0 <= s.logprobs <= 20, f"sampling.logprobs={s.logprobs}: need 0..20 (or null: off)"),
        (s.prompt_logprobs is None or 0 <= s.prompt_logprobs <= 20,
         f"sampling.prompt_logprobs={s.prompt_logprobs}: need 0..20 (or null: off)"),
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
    for ok, message in checks:
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
    twice = [c for i, c in enumerate(src.keep_columns) if c in src.keep_columns[:i]]
    if twice:  # Parquet would write two columns of one name, which readers refuse to open
        raise ConfigError(f"source.keep_columns lists {twice[0]!r} twice")


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


def select(config: Mapping[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def drafter_changes_rows(job: JobConfig) -> bool:
    """Greedy decoding and coupled sampling give the same rows whatever the drafter, k, adaptive choices,
    trees or batch (every token is the target's own); only rejection sampling of sampled rows depends on
    them. So a half-done greedy or coupled job may switch drafter and resume."""
    s = job.sampling
    return s.verify == Verify.rejection and (s.temperature > 0 or "temperature" in job.source.row_params)


def fingerprint(composed: Mapping[str, Any], job: JobConfig) -> dict[str, Any]:
    values = {key: select(composed, key) for key in FINGERPRINT_KEYS}
    if not drafter_changes_rows(job):
        values["drafter"] = values["model.draft"] = None  # not part of what the output depends on
    elif draft_path(job) is None:
        values["model.draft"] = None  # not used
    return values


def flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"sampling": {"seed": 1}} -> {"sampling.seed": 1}: a refusal names the leaf key that changed."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def check_fingerprint(out_dir: Path, current: dict[str, Any], *, source=None,
                      layout: list[dict[str, Any]] | None = None, running: bool = False) -> None:
    """Refuse to resume into an output dir whose rows were made under a config that changes them, or,
    with positional ids (`source` and its `layout` given), from an input whose rows have moved since.
    `running`: another run is writing the dir now, so its job.json counts even before it has parts."""
    path = out_dir / "job.json"
    has_parts = bool(part_files(out_dir))
    if not path.exists() or not (has_parts or running):
        return
    job = read_json(path, "it records the config the rows were made with; delete it to resume anyway")
    stored, now = flatten(job.get("fingerprint", {})), flatten(current)
    for key in list(now) + [k for k in stored if k not in now]:
        if stored.get(key) != now.get(key):
            made = "holds rows made with" if has_parts else "is being written by another run with"
            raise ConfigError(
                f"output.dir {out_dir} {made} a different {key} ({stored.get(key)!r}, now "
                f"{now.get(key)!r}): choose another output.dir, or delete {path} to add to it anyway"
            )
    change = source.layout_change(job["input"], layout) if source is not None and job.get("input") else None
    if change:
        raise ConfigError(
            f"the input changed since the rows in {out_dir} were made: {change}; with positional ids (no "
            "source.id_column) rows would be matched to other rows' outputs: restore the input, or set "
            "source.id_column, or choose another output.dir"
        )


def write_fingerprint(out_dir: Path, current: dict[str, Any], layout: list[dict[str, Any]] | None = None) -> None:
    atomic_write_text(out_dir / "job.json", json.dumps({"fingerprint": current, "input": layout}, indent=2) + "\n")


def output_config(job: JobConfig, job_name: str, generator, index: int, count: int) -> dict[str, Any]:
    """The configuration that produced a part's rows, in every part file's Parquet metadata under
    `batchspec.config` (docs/jobs.md), so the files alone say which drafter, k and sampling made them.
    k_max, adaptive and max_seq_len are the generator's: what ran after defaults were resolved."""
    drafter = job.drafter.name
    return {
        "job": job_name, "drafter": drafter.value, "k_max": generator.k_max, "adaptive": generator.adaptive is not None,
        "trees": [str(t) for t in generator.trees],
        "sampling": {key: getattr(value, "value", value) for key, value in asdict(job.sampling).items()},
        "batch_size": job.batch_size, "max_seq_len": generator.max_seq_len,
        "model": {"target": job.model.target, "draft": job.model.draft if draft_path(job) or self_training(job) else None,
                  "dtype": job.model.dtype.value, "compile": job.model.compile.value},
        "shard": {"index": index, "count": count}, "batchspec": versions()["batchspec"],
    }


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


# ---- the run -----------------------------------------------------------------------------------


def run(job: JobConfig, *, out_dir: Path, composed: dict[str, Any], job_name: str,
        environ: Mapping[str, str]) -> int:
    """Run (or resume) one shard of a job into out_dir; returns the exit status.

    The shard's lock is held for the whole run, so a second run of the same shard into the same dir (a
    double-submitted array task, a cron job overlapping itself) is refused before it reads anything."""
    index, count = shard_from_env(job.shard.index, job.shard.count, environ)
    out_dir.mkdir(parents=True, exist_ok=True)
    with ShardLock(out_dir, index, count):
        return run_shard(job, out_dir=out_dir, composed=composed, job_name=job_name, index=index, count=count)


def run_shard(job: JobConfig, *, out_dir: Path, composed: dict[str, Any], job_name: str, index: int,
              count: int) -> int:
    """run() with the shard's lock held."""
    started = time.perf_counter()
    src = job.source
    check_model_paths(job)
    for stop in job.sampling.stop:
        if "\\n" in stop or "\\t" in stop:  # Hydra keeps a backslash and an n: the user likely meant a newline
            log.warning("sampling.stop %r holds a backslash, not a newline or tab; for a newline on the command "
                        "line write $'sampling.stop=[\"\\n\\n\"]' (bash), or stop: [\"\\n\\n\"] in a job file", stop)
    nested = nesting_problem(src.path, out_dir)  # before listing the input, which may hold the output's parts
    if nested:
        raise ConfigError(nested)
    missing = missing_source_path(src.path)
    if missing:  # before datasets would spend ~30 s of hub retries on it
        raise SourceError(f"source.path: {missing}")
    source = open_source(src.path, "jsonl" if openai_lines(job) else src.format.value, src.split,
                         needed_columns(job), skip_unreadable=src.skip_unreadable)
    id_column = "custom_id" if openai_lines(job) else src.id_column
    check_output_dir(out_dir)  # before any work: a read-only dir, data/ on another filesystem
    wanted = fingerprint(composed, job)
    layout = source.layout() if id_column is None else None  # positional ids: rows must not move
    with DirLock(out_dir):  # compare and write job.json in one step: shards starting together see each other
        check_fingerprint(out_dir, wanted, source=source if id_column is None else None, layout=layout,
                          running=bool(other_runs(out_dir, index, count)))
        write_fingerprint(out_dir, wanted, layout)
    strays = foreign_files(out_dir)
    if strays:
        log.warning("%s holds %d file(s) that are not this job's part files (e.g. %s): resume ignores them, "
                    "but readers of data/ do not; move them out", out_dir / "data", len(strays), strays[0].name)
    scan_started = time.perf_counter()
    if job.retry_errors:
        retried = drop_error_rows(out_dir, index, count)
        if retried:
            log.info("retry_errors: %d failed id(s) of this shard will run again (e.g. %s)", len(retried),
                     ", ".join(map(repr, retried[:5])))
    done, own_done = done_ids(out_dir), shard_rows(out_dir, index, count)
    scan_s = time.perf_counter() - scan_started
    selector = RowSelector(source, id_column=id_column, shard_index=index, shard_count=count,
                           limit=src.limit, done=done)
    rows = iter(selector)
    peek_started = time.perf_counter()
    first = next(rows, None)
    peek_s = time.perf_counter() - peek_started
    label = f"shard {index}/{count}" if count > 1 else "job"
    if first is None:
        if selector.read_error:
            raise SourceError(selector.read_error)
        log.info("nothing to do: every row of %s %s is already in %s", job_name, label, out_dir / "data")
        finish(out_dir, index, count, composed, selector, outcome=None, load_s=0.0, generator=None, job=job)
        return 0

    progress_mode = resolve_progress_mode(job.progress.mode.value, sys.stderr)
    if progress_mode != "bar":
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # no "Loading weights" bars in cron / SLURM logs

    if job.threads is not None:
        import torch

        torch.set_num_threads(job.threads)
    # Done rows are skipped lazily while reading, so count this shard's from its part files.
    to_do = "an unknown number of" if selector.total is None else max(selector.total - own_done, 0)
    others = f"; {len(done) - own_done} rows of other shards in the dir" if len(done) > own_done else ""
    log.info("%s %s: %s rows to do (%d already done%s) -> %s", job_name, label, to_do, own_done, others, out_dir)
    models = load_job_models(job)
    row_params = RowParamColumns(src.row_params) if src.row_params else None
    generator = build_job_generator(job, models, row_params, out_dir, openai_lines=openai_lines(job))
    if openai_lines(job):
        builder = openai_batch.OpenAIRequests(models.tokenizer, generator.max_seq_len)
    else:
        builder = PromptBuilder(
            prompt_column=src.prompt_column, template=src.template, chat=src.chat, tokenizer=models.tokenizer,
            keep_columns=src.keep_columns, keep_schema=pa_fields(source.schema, src.keep_columns),
            check_columns=source.check_columns, row_params=row_params, max_seq_len=generator.max_seq_len,
        )
    load_s = time.perf_counter() - started
    log.info("models loaded in %.1f s (drafter %s, batch %d)", load_s,
             drafter_text(composed.get("drafter", {}), composed.get("sampling") or {}), job.batch_size)
    keep_schema = openai_batch.keep_schema() if openai_lines(job) else pa_fields(source.schema, src.keep_columns)
    sink = ParquetSink(out_dir, shard_index=index, shard_count=count, rows_per_file=job.output.rows_per_file,
                       flush_every_s=job.output.flush_every_s,
                       keep_schema=keep_schema, background=True,
                       file_metadata={CONFIG_KEY: json.dumps(output_config(job, job_name, generator, index, count)),
                                      FINGERPRINT_KEY: json.dumps(wanted)})
    progress = Progress(progress_mode, total=remaining(selector), every_s=job.progress.every_s)
    requests = TimedStream(builder.request(row) for row in chain([first], rows))
    groups = RowGroups(job.sampling.n, in_order=job.output.order == OutputOrder.input)
    try:
        outcome = run_job(requests, generator, sink, progress, remaining=lambda: remaining(selector), groups=groups)
    finally:
        closing = time.perf_counter()
        sink.close()  # every part is in data/ once this returns; re-raises a write error
    io = io_summary(read_s=peek_s + requests.seconds, write_s=sink.write_s, scan_s=scan_s,
                    wall_s=scan_s + peek_s + outcome.wall_s + time.perf_counter() - closing,
                    encode_write_s=sink.encode_write_s)
    if outcome.interrupted_by is not None:
        log.warning("stopped by signal %d: %d rows written this run (%d errors); rerun the same command to resume",
                    outcome.interrupted_by, outcome.rows, outcome.errors)
        return 128 + outcome.interrupted_by
    if selector.read_error:  # the rows read before the error ran and are written; the shard is not finished
        raise SourceError(f"{selector.read_error} ({outcome.rows} rows before it written this run)")
    finish(out_dir, index, count, composed, selector, outcome=outcome, load_s=load_s, generator=generator, io=io,
           job=job)
    return 0


def check_model_paths(job: JobConfig) -> None:
    """A model path that looks local and does not exist fails here, at once (not after the hub retries)."""
    draft = draft_path(job)
    for key, name in (("model.target", job.model.target), ("model.draft", draft)):
        problem = missing_local_path(name) if name else None
        if problem:
            raise ConfigError(f"{key}: {problem}")


def drafter_text(drafter: Mapping[str, Any], sampling: Mapping[str, Any]) -> str:
    """'none', 'model (k=4)' or 'ngram (adaptive, k <= 4)': adaptive null means on where it cannot change
    the output (greedy decoding and coupled sampling), off with rejection sampling."""
    name = drafter.get("name")
    if name == DrafterName.none.value:
        return str(name)
    adaptive = drafter.get("adaptive")
    if adaptive is None:
        adaptive = sampling.get("temperature", 0.0) == 0.0 or sampling.get("verify", "coupled") == "coupled"
    tree = f", trees {drafter['tree']}" if drafter.get("tree") else ""
    return (f"{name} (adaptive, k <= {drafter.get('k')}{tree})" if adaptive
            else f"{name} (tree {drafter['tree'].split(',')[0]})" if tree else f"{name} (k={drafter.get('k')})")


def pa_fields(schema: pa.Schema, names: list[str]) -> pa.Schema:
    return pa.schema([schema.field(n) for n in names])


def remaining(selector: RowSelector) -> int | None:
    return None if selector.total is None else selector.total - selector.skipped


def finish(out_dir: Path, index: int, count: int, composed: dict[str, Any], selector: RowSelector, *, outcome,
           load_s: float, generator, io: dict[str, Any] | None = None, job: JobConfig | None = None) -> dict[str, Any]:
    """Mark the shard finished, rewrite summary.json over the whole output dir, print it."""
    shards_dir = out_dir / "shards"
    shards_dir.mkdir(exist_ok=True)
    marker = shards_dir / f"{shard_name(index, count)}.json"
    if outcome is not None or not readable_json(marker):
        this_run = None
        if outcome is not None:
            this_run = {
                "rows": outcome.rows, "rows_error": outcome.errors, "completion_tokens": outcome.completion_tokens,
                "setup_s": round(load_s, 3), "wall_s": round(outcome.wall_s, 3),
                "tokens_per_s": outcome.completion_tokens / outcome.wall_s if outcome.wall_s else None,
                "generator": generator.stats.as_dict(), "io": io, "capture_s": round(generator.capture_s, 3),
                "round_phases_s": {name: round(t, 3) for name, t in generator.timings.items()},
            }
            if hasattr(generator, "report"):  # model.draft=train: the self-training's before/after
                this_run["self_training"] = generator.report()
        atomic_write_text(marker, json.dumps({
            "shard": index, "count": count, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "duplicate_ids_skipped": selector.duplicates, "duplicate_ids": selector.duplicate_ids,
            "skipped_files": selector.source.skipped, "last_run": this_run,
        }, indent=2) + "\n")
    finished, skipped = [], []
    for path in sorted(shards_dir.glob("shard-*.json")):
        try:
            m = read_json(path)
        except OSError as e:  # another shard's marker, damaged by hand: that shard counts as unfinished
            log.warning("%s", e)
            continue
        if m.get("count") == count:
            finished.append(m.get("shard"))
            skipped += [f for f in m.get("skipped_files") or [] if f not in skipped]
    if selector.duplicates:
        log.warning("%d row(s) dropped: their id repeats an earlier row's (ids %s%s); only the first row of an "
                    "id runs", selector.duplicates, ", ".join(map(repr, selector.duplicate_ids)),
                    ", ..." if selector.duplicates > len(selector.duplicate_ids) else "")
    summary = summarize(out_dir)
    summary.update({
        "output_dir": str(out_dir), "data": str(out_dir / "data"),
        "shards": {"count": count, "finished": sorted(finished), "complete": len(finished) == count},
        "duplicate_ids_skipped": selector.duplicates, "skipped_files": skipped, "io": io,
        "config": composed, "versions": versions(),
    })
    if job is not None and job.output.format == OutputFormat.openai and summary["shards"]["complete"]:
        from ..models import load_tokenizer

        tokenizer = load_tokenizer(job.model.target, trust_remote_code=job.model.trust_remote_code)
        summary["openai_results"] = str(openai_batch.write_results(
            out_dir, job.source.path, tokenizer, model=job.model.target, drafter=job.drafter.name.value))
    atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    print(format_summary(summary, outcome), flush=True)
    errors = summary["rows_error"]
    log.info("done: %d rows in %s (%d ok, %d errors%s); summary: %s", summary["rows"], out_dir / "data",
             summary["rows_ok"], errors, f", e.g. {next(iter(summary['errors']))!r}" if errors else "",
             out_dir / "summary.json")
    return summary


def readable_json(path: Path) -> bool:
    try:
        read_json(path)
        return True
    except OSError:
        return False


def format_summary(summary: dict[str, Any], outcome) -> str:
    """The human-readable block printed at the end of a run."""
    def num(x, fmt=".2f"):
        return "-" if x is None else format(x, fmt)

    config = summary["config"]
    by_position = " ".join(num(a) for a in summary["acceptance_by_position"]) or "-"
    lines = [
        f"batchspec summary: {summary['output_dir']}",
        f"  rows                      {summary['rows']} ({summary['rows_ok']} ok, {summary['rows_error']} errors)"
        + (f"; this run {outcome.rows}" if outcome is not None else "; nothing to do"),
        f"  tokens                    {summary['completion_tokens']} generated, {summary['prompt_tokens']} prompt",
        f"  generation time           {num(summary['wall_s'], '.1f')} s, {num(summary['tokens_per_s'], '.1f')} tokens/s",
        f"  drafter                   "
        f"{drafter_text(config.get('drafter', {}), config.get('sampling') or {})}",
        f"  acceptance rate           {num(summary['acceptance_rate'], '.3f')}",
        f"  acceptance by position    {by_position}",
        f"  rounds by drafts checked  {rounds_by_k_text(summary.get('rounds_by_k', []))}"
        + "".join(f"  tree {t} {n}" for t, n in (summary.get("rounds_by_tree") or {}).items()),
        f"  tokens per target forward {num(summary['tokens_per_target_forward'])}",
        f"  shards finished           {len(summary['shards']['finished'])}/{summary['shards']['count']}",
    ]
    if summary.get("skipped_files"):
        lines.append(f"  unreadable input skipped  {', '.join(f['file'] for f in summary['skipped_files'])}")
    io = summary.get("io")
    if io:
        lines.append(f"  IO this run               read {io['read_s']:.2f} s, write {io['write_s']:.2f} s, "
                     f"resume scan {io['resume_scan_s']:.2f} s = {num(io['share'], '.1%')} of {io['wall_s']:.1f} s")
    return "\n".join(lines)
