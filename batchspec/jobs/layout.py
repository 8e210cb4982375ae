"""The output dir: its layout, its part files and what they hold (done ids, row counts, totals).

Layout of an output dir:

    data/shard-00000-of-00001-part-000000.parquet   rows_per_file rows each (the last may be short)
    shards/shard-00000-of-00001.json                 written when that shard has finished
    summary.json                                     totals over every part file and finished shard
    job.json                                         the config that decides the output (resume guard)
    logs/                                            Hydra's log and composed config of each run
    .tmp/                                            parts being written; renamed into data/ when complete

A part is written to .tmp/ and renamed into data/ (sink.py), so data/ holds only whole Parquet files:
`pyarrow.dataset.dataset(out/"data")`, `pandas.read_parquet(out/"data")` and
`datasets.load_dataset("parquet", data_dir=out/"data")` read it as one table.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..util.textcheck import first_line
from ..engine.types import CONSTRAINT_KINDS, FINISH_ERROR
from .schema import LATER_COLUMNS, META_KEY, RESULT_SCHEMA

# The job's own part files. Anything else in data/ (a backup copy, a file dropped there by hand) is
# "foreign": resume and the summary never read it, batchspec.status reports it.
PART_NAME = re.compile(r"^shard-(\d+)-of-(\d+)-part-(\d+)\.parquet$")
FAILED_LISTED = 20
TOTAL_COLUMNS = ("prompt_tokens", "completion_tokens", "target_forwards", "draft_tokens", "accepted_tokens")
# Structured output's columns, summed where a part has them (parts written before forced_accepted lack it).
STRUCTURED_COLUMNS = ("forced_tokens", "forced_accepted")
# How a constrained row's error starts (a job's row_params name their column first).
CONSTRAINT_ERRORS = rf"^(source\.row_params column '[^']*': )?({'|'.join(CONSTRAINT_KINDS)}|structured output)\b"


def shard_name(index: int, count: int) -> str:
    return f"shard-{index:05d}-of-{count:05d}"


def part_files(out_dir: Path) -> list[Path]:
    """The job's part files in data/ (named shard-I-of-N-part-P.parquet), sorted."""
    return sorted(f for f in (out_dir / "data").glob("shard-*.parquet") if PART_NAME.match(f.name))


def foreign_files(out_dir: Path) -> list[Path]:
    """Entries of data/ that are not part files. Names starting with . or _ are left out: Parquet
    readers (pyarrow, pandas, datasets) skip them too."""
    data = out_dir / "data"
    if not data.is_dir():
        return []
    return sorted(f for f in data.iterdir() if not PART_NAME.match(f.name) and not f.name.startswith((".", "_")))


def part_problem(schema: pa.Schema) -> str | None:
    """Why a file named like a part is not one of this runner's parts (a column missing or of another type)."""
    for field in RESULT_SCHEMA:
        if field.name not in schema.names and field.name in LATER_COLUMNS:
            continue
        if field.name not in schema.names:
            return f"it has no {field.name!r} column"
        if schema.field(field.name).type != field.type:
            return f"its {field.name!r} column is {schema.field(field.name).type}, not {field.type}"
    return None


def shard_rows(out_dir: Path, index: int, count: int) -> int:
    """Input rows done in the part files of shard `index` of `count`: their rows of sample 0 (an input row
    of sampling.n samples has n output rows)."""
    prefix = shard_name(index, count) + "-part-"
    return sum(pc.sum(pc.equal(read_part(f, ["sample_index"]).column("sample_index"), 0)).as_py() or 0
               for f in part_files(out_dir) if f.name.startswith(prefix))


def read_part(path: Path, columns: list[str], optional: tuple[str, ...] = ()) -> pa.Table:
    """Some columns of one part file (with the file's schema metadata), and those of `optional` it has.
    ParquetFile.read rather than pq.read_table: over a thousand parts read_table's dataset machinery grew
    RSS by ~45 MiB and took 3x as long (pyarrow 26, mimalloc)."""
    with pq.ParquetFile(path) as f:
        present = f.schema_arrow.names
        return f.read(columns=columns + [c for c in optional if c in present], use_threads=False)


def done_ids(out_dir: Path) -> set[str]:
    """Ids of every row in the finished part files of any shard (only the id column is read). A part
    that cannot be read, or a file named like one that is not one, raises OSError naming it."""
    ids: set[str] = set()
    for f in part_files(out_dir):
        try:
            with pq.ParquetFile(f) as pf:
                problem = part_problem(pf.schema_arrow)
                if problem is None:
                    ids.update(pf.read(columns=["id"], use_threads=False).column("id").to_pylist())
        except (OSError, pa.ArrowException) as e:
            raise OSError(f"cannot read output part {f}: {first_line(e)}; move it away and rerun to redo its rows") from e
        if problem:
            raise OSError(f"{f} is not a batchspec part file ({problem}); move it out of {f.parent} and rerun")
    return ids


def read_json(path: Path, hint: str = "") -> dict[str, Any]:
    """The JSON object in `path` (job.json, a shard marker); OSError naming the file if it is not one."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise OSError(f"{path} is not valid JSON ({e})" + (f"; {hint}" if hint else "")) from None
    if not isinstance(value, dict):
        raise OSError(f"{path} does not hold a JSON object" + (f"; {hint}" if hint else ""))
    return value


def check_output_dir(out_dir: Path) -> None:
    """Create data/ and .tmp/ and move a probe file from .tmp/ into data/, as every part will be moved:
    a read-only dir, a full disk or a data/ on another filesystem (rename fails across filesystems)
    fail here, in one line, before any work instead of at the first part."""
    data, tmp = out_dir / "data", out_dir / ".tmp"
    probe = tmp / f".probe-{os.getpid()}"
    try:
        data.mkdir(parents=True, exist_ok=True)
        tmp.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"batchspec write probe\n")
        os.replace(probe, data / probe.name)
        (data / probe.name).unlink()
    except OSError as e:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)
        if e.errno == errno.EXDEV:
            raise OSError(f"output.dir {out_dir}: data/ and .tmp/ are on different filesystems, so parts cannot "
                          "be moved into data/ atomically; make data/ a plain folder of output.dir") from e
        raise OSError(f"output.dir {out_dir} is not writable: {e.strerror or e}"
                      + (f" ({e.filename})" if e.filename else "")) from e


def summarize(out_dir: Path) -> dict[str, Any]:
    """Totals over every part file in `out_dir` (all shards, all runs), reading only counter columns."""
    reasons: Counter = Counter()
    errors: Counter = Counter()
    failed: list[dict[str, str]] = []  # the first FAILED_LISTED failed rows: id and error
    totals = dict.fromkeys(TOTAL_COLUMNS, 0)
    proposed: list[int] = []
    accepted: list[int] = []
    by_k: list[int] = []
    by_tree: Counter = Counter()
    structured: Counter = Counter()
    wall = 0.0
    files = part_files(out_dir)
    for f in files:
        table = read_part(f, ["finish_reason", "error", *TOTAL_COLUMNS], optional=(*STRUCTURED_COLUMNS, "structured_complete"))
        _count_structured(table, structured)
        reasons.update(table.column("finish_reason").to_pylist())
        messages = table.column("error").to_pylist()
        errors.update(e for e in messages if e is not None)
        if len(failed) < FAILED_LISTED and any(e is not None for e in messages):  # ids only where rows failed
            ids = read_part(f, ["id"]).column("id").to_pylist()
            failed += [{"id": i, "error": e} for i, e in zip(ids, messages) if e is not None][: FAILED_LISTED - len(failed)]
        for c in TOTAL_COLUMNS:
            totals[c] += int(pc.sum(table.column(c)).as_py() or 0)
        meta = json.loads((table.schema.metadata or {}).get(META_KEY, b"{}"))
        wall += float(meta.get("wall_s", 0.0))
        for mine, theirs in ((proposed, meta.get("proposed_by_position", [])),
                             (accepted, meta.get("accepted_by_position", [])),
                             (by_k, meta.get("rounds_by_k", []))):
            mine.extend([0] * (len(theirs) - len(mine)))
            for i, v in enumerate(theirs):
                mine[i] += v
        by_tree.update(meta.get("rounds_by_tree", {}))
    rows = sum(reasons.values())
    completion, forwards = totals["completion_tokens"], totals["target_forwards"]
    return {
        "rows": rows,
        "rows_ok": rows - reasons.get(FINISH_ERROR, 0),
        "rows_error": reasons.get(FINISH_ERROR, 0),
        "finish_reasons": dict(sorted(reasons.items())),
        "errors": dict(errors.most_common(10)),  # the most frequent error messages, with counts
        "failed": failed,  # the first failed rows (retry_errors=true runs them again)
        **totals,
        "wall_s": round(wall, 3),  # generation time summed over runs and shards
        "tokens_per_s": completion / wall if wall else None,
        "acceptance_rate": totals["accepted_tokens"] / totals["draft_tokens"] if totals["draft_tokens"] else None,
        "acceptance_by_position": [a / p if p else None for a, p in zip(accepted, proposed)],
        "rounds_by_k": by_k,  # verify passes by drafts checked (index 0: plain rounds): what adaptive chose
        "rounds_by_tree": dict(sorted(by_tree.items())),  # tree verify passes by tree shape ("BxD")
        "tokens_per_target_forward": completion / forwards if forwards else None,
        "mean_accepted_length": totals["accepted_tokens"] / forwards if forwards else None,
        "files": len(files),
        **_structured_totals(totals, structured),
    }


def _count_structured(table: pa.Table, counts: Counter) -> None:
    """Add one part's structured-output counts: forced drafts, and constrained rows by how they ended."""
    for c in STRUCTURED_COLUMNS:
        if c in table.column_names:
            counts[c] += int(pc.sum(table.column(c)).as_py() or 0)
    if "structured_complete" not in table.column_names:
        return
    whole = table.column("structured_complete")
    constrained, failed = pc.is_valid(whole), pc.equal(table.column("finish_reason"), FINISH_ERROR)
    refused = pc.and_(pc.invert(constrained), pc.fill_null(
        pc.match_substring_regex(table.column("error"), CONSTRAINT_ERRORS), False))  # refused before it ran
    count = lambda mask: int(pc.sum(pc.cast(pc.fill_null(mask, False), pa.int64())).as_py() or 0)  # noqa: E731
    complete, errors = count(whole), count(pc.and_(constrained, failed))
    counts["complete"] += complete
    counts["error"] += errors
    counts["cut"] += count(constrained) - complete - errors
    counts["refused"] += count(refused)
    counts["rows"] += count(constrained) + count(refused)


def _structured_totals(totals: dict, counts: Counter) -> dict[str, Any]:
    """forced_tokens / forced_accepted, the drafter's own acceptance (forced drafts left out), and the
    constrained rows: complete, cut (a length limit or a stop string), errors mid-row, refused up front."""
    drafted = totals["draft_tokens"] - counts["forced_tokens"]
    accepted = totals["accepted_tokens"] - counts["forced_accepted"]
    return {
        "forced_tokens": counts["forced_tokens"], "forced_accepted": counts["forced_accepted"],
        "proposed_acceptance_rate": accepted / drafted if drafted else None,
        "structured": {k: counts[k] for k in ("rows", "complete", "cut", "error", "refused")},
    }
