"""`python -m batchspec.status OUTPUT_DIR [--json]`: is a sharded job complete?

Reads only the output dir: each shard's part files (`data/shard-I-of-N-part-*.parquet`, the `id` and
`finish_reason` columns) and finish markers (`shards/shard-I-of-N.json`, written when shard I has gone
through all its rows). Prints one line per shard (finished or not, rows, errors, parts, its last run)
and the total, checks that no id is in two part files, and exits

    0  complete: every shard 0..N-1 of some shard count N has finished, and no id is duplicated
    1  incomplete: a shard is missing, still running, stopped or cancelled (resubmit to resume),
       or an id is duplicated
    2  not an output dir (no data/ and no shards/)

Run it after an array (by hand, or as a job that depends on the array: docs/slurm.md). It never
reads the input, so rows added to the input after the shards finished are not counted as missing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from .jobs.sink import part_files, read_part
from .types import FINISH_ERROR

PART = re.compile(r"^shard-(\d+)-of-(\d+)-part-\d+\.parquet$")
MARKER = re.compile(r"^shard-(\d+)-of-(\d+)\.json$")


def status(out_dir: Path) -> dict[str, Any]:
    """The completion report of an output dir as a dict (what --json prints)."""
    shards: dict[tuple[int, int], dict[str, Any]] = {}

    def shard(index: int, count: int) -> dict[str, Any]:
        return shards.setdefault((count, index), {"shard": index, "count": count, "finished": False, "rows": 0,
                                                   "errors": 0, "parts": 0, "finished_at": None, "last_run": None})

    ids: Counter = Counter()
    messages: Counter = Counter()
    for f in part_files(out_dir):
        m = PART.match(f.name)
        if m is None:
            continue
        table = read_part(f, ["id", "finish_reason", "error"])
        s = shard(int(m.group(1)), int(m.group(2)))
        s["parts"] += 1
        s["rows"] += table.num_rows
        reasons = table.column("finish_reason").to_pylist()
        s["errors"] += reasons.count(FINISH_ERROR)
        messages.update(e for e in table.column("error").to_pylist() if e is not None)
        ids.update(table.column("id").to_pylist())
    for f in sorted((out_dir / "shards").glob("shard-*.json")):
        if (m := MARKER.match(f.name)) is None:
            continue
        marker = json.loads(f.read_text())
        s = shard(int(m.group(1)), int(m.group(2)))
        s.update(finished=True, finished_at=marker.get("finished_at"), last_run=marker.get("last_run"))

    counts = sorted({count for count, _ in shards})
    for count in counts:  # a shard of an N-shard run that has written nothing yet is missing, not absent
        for index in range(count):
            shard(index, count)
    complete_counts = [n for n in counts if all(shards[(n, i)]["finished"] for i in range(n))]
    duplicates = sorted(i for i, n in ids.items() if n > 1)
    in_flight = sorted(p.name for p in (out_dir / ".tmp").glob("*")) if (out_dir / ".tmp").is_dir() else []
    return {
        "output_dir": str(out_dir),
        "complete": bool(complete_counts) and not duplicates,
        "shard_counts": counts,
        "shards": [shards[key] for key in sorted(shards)],
        "rows": sum(ids.values()),
        "distinct_ids": len(ids),
        "duplicate_ids": duplicates[:20],
        "duplicate_id_count": len(duplicates),
        "rows_error": sum(s["errors"] for s in shards.values()),
        "errors": dict(messages.most_common(5)),
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
        else:
            note = "no finish marker: running, stopped or cancelled (resubmit the array to resume)"
        state = "finished" if s["finished"] else "missing"
        lines.append(f"  {s['shard']:>3} of {s['count']:<3} {state:<9} {s['rows']:>7} {s['errors']:>7} "
                     f"{s['parts']:>6}  {note}")
    if report["duplicate_id_count"]:
        lines.append(f"  DUPLICATE ids in more than one part file: {report['duplicate_id_count']} "
                     f"(e.g. {report['duplicate_ids'][:5]})")
    for message, n in report["errors"].items():
        lines.append(f"  error x{n}: {message}")
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
    print(json.dumps(report, indent=2) if args.json else format_status(report), flush=True)
    return 0 if report["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
