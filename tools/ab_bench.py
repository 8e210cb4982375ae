"""This checkout against another one (say, main before a change), side by side: separate processes, interleaved.

    python tools/ab_bench.py --base /path/to/other/checkout --prompts batchspec/assets/demo/templated.parquet \\
        --num-prompts 300 --max-new-tokens 32 --batch-size 8,32,64 --drafters none,suffix:adaptive \\
        --row-lengths staggered --rounds 2 --json ab.json

For each batch size it runs one process per checkout, alternating base / this / base / this ... for
--rounds pairs; inside each process every contender runs once untimed (warm-up), then --repeats timed
runs interleaved. It prints each contender's median tokens/s per checkout (over every timed run of every
round), the ratio to the same checkout's drafter none, and this checkout's ratio to the base's. Both
checkouts run through the API they share (`build_generator`, `Request`, `RowParams.max_new_tokens` for
staggered lengths), so any earlier main can be the base. Run it on a quiet machine: ratios are only
comparable within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

CHILD = r'''
import json, random, sys, time
import torch
from batchspec.api import build_generator
from batchspec.calibrate import read_prompts
from batchspec.models import load_models
from batchspec.types import Request, RowParams
cfg = json.loads(sys.argv[1])
prompts = read_prompts(cfg["prompts"], cfg["num_prompts"])
models = load_models(cfg["target"], cfg["draft"] or None, dtype="float32", device="cpu", head=cfg["head"] or None)
def requests():
    for i, p in enumerate(prompts):
        n = random.Random(str(i)).randint(8, 2 * cfg["max_new_tokens"]) if cfg["staggered"] else cfg["max_new_tokens"]
        yield Request(str(i), p, params=RowParams(max_new_tokens=n))
def build(spec):
    drafter, _, mode = spec.partition(":")
    return build_generator(models, drafter=drafter, k=cfg["k"], batch_size=cfg["batch_size"],
                           max_new_tokens=2 * cfg["max_new_tokens"], max_seq_len=cfg["max_seq_len"],
                           adaptive=mode == "adaptive", corpus=None)
gens = {spec: build(spec) for spec in cfg["drafters"]}
out = {spec: [] for spec in cfg["drafters"]}
outputs = {}
for repeat in range(cfg["repeats"] + 1):
    for spec in cfg["drafters"]:
        gen = build(spec) if spec.startswith("suffix") else gens[spec]  # suffix learns the job: start afresh
        gen.reset_stats()
        t = time.perf_counter()
        results = list(gen.run(requests()))
        seconds = time.perf_counter() - t
        outputs[spec] = {r.id: r.completion_token_ids for r in results}
        if repeat:
            out[spec].append(gen.stats.completion_tokens / seconds)
same = {spec: outputs[spec] == outputs[cfg["drafters"][0]] for spec in cfg["drafters"]}
print("RESULT " + json.dumps({"rates": out, "same_as_first": same}))
'''


def run(checkout: Path, cfg: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg)], env=env, capture_output=True, text=True,
                          cwd="/tmp")
    line = next((l for l in done.stdout.splitlines() if l.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"ab_bench: the run in {checkout} failed:\n{done.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    demo = HERE / "batchspec" / "assets" / "demo"
    parser.add_argument("--base", required=True, help="the other checkout (its folder holding batchspec/)")
    parser.add_argument("--target", default=str(demo / "target"))
    parser.add_argument("--draft", default=str(demo / "draft"))
    parser.add_argument("--head", default="", help="an EAGLE-3 head folder, for the eagle drafter")
    parser.add_argument("--prompts", default=str(demo / "prompts.parquet"))
    parser.add_argument("--num-prompts", type=int, default=200)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--max-seq-len", type=int, default=512)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--batch-size", default="8")
    parser.add_argument("--drafters", default="none,suffix:adaptive",
                        help="contenders, drafter[:adaptive]; the first is the reference for ratios and outputs")
    parser.add_argument("--row-lengths", choices=("fixed", "staggered"), default="fixed")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1, help="base/this process pairs per batch size")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    drafters = [d.strip() for d in args.drafters.split(",") if d.strip()]
    report = []
    for batch in [int(b) for b in args.batch_size.split(",")]:
        cfg = dict(prompts=args.prompts, num_prompts=args.num_prompts, target=args.target, draft=args.draft,
                   head=args.head, max_new_tokens=args.max_new_tokens, max_seq_len=args.max_seq_len, k=args.k,
                   batch_size=batch, drafters=drafters, staggered=args.row_lengths == "staggered",
                   repeats=args.repeats)
        rates = {"base": {d: [] for d in drafters}, "this": {d: [] for d in drafters}}
        same = {"base": True, "this": True}
        for _ in range(args.rounds):
            for name, checkout in (("base", Path(args.base)), ("this", HERE)):
                result = run(checkout, cfg)
                for d in drafters:
                    rates[name][d] += result["rates"][d]
                same[name] &= all(result["same_as_first"].values())
        medians = {name: {d: statistics.median(r) for d, r in by.items()} for name, by in rates.items()}
        print(f"batch {batch}, {args.row_lengths} lengths ({len(rates['this'][drafters[0]])} timed runs each; "
              f"outputs equal to {drafters[0]}: base {same['base']}, this {same['this']})")
        for d in drafters:
            b, t = medians["base"][d], medians["this"][d]
            print(f"  {d:24s} base {b:8.1f} tok/s ({b / medians['base'][drafters[0]]:.2f}x)   "
                  f"this {t:8.1f} tok/s ({t / medians['this'][drafters[0]]:.2f}x)   this/base {t / b:.2f}", flush=True)
        report.append({"batch_size": batch, "row_lengths": args.row_lengths, "rates": rates, "medians": medians,
                       "outputs_equal": same})
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    random.seed(0)
    main()
