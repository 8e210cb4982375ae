"""The figures of an output, one row of the page's table each, shared by the page and the terminal."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..engine.runstats import rounds_by_k_text
from .data import Output


def num(x, fmt: str = ".2f") -> str:
    return "–" if x is None or (isinstance(x, float) and np.isnan(x)) else format(x, fmt)


def pct(v: np.ndarray, q: float) -> float | None:
    return float(np.percentile(v, q)) if len(v) else None


def forced_text(totals: dict) -> str:
    forced = totals.get("forced_tokens") or 0
    return f"{totals['forced_accepted']} / {forced} ({totals['forced_accepted'] / forced:.3f})" if forced else "–"


def structured_text(totals: dict) -> str:
    s = totals.get("structured") or {}
    if not s.get("rows"):
        return "–"
    return f"{s['rows']}: {s['complete']} complete, {s['cut']} cut short, {s['error']} errors, {s['refused']} refused"


# (header, value of an output, format, higher is better / lower is better / None: not ranked)
Column = tuple[str, Callable[[Output], Any], str, bool | None]
COLUMNS: list[Column] = [
    ("rows", lambda o: o.totals["rows"], "d", None),
    ("errors", lambda o: o.totals["rows_error"], "d", None),
    ("tokens/s", lambda o: o.totals["tokens_per_s"], ".1f", True),
    ("tokens per target forward", lambda o: o.totals["tokens_per_target_forward"], ".2f", True),
    # The drafter's own drafts: a grammar's forced drafts (accepted almost always) would rank drafter none first.
    ("acceptance", lambda o: o.totals.get("proposed_acceptance_rate", o.totals["acceptance_rate"]), ".3f", True),
    ("forced drafts (structured output): accepted / forced", lambda o: forced_text(o.totals), "s", None),
    ("structured output rows", lambda o: structured_text(o.totals), "s", None),
    ("acceptance by position", lambda o: " ".join(num(a) for a in o.totals["acceptance_by_position"]) or "–", "s", None),
    ("mean drafts accepted per round", lambda o: o.totals["mean_accepted_length"], ".2f", True),
    ("per-request acceptance p10 / p50 / p90",
     lambda o: " / ".join(num(pct(o.acceptance, q)) for q in (10, 50, 90)), "s", None),
    ("per-request tokens/forward p10 / p50 / p90",
     lambda o: " / ".join(num(pct(o.tokens_per_forward, q)) for q in (10, 50, 90)), "s", None),
    ("rounds by drafts checked", lambda o: rounds_by_k_text(o.totals["rounds_by_k"]), "s", None),
    ("tree rounds by shape", lambda o: "  ".join(f"{t} {n}" for t, n in (o.totals.get("rounds_by_tree") or {}).items())
     or "-", "s", None),
    ("latency p50 / p90 / max (s)",
     lambda o: " / ".join(num(pct(o.latency_s, q)) for q in (50, 90, 100)), "s", None),
    ("generation time (s)", lambda o: o.totals["wall_s"], ".1f", None),
    ("completion tokens", lambda o: o.totals["completion_tokens"], "d", None),
    ("predicted speedup vs plain decoding", lambda o: o.prediction.get("speedup"), ".2f", True),
    ("shards finished", lambda o: f"{len(o.shards['finished'])}/{o.shards['count']}", "s", None),
]


def cell(o: Output, column: Column) -> str:
    value = column[1](o)
    return value if column[2] == "s" else num(value, column[2])


def best_index(outs: list[Output], column: Column) -> int | None:
    if column[3] is None or len(outs) < 2:
        return None
    values = [column[1](o) for o in outs]
    known = [(v, i) for i, v in enumerate(values) if v is not None]
    return (max(known) if column[3] else min(known))[1] if known else None
