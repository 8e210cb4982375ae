"""What n samples save and what logprobs cost, measured side by side in one run (interleaved repeats).

    python tools/bench_features.py                      # the demo pair, 48 prompts, 3 repeats
    python tools/bench_features.py --prompts 96 --n 4 --repeats 5

1. n samples: `n=N` on P prompts against the same P prompts written out N times with n=1 (other ids,
   so every copy is prefilled): wall time, admission (prefill) time and prompt tokens prefilled.
2. logprobs: greedy decoding with the model drafter at logprobs None / 1 / 5 / 20: wall time, rounds
   and the cost per round against None.
Medians over the repeats; ratios are within one run on one machine, never against another run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402

import batchspec  # noqa: E402
from batchspec.engine.types import Request  # noqa: E402

DEMO = Path(batchspec.__file__).parent / "assets" / "demo"


def timed(generator, requests: list[Request]) -> dict:
    generator.reset_stats()
    started = time.perf_counter()
    results = list(generator.run(requests))
    wall = time.perf_counter() - started
    return {"wall": wall, "admit": generator.timings["admit"], "rounds": generator.stats.rounds,
            "tokens": sum(r.completion_tokens for r in results), "results": results}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=48)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--prompt-times", type=int, default=1, help="each prompt repeated this many times: longer "
                   "prompts, where the shared prefill of n samples matters more")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    prompts = pq.read_table(DEMO / "prompts.parquet").column("prompt").to_pylist()[: args.prompts]
    prompts = ["\n".join([p] * args.prompt_times) for p in prompts]
    models = batchspec.load_models(str(DEMO / "target"), str(DEMO / "draft"), dtype="float32", device="cpu")
    common = dict(batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, max_seq_len=1024)

    def build(**kw):
        return batchspec.build_generator(models, **{**common, **kw})

    n_samples_table(args, prompts, models, build)
    logprobs_table(args, prompts, build)


def n_samples_table(args, prompts: list[str], models, build) -> None:
    """n samples: `n=N` on the prompts against the prompts written out N times with n=1 (shared prefill)."""
    sampled = dict(drafter="model", k=4, temperature=0.8, seed=1)
    n_gen, copy_gen = build(n=args.n, **sampled), build(**sampled)
    grouped = [Request(id=str(i), prompt=t) for i, t in enumerate(prompts)]
    copies = [Request(id=f"{i}-{j}", prompt=t) for i, t in enumerate(prompts) for j in range(args.n)]
    runs: dict[str, list[dict]] = {"n": [], "copies": []}
    for _ in range(args.repeats + 1):  # the first repeat warms up and is dropped
        for name, gen, reqs in (("n", n_gen, grouped), ("copies", copy_gen, copies)):
            runs[name].append(timed(gen, reqs))
    prompt_tokens = sum(len(models.tokenizer(t)["input_ids"]) for t in prompts)
    med = {name: {key: statistics.median(r[key] for r in rs[1:]) for key in ("wall", "admit", "tokens")}
           for name, rs in runs.items()}
    print(f"n samples: {args.prompts} prompts ({prompt_tokens / args.prompts:.0f} tokens on average) x n={args.n}, "
          f"drafter model k=4, T=0.8, batch {args.batch_size}, "
          f"{args.max_new_tokens} new tokens, median of {args.repeats}")
    print(f"  {'':<22}{'wall s':>9}{'admit s':>9}{'tok/s':>9}{'prompt tokens prefilled':>26}")
    for name, label, prefilled in (("n", f"n={args.n}", prompt_tokens), ("copies", f"{args.n} copies, n=1",
                                                                        prompt_tokens * args.n)):
        m = med[name]
        print(f"  {label:<22}{m['wall']:>9.2f}{m['admit']:>9.2f}{m['tokens'] / m['wall']:>9.1f}{prefilled:>26}")
    print(f"  saving: admission {1 - med['n']['admit'] / med['copies']['admit']:.0%}, "
          f"wall {1 - med['n']['wall'] / med['copies']['wall']:.0%}")


def logprobs_table(args, prompts: list[str], build) -> None:
    """logprobs: greedy decoding at logprobs None / 1 / 5 / 20 (output checked identical), cost per round."""
    requests = [Request(id=str(i), prompt=t) for i, t in enumerate(prompts)]
    settings = [None, 1, 5, 20]
    gens = {k: build(drafter="model", k=4, adaptive=False, logprobs=k) for k in settings}
    lp_runs: dict = {k: [] for k in settings}
    for _ in range(args.repeats + 1):
        for k in settings:
            lp_runs[k].append(timed(gens[k], requests))
    reference = [r.completion_token_ids for r in sorted(lp_runs[None][0]["results"], key=lambda r: int(r.id))]
    for k in settings[1:]:
        got = [r.completion_token_ids for r in sorted(lp_runs[k][0]["results"], key=lambda r: int(r.id))]
        assert got == reference, f"logprobs={k} changed the greedy output"
    base = statistics.median(r["wall"] / r["rounds"] for r in lp_runs[None][1:])
    print(f"\nlogprobs: {args.prompts} prompts, greedy, drafter model k=4 fixed, batch {args.batch_size}, "
          f"median of {args.repeats} (output identical at every setting)")
    print(f"  {'logprobs':<10}{'wall s':>9}{'rounds':>8}{'ms/round':>10}{'vs none':>9}")
    for k in settings:
        wall = statistics.median(r["wall"] for r in lp_runs[k][1:])
        per = statistics.median(r["wall"] / r["rounds"] for r in lp_runs[k][1:])
        print(f"  {str(k):<10}{wall:>9.2f}{lp_runs[k][1]['rounds']:>8}{per * 1000:>10.2f}{per / base:>8.2f}x")


if __name__ == "__main__":
    main()
