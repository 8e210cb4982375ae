"""The report's figures as PNG bytes, drawn with matplotlib (the optional extra `batchspec[report]`).

Every figure overlays all the outputs of a report, one colour each, labelled with its configuration,
so one job and a sweep use the same code. `figures()` raises ImportError without matplotlib; the page
then shows its tables alone.
"""

from __future__ import annotations

import io
import textwrap
from dataclasses import dataclass, field

import numpy as np

from .data import Output


@dataclass
class Plot:
    title: str
    png: bytes


LABEL_WIDTH = 30  # characters per line of a configuration label in the plots


def figures(outs: list[Output]) -> list[Plot]:
    """The plots of `outs`, in the page's order; a plot with nothing to show is left out."""
    from matplotlib.figure import Figure  # deferred: only a page draws; no pyplot: no global state, no GUI backend

    canvas = Canvas(outs, Figure)
    if len(outs) > 1:
        throughput(canvas)
    acceptance_by_position(canvas)
    per_request(canvas)
    rounds(canvas)
    latency(canvas)
    return canvas.plots


@dataclass
class Canvas:
    """What every plot of a report shares: the outputs, a colour and a label each, and the plots drawn."""

    outs: list[Output]
    figure_class: type
    plots: list[Plot] = field(default_factory=list)

    def __post_init__(self):
        self.several = len(self.outs) > 1
        self.colors = [f"C{i % 10}" for i in range(len(self.outs))]
        # Long configuration names are wrapped, not clipped: a tick label or legend entry keeps every word.
        self.labels = ["\n".join(textwrap.wrap(o.label, LABEL_WIDTH, break_on_hyphens=False)) or o.label
                       for o in self.outs]
        self.k_max = max((len(o.totals["acceptance_by_position"]) for o in self.outs), default=0)

    def new(self, title: str, xlabel: str, ylabel: str):
        fig = self.figure_class(figsize=(6.4, 3.7), dpi=100, layout="constrained")
        ax = fig.add_subplot()
        ax.set_title(title, fontsize=11)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
        return fig, ax

    def done(self, fig, ax, title: str, empty: bool = False) -> None:
        if empty:  # e.g. drafting plots of drafter none: the tables say "–"
            return
        if ax.get_legend_handles_labels()[0]:  # below the axes, where it hides no data
            fig.legend(loc="outside lower center", ncols=min(len(self.outs), 3), fontsize=9, title="configuration",
                       title_fontsize=9, frameon=False)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100)
        self.plots.append(Plot(title, buffer.getvalue()))

    def bars(self, title: str, xlabel: str, ylabel: str, series: list[list[float]]) -> None:
        """Grouped bars of shares (%): one group per x from 0, one bar per output."""
        fig, ax = self.new(title, xlabel, ylabel)
        width = max(len(s) for s in series)
        padded = [s + [0.0] * (width - len(s)) for s in series]
        bar_width = 0.8 / len(padded)
        for i, (values, color, label) in enumerate(zip(padded, self.colors, self.labels)):
            x = np.arange(len(values)) + (i - (len(padded) - 1) / 2) * bar_width
            ax.bar(x, values, width=bar_width, color=color, label=label)
        ax.set_xticks(range(width))
        self.done(fig, ax, title, empty=not any(sum(s) for s in series))

    def histogram(self, title: str, xlabel: str, values: list[np.ndarray], bins: np.ndarray,
                  mark_one: bool = False) -> None:
        """One distribution per output over requests (%), values outside the bins in the end bins."""
        fig, ax = self.new(title, xlabel, "requests (%)")
        for v, color, label in zip(values, self.colors, self.labels):
            if len(v):
                weights = np.full(len(v), 100.0 / len(v))
                clipped = np.clip(v, bins[0], bins[-1])
                if self.several:  # outlines over a light fill, so overlapping distributions stay readable
                    ax.hist(clipped, bins=bins, weights=weights, color=color, histtype="stepfilled", alpha=0.15)
                    ax.hist(clipped, bins=bins, weights=weights, color=color, histtype="step", linewidth=1.8,
                            label=label)
                else:
                    ax.hist(clipped, bins=bins, weights=weights, color=color, edgecolor="white", label=label)
        if mark_one:
            ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
            ax.text(1.0, 0.97, " 1 = no speedup", transform=ax.get_xaxis_transform(), va="top", fontsize=8,
                    color="grey")
        self.done(fig, ax, title, empty=not any(len(v) for v in values))


def throughput(canvas: Canvas) -> None:
    """Tokens per second by configuration (several outputs): one horizontal bar each."""
    title = "Throughput by configuration"
    fig, ax = canvas.new(title, "completion tokens per second of generation (tokens/s)", "")
    outs = canvas.outs
    y = np.arange(len(outs))[::-1]
    rates = [o.totals["tokens_per_s"] or 0.0 for o in outs]
    ax.barh(y, rates, color=canvas.colors)
    ax.set_yticks(y, canvas.labels, fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    for yi, o, rate in zip(y, outs, rates):
        tpf = o.totals["tokens_per_target_forward"]
        ax.text(rate, yi, f" {rate:.0f}" + (f" · {tpf:.2f} tok/fwd" if tpf else ""), va="center", fontsize=8)
    ax.set_xlim(0, max(rates + [1.0]) * 1.35)
    canvas.done(fig, ax, title)


def acceptance_by_position(canvas: Canvas) -> None:
    title = "Acceptance by draft position"
    fig, ax = canvas.new(title, "draft position in a round (1 = first draft)", "accepted / proposed")
    for o, color, label in zip(canvas.outs, canvas.colors, canvas.labels):
        rates = [np.nan if a is None else a for a in o.totals["acceptance_by_position"]]
        if rates:
            ax.plot(np.arange(1, len(rates) + 1), rates, marker="o", color=color, label=label)
    ax.set_ylim(0, 1.02)
    ax.set_xticks(np.arange(1, canvas.k_max + 1) if canvas.k_max else [])
    canvas.done(fig, ax, title, empty=canvas.k_max == 0)


def per_request(canvas: Canvas) -> None:
    """Acceptance and tokens per target forward, each a distribution over requests."""
    outs = canvas.outs
    canvas.histogram("Acceptance per request", "drafts accepted / drafts proposed, per request",
                     [o.acceptance for o in outs], np.linspace(0, 1, 21))
    top = max([canvas.k_max + 1.0, 2.0] + [float(o.tokens_per_forward.max()) for o in outs
                                           if len(o.tokens_per_forward)])
    bins = np.arange(0.875, top + 0.25, 0.25)  # centred on 1, 1.25, ...
    canvas.histogram("Tokens per target forward, per request", "completion tokens / target forwards (tokens)",
                     [o.tokens_per_forward for o in outs], bins, mark_one=True)


def rounds(canvas: Canvas) -> None:
    """Verify rounds by the drafts they checked, and request-rounds by the drafts they accepted."""
    canvas.bars("Rounds by drafts checked (the k of each round)",
                "drafts checked by the verify pass, k (0 = plain decoding)", "verify rounds (%)",
                [share(o.totals["rounds_by_k"]) for o in canvas.outs])
    canvas.bars("Drafts accepted per verify round", "drafts accepted in one verify round of one request",
                "request-rounds (%)", [share(o.accepted_per_round) for o in canvas.outs])


def latency(canvas: Canvas) -> None:
    latencies = [o.latency_s for o in canvas.outs]
    longest = max([float(np.percentile(v, 99)) for v in latencies if len(v)] + [1e-3])
    canvas.histogram("Latency per request", "admission to finish (s; the slowest 1% in the last bin)", latencies,
                     np.linspace(0, longest * 1.05, 31))


def share(counts: list[int]) -> list[float]:
    total = sum(counts)
    return [100.0 * n / total for n in counts] if total else []
