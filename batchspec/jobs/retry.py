"""`retry_errors=true`: a shard's failed rows run again, replacing the old ones, never duplicating them.

Before the run reads its input, every part file of this shard that holds an error row is rewritten
without the rows of that id (all of its samples), through .tmp/ and an atomic rename, as the sink writes
parts. The ids are then not done, so the run does them again; a run killed after the rewrite simply
leaves them not done for the next one. A part left with no rows stays, empty, for its metadata. Only this shard's parts are touched, so shards retrying side by
side never write the same file.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..engine.types import FINISH_ERROR
from .layout import part_files, shard_name
from .sink import write_part


def drop_error_rows(out_dir: Path, index: int, count: int) -> list[str]:
    """Remove the rows of every id with an error row from shard `index` of `count`'s parts; return the ids."""
    prefix = shard_name(index, count) + "-part-"
    dropped: list[str] = []
    for path in part_files(out_dir):
        if not path.name.startswith(prefix):
            continue
        with pq.ParquetFile(path) as f:
            reasons = f.read(columns=["id", "finish_reason"], use_threads=False)
            failed = pc.filter(reasons.column("id"), pc.equal(reasons.column("finish_reason"), FINISH_ERROR))
            if len(failed) == 0:
                continue
            table = f.read(use_threads=False)
        failed = pa.array(sorted(set(failed.to_pylist())), pa.string())
        kept = table.filter(pc.invert(pc.is_in(table.column("id"), value_set=failed)))
        replace_part(out_dir, path, kept)
        dropped += failed.to_pylist()
    return dropped


def failed_again(out_dir: Path, index: int, count: int, ids: list[str]) -> list[tuple[str, str]]:
    """(id, error) of the rows of `ids` in shard `index` of `count`'s parts that are errors (again)."""
    prefix = shard_name(index, count) + "-part-"
    order, failed = {row_id: n for n, row_id in enumerate(ids)}, {}
    for path in part_files(out_dir):
        if path.name.startswith(prefix):
            with pq.ParquetFile(path) as f:
                rows = f.read(columns=["id", "finish_reason", "error"], use_threads=False).to_pylist()
            failed.update((r["id"], r["error"] or "") for r in rows
                          if r["finish_reason"] == FINISH_ERROR and r["id"] in order)
    return sorted(failed.items(), key=lambda item: order[item[0]])


def replace_part(out_dir: Path, path: Path, table: pa.Table) -> None:
    """Write `table` over the part at `path` atomically. Its metadata (the drafting statistics of the rounds
    before it, the configuration) is kept, even with no rows left, so the summary still counts them."""
    tmp_dir = out_dir / ".tmp"
    tmp_dir.mkdir(exist_ok=True)
    write_part(table, tmp_dir / path.name, path)
