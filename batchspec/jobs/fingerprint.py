"""What decides a job's rows, kept in job.json: a resume under other values, or over an input whose rows
moved, is refused with one line naming the key (docs/jobs.md: Resume and idempotence)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Mapping

from ..util.files import atomic_write_text
from .config import ConfigError, JobConfig, Verify, draft_path
from .layout import part_files, read_json

log = logging.getLogger("batchspec")


# Keys whose values decide what the output rows contain: a resumed run must agree on them.
FINGERPRINT_KEYS = ("drafter", "model.target", "model.draft", "model.dtype", "sampling", "source.path",
                    "source.format", "source.split", "source.prompt_column", "source.id_column",
                    "source.template", "source.chat", "source.keep_columns", "source.row_params", "max_seq_len")

def select(config: Mapping[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node

def drafter_changes_rows(job: JobConfig) -> bool:
    """Greedy decoding and coupled sampling give the same rows whatever the drafter, k, adaptive choices,
    trees or batch (every token is the target's own); only rejection sampling of sampled rows depends on
    them. So a half-done greedy or coupled job may switch drafter and resume."""
    s = job.sampling
    return s.verify == Verify.rejection and (s.temperature > 0 or "temperature" in job.source.row_params)

def fingerprint(composed: Mapping[str, Any], job: JobConfig) -> dict[str, Any]:
    values = {key: select(composed, key) for key in FINGERPRINT_KEYS}
    if not drafter_changes_rows(job):
        values["drafter"] = values["model.draft"] = None  # not part of what the output depends on
    elif draft_path(job) is None:
        values["model.draft"] = None  # not used
    return values

def flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"sampling": {"seed": 1}} -> {"sampling.seed": 1}: a refusal names the leaf key that changed."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat

def check_fingerprint(out_dir: Path, current: dict[str, Any], *, source=None,
                      layout: list[dict[str, Any]] | None = None, running: bool = False) -> None:
    """Refuse to resume into an output dir whose rows were made under a config that changes them, or,
    with positional ids (`source` and its `layout` given), from an input whose rows have moved since.
    `running`: another run is writing the dir now, so its job.json counts even before it has parts."""
    path = out_dir / "job.json"
    has_parts = bool(part_files(out_dir))
    if not path.exists() or not (has_parts or running):
        return
    job = read_json(path, "it records the config the rows were made with; delete it to resume anyway")
    stored, now = flatten(job.get("fingerprint", {})), flatten(current)
    for key in list(now) + [k for k in stored if k not in now]:
        if stored.get(key) != now.get(key):
            made = "holds rows made with" if has_parts else "is being written by another run with"
            raise ConfigError(
                f"output.dir {out_dir} {made} a different {key} ({stored.get(key)!r}, now "
                f"{now.get(key)!r}): choose another output.dir, or delete {path} to add to it anyway"
            )
    change = source.layout_change(job["input"], layout) if source is not None and job.get("input") else None
    if change:
        raise ConfigError(
            f"the input changed since the rows in {out_dir} were made: {change}; with positional ids (no "
            "source.id_column) rows would be matched to other rows' outputs: restore the input, or set "
            "source.id_column, or choose another output.dir"
        )

def write_fingerprint(out_dir: Path, current: dict[str, Any], layout: list[dict[str, Any]] | None = None) -> None:
    atomic_write_text(out_dir / "job.json", json.dumps({"fingerprint": current, "input": layout}, indent=2) + "\n")
