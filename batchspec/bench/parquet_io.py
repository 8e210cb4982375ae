"""How much of a job's time goes to Parquet IO, and whether memory stays flat as the input grows.

    python -m batchspec.bench_io                          # IO share of a 100k-row job, drafter none
    python -m batchspec.bench_io --rows 20000 --repeats 3 --max-new-tokens 1
    python -m batchspec.bench_io --rss                    # peak RSS: 10k-row vs 1M-row input, same batch size
    python -m batchspec.bench_io --rss --rss-rows 10000 200000 --id-column

Everything runs offline in a temp dir (or --workdir): a tiny random Llama (fp32, fixed seed, 2 layers,
hidden 32, 64 positions) with a word-level tokenizer is built from a config and saved; a synthetic
Parquet input is written (an `id` column and a `text` column of 3-10 words); then the real job runner
runs on it as a user would, `python -m batchspec job=bench_io ...` in a subprocess, drafter none,
greedy, progress as log lines.

IO share: read from the job's own accounting (`io` in summary.json): read_s (source decode, shard
selection, done/duplicate-id filtering, prompt building), write_s (Arrow table + Parquet encode +
fsync + rename per part), over the job's wall time without model loading. The round phases
(admit / draft / verify / accept / bookkeeping) come from the shard marker; "other" is the rest of the
wall time (the job loop itself: progress, results into the sink buffer, tokenizing prompts). The
target is share < 10% for 100k rows.

--rss: the job runs on each input size in its own subprocess and the peak RSS is the child's
ru_maxrss (os.wait4), at the same batch size, max_new_tokens and rows_per_file. The target is the
largest within 10% of the smallest. Generation length does not matter for this (it is about streaming:
what the process keeps per row read or written), so the default max_new_tokens is 1 to keep a
1M-row run to a few minutes on 2 CPU cores. --id-column uses the input's `id` column as row ids
(source.id_column); the default uses row positions. With an id column the duplicate-id check must
remember every id it has seen in the run, so memory grows with the number of rows by design
(exactly, not by a hash): the report says by how much.

Timings on a shared machine are noisy: use --repeats and compare numbers from the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORDS = (
    "the a quick brown fox jumps over lazy dog cat sleeps runs and or not def return print if else for in "
    "range import class self x y z one two three four five six seven eight nine ten hello world batch "
    "speculative decoding token model draft target question answer is what why how"
).split()
SPECIALS = ["<s>", "</s>", "<pad>", "<unk>"]
REPO = Path(__file__).resolve().parents[2]  # the checkout: the job's subprocess imports batchspec from it


def build_model(path: Path, seed: int = 0) -> Path:
    """A tiny random Llama (fp32) with a word-level tokenizer, saved to `path`."""
    # deferred here and below: `--help` and the parent process (which only times a job's subprocess) need
    # neither torch, transformers, pyarrow nor yaml
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                        pad_token="<pad>", unk_token="<unk>")
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.05,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=2,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def write_input(path: Path, rows: int, chunk: int = 100_000) -> Path:
    """`rows` rows: id "q0000000".., text of 3-10 words (deterministic), written in row groups of `chunk`."""
    import pyarrow as pa  # deferred, as in build_model
    import pyarrow.parquet as pq

    schema = pa.schema([("id", pa.string()), ("text", pa.string())])
    n = len(WORDS)
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        for start in range(0, rows, chunk):
            ids = range(start, min(start + chunk, rows))
            texts = [" ".join(WORDS[(7 * i + 3 * j) % n] for j in range(3 + i % 8)) for i in ids]
            writer.write_table(pa.table({"id": [f"q{i:07d}" for i in ids], "text": texts}, schema=schema),
                               row_group_size=chunk)
    return path


def write_job(workdir: Path, model: Path, data: Path, args) -> None:
    import yaml  # deferred, as in build_model

    job = {
        "model": {"target": str(model), "dtype": "float32", "device": "cpu"},
        "sampling": {"max_new_tokens": args.max_new_tokens},
        "source": {"path": str(data), "prompt_column": "text"},
        "batch_size": args.batch_size,
        "threads": args.threads,
        "output": {"rows_per_file": args.rows_per_file},
        "progress": {"mode": "log", "every_s": 3600},
    }
    (workdir / "jobs").mkdir(parents=True, exist_ok=True)
    (workdir / "jobs" / "bench_io.yaml").write_text("# @package _global_\n" + yaml.safe_dump(job, sort_keys=False))


def run_job(workdir: Path, out_dir: Path, data: Path, id_column: bool) -> dict:
    """One job run in a subprocess; its wall time, peak RSS, summary io block and round phases."""
    cmd = [sys.executable, "-m", "batchspec", "job=bench_io", f"output.dir={out_dir}", f"source.path={data}"]
    if id_column:
        cmd.append("source.id_column=id")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    log = open(out_dir.with_suffix(".log"), "w")
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    log.close()
    if proc.returncode != 0:
        raise SystemExit(f"job failed with exit {proc.returncode}; log: {out_dir.with_suffix('.log')}\n"
                         + out_dir.with_suffix(".log").read_text()[-3000:])
    summary = json.loads((out_dir / "summary.json").read_text())
    marker = json.loads(next((out_dir / "shards").glob("*.json")).read_text())["last_run"]
    return {"process_s": wall, "max_rss_mib": usage.ru_maxrss / 1024, "rows": summary["rows"], "io": summary["io"],
            "phases": marker["round_phases_s"], "setup_s": marker["setup_s"]}


def io_share(args, workdir: Path, model: Path) -> None:
    data = write_input(workdir / f"in-{args.rows}.parquet", args.rows)
    runs = []
    for r in range(args.repeats):
        out = workdir / f"out-io-{r}"
        runs.append(run_job(workdir, out, data, args.id_column))
        io = runs[-1]["io"]
        phases = runs[-1]["phases"]
        other = io["wall_s"] - io["read_s"] - io["write_s"] - io["resume_scan_s"] - sum(phases.values())
        parts = {**phases, "read": io["read_s"], "write": io["write_s"], "other": other}
        print(f"run {r + 1}/{args.repeats}: {runs[-1]['rows']} rows, job wall {io['wall_s']:.1f} s "
              f"(process {runs[-1]['process_s']:.1f} s, setup {runs[-1]['setup_s']:.1f} s): "
              f"read {io['read_s']:.2f} s + write {io['write_s']:.2f} s = IO share {io['share']:.1%} "
              f"(writer thread, overlapping: {io['encode_write_s']:.2f} s)", flush=True)
        print("    where the job wall goes: " + ", ".join(
            f"{k} {v:.2f} s ({v / io['wall_s']:.0%})" for k, v in parts.items()), flush=True)
        if not args.keep:
            _rmtree(out)
    shares = [r["io"]["share"] for r in runs]
    print(f"IO share over {len(runs)} run(s): median {statistics.median(shares):.1%}, "
          f"max {max(shares):.1%} (target < 10%)")


def rss(args, workdir: Path, model: Path) -> None:
    results = {}
    for n in args.rss_rows:
        data = write_input(workdir / f"in-{n}.parquet", n)
        peaks = []
        for r in range(args.repeats):
            out = workdir / f"out-rss-{n}-{r}"
            run = run_job(workdir, out, data, args.id_column)
            peaks.append(run["max_rss_mib"])
            print(f"{n} rows: peak RSS {run['max_rss_mib']:.1f} MiB, job wall {run['io']['wall_s']:.1f} s, "
                  f"IO share {run['io']['share']:.1%}", flush=True)
            if not args.keep:
                _rmtree(out)
        results[n] = max(peaks)
        if not args.keep:
            data.unlink()
    small, large = results[min(results)], results[max(results)]
    print(f"peak RSS {min(results)} rows: {small:.1f} MiB; {max(results)} rows: {large:.1f} MiB; "
          f"ratio {large / small:.3f} (target <= 1.10)")


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.with_suffix(".log").unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m batchspec.bench_io", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=100_000, help="input rows for the IO share run")
    p.add_argument("--rss", action="store_true", help="measure peak RSS over --rss-rows input sizes instead")
    p.add_argument("--rss-rows", type=int, nargs="+", default=[10_000, 1_000_000])
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--max-new-tokens", type=int, default=None, help="default 4 (IO share), 1 (--rss)")
    p.add_argument("--rows-per-file", type=int, default=1000)
    p.add_argument("--threads", type=int, default=1, help="torch threads in the job")
    p.add_argument("--id-column", action="store_true", help="row ids from the input's id column, not positions")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--workdir", type=Path, default=None, help="keep inputs and model here (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the output dirs")
    args = p.parse_args(argv)
    if args.max_new_tokens is None:
        args.max_new_tokens = 1 if args.rss else 4
    with tempfile.TemporaryDirectory(prefix="bench_io-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        model = build_model(workdir / "model")
        write_job(workdir, model, workdir / "in.parquet", args)
        print(f"tiny Llama (2 layers, hidden 32, fp32), drafter none, greedy, batch {args.batch_size}, "
              f"max_new_tokens {args.max_new_tokens}, rows_per_file {args.rows_per_file}, threads {args.threads}, "
              f"ids from {'the id column' if args.id_column else 'positions'}", flush=True)
        (rss if args.rss else io_share)(args, workdir, model)


if __name__ == "__main__":
    main()
