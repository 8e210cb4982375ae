"""The held-out grid: adaptive speculation judged on pairs and prompts nothing in the controller was fitted on.

    python tools/heldout_grid.py --pair p512=/work/heldout/p512 --pair p384=/work/heldout/p384 \\
        --rows 32 --max-new-tokens 64 --batch-size 1,8,32,64 --lengths fixed,staggered --temperature 0,0.7 \\
        --drafters model,ngram,prompt_lookup,suffix --json grid.json

A pair is NAME=FOLDER, a folder `tools/build_demo.py --out FOLDER` wrote (target/, draft/, prompts.parquet:
prompts cut from files the pair never trained on, and eagle/ when built with --eagle), or
NAME=TARGET,DRAFT,PROMPTS[,HEAD] (DRAFT '' for none). Every cell (pair, rows, lengths, batch size,
temperature) is one `python -m batchspec.bench` run in this process: drafter none, each drafter at fixed k
(--fixed-k, default 1, 2 and 4) and adaptive (k up to the largest), interleaved, --repeats timed runs each
after an untimed one, every run a job of its own (`--fresh`: the controller starts from the machine's cached
costs and nothing else); with --interleave the contenders' jobs advance round by round in one stretch of time
(the bench's --interleave), and --noise-check adds drafter none a second time. It prints a
line per cell as it goes, then per drafter the worst and the median over the cells of adaptive's tokens/s
over drafter none's and over the best fixed k's (only in cells where some fixed k beat none by 5% or more),
and whether every greedy or coupled output equalled drafter none's.

The developers' workloads (the demo pair on its held-out and templated prompts) tuned the controller: they
are not a pair here. docs/benchmarks.md says which workloads tuned what and which judged it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from batchspec.bench import main as bench  # noqa: E402
from batchspec.bench.report import side_by_side  # noqa: E402


def parse_pair(text: str) -> tuple[str, dict]:
    name, _, spec = text.partition("=")
    if not name or not spec:
        raise argparse.ArgumentTypeError(f"--pair {text!r}: expected NAME=FOLDER or NAME=TARGET,DRAFT,PROMPTS[,HEAD]")
    parts = spec.split(",")
    if len(parts) == 1:
        folder = Path(parts[0])
        head = folder / "eagle"
        return name, {"target": str(folder / "target"), "draft": str(folder / "draft"),
                      "prompts": str(folder / "prompts.parquet"), "head": str(head) if head.is_dir() else None}
    if len(parts) not in (3, 4):
        raise argparse.ArgumentTypeError(f"--pair {text!r}: expected NAME=TARGET,DRAFT,PROMPTS[,HEAD]")
    return name, {"target": parts[0], "draft": parts[1], "prompts": parts[2], "head": parts[3] if len(parts) == 4 else None}


def cell_args(pair: dict, args, rows: int, lengths: str, batch: int, temperature: float, out: Path) -> list[str]:
    drafters = [d for d in args.drafters if (d != "model" or pair["draft"]) and (d != "eagle" or pair["head"])]
    argv = ["--target", pair["target"], "--draft", pair["draft"] or "", "--prompts", pair["prompts"],
            "--num-prompts", str(rows), "--max-new-tokens", str(args.max_new_tokens), "--row-lengths", lengths,
            "--batch-size", str(batch), "--k", args.fixed_k, "--repeats", str(args.repeats), "--drafters",
            ",".join(drafters), "--temperature", str(temperature), "--fresh", "--no-hf-static", "--no-hf-batch1",
            "--no-hf-batched", "--json", str(out)]
    if pair["head"]:
        argv += ["--head", pair["head"]]
    argv += [flag for flag, on in (("--chat", args.chat), ("--interleave", args.interleave),
                                   ("--noise-check", args.noise_check)) if on]
    if args.spare_slots:
        argv += ["--spare-slots", str(args.spare_slots)]
    return argv


def cell_ratios(report: dict) -> dict[str, dict]:
    """Per drafter: adaptive / none, adaptive / the best fixed k, the best fixed k / none, outputs identical."""
    rows = [r for r in report["rows"] if r["kind"] == "batchspec"]
    out = {}
    for drafter in sorted({r["drafter"] for r in rows} - {"none"}):
        mine = [r for r in rows if r["drafter"] == drafter]
        adaptive = next((r for r in mine if r["adaptive"]), None)
        fixed = [r for r in mine if not r["adaptive"]]
        if adaptive is None:
            continue
        best = max(fixed, key=lambda r: r["vs_none"]) if fixed else None
        out[drafter] = {
            "vs_none": adaptive["vs_none"],
            "best_fixed": best["contender"] if best else None,
            "best_fixed_vs_none": best["vs_none"] if best else None,
            "vs_best_fixed": side_by_side(adaptive["repeats_tokens_per_s"], best["repeats_tokens_per_s"]) if best else None,
            "identical": all(r["outputs_equal_to_none"] == r["num_prompts"] for r in mine),
            "tokens_per_forward": adaptive["tokens_per_forward"],
        }
    return out


def noise(report: dict) -> float | None:
    """--noise-check: drafter none's second contender over its first, a ratio that should be 1."""
    nones = [r for r in report["rows"] if r["kind"] == "batchspec" and r["drafter"] == "none"]
    return nones[1]["vs_none"] if len(nones) > 1 else None


def summary(cells: list[dict]) -> list[str]:
    lines = ["", "drafter          cells  vs none: worst  median   vs best fixed k (where it beat none by 5%): worst  "
             "median  cells   outputs"]
    for drafter in sorted({d for c in cells for d in c["ratios"]}):
        mine = [c["ratios"][drafter] for c in cells if drafter in c["ratios"]]
        vs_none = [m["vs_none"] for m in mine]
        paying = [m["vs_best_fixed"] for m in mine if m["best_fixed_vs_none"] and m["best_fixed_vs_none"] >= 1.05]
        same = "identical" if all(m["identical"] for m in mine) else "DIFFER"
        best = f"{min(paying):.2f}  {statistics.median(paying):.2f}  {len(paying):5d}" if paying else "   -     -      0"
        lines.append(f"{drafter:16s} {len(mine):5d}  {min(vs_none):13.2f}  {statistics.median(vs_none):6.2f}   "
                     f"{'':45s}{best}   {same}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", action="append", type=parse_pair, required=True, metavar="NAME=FOLDER")
    parser.add_argument("--rows", default="32", help="rows per job, a list (e.g. 32,1000)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--lengths", default="fixed,staggered")
    parser.add_argument("--batch-size", default="1,8,32,64")
    parser.add_argument("--temperature", default="0", help="a list: 0 (greedy), 0.7 (coupled sampling)")
    parser.add_argument("--drafters", default="model,eagle,ngram,prompt_lookup,suffix")
    parser.add_argument("--fixed-k", default="1,2,4", help="the fixed-k contenders of each drafter (adaptive's "
                        "ceiling is the largest)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chat", action="store_true", help="prompts through the target's chat template")
    parser.add_argument("--interleave", action="store_true", help="the bench's --interleave: every cell's "
                        "contenders round by round in one stretch of time (bench/interleave.py)")
    parser.add_argument("--noise-check", action="store_true", help="the bench's --noise-check: drafter none twice, "
                        "and the cell's line says what the second read over the first")
    parser.add_argument("--spare-slots", type=int, default=0, help="the bench's --spare-slots: batchspec's spare "
                        "cache slots, prompts prefilled ahead in waves")
    parser.add_argument("--json", help="every cell's ratios, written as the grid goes")
    args = parser.parse_args(argv)
    args.drafters = [d for d in args.drafters.split(",") if d]
    cells = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, pair in args.pair:
            for rows in (int(r) for r in args.rows.split(",")):
                for lengths in args.lengths.split(","):
                    for batch in (int(b) for b in args.batch_size.split(",")):
                        for temperature in (float(t) for t in args.temperature.split(",")):
                            out = Path(tmp) / "cell.json"
                            bench.main(cell_args(pair, args, rows, lengths, batch, temperature, out))
                            report = json.loads(out.read_text())
                            ran = report.get("prompts", rows)  # fewer when the pair's prompts run out
                            cell = {"pair": name, "rows": ran, "lengths": lengths, "batch": batch,
                                    "temperature": temperature, "ratios": cell_ratios(report),
                                    "none_tokens_per_s": next(r["tokens_per_s"] for r in report["rows"]
                                                              if r["drafter"] == "none"),
                                    "none_again_vs_none": noise(report)}
                            cells.append(cell)
                            again = "" if cell["none_again_vs_none"] is None else \
                                f" [none again {cell['none_again_vs_none']:.2f}x none]"
                            asked = "" if ran == rows else f" (of {rows} asked: the prompts hold {ran})"
                            ratios = ", ".join(f"{d} {m['vs_none']:.2f}x none ({m['vs_best_fixed']:.2f}x "
                                               f"{m['best_fixed']})" for d, m in cell["ratios"].items())
                            print(f"grid: {name} rows {ran}{asked} {lengths} batch {batch} T {temperature}: "
                                  f"{ratios}{again}", flush=True)
                            if args.json:
                                Path(args.json).write_text(json.dumps(cells, indent=1))
    print("\n".join(summary(cells)))


if __name__ == "__main__":
    main()
