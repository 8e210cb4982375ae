"""The report as one self-contained HTML page (inline CSS, images as data URIs) and a terminal summary.

The figures are one table with a column per output, so one job and a sweep read the same way: for a
sweep it is the side-by-side comparison (the best value of a ranked row highlighted), and the plots
overlay the outputs.
"""

from __future__ import annotations

import base64
import html
import os
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..types import rounds_by_k_text, self_training_text
from .data import Output
from .plots import Plot

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1320px;
       padding: 0 16px; color: #1b1f24; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }
h3 { font-size: 15px; margin-bottom: 6px; }
.meta, .note { color: #57606a; } .note { font-size: 13px; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; vertical-align: top; }
th { background: #f6f8fa; text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.best { font-weight: 700; background: #e6f4ea; }
code.text { white-space: pre-wrap; font-size: 12px; display: block; max-width: 440px; max-height: 7.5em;
            overflow: hidden; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 12px; }
.plots img { width: 100%; max-width: 640px; border: 1px solid #eee; }
.missing { background: #fff8c5; border: 1px solid #d4a72c; padding: 6px 10px; }
"""


# ---- labels --------------------------------------------------------------------------------------


def flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if key in ("shard", "batchspec") and not prefix:
            continue  # how and with which version it ran, not what it ran
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def drafting(cfg: dict[str, Any]) -> str:
    name = cfg.get("drafter")
    if name is None:
        return "configuration unknown"
    if name == "none":
        return "none (plain decoding)"
    trees = ",".join(cfg.get("trees") or [])
    if cfg.get("adaptive"):
        return f"{name} k≤{cfg.get('k_max')}" + (f" + trees {trees}" if trees else "") + " adaptive"
    # Without adaptive a tree, when given, drafts every round (the first tree of a list).
    return f"{name} tree {trees.split(',')[0]} fixed" if trees else f"{name} k={cfg.get('k_max')} fixed"


def sampling(cfg: dict[str, Any]) -> str:
    s = cfg.get("sampling") or {}
    if not s.get("temperature"):
        return "greedy"
    defaults = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0}
    return " ".join([f"T={s['temperature']:g}"] + [f"{k}={s[k]:g}" for k, d in defaults.items()
                                                    if s.get(k, d) != d] + [f"seed={s.get('seed', 0)}"])


def describe(cfg: dict[str, Any]) -> str:
    """The configuration in a line: drafting, sampling, batch size, length cap."""
    if not cfg:
        return "configuration unknown"
    parts = [drafting(cfg), sampling(cfg)]
    if cfg.get("batch_size") is not None:
        parts.append(f"batch {cfg['batch_size']}")
    if (cfg.get("sampling") or {}).get("max_new_tokens") is not None:
        parts.append(f"≤{cfg['sampling']['max_new_tokens']} new tokens")
    return ", ".join(parts)


def label_outputs(outs: list[Output]) -> None:
    """Name each output by its path below the common folder, and label it by what in its configuration
    differs from the others (one output: its whole configuration)."""
    common = Path(os.path.commonpath([o.path.absolute() for o in outs])) if len(outs) > 1 else None
    for o in outs:
        o.name = str(o.path) if common is None or o.path.absolute() == common else str(o.path.absolute().relative_to(common))
    if len(outs) == 1:
        outs[0].label = describe(outs[0].config)
        return
    flats = [flat(o.config) for o in outs]
    keys = sorted({k for f in flats for k in f})
    differ = [k for k in keys if len({repr(f.get(k)) for f in flats}) > 1]
    if len({repr(f.get("model.draft")) for f in flats if f.get("drafter") == "model"}) <= 1:
        differ = [k for k in differ if k != "model.draft"]  # only other drafters' "no draft model" differs
    in_drafting = {"drafter", "k_max", "adaptive"}.__contains__

    def in_sampling(key: str) -> bool:  # the keys that sampling() writes
        return key.startswith("sampling.") and key not in ("sampling.max_new_tokens", "sampling.stop")

    for o, f in zip(outs, flats):
        parts = [drafting(o.config)] if any(map(in_drafting, differ)) else []
        parts += [sampling(o.config)] if any(map(in_sampling, differ)) else []
        parts += [f"{k.removeprefix('sampling.')}={f.get(k)}" for k in differ if not in_drafting(k) and not in_sampling(k)]
        o.label = ", ".join(parts) or o.name
    seen: dict[str, int] = {}
    for o in outs:
        seen[o.label] = seen.get(o.label, 0) + 1
    for o in outs:
        if seen[o.label] > 1:
            o.label = f"{o.label} ({o.name})"


# ---- the figures of an output, shared by the page and the terminal -------------------------------


def num(x, fmt: str = ".2f") -> str:
    return "–" if x is None or (isinstance(x, float) and np.isnan(x)) else format(x, fmt)


def pct(v: np.ndarray, q: float) -> float | None:
    return float(np.percentile(v, q)) if len(v) else None


# (header, value of an output, format, higher is better / lower is better / None: not ranked)
Column = tuple[str, Callable[[Output], Any], str, bool | None]
COLUMNS: list[Column] = [
    ("rows", lambda o: o.totals["rows"], "d", None),
    ("errors", lambda o: o.totals["rows_error"], "d", None),
    ("tokens/s", lambda o: o.totals["tokens_per_s"], ".1f", True),
    ("tokens per target forward", lambda o: o.totals["tokens_per_target_forward"], ".2f", True),
    ("acceptance", lambda o: o.totals["acceptance_rate"], ".3f", True),
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


# ---- HTML ----------------------------------------------------------------------------------------


def esc(x: Any) -> str:
    return html.escape(str(x))


def table(headers: list[str], rows: list[list[str]], numeric: set[int] = frozenset(),
          best: set[tuple] = frozenset()) -> str:
    """An HTML table; cells are escaped here (a header's lines are joined with <br>). best: the (row,
    column) cells to highlight."""
    out = ["<table><tr>" + "".join(f"<th>{'<br>'.join(map(esc, h.splitlines()))}</th>" for h in headers) + "</tr>"]
    for r, row in enumerate(rows):
        tds = []
        for c, value in enumerate(row):
            classes = " ".join(x for x in ("num" if c in numeric else "", "best" if (r, c) in best else "") if x)
            tds.append(f"<td class=\"{classes}\">{esc(value)}</td>" if classes else f"<td>{esc(value)}</td>")
        out.append("<tr>" + "".join(tds) + "</tr>")
    return "\n".join(out) + "</table>"


def figures_table(outs: list[Output]) -> str:
    """One row per figure, one column per output: side by side, the best of a ranked figure highlighted."""
    headers = ["figure"] + ([f"{o.name}\n{o.label}" for o in outs] if len(outs) > 1 else ["value"])
    best = {(i, best_index(outs, c) + 1) for i, c in enumerate(COLUMNS) if best_index(outs, c) is not None}
    rows = [[c[0]] + [cell(o, c) for o in outs] for c in COLUMNS]
    return table(headers, rows, numeric=set(range(1, len(headers))), best=best)


def text_cell(text: str | None, limit: int = 240) -> str:
    text = text or ""
    return text if len(text) <= limit else text[:limit] + "…"


def requests_table(rows: list[dict[str, Any]]) -> str:
    headers = ["id", "tokens/forward", "acceptance", "accepted / drafted", "tokens", "finish", "prompt", "completion"]
    out = ["<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in headers) + "</tr>"]
    for r in rows:
        out.append(
            f"<tr><td>{esc(r['id'])}</td><td class=num>{num(r['tokens_per_forward'])}</td>"
            f"<td class=num>{num(r['acceptance_rate'], '.3f')}</td>"
            f"<td class=num>{r['accepted_tokens']} / {r['draft_tokens']}</td><td class=num>{r['completion_tokens']}</td>"
            f"<td>{esc(r['finish_reason'])}</td><td><code class=text>{esc(text_cell(r['prompt']))}</code></td>"
            f"<td><code class=text>{esc(text_cell(r['completion']))}</code></td></tr>")
    return "\n".join(out) + "</table>"


def config_block(o: Output) -> str:
    cfg = o.config
    return (f"<p><b>{esc(describe(cfg))}</b><br><span class=note>target {esc((cfg.get('model') or {}).get('target'))}"
             + (f", draft {esc(cfg['model']['draft'])}" if (cfg.get("model") or {}).get("draft") else "")
             + f"; configuration from {esc(o.config_source)}"
            + (f"; parts written at batch sizes {o.batch_sizes}" if len(o.batch_sizes) > 1 else "") + "</span></p>")


def output_section(o: Output, several: bool) -> str:
    """Shards, predicted speedup, errors and the best / worst requests of one output (several: folded)."""
    t = o.totals
    parts = [f"<h2>{esc(o.name)}</h2>" + config_block(o)] if several else ["<h2>Details</h2>"]
    if len(o.shards["finished"]) < o.shards["count"]:
        parts.append(f"<p class=missing>Incomplete: {len(o.shards['finished'])} of {o.shards['count']} shards "
                     "have finished; the figures cover the parts written so far.</p>")
    pred = o.prediction
    if "speedup" in pred:
        c = pred["curve"]
        curve = ", ".join(f"{tokens} tok {ms:.2f} ms" for tokens, ms in sorted(c.target_ms.items()))
        parts.append(f"<p>Predicted speedup over plain decoding: <b>{pred['speedup']:.2f}×</b> (tokens per target "
                     f"forward × t(1) / mean round cost {pred['round_ms']:.2f} ms). Cost curve from {esc(c.source)} at "
                     f"batch {c.batch_size}" + (f", ~{c.context} tokens cached" if c.context else "")
                     + f": target forward {esc(curve)}"
                     + (f"; draft forward {c.draft_ms:.2f} ms" if c.draft_ms else "") + ".</p>")
    else:
        parts.append(f"<p class=note>Predicted speedup: none — {esc(pred.get('why', ''))}.</p>")
    if o.self_training:
        rows = [[shard, x.get("fallback") or "ngram", str(x["rows_before"]), fmt(x["tokens_per_s_before"], ".1f"),
                 f"{x['train_s']:.0f}", str(x["rows_after"]), fmt(x["tokens_per_s_after"], ".1f"),
                 str(x.get("rows_back") or 0), fmt(x.get("tokens_per_s_back"), ".1f"),
                 str(x.get("break_even_row") or "–")] for shard, x in o.self_training.items()]
        parts.append("<h3>Self-trained EAGLE head (model.draft=train)</h3>" + table(
            ["shard", "fallback drafter", "rows before", "tokens/s before", "training s", "rows with the head",
             "tokens/s with the head", "rows with the fallback after the trial", "tokens/s after the trial",
             "break-even row"], rows, numeric=set(range(2, 10))))
    reasons = t["finish_reasons"]
    parts.append("<h3>Finish reasons and errors</h3>" + table(
        ["finish reason", "rows"], [[k, str(v)] for k, v in sorted(reasons.items())] or [["–", "0"]], numeric={1}))
    if t["errors"]:
        parts.append(table(["error (most frequent first)", "rows"], [[k, str(v)] for k, v in t["errors"].items()],
                           numeric={1}))
    requests = []
    if o.best:
        requests.append("<h3>Requests that drafted best (most tokens per target forward)</h3>" + requests_table(o.best))
    if o.worst:
        requests.append("<h3>Requests that drafted worst</h3>" + requests_table(o.worst))
    if not o.best:
        parts.append("<p class=note>No request drafted (drafter none, or every row failed).</p>")
    elif several:
        parts.append(f"<details><summary>Requests that drafted best and worst</summary>{''.join(requests)}</details>")
    else:
        parts += requests
    return "\n".join(parts)


def render(outs: list[Output], plots: list[Plot] | None, missing_plots: str = "") -> str:
    several = len(outs) > 1
    title = (f"batchspec report: {len(outs)} outputs" if several else f"batchspec report: {outs[0].path}")
    body = [f"<h1>{esc(title)}</h1>",
            f"<p class=meta>Generated {esc(time.strftime('%Y-%m-%d %H:%M:%S %z'))} by python -m batchspec.report from "
            "the output folders' Parquet parts and shard markers (nothing was rerun).</p>"]
    if several:
        body.append("<h2>Side by side</h2>" + table(["output", "configuration"], [[o.name, describe(o.config)]
                                                                                  for o in outs]))
        body.append("<p class=note>The best value of a ranked figure is highlighted.</p>")
    else:
        body.append(config_block(outs[0]))
    body.append(figures_table(outs))
    body.append("<h2>Plots</h2>")
    if plots:
        body.append("<div class=plots>" + "".join(
            f"<figure><img alt=\"{esc(p.title)}\" title=\"{esc(p.title)}\" "
            f"src=\"data:image/png;base64,{base64.b64encode(p.png).decode()}\"></figure>" for p in plots) + "</div>")
    else:
        body.append(f"<p class=missing>No plots: {esc(missing_plots)}. The tables above hold the same figures.</p>")
    body += [output_section(o, several) for o in outs]
    return (f"<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8><title>{esc(title)}</title>"
            f"<meta name=viewport content=\"width=device-width, initial-scale=1\"><style>{CSS}</style></head>"
            "<body>\n" + "\n".join(b for b in body if b) + "\n</body></html>\n")


# ---- terminal ------------------------------------------------------------------------------------

TERMINAL = ["rows", "errors", "tokens/s", "tokens per target forward", "acceptance",
            "predicted speedup vs plain decoding"]
SHORT = {"tokens per target forward": "tok/fwd", "predicted speedup vs plain decoding": "predicted"}


def terminal_summary(outs: list[Output], html_path: Path, plots: int, missing_plots: str = "") -> str:
    lines = [f"batchspec report: {len(outs)} output{'s' if len(outs) > 1 else ''} -> {html_path}"
             + (f" ({plots} plots)" if plots else f" (tables only: {missing_plots})")]
    columns = {c[0]: c for c in COLUMNS}
    if len(outs) == 1:
        o = outs[0]
        lines.append(f"  {o.label}")
        trees = ("tree rounds by shape",) if o.totals.get("rounds_by_tree") else ()
        for name in ("rows", "errors", "tokens/s", "tokens per target forward", "acceptance", "acceptance by position",
                     "rounds by drafts checked", *trees, "latency p50 / p90 / max (s)", "shards finished"):
            lines.append(f"  {name:<28} {cell(o, columns[name])}")
        pred = o.prediction
        lines.append(f"  {'predicted speedup':<28} " + (f"{pred['speedup']:.2f}x" if "speedup" in pred else
                                                         f"- ({pred.get('why', '')})"))
        for shard, x in o.self_training.items():
            lines.append(f"  {'self-trained head':<28} shard {shard}: {self_training_text(x)}")
        return "\n".join(lines)
    headers = [SHORT.get(h, h) for h in TERMINAL]
    name_width = max(len(o.name) for o in outs)
    label_width = max(len(o.label) for o in outs)
    lines.append(f"  {'output':<{name_width}}  {'configuration':<{label_width}}  " + "  ".join(f"{h:>9}" for h in headers))
    best = best_index(outs, columns["tokens/s"])
    for i, o in enumerate(outs):
        values = "  ".join(f"{cell(o, columns[h]):>9}" for h in TERMINAL)
        lines.append(f"  {o.name:<{name_width}}  {o.label:<{label_width}}  {values}" + ("  <- fastest" if i == best else ""))
    if best is not None:
        lines.append("  fastest: by tokens/s of runs made at different times; under different machine load they "
                     "are not comparable (python -m batchspec.bench measures side by side)")
    reasons = sorted({o.prediction["why"] for o in outs if "why" in o.prediction})
    lines += [f"  predicted speedup: {why}" for why in reasons]
    lines += [f"  {o.name}: INCOMPLETE: {len(o.shards['finished'])} of {o.shards['count']} shards finished"
              for o in outs if len(o.shards["finished"]) < o.shards["count"]]
    return "\n".join(lines)


def fmt(x, spec: str) -> str:
    return "–" if x is None else format(x, spec)
