"""The command: find the outputs, read them, attach cost curves, draw, write the page, print a summary."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..util.files import atomic_write_text
from .data import NotAnOutput, Output, cost_files, find_outputs, load_output, predict, read_cost_curves
from .labels import label_outputs
from .page import render
from .terminal import terminal_summary


def build_report(paths: list[Path], html_path: Path | None = None, *, cost: list[Path] = (), top: int = 5,
                 plots: bool = True) -> tuple[list[Output], Path, str]:
    """Read `paths` (output dirs, or folders with output dirs below them), write the page; returns the
    outputs, the page's path and the terminal summary. Raises NotAnOutput."""
    found = [out for p in paths for out in find_outputs(Path(p))]
    outs = [load_output(p, top=top) for p in dict.fromkeys(found)]  # each once, in the order given
    extra = [c for f in cost for c in read_cost_curves(Path(f))]
    for o in outs:
        o.prediction = predict(o, extra + [c for f in cost_files(o.path) for c in read_cost_curves(f)])
    label_outputs(outs)
    drawn, missing = None, ""
    if plots:
        try:
            from .plots import figures  # deferred: matplotlib is optional (.[report]); tables need nothing
            drawn = figures(outs)
            missing = "" if drawn else "nothing to plot (no rows)"
        except ImportError as e:
            missing = f"matplotlib is not installed ({e}); pip install 'batchspec[report]'"
    else:
        missing = "plots were turned off (--no-plots)"
    if html_path is None:  # next to the output, or in the folder the outputs share (never over a job's report)
        try:
            common = Path(os.path.commonpath([o.path for o in outs]))  # relative if the paths given were
        except ValueError:  # relative and absolute paths mixed
            common = Path(os.path.commonpath([o.path.absolute() for o in outs]))
        html_path = outs[0].path / "report.html" if len(outs) == 1 else common / "compare.html"
    html_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(html_path, render(outs, drawn, missing))
    return outs, html_path, terminal_summary(outs, html_path, len(drawn or []), missing)


def main(argv: list[str] | None = None) -> int:
    # The package's docstring is the command's description; read from the package already imported (Python
    # imports a package before its modules), not imported from it, which would make the two a circle.
    doc = sys.modules[__package__].__doc__
    parser = argparse.ArgumentParser(prog="python -m batchspec.report", description=doc.splitlines()[0],
                                     epilog="\n".join(doc.splitlines()[2:5]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outputs", nargs="+", type=Path, metavar="OUT",
                        help="an output dir (a job and its shards), or a folder with output dirs below it (a sweep)")
    parser.add_argument("--html", type=Path, help="where to write the page (default: OUT/report.html for one "
                        "output, compare.html in the folder they share for several)")
    parser.add_argument("--cost", type=Path, action="append", default=[], metavar="JSON",
                        help="a cost curve for every output: the JSON of `python -m batchspec.calibrate --json` or "
                             "`python -m batchspec.bench --json` (default: calibrate.json / bench.json found next to "
                             "an output or its sweep)")
    parser.add_argument("--top", type=int, default=5, help="requests listed as drafting best and worst (default 5)")
    parser.add_argument("--no-plots", action="store_true", help="tables only")
    args = parser.parse_args(argv)
    try:
        _, _, summary = build_report(args.outputs, args.html, cost=args.cost, top=args.top, plots=not args.no_plots)
    except NotAnOutput as e:
        print(f"batchspec.report: error: {e}", file=sys.stderr)
        return 2
    print(summary, flush=True)
    return 0
