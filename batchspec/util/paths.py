"""Model paths: tell a local path that does not exist from a hub id, without importing torch (the
job runner checks its model paths before it reads the input, and a finished job's rerun loads nothing)."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse
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


def offline_hub_id(name_or_path: str, *, timeout_s: float = 2.0) -> str | None:
    """Why a name that reads as a hub id (no local folder of that name) cannot be loaded here, or None: the hub
    is off (HF_HUB_OFFLINE) or cannot be reached, and the name is not in the local Hugging Face cache.
    transformers' own answer offline is ~40 s of retries, each warning printed twice, then a long error."""
    if Path(name_or_path).expanduser().exists() or missing_local_path(name_or_path):
        return None
    from huggingface_hub import constants, try_to_load_from_cache  # deferred: only names that read as hub ids

    if isinstance(try_to_load_from_cache(name_or_path, "config.json"), str):
        return None  # cached: transformers loads it offline
    if constants.HF_HUB_OFFLINE:
        why = "HF_HUB_OFFLINE is set"
    else:
        url = urlparse(constants.ENDPOINT)
        try:
            socket.create_connection((url.hostname, url.port or 443), timeout=timeout_s).close()
            return None
        except OSError as error:
            why = f"{url.hostname} cannot be reached: {error.strerror or type(error).__name__}"
    return (f"no local folder {name_or_path!r} here, and it is not in the Hugging Face cache; the hub is off "
            f"({why}): pass the path of a local model folder")


def missing_source_path(path: str) -> str | None:
    """missing_local_path for `source.path` (a URL such as hf:// is the reader's business). Files and globs
    need no check here: the sources refuse a missing one without asking the hub."""
    return None if "://" in path else missing_local_path(path)
