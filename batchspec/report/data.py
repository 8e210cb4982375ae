"""Read output folders into the figures of a report: their part files and markers only, never a rerun.

Totals come from `sink.summarize` (the same numbers as summary.json, recomputed from the parts, so a
report of a job still running or resumed is current); the per-request columns are read part by part
for the distributions and the best / worst requests; the configuration from each part's
`batchspec.config` metadata (older outputs: summary.json's composed config).
"""

from __future__ import annotations

from collections import Counter

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

from ..jobs.layout import part_files, read_part, summarize

from ..jobs.schema import CONFIG_KEY
from ..engine.types import FINISH_ERROR, TreeSpec

ROW_COLUMNS = ["id", "finish_reason", "draft_tokens", "accepted_tokens", "acceptance_rate", "tokens_per_forward", "latency_s",
               "accepted_per_round"]
MARKER = re.compile(r"^shard-(\d+)-of-(\d+)\.json$")
NOT_MEMBERS = {"data", "shards", "logs", ".tmp"}  # folders of an output dir that are not sweep members


class NotAnOutput(ValueError):
    """A path that is neither an output dir nor a folder with output dirs below it."""


@dataclass
class Output:
    path: Path
    config: dict[str, Any]  # batchspec.config of the newest part (shard.output_config), or from summary.json
    config_source: str  # where `config` came from
    batch_sizes: list[int]  # every batch size the parts were written with (a resumed job may change it)
    totals: dict[str, Any]  # sink.summarize(): rows, tokens, wall_s, acceptance_by_position, rounds_by_k, ...
    shards: dict[str, Any]  # count, finished (indices with a finish marker)
    acceptance: np.ndarray  # per request that drafted: accepted / drafted
    tokens_per_forward: np.ndarray  # per request that did not fail
    latency_s: np.ndarray  # per request that did not fail
    accepted_per_round: list[int]  # verify rounds of a request by drafts accepted (the prefill left out)
    best: list[dict[str, Any]] = field(default_factory=list)  # requests that drafted best (tokens per forward)
    worst: list[dict[str, Any]] = field(default_factory=list)
    label: str = ""  # its configuration, as far as it tells it apart from the others in the report
    name: str = ""  # its path, relative to the outputs' common folder
    prediction: dict[str, Any] = field(default_factory=dict)  # predicted speedup, or why there is none
    self_training: dict[str, Any] = field(default_factory=dict)  # model.draft=train: per shard, before / after


def find_outputs(path: Path) -> list[Path]:
    """`path` itself if it is an output dir, and the output dirs below it (a sweep's members)."""
    # An output dir may also hold a sweep's members (output.dir=outputs/demo -m drafter.k=2,4 writes
    # outputs/demo/drafter.k=2 ...): they are reported beside it.
    found = []
    for root, dirs, _ in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d not in NOT_MEMBERS)
        if is_output(Path(root)):
            found.append(Path(root))
    if not found:
        raise NotAnOutput(f"{path} is not a batchspec output dir (no data/ or summary.json) and has none below it")
    return found


def is_output(path: Path) -> bool:
    return (path / "data").is_dir() or (path / "summary.json").is_file()


def load_output(path: Path, top: int = 5) -> Output:
    totals = summarize(path)
    configs: list[dict] = []
    acceptance, per_forward, latency = [], [], []
    by_accepted = np.zeros(0, dtype=np.int64)
    candidates = []  # [tokens per forward, acceptance, part, row] of the requests that drafted, per part
    files = part_files(path)
    for i, f in enumerate(files):
        table = read_part(f, ROW_COLUMNS, optional=("forced_tokens", "forced_accepted"))
        meta = (table.schema.metadata or {}).get(CONFIG_KEY)
        if meta is not None:
            configs.append(json.loads(meta))
        ok = np.asarray(pc.not_equal(table.column("finish_reason"), FINISH_ERROR).to_numpy(zero_copy_only=False))
        acc, proposed = proposed_acceptance(table)
        drafted = ok & (proposed > 0)
        tpf = table.column("tokens_per_forward").to_numpy(zero_copy_only=False)
        acceptance.append(acc[drafted].astype(float))
        per_forward.append(tpf[ok].astype(float))
        latency.append(table.column("latency_s").to_numpy()[ok])
        rounds = table.column("accepted_per_round")
        counts = np.bincount(pc.list_flatten(rounds).to_numpy(), minlength=1)
        counts[0] -= int(pc.sum(pc.greater(pc.list_value_length(rounds), 0)).as_py() or 0)  # each list opens with its prefill's 0
        by_accepted = np.pad(by_accepted, (0, max(0, len(counts) - len(by_accepted))))
        by_accepted[:len(counts)] += counts
        rows = np.flatnonzero(drafted)
        candidates.append(np.stack([tpf[rows].astype(float), acc[rows].astype(float), np.full(len(rows), i), rows]))
    summary = read_summary(path)
    if configs:
        config, source = configs[-1], "Parquet metadata (batchspec.config)"
    elif summary.get("config"):
        config, source = config_from_composed(summary["config"]), "summary.json (outputs older than batchspec.config)"
    else:
        config, source = {}, "unknown"
    out = Output(
        path=path, config=config, config_source=source,
        batch_sizes=sorted({c["batch_size"] for c in configs if "batch_size" in c}) or
        ([config["batch_size"]] if "batch_size" in config else []),
        totals=totals, shards=shard_markers(path, files),
        acceptance=np.concatenate(acceptance) if acceptance else np.zeros(0),
        tokens_per_forward=np.concatenate(per_forward) if per_forward else np.zeros(0),
        latency_s=np.concatenate(latency) if latency else np.zeros(0),
        accepted_per_round=[int(n) for n in by_accepted] if totals["draft_tokens"] else [],  # nothing drafted
        self_training=summary.get("self_training") or {},
    )
    if candidates:
        c = np.concatenate(candidates, axis=1)
        order = np.lexsort((c[1], c[0]))  # by tokens per forward, then acceptance; worst first
        out.best = request_rows(files, c[2:, order[::-1][:top]].astype(int).T)
        out.worst = request_rows(files, c[2:, order[:min(top, len(order) - top)]].astype(int).T)  # none twice
    return out


def proposed_acceptance(table) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the acceptance of the drafter's own drafts (a grammar's forced drafts left out; NaN where it
    proposed none) and how many it proposed."""
    drafts = table.column("draft_tokens").to_numpy().astype(float)
    accepted = table.column("accepted_tokens").to_numpy().astype(float)
    if "forced_tokens" in table.column_names:
        drafts = drafts - table.column("forced_tokens").to_numpy()
    if "forced_accepted" in table.column_names:
        accepted = accepted - table.column("forced_accepted").to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(drafts > 0, accepted / np.maximum(drafts, 1), np.nan), drafts


def request_rows(files: list[Path], picked: np.ndarray) -> list[dict[str, Any]]:
    """The picked requests' rows (pairs of part index, row index), with their text."""
    columns = ["id", "prompt", "completion", "completion_tokens", "target_forwards", "draft_tokens",
               "accepted_tokens", "acceptance_rate", "tokens_per_forward", "finish_reason"]
    tables = {i: read_part(files[i], columns) for i in {int(p) for p, _ in picked}}
    return [tables[int(p)].slice(int(r), 1).to_pylist()[0] for p, r in picked]


def read_summary(path: Path) -> dict[str, Any]:
    try:
        return json.loads((path / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def config_from_composed(composed: dict[str, Any]) -> dict[str, Any]:
    """batchspec.config's fields from a composed Hydra config (summary.json), resolving the defaults as
    batchspec.api.build_generator does: k 0 and no adaptive speculation for drafter none, adaptive
    null = on for greedy."""
    drafter = composed.get("drafter", {})
    sampling = composed.get("sampling", {})
    name = drafter.get("name", "none")
    adaptive = drafter.get("adaptive")
    if adaptive is None:
        adaptive = sampling.get("temperature", 0.0) == 0.0
    return {
        "drafter": name, "k_max": 0 if name == "none" else drafter.get("k"), "adaptive": bool(adaptive) and name != "none",
        "sampling": sampling, "batch_size": composed.get("batch_size"), "max_seq_len": composed.get("max_seq_len"),
        "model": {key: composed.get("model", {}).get(key) for key in ("target", "draft", "dtype")},
    }


def shard_markers(path: Path, files: list[Path]) -> dict[str, Any]:
    """Shard count (from the part names, else the markers) and the shards that have finished."""
    counts = {int(m.group(1)) for f in files if (m := re.search(r"-of-(\d+)-part-", f.name))}
    markers = [(int(m.group(1)), int(m.group(2))) for p in (path / "shards").glob("shard-*.json")
               if (m := MARKER.match(p.name))]
    count = max(counts | {c for _, c in markers}, default=1)
    return {"count": count, "finished": sorted(i for i, c in markers if c == count)}


# ---- cost curves and the predicted speedup ------------------------------------------------------

COST_FILES = ("calibrate.json", "bench.json")


@dataclass
class CostCurve:
    source: Path
    batch_size: int
    target_ms: dict[int, float]  # tokens per row in one target forward -> ms
    draft_ms: float | None  # one draft-model forward of 1 token; None when not measured
    context: int | None  # tokens cached when measured


def cost_files(out: Path) -> list[Path]:
    """calibrate.json / bench.json in the output dir, or above it through its sweep's key=value folders
    up to the sweep's output.dir: a cost curve put next to a sweep covers its members."""
    dirs = [out]
    while "=" in dirs[-1].name and dirs[-1].parent != dirs[-1]:
        dirs.append(dirs[-1].parent)
    return [d / name for d in dirs for name in COST_FILES if (d / name).is_file()]


def read_cost_curves(path: Path) -> list[CostCurve]:
    """The cost curves in the JSON of `python -m batchspec.calibrate --json` (one per batch size) or
    `python -m batchspec.bench --json` (one per batch size run); [] for anything else."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    curves = []
    if isinstance(data, dict) and isinstance(data.get("curves"), dict):  # calibrate
        for b, c in data["curves"].items():
            curves.append(CostCurve(path, int(b), {t + 1: float(ms) for t, ms in enumerate(c["target_ms"])},
                                    measured(c.get("draft_ms")), data.get("context_tokens")))
    for report in data if isinstance(data, list) else [data]:  # bench: one report per batch size
        if isinstance(report, dict) and isinstance(report.get("cost_ms"), dict) and "batch_size" in report:
            cost = report["cost_ms"]
            target = {int(m.group(1)): float(v) for key, v in cost.items() if (m := re.fullmatch(r"target_ms_(\d+)", key))}
            curves.append(CostCurve(path, int(report["batch_size"]), target, measured(cost.get("draft_ms_1")),
                                    cost.get("context")))
    return curves


def measured(ms) -> float | None:
    return float(ms) if ms else None  # 0 is what both commands record when no draft model was timed


def predict(out: Output, curves: list[CostCurve]) -> dict[str, Any]:
    """The speedup over plain decoding predicted from this output's measured drafting and a cost curve:

        tokens per target forward * t(1) / mean round cost,  round cost of k drafts = t(k + 1) + k * t_draft

    with the mean over the rounds by drafts checked (rounds_by_k) and by tree shape (rounds_by_tree: a
    BxD tree verifies B*D nodes after D draft steps, t(B*D + 1) + D * t_draft) — the bench's formula,
    each round at the shape it checked. t(T) is one target forward of T tokens per row at the job's batch
    size; t_draft one draft-model forward (0 for lookup drafters). Returns {"speedup", "curve"} or
    {"why": reason}."""
    cfg, totals = out.config, out.totals
    drafter = cfg.get("drafter")
    if drafter in (None, "none"):
        return {"why": "drafter none: plain decoding, the baseline" if drafter else "configuration unknown"}
    if not curves:
        return {"why": "no cost curve: no calibrate.json or bench.json next to the output or its sweep "
                       "(python -m batchspec.calibrate --json OUT/calibrate.json records one)"}
    sizes = sorted({c.batch_size for c in curves})
    batch = out.batch_sizes[-1] if len(out.batch_sizes) == 1 else None
    at_batch = [c for c in curves if c.batch_size == batch]
    if not at_batch:
        return {"why": f"cost curves at batch sizes {sizes} in {', '.join(sorted({c.source.name for c in curves}))}; "
                       f"none at this job's batch size {batch if batch else out.batch_sizes}"}
    # (tokens verified after the pending one, draft steps) -> rounds: chains of k, then trees BxD
    rounds = Counter({(k, k): n for k, n in enumerate(totals.get("rounds_by_k") or []) if n})
    for shape, n in (totals.get("rounds_by_tree") or {}).items():
        spec = TreeSpec.parse(shape)
        rounds[spec.nodes, spec.depth] += n
    tpf = totals.get("tokens_per_target_forward")
    if not rounds or not tpf:
        return {"why": "no verify rounds recorded"}
    for curve in at_batch:
        draft_ms = 0.0 if drafter != "model" else curve.draft_ms
        if draft_ms is None or any(v + 1 not in curve.target_ms for v, _ in rounds) or 1 not in curve.target_ms:
            continue
        round_ms = sum(n * (curve.target_ms[v + 1] + d * draft_ms) for (v, d), n in rounds.items()) / sum(rounds.values())
        return {"speedup": tpf * curve.target_ms[1] / round_ms, "curve": curve, "round_ms": round_ms}
    widths = sorted({v + 1 for v, _ in rounds})
    return {"why": f"the cost curve at batch {batch} lacks a forward of {widths} tokens"
                   + (" or a draft-model time" if drafter == "model" else "")}
