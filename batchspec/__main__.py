"""`batchspec VERB ...` and `python -m batchspec ...`: a job (`job=NAME [key=value ...]`, the default; `job`
may also be spelt out as the verb) or one of the commands in VERBS, each of which also runs as
`python -m batchspec.NAME` (the thin entry modules of entry/)."""

import importlib
import re
import sys

VERBS = {  # verb -> the module whose main(argv) runs it
    "run-batch": "batchspec.jobs.openai.run_batch",  # OpenAI batch files in and out
    "status": "batchspec.jobs.status",  # what an output dir holds, done and failed rows
    "report": "batchspec.report.main",  # an output dir's acceptance as tables and a page
    "bench": "batchspec.bench.main",  # drafters side by side on the same models
    "bench-io": "batchspec.bench.parquet_io",  # the Parquet IO share of a job
    "calibrate": "batchspec.bench.calibrate",  # the tuning checklist
    "train-draft": "batchspec.training.train_draft",  # an EAGLE-3 head for a target
}
USAGE = ("usage: batchspec job=NAME [key=value ...]  |  batchspec VERB [--help]\n"
         "verbs: job, " + ", ".join(VERBS))


def main() -> None:
    verb = sys.argv[1] if len(sys.argv) > 1 else ""
    try:
        if verb in VERBS:  # imported on demand: a verb need not load Hydra, nor a job the benchmark or the trainer
            sys.exit(importlib.import_module(VERBS[verb]).main(sys.argv[2:]))
        if verb in ("-h", "--help"):  # the verbs, then Hydra's help for a job
            print(USAGE + "\n")
        if verb == "job":
            del sys.argv[1]
        elif re.fullmatch(r"[a-z][a-z_-]*", verb):  # a word, not an override (key=value, +key=value, ~key)
            print(f"batchspec: error: unknown verb {verb!r}; {USAGE.splitlines()[1]} (or job=NAME to run a job)",
                  file=sys.stderr)
            sys.exit(2)
        from .jobs.cli import main as run_job  # deferred: a verb need not load Hydra
    except KeyboardInterrupt:  # Ctrl-C while the command is still importing: nothing has started
        raise SystemExit(130)
    run_job()


if __name__ == "__main__":
    main()
