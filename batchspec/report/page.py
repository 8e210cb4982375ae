"""The report as one self-contained HTML page (inline CSS, images as data URIs).

The figures are one table with a column per output, so one job and a sweep read the same way: for a
sweep it is the side-by-side comparison (the best value of a ranked row highlighted), and the plots
overlay the outputs. The outputs' names and labels are labels.py's, the figures columns.py's; the
terminal summary is terminal.py's.
"""

from __future__ import annotations

import base64
import html
import time
from typing import Any

from .columns import COLUMNS, best_index, cell, num
from .data import Output
from .labels import describe, label_outputs  # noqa: F401 (label_outputs: for callers of page)
from .plots import Plot
from .terminal import terminal_summary  # noqa: F401 (for callers of page)

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


def plots_section(plots: list[Plot] | None, missing_plots: str) -> str:
    """The plots, each a <figure> with its PNG inline, on a line of its own: as many <img> elements (and
    lines that hold one, for a reader of the file) as the terminal summary counts plots."""
    if not plots:
        return (f"<h2>Plots</h2>\n<p class=missing>No plots: {esc(missing_plots)}. "
                "The tables above hold the same figures.</p>")
    figures = [f"<figure><img alt=\"{esc(p.title)}\" title=\"{esc(p.title)}\" "
               f"src=\"data:image/png;base64,{base64.b64encode(p.png).decode()}\"></figure>" for p in plots]
    return "<h2>Plots</h2>\n<div class=plots>\n" + "\n".join(figures) + "\n</div>"


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
    body.append(plots_section(plots, missing_plots))
    body += [output_section(o, several) for o in outs]
    return (f"<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8><title>{esc(title)}</title>"
            f"<meta name=viewport content=\"width=device-width, initial-scale=1\"><style>{CSS}</style></head>"
            "<body>\n" + "\n".join(b for b in body if b) + "\n</body></html>\n")


def fmt(x, spec: str) -> str:
    return "–" if x is None else format(x, spec)
