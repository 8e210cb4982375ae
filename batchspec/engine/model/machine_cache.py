"""Measurements of this machine kept across processes: what start-up timed (the packed forward's costs,
startup_costs.py; which linears run weight-first, few_rows.py), so that a resumed or repeated job reads them
instead of timing again, and every process of one machine decides alike.

Entries live in the user's cache ($BATCHSPEC_CACHE, else $XDG_CACHE_HOME/batchspec, else ~/.cache/batchspec),
one JSON file per key under a folder per kind, written by a rename. A key holds everything the measurement
depends on (shapes, dtype, the device and threads, the versions) and is stored in the file, so a file whose
name collides with another key's is never read as its. A measurement another process disturbed (torch's
threads waited for a CPU) is not stored. A cache that cannot be read or written is measured around.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

import torch

from .threads import waited_share

CACHE_ENV = "BATCHSPEC_CACHE"
MAX_WAIT = 0.15  # the share of the time torch's threads may wait for a CPU for a measurement to be kept


def cache_dir() -> Path:
    """$BATCHSPEC_CACHE, else $XDG_CACHE_HOME/batchspec, else ~/.cache/batchspec."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "batchspec"


def machine(device: torch.device) -> dict:
    """The device a measurement ran on: the GPU's name, or the CPU's model and torch's threads."""
    if device.type == "cuda":
        return {"device": torch.cuda.get_device_name(device)}
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"device": f"cpu {name}", "threads": torch.get_num_threads()}


def _path(kind: str, key: dict, folder: Path | None) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return (folder or cache_dir()) / kind / f"{digest}.json"


def read(kind: str, key: dict, folder: Path | None = None) -> dict | None:
    """The entry stored under `key`, or None."""
    try:
        stored = json.loads(_path(kind, key, folder).read_text())
        return stored["value"] if stored.get("key") == key else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write(kind: str, key: dict, value: dict, folder: Path | None = None) -> None:
    """Store `value` under `key` (atomically); a folder that cannot be written is left alone."""
    path = _path(kind, key, folder)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": key, "value": value}, indent=1))
        tmp.replace(path)
    except OSError:
        pass


def undisturbed(before, after, seconds: float) -> bool:
    """Whether torch's threads waited for a CPU less than MAX_WAIT of `seconds` between two threads.read_sample()
    readings (True where /proc cannot tell)."""
    share = waited_share(before, after, seconds, torch.get_num_threads())
    return share is None or share <= MAX_WAIT
