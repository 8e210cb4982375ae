"""`batchspec run-batch -i IN.jsonl -o OUT.jsonl --model TARGET`: OpenAI batch files in and out.

    batchspec run-batch -i requests.jsonl -o results.jsonl --model path/to/target --drafter ngram
    python -m batchspec.run_batch -i requests.jsonl -o results.jsonl --model T --draft D --drafter model

A thin command line over the job runner: the flags become a job with `source.format=openai` and
`output.format=openai` whose output dir is the work folder OUT.jsonl.parts/, run as any job is (one
lock, the Parquet sink, signals, resume, --retry-errors). Each input line is an OpenAI batch request
(/v1/chat/completions or /v1/completions); each output line its response, in input order
(request.py and response.py have the formats). A line that cannot run becomes an error line; it never stops the run.

Resume: rerunning the same command after a kill runs only the lines not yet in a part; it is refused,
with one line, when the input file or a setting that changes the output (model, dtype, device, seed,
max_seq_len) differs from the run that started the folder (settings.json). The drafter, k and batch size
may change: they change only speed and the `batchspec` statistics. OUT.jsonl appears, by a rename, only
when every line is done.

Exit status: 0 when OUT.jsonl is written (error lines included), 2 with one line on stderr for a setup
problem (missing input, bad model dir, settings that differ from the folder's), 128+N after signal N.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from dataclasses import asdict
from enum import Enum
from pathlib import Path
from typing import Any

from ...engine.drafters.registry import DRAFTERS, needs_draft
from ..config import (ConfigError, DrafterConfig, DrafterName, Dtype, JobConfig, ModelConfig, OutputConfig,
                      OutputFormat, ProgressConfig, ProgressMode, SamplingConfig, SourceConfig, SourceFormat)
from ...util.files import atomic_write_text
from ...sources import SourceError
from ...util.paths import missing_local_path, offline_hub_id
from ...util.textcheck import first_line

EXIT_SETUP = 2
FLUSH_LINES = 64  # a part file every this many finished lines ...
FLUSH_S = 30.0  # ... or this many seconds
PROGRESS_S = 10.0
SETTINGS = "settings.json"
JOB_NAME = "run-batch"
log = logging.getLogger("batchspec")


class SetupError(Exception):
    """A problem to report in one line with exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="batchspec run-batch", description="OpenAI batch file in, batch output "
                                "file out, with speculative decoding; rerun the same command to resume.")
    p.add_argument("-i", "--input-file", required=True, help="JSONL of OpenAI batch requests")
    p.add_argument("-o", "--output-file", required=True, help="JSONL of responses (work folder: OUT.parts/)")
    p.add_argument("--model", required=True, help="target model: local folder or hub id")
    p.add_argument("--served-model-name", help="the `model` the responses name (default: --model)")
    p.add_argument("--draft", help="draft model folder (--drafter model) or EAGLE-3 head folder (eagle)")
    p.add_argument("--drafter", choices=DRAFTERS, help="default: model with --draft, else none")
    p.add_argument("--k", type=int, default=4, help="most drafts per round (default 4)")
    p.add_argument("--batch-size", type=int, default=8, help="slots: requests decoded together (default 8)")
    p.add_argument("--max-seq-len", type=int, help="prompt + completion tokens per request (default: "
                   "min(the model's positions, 2048)); chat requests without max_tokens may fill it")
    p.add_argument("--dtype", default="auto", choices=[d.value for d in Dtype], help="default auto")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N (default auto)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed of lines without their own (default 0)")
    p.add_argument("--retry-errors", action="store_true", help="rerun the lines whose output was an error")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("batchspec run-batch: %(message)s"))
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        return run(args)
    except (SetupError, ConfigError, SourceError, OSError) as e:
        say(f"error: {first_line(e)}")
        return EXIT_SETUP
    except KeyboardInterrupt:  # while loading (the job loop handles its own signals)
        say("interrupted; finished lines are kept: rerun the same command to resume")
        return 128 + signal.SIGINT
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def say(message: str) -> None:
    print(f"batchspec run-batch: {message}", file=sys.stderr, flush=True)


def work_folder(output: Path) -> Path:
    return output.with_name(output.name + ".parts")


def check_args(args: argparse.Namespace) -> None:
    inp, out = Path(args.input_file), Path(args.output_file)
    if not inp.is_file():
        raise SetupError(f"no such input file {str(inp)!r}")
    try:  # as vLLM's run_batch does: the output file's folder is made when missing
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SetupError(f"cannot make the output file's folder {str(out.parent)!r}: {e.strerror}") from None
    if out.resolve() == inp.resolve():
        raise SetupError("the output file is the input file")
    if args.drafter is None:
        args.drafter = "model" if args.draft else "none"
    if needs_draft(args.drafter) and not args.draft:
        raise SetupError(f"--drafter {args.drafter} needs --draft DIR")
    for name, value in (("--model", args.model), ("--draft", args.draft)):
        problem = value and (missing_local_path(value) or offline_hub_id(value))
        if problem:
            raise SetupError(f"{name}: {problem}")
    for name in ("k", "batch_size", "max_seq_len"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "k" else 1):
            raise SetupError(f"--{name.replace('_', '-')}={value} is too small")
    if args.k == 0 and args.drafter != "none":
        raise SetupError(f"--k=0 with --drafter {args.drafter} drafts nothing: use --drafter none, or --k >= 1")
    work = work_folder(out)
    if out.exists() and not work.is_dir():
        raise SetupError(f"{out} exists and has no work folder {work.name}/: remove it or choose another --output-file")
    if any(work.glob("part-*.jsonl")):  # the layout of run-batch before it ran through the job runner
        raise SetupError(f"{work}/ was written by an older batchspec run-batch (part-*.jsonl files): finish it with "
                         f"that version, or delete {work}/ to start over")


def job_for(args: argparse.Namespace) -> JobConfig:
    """The job that run-batch runs: the OpenAI batch file in, its responses out, into the work folder."""
    return JobConfig(
        model=ModelConfig(target=args.model, draft=args.draft if needs_draft(args.drafter) else None,
                          dtype=Dtype(args.dtype), device=args.device),
        drafter=DrafterConfig(name=DrafterName(args.drafter), k=args.k if args.drafter != "none" else 4),
        sampling=SamplingConfig(seed=args.seed),
        source=SourceConfig(path=str(args.input_file), format=SourceFormat.openai, prompt_column=None),
        output=OutputConfig(dir=str(work_folder(Path(args.output_file))), rows_per_file=FLUSH_LINES,
                            flush_every_s=FLUSH_S, format=OutputFormat.openai, model_name=args.served_model_name),
        progress=ProgressConfig(mode=ProgressMode.log, every_s=PROGRESS_S),
        batch_size=args.batch_size, max_seq_len=args.max_seq_len, retry_errors=args.retry_errors)


def plain(value: Any) -> Any:
    """A config dataclass as the plain dict Hydra composes (enums as their values)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value.value if isinstance(value, Enum) else value


def settings_of(args: argparse.Namespace, input_sha256: str) -> dict[str, Any]:
    """What the output lines depend on (a resume must agree on all of it)."""
    model = str(Path(args.model).expanduser().resolve()) if Path(args.model).expanduser().exists() else args.model
    return {"input_sha256": input_sha256, "model": model, "dtype": args.dtype, "device": args.device,
            "seed": args.seed, "max_seq_len": args.max_seq_len}


def check_settings(work: Path, settings: dict[str, Any]) -> None:
    """Refuse a folder started with other settings; record them in a new one (called under the lock)."""
    path = work / SETTINGS
    if not path.exists():
        atomic_write_text(path, json.dumps(settings, indent=1) + "\n")
        return
    saved = json.loads(path.read_text())
    changed = [f"{k} {saved.get(k)!r} -> {settings.get(k)!r}" for k in sorted(set(saved) | set(settings))
               if k != "model_name" and saved.get(k) != settings.get(k)]  # model_name: written before the fold
    if changed:
        raise SetupError(f"{work}/ was started with other settings ({'; '.join(changed)}): rerun with the same "
                         f"input and settings, or delete {work}/ to start over")


def run(args: argparse.Namespace) -> int:
    # deferred: --help and a bad argument answer before the job runner (and torch) is loaded
    from ..checks import validate
    from ..locks import ShardLock
    from .batch import RESULTS_FILE, file_digest
    from ..shard import run_shard

    check_args(args)
    job = job_for(args)
    validate(job)
    out, work = Path(args.output_file), Path(job.output.dir)
    work.mkdir(exist_ok=True)
    lock = ShardLock(work, 0, 1)
    try:
        lock.__enter__()
    except ConfigError:
        raise SetupError(f"another run-batch is writing {out} ({work}/.locks/ is held)") from None
    try:
        check_settings(work, settings_of(args, file_digest(args.input_file)))
        code = run_shard(job, out_dir=work, composed=plain(asdict(job)), job_name=JOB_NAME, index=0, count=1)
    finally:
        lock.release()
    if code:
        return code
    os.replace(work / RESULTS_FILE, out)
    lines = errors = 0
    with open(out, encoding="utf-8") as f:
        for text in f:
            lines += 1
            errors += json.loads(text)["error"] is not None
    say(f"wrote {out}: {lines} lines, {errors} errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
