"""The report's summary on the terminal: the main figures of one output, or a line per output of several."""

from __future__ import annotations

from pathlib import Path

from ..engine.runstats import self_training_text
from .columns import COLUMNS, best_index, cell
from .data import Output

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
