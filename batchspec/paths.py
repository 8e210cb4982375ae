"""Model paths: tell a local path that does not exist from a hub id, without importing torch (the
job runner checks its model paths before it reads the input, and a finished job's rerun loads nothing)."""

from __future__ import annotations

import os
from pathlib import Path


def missing_local_path(name_or_path: str) -> str | None:
    """Why `name_or_path` is a local path that does not exist, or None (it exists, or reads as a hub id).

    A hub id is `name` or `org/name`; anything else (absolute, ./ or ../ or ~, two or more slashes, or
    an `org/name` whose `org` is a folder here) is meant as a path. Saying so at once beats
    transformers' answer: ~30 s of hub retries, then a network error or "Repo id must be in the form"."""
    path = Path(name_or_path).expanduser()
    first = name_or_path.split("/", 1)[0]
    looks_local = (name_or_path.startswith(("/", "./", "../", "~")) or name_or_path in (".", "..")
                   or name_or_path.count("/") >= 2 or ("/" in name_or_path and Path(first).is_dir())
                   or os.sep != "/" and os.sep in name_or_path)
    if not looks_local or path.exists():
        return None
    return f"no such local directory {name_or_path!r} (resolved to {path.resolve()})"


DATA_SUFFIXES = (".parquet", ".jsonl", ".json", ".gz", ".csv", ".arrow")


def missing_source_path(path: str) -> str | None:
    """Like missing_local_path for `source.path`, where a file name (a data suffix) or a glob also means
    local: such a path that matches nothing is refused at once instead of being looked up on the hub."""
    if "://" in path:  # a URL (hf://, s3://): the reader's business
        return None
    pattern = any(c in path for c in "*?[")
    problem = None if pattern else missing_local_path(path)
    if problem is None and (pattern or path.lower().endswith(DATA_SUFFIXES)):
        import glob

        if not glob.glob(os.path.expanduser(path), recursive=True):
            what = "file matches" if pattern else "such local file"
            problem = f"no {what} {path!r} (resolved to {Path(path).expanduser().resolve()})"
    return problem
