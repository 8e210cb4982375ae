"""The report's figures as PNG bytes, drawn with matplotlib (the optional extra `batchspec[report]`).

Every figure overlays all the outputs of a report, one colour each, labelled with its configuration,
so one job and a sweep use the same code. `figures()` raises ImportError without matplotlib; the page
then shows its tables alone.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from .data import Output


@dataclass
class Plot:
    title: str
    png: bytes


LABEL_WIDTH = 30  # characters per line of a configuration label in the plots

def figures(outs: list[Output]) -> list[Plot]:
    import textwrap

    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    several = len(outs) > 1
    colors = [f"C{i % 10}" for i in range(len(outs))]
    # Long configuration names are wrapped, not clipped: a tick label or legend entry keeps every word.
    labels = ["\n".join(textwrap.wrap(o.label, LABEL_WIDTH, break_on_hyphens=False)) or o.label for o in outs]
    k_max = max((len(o.totals["acceptance_by_position"]) for o in outs), default=0)
    plots = []

    def new(title: str, xlabel: str, ylabel: str):
        fig = Figure(figsize=(6.4, 3.7), dpi=100, layout="constrained")
        ax = fig.add_subplot()
        ax.set_title(title, fontsize=11)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
        return fig, ax

    def done(fig, ax, title: str, empty: bool = False):
        if empty:  # e.g. drafting plots of drafter none: the tables say "–"
            return
        if ax.get_legend_handles_labels()[0]:  # below the axes, where it hides no data
            fig.legend(loc="outside lower center", ncols=min(len(outs), 3), fontsize=9, title="configuration",
                       title_fontsize=9, frameon=False)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100)
        plots.append(Plot(title, buffer.getvalue()))

    def bars(ax, series: list[list[float]], offset0: int = 0):
        """Grouped bars: one group per x, one bar per output."""
        width = 0.8 / len(series)
        for i, (values, color, label) in enumerate(zip(series, colors, labels)):
            x = np.arange(len(values)) + offset0 + (i - (len(series) - 1) / 2) * width
            ax.bar(x, values, width=width, color=color, label=label)

    if several:
        title = "Throughput by configuration"
        fig, ax = new(title, "completion tokens per second of generation (tokens/s)", "")
        y = np.arange(len(outs))[::-1]
        rates = [o.totals["tokens_per_s"] or 0.0 for o in outs]
        ax.barh(y, rates, color=colors)
        ax.set_yticks(y, labels, fontsize=9)
        ax.grid(axis="x", alpha=0.3)
        for yi, o, rate in zip(y, outs, rates):
            tpf = o.totals["tokens_per_target_forward"]
            ax.text(rate, yi, f" {rate:.0f}" + (f" · {tpf:.2f} tok/fwd" if tpf else ""), va="center", fontsize=8)
        ax.set_xlim(0, max(rates + [1.0]) * 1.35)
        done(fig, ax, title)

    title = "Acceptance by draft position"
    fig, ax = new(title, "draft position in a round (1 = first draft)", "accepted / proposed")
    for o, color, label in zip(outs, colors, labels):
        rates = [np.nan if a is None else a for a in o.totals["acceptance_by_position"]]
        if rates:
            ax.plot(np.arange(1, len(rates) + 1), rates, marker="o", color=color, label=label)
    ax.set_ylim(0, 1.02)
    ax.set_xticks(np.arange(1, k_max + 1) if k_max else [])
    done(fig, ax, title, empty=k_max == 0)

    def histogram(title: str, xlabel: str, values: list[np.ndarray], bins: np.ndarray, mark_one: bool = False):
        fig, ax = new(title, xlabel, "requests (%)")
        for v, color, label in zip(values, colors, labels):
            if len(v):
                weights = np.full(len(v), 100.0 / len(v))
                clipped = np.clip(v, bins[0], bins[-1])
                if several:  # outlines over a light fill, so overlapping distributions stay readable
                    ax.hist(clipped, bins=bins, weights=weights, color=color, histtype="stepfilled", alpha=0.15)
                    ax.hist(clipped, bins=bins, weights=weights, color=color, histtype="step", linewidth=1.8,
                            label=label)
                else:
                    ax.hist(clipped, bins=bins, weights=weights, color=color, edgecolor="white", label=label)
        if mark_one:
            ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
            ax.text(1.0, 0.97, " 1 = no speedup", transform=ax.get_xaxis_transform(), va="top", fontsize=8,
                    color="grey")
        done(fig, ax, title, empty=not any(len(v) for v in values))

    histogram("Acceptance per request", "drafts accepted / drafts proposed, per request",
              [o.acceptance for o in outs], np.linspace(0, 1, 21))
    top = max([k_max + 1.0, 2.0] + [float(o.tokens_per_forward.max()) for o in outs if len(o.tokens_per_forward)])
    histogram("Tokens per target forward, per request", "completion tokens / target forwards (tokens)",
              [o.tokens_per_forward for o in outs], np.arange(0.875, top + 0.25, 0.25), mark_one=True)  # bins centred on 1, 1.25, ...

    title = "Rounds by drafts checked (the k of each round)"
    fig, ax = new(title, "drafts checked by the verify pass, k (0 = plain decoding)", "verify rounds (%)")
    series = [share(o.totals["rounds_by_k"]) for o in outs]
    width = max(len(s) for s in series)
    bars(ax, [s + [0.0] * (width - len(s)) for s in series])
    ax.set_xticks(range(width))
    done(fig, ax, title, empty=not any(sum(s) for s in series))

    title = "Drafts accepted per verify round"
    fig, ax = new(title, "drafts accepted in one verify round of one request", "request-rounds (%)")
    series = [share(o.accepted_per_round) for o in outs]
    width = max(len(s) for s in series)
    bars(ax, [s + [0.0] * (width - len(s)) for s in series])
    ax.set_xticks(range(width))
    done(fig, ax, title, empty=not any(sum(s) for s in series))

    latencies = [o.latency_s for o in outs]
    longest = max([float(np.percentile(v, 99)) for v in latencies if len(v)] + [1e-3])
    histogram("Latency per request", "admission to finish (s; the slowest 1% in the last bin)", latencies,
              np.linspace(0, longest * 1.05, 31))
    return plots


def share(counts: list[int]) -> list[float]:
    total = sum(counts)
    return [100.0 * n / total for n in counts] if total else []
