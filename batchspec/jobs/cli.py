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
import logging
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import quote

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..util.textcheck import first_line
from .checks import to_job_config
from .cmdline import job_file_problem, split_argv, unknown_key
from .config import CONF_DIR, ConfigError, find_jobs, job_dirs, plain_job_name, register_configs
from .job import pass_on_signal
from .locks import other_runs
from .shard import run
from ..sources import SourceError

log = logging.getLogger("batchspec")

EXIT_CONFIG_ERROR = 1  # as Hydra exits when the config does not compose
EXIT_SETUP_ERROR = 2


def main() -> None:
    """Register the schema and the job files, check the overrides' keys, then hand over to Hydra."""
    try:
        try:
            jobs = find_jobs(job_dirs(Path.cwd()))
            register_configs(jobs)
        except (ConfigError, OmegaConfBaseException, OSError) as e:
            fail(f"cannot register the job files: {first_line(e)}")
        flags, overrides = split_argv(sys.argv[1:])
        sys.argv[1:] = flags + overrides  # flags may follow the overrides: job=demo -m drafter.k=2,4
        problem = unknown_key(overrides)
        if problem:
            fail(problem, code=EXIT_CONFIG_ERROR)
        for name in job_choices(overrides):  # a misspelled key in the job file, as on the command line
            problem = (job_file_problem(jobs[name], OmegaConf.to_container(OmegaConf.load(jobs[name]), resolve=False))
                       if name in jobs else None)
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


def fail(message: str, code: int = EXIT_SETUP_ERROR) -> None:
    print(f"batchspec: error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


# ---- the run -----------------------------------------------------------------------------------


