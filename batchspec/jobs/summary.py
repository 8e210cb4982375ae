"""The end of a shard's run: its finish marker, summary.json over the whole output dir, the printed block,
and, with output.format=openai, results.jsonl once every shard has finished."""

from __future__ import annotations

import json
import logging
import platform
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

from ..util.files import atomic_write_text
from ..engine.runstats import rounds_by_k_text, self_training_text
from .openai import batch as openai_batch
from .config import DrafterName, JobConfig, OutputFormat
from .layout import read_json, shard_name, summarize
from ..sources import RowSelector

log = logging.getLogger("batchspec")


def finish(out_dir: Path, index: int, count: int, composed: dict[str, Any], selector: RowSelector, *, outcome,
           load_s: float, generator, io: dict[str, Any] | None = None, job: JobConfig | None = None) -> dict[str, Any]:
    """Mark the shard finished, rewrite summary.json over the whole output dir, print it."""
    shards_dir = out_dir / "shards"
    shards_dir.mkdir(exist_ok=True)
    write_marker(shards_dir / f"{shard_name(index, count)}.json", index, count, selector, outcome=outcome,
                 load_s=load_s, generator=generator, io=io)
    finished, skipped, trained = [], [], {}
    for path in sorted(shards_dir.glob("shard-*.json")):
        try:
            m = read_json(path)
        except OSError as e:  # another shard's marker, damaged by hand: that shard counts as unfinished
            log.warning("%s", e)
            continue
        if m.get("count") == count:
            finished.append(m.get("shard"))
            skipped += [f for f in m.get("skipped_files") or [] if f not in skipped]
            if (m.get("last_run") or {}).get("self_training"):
                trained[str(m.get("shard"))] = m["last_run"]["self_training"]
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
    if trained:  # model.draft=train: each shard's before / after, training time and break-even row
        summary["self_training"] = trained
    if job is not None and job.output.format == OutputFormat.openai and summary["shards"]["complete"]:
        from ..engine.model.models import load_tokenizer  # deferred: transformers only for an OpenAI-format output

        tokenizer = load_tokenizer(job.model.target, trust_remote_code=job.model.trust_remote_code)
        summary["openai_results"] = str(openai_batch.write_results(
            out_dir, job.source.path, tokenizer, model=job.output.model_name or job.model.target, drafter=job.drafter.name.value,
            limit=job.source.limit))
    atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    print(format_summary(summary, outcome), flush=True)
    errors = summary["rows_error"]
    log.info("done: %d rows in %s (%d ok, %d errors%s); summary: %s", summary["rows"], out_dir / "data",
             summary["rows_ok"], errors, f", e.g. {next(iter(summary['errors']))!r}" if errors else "",
             out_dir / "summary.json")
    return summary

def write_marker(marker: Path, index: int, count: int, selector: RowSelector, *, outcome, load_s: float,
                 generator, io: dict[str, Any] | None) -> None:
    """shards/shard-I-of-N.json: the shard is finished, with what its last run did (a run with nothing to do
    keeps the marker it finds, unless that one is unreadable)."""
    if outcome is None and readable_json(marker):
        return
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


def readable_json(path: Path) -> bool:
    try:
        read_json(path)
        return True
    except OSError:
        return False

def structured_lines(summary: dict[str, Any]) -> list[str]:
    """Structured output's lines of the summary (none for a job without constrained rows)."""
    rows = (summary.get("structured") or {}).get("rows")
    if not rows:
        return []
    s, forced = summary["structured"], summary.get("forced_tokens", 0)
    accepted = f"{summary['forced_accepted'] / forced:.3f}" if forced else "-"
    return [f"  structured output         {rows} rows: {s['complete']} complete, {s['cut']} cut short, "
            f"{s['error']} errors mid-row, {s['refused']} refused",
            f"  forced drafts             {forced} ({accepted} accepted)"]


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
        f"  acceptance rate           {num(summary.get('proposed_acceptance_rate', summary['acceptance_rate']), '.3f')}"
        + (" (the drafter's drafts; forced ones below)" if summary.get("forced_tokens") else ""),
        f"  acceptance by position    {by_position}",
        *structured_lines(summary),
        f"  rounds by drafts checked  {rounds_by_k_text(summary.get('rounds_by_k', []))}"
        + "".join(f"  tree {t} {n}" for t, n in (summary.get("rounds_by_tree") or {}).items()),
        f"  tokens per target forward {num(summary['tokens_per_target_forward'])}",
        f"  shards finished           {len(summary['shards']['finished'])}/{summary['shards']['count']}",
    ]
    for shard, t in (summary.get("self_training") or {}).items():
        lines.append(f"  self-trained EAGLE head    shard {shard}: {self_training_text(t)}")
    if summary.get("skipped_files"):
        lines.append(f"  unreadable input skipped  {', '.join(f['file'] for f in summary['skipped_files'])}")
    io = summary.get("io")
    if io:
        lines.append(f"  IO this run               read {io['read_s']:.2f} s, write {io['write_s']:.2f} s, "
                     f"resume scan {io['resume_scan_s']:.2f} s = {num(io['share'], '.1%')} of {io['wall_s']:.1f} s")
    return "\n".join(lines)


LIBRARIES = ("batchspec", "torch", "transformers", "tokenizers", "datasets", "pyarrow", "hydra-core", "omegaconf")


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


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
