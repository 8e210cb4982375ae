"""One shard of a job: read the input, skip what is done, load the models, run, write, finish."""

from __future__ import annotations

import gc
import json
import logging
import sys
import time
from dataclasses import asdict, dataclass
from itertools import chain
from pathlib import Path
from typing import Any, Iterator, Mapping

import pyarrow as pa

from ..util.paths import missing_source_path
from .openai import batch as openai_batch
from .build import build_job_generator, load_job_models
from .checks import check_model_paths, needed_columns, openai_lines
from .config import ConfigError, JobConfig, OutputOrder, draft_path, self_training
from .fingerprint import check_fingerprint, fingerprint, write_fingerprint
from .grouping import RowGroups
from .iostats import TimedStream, io_summary
from .job import Progress, resolve_progress_mode, run_job
from .layout import check_output_dir, done_ids, foreign_files, shard_rows
from .locks import DirLock, ShardLock, other_runs
from ..sources.prompts import PromptBuilder
from .retry import drop_error_rows, failed_again
from ..sources.rowparams import RowParamColumns
from .schema import CONFIG_KEY, FINGERPRINT_KEY
from .sink import ParquetSink
from ..sources import Row, RowSelector, SourceError, nesting_problem, open_source, shard_from_env
from .summary import drafter_text, finish, versions

log = logging.getLogger("batchspec")


def run(job: JobConfig, *, out_dir: Path, composed: dict[str, Any], job_name: str,
        environ: Mapping[str, str]) -> int:
    """Run (or resume) one shard of a job into out_dir; returns the exit status.

    The shard's lock is held for the whole run, so a second run of the same shard into the same dir (a
    double-submitted array task, a cron job overlapping itself) is refused before it reads anything."""
    index, count = shard_from_env(job.shard.index, job.shard.count, environ)
    out_dir.mkdir(parents=True, exist_ok=True)
    with ShardLock(out_dir, index, count):
        code = run_shard(job, out_dir=out_dir, composed=composed, job_name=job_name, index=index, count=count)
    free_engine()  # after a failure the traceback holds the engine anyway, and a failed job ends a sweep
    return code


def free_engine() -> None:
    """Free a finished job's models, KV caches and captured steps now. The engine's parts refer to each other (a
    runner and its captured steps, paths chosen once as bound methods), so without a collection they wait for
    the cycle collector, and a sweep's next job (Hydra -m, one process) would load its models beside them: on a
    GPU, two jobs' weights at once, and a budget for captured steps measured with the last job's memory held."""
    gc.collect()
    torch = sys.modules.get("torch")  # loaded by any job that ran; this module does not import it
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()  # the freed blocks back to the device, where the next job measures what is free


@dataclass
class ShardInput:
    """What a shard run works from once its input is open and the done rows are known."""

    source: Any
    selector: RowSelector
    rows: Iterator[Row]  # the rows to run after `first`
    first: Row | None  # None: nothing left to do
    fingerprint: dict[str, Any]
    scan_s: float  # reading the done ids (and, with retry_errors, dropping the failed rows)
    peek_s: float  # reading up to the first row to do
    own_done: int  # input rows of this shard already in the parts
    retried: list[str]  # with retry_errors: the failed ids dropped to run again


def run_shard(job: JobConfig, *, out_dir: Path, composed: dict[str, Any], job_name: str, index: int,
              count: int) -> int:
    """run() with the shard's lock held: prepare the input, run the rows, finish the shard."""
    started = time.perf_counter()
    shard = prepare(job, out_dir, composed, index, count)
    label = f"shard {index}/{count}" if count > 1 else "job"
    if shard.first is None:
        if shard.selector.read_error:
            raise SourceError(shard.selector.read_error)
        log.info("nothing to do: every row of %s %s is already in %s", job_name, label, out_dir / "data")
        finish(out_dir, index, count, composed, shard.selector, outcome=None, load_s=0.0, generator=None, job=job)
        return 0
    done = len(shard.selector.done)
    to_do = "an unknown number of" if shard.selector.total is None else max(shard.selector.total - shard.own_done, 0)
    others = f"; {done - shard.own_done} rows of other shards in the dir" if done > shard.own_done else ""
    log.info("%s %s: %s rows to do (%d already done%s) -> %s", job_name, label, to_do, shard.own_done, others, out_dir)
    outcome, generator, io, load_s = run_rows(job, shard, out_dir, composed, job_name, index, count, started)
    if outcome.interrupted_by is not None:
        log.warning("stopped by signal %d: %d rows written this run (%d errors); rerun the same command to resume",
                    outcome.interrupted_by, outcome.rows, outcome.errors)
        return 128 + outcome.interrupted_by
    if shard.selector.read_error:  # the rows read before the error ran and are written; the shard is not finished
        raise SourceError(f"{shard.selector.read_error} ({outcome.rows} rows before it written this run)")
    finish(out_dir, index, count, composed, shard.selector, outcome=outcome, load_s=load_s, generator=generator,
           io=io, job=job)
    again = failed_again(out_dir, index, count, shard.retried) if shard.retried else []
    if again:  # which retried rows failed again, and why (the summary lists the first failed rows of all)
        log.warning("retry_errors: %d of the %d retried id(s) failed again: %s", len(again), len(shard.retried),
                    "; ".join(f"{row_id!r}: {error}" for row_id, error in again[:5]) + ("; ..." if len(again) > 5 else ""))
    elif shard.retried:
        log.info("retry_errors: all %d retried id(s) ran without an error this time", len(shard.retried))
    return 0


def prepare(job: JobConfig, out_dir: Path, composed: dict[str, Any], index: int, count: int) -> ShardInput:
    """Check the job against its input and output dir, open the input, record the fingerprint, drop the
    failed rows with retry_errors, and read up to the first row still to do."""
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
                         needed_columns(job), skip_unreadable=src.skip_unreadable,
                         optional=openai_batch.OPTIONAL_COLUMNS if openai_lines(job) else ())
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
    retried = drop_error_rows(out_dir, index, count) if job.retry_errors else []
    if retried:
        if retried:
            log.info("retry_errors: %d failed id(s) of this shard will run again (e.g. %s)", len(retried),
                     ", ".join(map(repr, retried[:5])))
    done, own_done = done_ids(out_dir), shard_rows(out_dir, index, count)
    scan_s = time.perf_counter() - scan_started
    selector = RowSelector(source, id_column=id_column, shard_index=index, shard_count=count,
                           limit=src.limit, done=done, repeats_are_errors=openai_lines(job))
    rows = iter(selector)
    peek_started = time.perf_counter()
    first = next(rows, None)
    return ShardInput(source, selector, rows, first, wanted, scan_s, time.perf_counter() - peek_started, own_done,
                      retried)


def run_rows(job: JobConfig, shard: ShardInput, out_dir: Path, composed: dict[str, Any], job_name: str,
             index: int, count: int, started: float):
    """Load the models and run the shard's rows into its part files: (outcome, generator, io, load_s)."""
    progress_mode = resolve_progress_mode(job.progress.mode.value, sys.stderr)
    if progress_mode != "bar":
        from transformers.utils import logging as hf_logging  # deferred: torch only once there is work (build.py)

        hf_logging.disable_progress_bar()  # no "Loading weights" bars in cron / SLURM logs
    if job.threads is not None:
        import torch  # deferred, as transformers above

        torch.set_num_threads(job.threads)
    models = load_job_models(job)
    generator, builder = request_pipeline(job, models, shard, out_dir)
    load_s = time.perf_counter() - started
    log.info("models loaded in %.1f s (drafter %s, batch %d)", load_s,
             drafter_text(composed.get("drafter", {}), composed.get("sampling") or {}), job.batch_size)
    keep_schema = (openai_batch.keep_schema() if openai_lines(job)
                   else pa_fields(shard.source.schema, job.source.keep_columns))
    sink = ParquetSink(out_dir, shard_index=index, shard_count=count, rows_per_file=job.output.rows_per_file,
                       flush_every_s=job.output.flush_every_s, keep_schema=keep_schema, background=True,
                       file_metadata={CONFIG_KEY: json.dumps(output_config(job, job_name, generator, index, count)),
                                      FINGERPRINT_KEY: json.dumps(shard.fingerprint)})
    progress = Progress(progress_mode, total=remaining(shard.selector), every_s=job.progress.every_s)
    requests = TimedStream(builder.request(row) for row in chain([shard.first], shard.rows))
    groups = RowGroups(job.sampling.n, in_order=job.output.order == OutputOrder.input)
    try:
        outcome = run_job(requests, generator, sink, progress, remaining=lambda: remaining(shard.selector),
                          groups=groups)
    finally:
        closing = time.perf_counter()
        sink.close()  # every part is in data/ once this returns; re-raises a write error
    io = io_summary(read_s=shard.peek_s + requests.seconds, write_s=sink.write_s, scan_s=shard.scan_s,
                    wall_s=shard.scan_s + shard.peek_s + outcome.wall_s + time.perf_counter() - closing,
                    encode_write_s=sink.encode_write_s)
    return outcome, generator, io, load_s


def request_pipeline(job: JobConfig, models, shard: ShardInput, out_dir: Path):
    """The generator and what turns the shard's rows into its requests (prompts, per-row settings)."""
    src = job.source
    row_params = RowParamColumns(src.row_params) if src.row_params else None
    generator = build_job_generator(job, models, row_params, out_dir, openai_lines=openai_lines(job),
                                    rows_left=lambda: remaining(shard.selector))
    if openai_lines(job):
        return generator, openai_batch.OpenAIRequests(models.tokenizer, generator.max_seq_len)
    return generator, PromptBuilder(
        prompt_column=src.prompt_column, template=src.template, chat=src.chat, tokenizer=models.tokenizer,
        keep_columns=src.keep_columns, keep_schema=pa_fields(shard.source.schema, src.keep_columns),
        check_columns=shard.source.check_columns, row_params=row_params, max_seq_len=generator.max_seq_len,
    )


def output_config(job: JobConfig, job_name: str, generator, index: int, count: int) -> dict[str, Any]:
    """The configuration that produced a part's rows, in every part file's Parquet metadata under
    `batchspec.config` (docs/jobs.md), so the files alone say which drafter, k and sampling made them.
    k_max, adaptive and max_seq_len are the generator's: what ran after defaults were resolved."""
    drafter = job.drafter.name
    return {
        "job": job_name, "drafter": drafter.value, "k_max": generator.k_max, "adaptive": generator.adaptive is not None,
        "trees": [str(t) for t in generator.trees],
        "sampling": {key: getattr(value, "value", value) for key, value in asdict(job.sampling).items()},
        "batch_size": job.batch_size, "spare_slots": generator.spare_slots, "max_seq_len": generator.max_seq_len,
        "model": {"target": job.model.target, "draft": job.model.draft if draft_path(job) or self_training(job) else None,
                  "dtype": job.model.dtype.value, "compile": job.model.compile.value},
        "shard": {"index": index, "count": count}, "batchspec": versions()["batchspec"],
    }


def pa_fields(schema: pa.Schema, names: list[str]) -> pa.Schema:
    return pa.schema([schema.field(n) for n in names])

def remaining(selector: RowSelector) -> int | None:
    return None if selector.total is None else selector.total - selector.skipped
