"""`batchspec run-batch -i IN.jsonl -o OUT.jsonl --model TARGET`: OpenAI batch files in and out.

    batchspec run-batch -i requests.jsonl -o results.jsonl --model path/to/target --drafter ngram
    python -m batchspec.run_batch -i requests.jsonl -o results.jsonl --model T --draft D --drafter model

Each input line is an OpenAI batch request (/v1/chat/completions or /v1/completions); each output line
its response, in input order (openai_format.py has the formats). A line that cannot run becomes an
error line for its custom_id; it never stops the run.

Resume: finished lines go to OUT.jsonl.parts/ (part files made by atomic rename every FLUSH_LINES lines
or FLUSH_S seconds) and OUT.jsonl appears, by a rename, only when every line is done. Rerunning the same
command after a kill runs only the lines not yet in a part; it is refused, with one line, when the input
file or a setting that changes the output (model, dtype, device, seed, max_seq_len) differs from the
run that started the folder. The drafter, k and batch size may change: they change only speed and the
`batchspec` statistics. --retry-errors reruns the lines whose output was an error. SIGTERM or SIGINT:
stop admitting, finish the lines in flight, write them, exit 128+N (a second signal: at once).

Exit status: 0 when OUT.jsonl is written (error lines included), 2 with one line on stderr for a setup
problem (missing input, bad model dir, settings that differ from the parts'), 128+N after signal N.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

from .jobs.sink import atomic_write_text
from .openai_format import (BatchLine, dumps, error_output, format_output, is_error, line_key, max_logprobs,
                            parse_line, token_decoder, with_defaults)
from .paths import missing_local_path

EXIT_SETUP = 2
FLUSH_LINES = 64  # a part file every this many finished lines ...
FLUSH_S = 30.0  # ... or this many seconds
PROGRESS_S = 10.0
SETTINGS = "settings.json"
DRAFTERS = ("none", "ngram", "prompt_lookup", "model", "suffix", "eagle")


class SetupError(Exception):
    """A problem to report in one line with exit status 2."""


class StopNow(Exception):
    """A second signal: stop without finishing the lines in flight."""


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
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16 (default auto)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N (default auto)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed of lines without their own (default 0)")
    p.add_argument("--retry-errors", action="store_true", help="rerun the lines whose output was an error")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except SetupError as e:
        print(f"batchspec run-batch: error: {e}", file=sys.stderr, flush=True)
        return EXIT_SETUP
    except KeyboardInterrupt:
        print("batchspec run-batch: interrupted; finished lines are kept: rerun the same command to resume",
              file=sys.stderr, flush=True)
        return 128 + signal.SIGINT


def say(message: str) -> None:
    print(f"batchspec run-batch: {message}", file=sys.stderr, flush=True)


# ---- input ------------------------------------------------------------------------------------------


def read_input(path: Path) -> tuple[str, list[BatchLine]]:
    """(the file's sha256, its non-blank lines parsed, a repeated custom_id made an error)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SetupError(f"cannot read the input file {str(path)!r}: {e.strerror or e}") from None
    lines, first = [], {}
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if raw.strip():
            line = parse_line(raw, number)
            if line.custom_id is not None and line.custom_id in first:
                line = replace(line, error=f"duplicate custom_id {line.custom_id!r} (first on line "
                                           f"{first[line.custom_id]})")
            first.setdefault(line.custom_id, number)
            lines.append(line)
    return hashlib.sha256(data).hexdigest(), lines


def chat_prompt(tokenizer, messages: list[dict[str, str]]) -> list[int] | str:
    """The chat template applied with a generation prompt: token ids, or an error message."""
    if not getattr(tokenizer, "chat_template", None):
        return "the model's tokenizer has no chat template: use /v1/completions"
    try:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    except Exception as e:  # templates raise their own errors (roles must alternate, ...)
        return f"chat template: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


# ---- the work folder -----------------------------------------------------------------------------------


class WorkDir:
    """OUT.parts/: settings.json (what the lines' output depends on), a lock held while a run writes,
    and part-NNNNNN.jsonl files of {"line": N, "output": {...}} records; a later record of a line
    replaces an earlier one (--retry-errors)."""

    def __init__(self, output: Path):
        self.output = output
        self.path = output.with_name(output.name + ".parts")
        self._lock = None

    def open(self, settings: dict[str, Any]) -> None:
        if self.output.exists() and not self.path.is_dir():
            raise SetupError(f"{self.output} exists and has no work folder {self.path.name}/: "
                             "remove it or choose another --output-file")
        try:
            self.path.mkdir(exist_ok=True)
            self._lock = open(self.path / "lock", "w")
        except OSError as e:
            raise SetupError(f"cannot write the work folder {self.path}: {e.strerror or e}") from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SetupError(f"another run-batch is writing {self.output} ({self.path}/lock is held)") from None
        saved_path = self.path / SETTINGS
        if saved_path.exists():
            saved = json.loads(saved_path.read_text())
            changed = [f"{k} {saved.get(k)!r} -> {settings.get(k)!r}" for k in sorted(set(saved) | set(settings))
                       if saved.get(k) != settings.get(k)]
            if changed:
                raise SetupError(f"{self.path}/ was started with other settings ({'; '.join(changed)}): rerun with "
                                 f"the same input and settings, or delete {self.path}/ to start over")
        else:
            atomic_write_text(saved_path, json.dumps(settings, indent=1) + "\n")

    def close(self) -> None:
        """Let go of the lock (the kernel also drops it when the process dies)."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def parts(self) -> list[Path]:
        return sorted(self.path.glob("part-*.jsonl"))

    def done(self) -> dict[int, dict[str, Any]]:
        """Line number -> its latest output."""
        out: dict[int, dict[str, Any]] = {}
        for part in self.parts():
            try:
                for text in part.read_text().splitlines():
                    record = json.loads(text)
                    out[record["line"]] = record["output"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise SetupError(f"cannot read {part}: {e}; delete it to redo its lines") from None
        return out

    def write(self, records: list[tuple[int, dict[str, Any]]]) -> None:
        parts = self.parts()
        number = int(parts[-1].stem.split("-")[1]) + 1 if parts else 1
        atomic_write_text(self.path / f"part-{number:06d}.jsonl",
                     "".join(dumps({"line": n, "output": o}) + "\n" for n, o in records))

    def assemble(self, lines: list[BatchLine], done: dict[int, dict[str, Any]]) -> None:
        atomic_write_text(self.output, "".join(dumps(done[line.number]) + "\n" for line in lines))


class Sink:
    """Buffers finished lines; writes a part every FLUSH_LINES lines or FLUSH_S seconds, and on flush()."""

    def __init__(self, workdir: WorkDir, done: dict[int, dict[str, Any]], total: int):
        self.workdir, self.done, self.total = workdir, done, total
        self.buffer: list[tuple[int, dict[str, Any]]] = []
        self.since = time.monotonic()
        self.writing = False
        self.finished = self.errors = self.tokens = 0
        self.started = self.shown = time.monotonic()

    def add(self, number: int, output: dict[str, Any]) -> None:
        self.buffer.append((number, output))
        self.finished += 1
        self.errors += is_error(output)
        usage = ((output.get("response") or {}).get("body") or {}).get("usage") or {}
        self.tokens += usage.get("completion_tokens", 0)
        if len(self.buffer) >= FLUSH_LINES or time.monotonic() - self.since >= FLUSH_S:
            self.flush()
        if time.monotonic() - self.shown >= PROGRESS_S:
            self.progress()

    def flush(self) -> None:
        if self.buffer:
            self.writing = True
            self.workdir.write(self.buffer)
            self.done.update(self.buffer)
            self.buffer, self.writing = [], False
        self.since = time.monotonic()

    def progress(self) -> None:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        say(f"{self.finished}/{self.total} lines ({self.errors} errors), {self.tokens:,} tokens, "
            f"{self.tokens / elapsed:,.1f} tokens/s")
        self.shown = time.monotonic()


# ---- the run ---------------------------------------------------------------------------------------------


def settings_of(args: argparse.Namespace, input_sha256: str) -> dict[str, Any]:
    """What the output lines depend on (a resume must agree on all of it)."""
    model = str(Path(args.model).expanduser().resolve()) if Path(args.model).expanduser().exists() else args.model
    return {"input_sha256": input_sha256, "model": model, "model_name": args.served_model_name or args.model,
            "dtype": args.dtype, "device": args.device, "seed": args.seed, "max_seq_len": args.max_seq_len}


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
    if args.drafter in ("model", "eagle") and not args.draft:
        raise SetupError(f"--drafter {args.drafter} needs --draft DIR")
    for name, value in (("--model", args.model), ("--draft", args.draft)):
        problem = value and missing_local_path(value)
        if problem:
            raise SetupError(f"{name}: {problem}")
    for name in ("k", "batch_size", "max_seq_len"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "k" else 1):
            raise SetupError(f"--{name.replace('_', '-')}={value} is too small")


def run(args: argparse.Namespace) -> int:
    check_args(args)
    sha, lines = read_input(Path(args.input_file))
    workdir = WorkDir(Path(args.output_file))
    try:
        workdir.open(settings_of(args, sha))
        return resume(args, sha, lines, workdir)
    finally:
        workdir.close()


def resume(args: argparse.Namespace, sha: str, lines: list[BatchLine], workdir: WorkDir) -> int:
    """Run the lines not done yet (and with --retry-errors those that failed); assemble the output."""
    done = workdir.done()
    todo = [line for line in lines if line.number not in done or (args.retry_errors and is_error(done[line.number]))]
    bad = [line for line in todo if line.error is not None]
    runnable = [line for line in todo if line.error is None]
    say(f"{len(lines)} lines in {args.input_file} ({sum(line.error is not None for line in lines)} not runnable); "
        f"{len(lines) - len(todo)} done earlier, {len(todo)} to do")
    sink = Sink(workdir, done, len(todo))
    for line in bad:
        sink.add(line.number, error_output(line, line.error, key=line_key(sha, line.number)))
    sink.flush()
    stopped_by = generate_lines(runnable, args, sha, sink) if runnable else None
    sink.flush()
    if stopped_by is not None:
        say(f"stopped after {sink.finished} of {len(todo)} lines; rerun the same command to resume")
        return 128 + stopped_by
    missing = [line.number for line in lines if line.number not in done]
    if missing:  # the engine returned no result for them: a bug, but the rest is kept
        say(f"{len(missing)} lines got no result (first: line {missing[0]}); rerun to retry them")
        return 1
    workdir.assemble(lines, done)
    errors = sum(is_error(done[line.number]) for line in lines)
    say(f"wrote {args.output_file}: {len(lines)} lines, {errors} errors")
    return 0


def generate_lines(lines: list[BatchLine], args: argparse.Namespace, sha: str, sink: Sink) -> int | None:
    """Run the lines through the engine into the sink; returns the signal that stopped it, if one did."""
    from .api import build_generator, load_models, run_grouped
    from .engine.sampling import SamplingParams
    from .models import ModelLoadError
    from .types import Request

    try:
        models = load_models(args.model, args.draft if args.drafter == "model" else None, dtype=args.dtype,
                             device=args.device, head=args.draft if args.drafter == "eagle" else None)
        generator = build_generator(
            models, drafter=args.drafter, k=args.k, batch_size=args.batch_size, max_seq_len=args.max_seq_len,
            sampling=SamplingParams(temperature=1.0, seed=args.seed, varied=True), max_logprobs=max_logprobs(lines))
    except (ModelLoadError, ValueError, OSError) as e:
        raise SetupError(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__) from None
    sink.started = time.monotonic()  # tokens/s from here, not from the model loading
    tokenizer = models.tokenizer
    by_id = {line.custom_id: line for line in lines}
    decode = token_decoder(tokenizer)
    name = args.served_model_name or args.model

    def requests() -> Iterator[Request]:
        for line in lines:
            params = with_defaults(line, generator.max_seq_len)
            prompt = chat_prompt(tokenizer, line.messages) if line.chat else line.prompt
            error = prompt if isinstance(prompt, str) and line.chat else None
            yield Request(id=line.custom_id, prompt=None if error else prompt, error=error, params=params)

    received: list[int] = []

    def on_signal(signum, frame):
        received.append(signum)
        if len(received) == 1:
            say(f"signal {signum}: finishing the lines in flight (signal again to stop now)")
            generator.stop_admitting()
        elif not sink.writing:
            raise StopNow()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for results in run_grouped(generator, requests()):
            line = by_id[results[0].id]
            sink.add(line.number, format_output(line, results, key=line_key(sha, line.number), model=name,
                                                created=int(time.time()), decode=decode,
                                                drafter=args.drafter))
    except StopNow:
        pass
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return received[0] if received else None


if __name__ == "__main__":
    sys.exit(main())
