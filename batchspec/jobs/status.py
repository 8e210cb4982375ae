"""`python -m batchspec.status OUTPUT_DIR [--json]`: is a sharded job complete?

Reads only the output dir: each shard's part files (`data/shard-I-of-N-part-*.parquet`, the `id` and
`finish_reason` columns) and finish markers (`shards/shard-I-of-N.json`, written when shard I has gone
through all its rows). Prints one line per shard (finished or not, rows, errors, parts, its last run)
and the total, checks that no id is in two part files, lists the problems it found (files in data/
that are not part files, unreadable parts or markers, ids in more than one part file, parts made
with different settings) and input files
the shards skipped as unreadable, and exits

    0  complete: every shard 0..N-1 of some shard count N has finished, and no problem was found
    1  incomplete: a shard is missing, still running, stopped or cancelled (rerun the same command, or
       resubmit the array, to resume),
       or a problem was found
    2  not an output dir (no data/ and no shards/)

Run it after an array (by hand, or as a job that depends on the array: docs/slurm.md). It never
reads the input, so rows added to the input after the shards finished are not counted as missing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .layout import FAILED_LISTED, PART_NAME, foreign_files, part_files, part_problem, read_json
from .schema import CONFIG_KEY, FINGERPRINT_KEY
from ..util.textcheck import first_line
from ..engine.types import FINISH_ERROR
from ..engine.runstats import self_training_text

MARKER = re.compile(r"^shard-(\d+)-of-(\d+)\.json$")


def read_checked_part(path: Path) -> pa.Table:
    """The id, sample_index, finish_reason and error columns of a part; ValueError if the file is not a part."""
    with pq.ParquetFile(path) as f:
        problem = part_problem(f.schema_arrow)
        if problem:
            raise ValueError(f"named like a part file but is not one: {problem}")
        return f.read(columns=["id", "sample_index", "finish_reason", "error"], use_threads=False)


class PartSettings:
    """Compares the configuration each part file records in its metadata: parts made under other settings
    (shards started together with different ones, or a job.json deleted by hand) mean the rows do not
    belong together. `batchspec.fingerprint` (job.json's keys) is compared between the parts that have
    one; `batchspec.config`, less what may change between runs, between older parts that have none."""

    MAY_CHANGE = ("job", "batch_size", "shard.index", "shard.count", "batchspec", "model.compile")

    def __init__(self):
        self.seen: dict[str, tuple[str, dict[str, Any]]] = {}  # "fingerprint" / "config" -> (first file, values)
        self.differences: dict[str, str] = {}  # part file -> how it differs from the first

    def add(self, name: str, metadata: dict[bytes, bytes] | None) -> None:
        # A part that records its fingerprint is compared on it alone: it says what decides the rows (a greedy
        # job may switch drafter, k or batch between runs). Older parts have only their configuration.
        fingerprint = flatten(recorded(metadata, FINGERPRINT_KEY))
        values = {"fingerprint": fingerprint} if fingerprint else {
            "config": {k: v for k, v in flatten(recorded(metadata, CONFIG_KEY)).items() if k not in self.MAY_CHANGE}}
        for what, flat in values.items():
            if not flat:
                continue
            first, reference = self.seen.setdefault(what, (name, flat))
            key = next((k for k in sorted(set(reference) | set(flat)) if reference.get(k) != flat.get(k)), None)
            if key is not None:
                self.differences.setdefault(name, f"{key} is {reference.get(key)!r} in {first} but "
                                                  f"{flat.get(key)!r} in {name}")

    def problems(self) -> list[str]:
        if not self.differences:
            return []
        return [f"parts made with DIFFERENT SETTINGS: {len(self.differences)} part file(s) differ from the first "
                f"(e.g. {next(iter(self.differences.values()))}); their rows do not belong in one output dir"]


def recorded(metadata: dict[bytes, bytes] | None, key: bytes) -> dict[str, Any]:
    """The JSON object a part's metadata holds under `key` ({} if none, or not an object)."""
    try:
        value = json.loads((metadata or {}).get(key, b"{}"))
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def flatten(values: Any, prefix: str = "") -> dict[str, Any]:
    """{"sampling": {"seed": 1}} -> {"sampling.seed": 1}."""
    if not isinstance(values, dict):
        return {prefix.rstrip("."): values} if prefix else {}
    flat: dict[str, Any] = {}
    for key, value in values.items():
        flat.update(flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return flat


class Tally:
    """What status() gathers from the part files and finish markers of an output dir, shard by shard."""

    def __init__(self):
        self.shards: dict[tuple[int, int], dict[str, Any]] = {}  # (count, index) -> the shard's line
        self.ids: Counter = Counter()  # (id, sample_index) -> rows: a row of n samples is n distinct keys
        self.first_file: dict[tuple, str] = {}  # (id, sample_index) -> the part file it was first seen in
        self.failed: list[dict[str, str]] = []
        self.dropped: list[str] = []  # input rows dropped as repeats of an earlier id (from the finish markers)
        self.duplicate_files: set[tuple[str, str]] = set()
        self.messages: Counter = Counter()
        self.problems: list[str] = []
        self.skipped: list[dict[str, Any]] = []

    def shard(self, index: int, count: int) -> dict[str, Any]:
        return self.shards.setdefault((count, index), {"shard": index, "count": count, "finished": False, "rows": 0,
                                                        "errors": 0, "parts": 0, "finished_at": None,
                                                        "last_run": None})

    def add_part(self, name: str, table: pa.Table) -> None:
        """A part's rows, errors and ids, counted for the shard its name gives."""
        m = PART_NAME.match(name)
        s = self.shard(int(m.group(1)), int(m.group(2)))
        s["parts"] += 1
        s["rows"] += table.num_rows
        reasons = table.column("finish_reason").to_pylist()
        s["errors"] += reasons.count(FINISH_ERROR)
        errors = table.column("error").to_pylist()
        self.messages.update(e for e in errors if e is not None)
        row_ids = table.column("id").to_pylist()
        self.failed += [{"id": i, "error": e} for i, e in zip(row_ids, errors)
                        if e is not None][: FAILED_LISTED - len(self.failed)]
        for row_id in zip(row_ids, table.column("sample_index").to_pylist()):
            self.ids[row_id] += 1
            if self.first_file.setdefault(row_id, name) != name:
                self.duplicate_files.add((self.first_file[row_id], name))

    def add_marker(self, s: dict[str, Any], marker: dict[str, Any]) -> None:
        """A finish marker: its shard finished, and what it skipped or dropped."""
        s.update(finished=True, finished_at=marker.get("finished_at"), last_run=marker.get("last_run"))
        self.skipped += [x for x in marker.get("skipped_files") or [] if x not in self.skipped]
        self.dropped += [i for i in marker.get("duplicate_ids") or [] if i not in self.dropped]

    def complete_counts(self) -> tuple[list[int], list[int]]:
        """The shard counts seen and those all of whose shards finished. A shard of an N-shard run that has
        written nothing yet is added as missing, not left out."""
        counts = sorted({count for count, _ in self.shards})
        for count in counts:
            for index in range(count):
                self.shard(index, count)
        return counts, [n for n in counts if all(self.shards[(n, i)]["finished"] for i in range(n))]

    def duplicates(self) -> list[str]:
        """The ids in more than one part file (a problem if any)."""
        duplicates = sorted(f"{i}" if j == 0 else f"{i} (sample {j})" for (i, j), n in self.ids.items() if n > 1)
        if duplicates:
            pairs = ", ".join(f"{a} and {b}" for a, b in sorted(self.duplicate_files)[:3])
            self.problems.append(f"DUPLICATE ids in more than one part file: {len(duplicates)} "
                                 f"(e.g. {duplicates[:5]}; in {pairs})")
        return duplicates


def read_parts(tally: Tally, out_dir: Path) -> None:
    settings = PartSettings()
    for f in part_files(out_dir):
        try:
            table = read_checked_part(f)
        except (OSError, ValueError, pa.ArrowException) as e:
            tally.problems.append(f"unreadable part file {f.name}: {first_line(e)}")
            continue
        tally.add_part(f.name, table)
        settings.add(f.name, table.schema.metadata)
    tally.problems += settings.problems()


def read_markers(tally: Tally, out_dir: Path) -> None:
    for f in sorted((out_dir / "shards").glob("shard-*.json")):
        if (m := MARKER.match(f.name)) is None:
            continue
        s = tally.shard(int(m.group(1)), int(m.group(2)))
        try:
            marker = read_json(f)
        except OSError as e:
            tally.problems.append(f"unreadable finish marker: {e}")
            continue
        tally.add_marker(s, marker)


def status(out_dir: Path) -> dict[str, Any]:
    """The completion report of an output dir as a dict (what --json prints)."""
    tally = Tally()
    read_parts(tally, out_dir)
    read_markers(tally, out_dir)
    foreign = [p.name for p in foreign_files(out_dir)]
    if foreign:
        tally.problems.append(f"{len(foreign)} file(s) in data/ that are not part files (readers of data/ include "
                              f"them; move them out): {', '.join(foreign[:5])}")
    counts, complete_counts = tally.complete_counts()
    duplicates = tally.duplicates()
    in_flight = sorted(p.name for p in (out_dir / ".tmp").glob("*")) if (out_dir / ".tmp").is_dir() else []
    shards, ids = tally.shards, tally.ids
    return {
        "output_dir": str(out_dir),
        "complete": bool(complete_counts) and not tally.problems,
        "shard_counts": counts,
        "shards": [shards[key] for key in sorted(shards)],
        "rows": sum(ids.values()),
        "distinct_ids": len({i for i, _ in ids}),
        "failed": tally.failed,  # the first failed rows, id and error (retry_errors=true runs them again)
        "duplicate_input_ids_dropped": tally.dropped,  # input rows repeating an earlier id, not run
        "duplicate_ids": duplicates[:20],
        "duplicate_id_count": len(duplicates),
        "duplicate_files": sorted({name for pair in tally.duplicate_files for name in pair}),
        "foreign_files": foreign,
        "skipped_files": tally.skipped,  # unreadable input files the shards skipped (source.skip_unreadable)
        "problems": tally.problems,
        "rows_error": sum(s["errors"] for s in shards.values()),
        "errors": dict(tally.messages.most_common(5)),
        "tmp_files": in_flight,  # parts being written now, or left by a killed run (never read)
    }


def format_status(report: dict[str, Any]) -> str:
    counts = report["shard_counts"]
    finished = sum(s["finished"] for s in report["shards"])
    lines = [
        f"{report['output_dir']}: {'complete' if report['complete'] else 'INCOMPLETE'}: "
        f"{report['rows']} rows ({report['rows_error']} errors), {finished}/{len(report['shards'])} shards finished"
        + (f" (shard counts {counts}: output dir used with several shard counts)" if len(counts) > 1 else ""),
        f"  {'shard':<10} {'state':<9} {'rows':>7} {'errors':>7} {'parts':>6}  last run",
    ]
    for s in report["shards"]:
        run = s["last_run"]
        if s["finished"]:
            note = f"finished {s['finished_at']}" + (
                f": {run['rows']} rows in {run['wall_s']:.1f} s" if run else ": nothing left to do")
            trained = (run or {}).get("self_training")
            if trained:
                note += f"; self-trained head: {self_training_text(trained)}"
        else:
            # One shard is a single command; several are an array (or the same commands by hand).
            resume = ("rerun the same command" if s["count"] == 1 else
                      "resubmit the array, or rerun this shard's command,")
            note = f"no finish marker: running, stopped or cancelled ({resume} to resume)"
        state = "finished" if s["finished"] else "missing"
        lines.append(f"  {s['shard']:>3} of {s['count']:<3} {state:<9} {s['rows']:>7} {s['errors']:>7} "
                     f"{s['parts']:>6}  {note}")
    for problem in report["problems"]:
        lines.append(f"  PROBLEM: {problem}")
    for skipped in report["skipped_files"]:
        lines.append(f"  skipped unreadable input (source.skip_unreadable): {skipped['file']}: {skipped['reason']}")
    for message, n in report["errors"].items():
        lines.append(f"  error x{n}: {message}")
    if report["failed"]:
        shown = ", ".join(repr(f["id"]) for f in report["failed"][:10])
        lines.append(f"  failed ids: {shown}{', ...' if report['rows_error'] > 10 else ''} "
                     "(rerun with retry_errors=true to run them again)")
    if report["duplicate_input_ids_dropped"]:
        lines.append(f"  input rows dropped as repeated ids: {', '.join(map(repr, report['duplicate_input_ids_dropped']))}")
    if report["tmp_files"]:
        lines.append(f"  {len(report['tmp_files'])} file(s) in .tmp/: parts being written, or left by a killed run")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m batchspec.status", description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", type=Path, help="a job's output.dir, e.g. outputs/demo")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    out = args.output_dir
    if not (out / "data").is_dir() and not (out / "shards").is_dir():
        print(f"batchspec.status: error: {out} is not a batchspec output dir (no data/ or shards/)", file=sys.stderr)
        return 2
    report = status(out)
    try:
        print(json.dumps(report, indent=2) if args.json else format_status(report), flush=True)
    except BrokenPipeError:  # `... --json | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
    return 0 if report["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
