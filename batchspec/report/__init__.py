"""`python -m batchspec.report OUT [OUT ...] [--html report.html]`: how a job or a sweep drafted, on one page.

    python -m batchspec.report outputs/demo                        # one job (all its shards)
    python -m batchspec.report outputs/demo/drafter.k=*            # a sweep's members side by side
    python -m batchspec.report outputs/sweep --html sweep.html     # a folder without data/: every output below it

The page goes to OUT/report.html for one output, to compare.html in the folder the outputs share for
several, or where --html says.

Reads output folders only (their Parquet parts, part metadata and shard markers; never reruns
anything) and writes one self-contained HTML page (inline CSS, plots as PNG data URIs: it opens
offline) plus a short summary on the terminal. The page has a table of figures per output (one row
each, side by side, for several): throughput, tokens per target forward, acceptance overall and by
draft position, per-request distributions, rounds by drafts checked (what adaptive speculation
chose), latency, errors by reason, the requests that drafted best and worst, and the speedup
predicted from the measured drafting and a cost curve (`calibrate.json` / `bench.json` next to an
output or its sweep: data.predict). Plots need matplotlib (`pip install 'batchspec[report]'`);
without it the page has the tables alone. Exit status 0, or 2 when an OUT holds no output.
"""

from .data import CostCurve, NotAnOutput, Output, find_outputs, load_output, predict, read_cost_curves
from .main import build_report, main

__all__ = ["build_report", "main", "find_outputs", "load_output", "predict", "read_cost_curves", "Output",
           "CostCurve", "NotAnOutput"]
