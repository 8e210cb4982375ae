"""Replay greedy completions through lookup drafters: does a workload have structure across rows?

    python tools/suffix_sim.py                                    # templated workload + the demo prompts
    python tools/suffix_sim.py --prompts P.parquet --batch 8 --limit 100

For each prompt file, the demo target's greedy completions are generated once with the public API
(`batchspec.generate(..., drafter="none", max_new_tokens=64, batch_size=8)`; cached under
outputs/suffix_sim/) and then replayed offline: B slots take the rows in order, and in every round each
running row proposes from what it has emitted so far, keeps the longest prefix of its proposal that
equals its real continuation plus one token of the target's own (the bonus), and the drafter learns
those tokens, as a verify round of the engine would. Rows that end leave their slot in that round and
the next rows come in; the suffix drafter's job-wide structure learns each finished row's completion
then, in completion order (rows ending in one round: in slot order). A row never drafts past its last
token: with R tokens to go it proposes at most R - 1 (the target emits the R-th), for every drafter.

Drafters replayed: suffix (engine/drafters/suffix_index.py) as a chain of up to k, with its own scaled
length (up to --scaled tokens: a match of m tokens may propose m), with a pseudo-count of 1
(prior_count), as a tree, with --prompt-context prompt tokens stored before each completion, and with
its per-request structure only; and the existing `ngram` and `prompt_lookup` drafters, re-implemented
here on host lists from their documented rules (engine/drafters/lookup.py; --check-baselines compares
these with the real drafters on every position of the first rows). For the scaled chains it also prints
how well the proposal probabilities predict acceptance (calibration).

Reported per drafter: drafts proposed and accepted (their ratio: acceptance), the share of rounds that
proposed anything, and tokens per target forward = completion tokens / (the prefill + verify rounds):
the number speculation turns into speed when a verify pass costs about what a plain step does (on 2 CPU
cores a longer draft costs more; see tools/suffix_cost.py and the bench). Greedy, so the replay is
exactly what the engine would accept.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if str(Path(__file__).resolve().parent) not in sys.path:  # the suffix_replay/ package beside this script
    sys.path.insert(0, str(Path(__file__).resolve().parent))

# The parts live in tools/suffix_replay/, one module each; their public names are handed on here.
from suffix_replay.baselines import check_baselines  # noqa: E402
from suffix_replay.drafters import NGramSim, PromptLookupSim, SuffixSim  # noqa: E402
from suffix_replay.replay import Tally, accepted_length, replay  # noqa: E402
from suffix_replay.workload import CACHE, Row, load_rows  # noqa: E402

DEMO = ROOT / "batchspec" / "assets" / "demo"
__all__ = ["CACHE", "DEMO", "NGramSim", "PromptLookupSim", "Row", "SuffixSim", "Tally", "accepted_length",
           "check_baselines", "drafters", "load_rows", "main", "parse_args", "replay", "replay_table"]


def drafters(k: int, scaled: int, tree: tuple[int, int], prompt_context: int):
    """The replayed drafters by name, each a factory of a fresh one."""
    return {
        f"suffix k={k}": lambda: SuffixSim(k),
        f"suffix scaled k<={scaled}": lambda: SuffixSim(scaled),
        f"suffix k={k}, prior_count=1": lambda: SuffixSim(k, prior_count=1.0),
        f"suffix scaled k<={scaled}, prior_count=1": lambda: SuffixSim(scaled, prior_count=1.0),
        f"suffix tree {tree[0]} nodes, depth<={tree[1]}": lambda: SuffixSim(k, tree=tree),
        f"suffix k={k}, prompt_context={prompt_context}": lambda: SuffixSim(k, prompt_context=prompt_context),
        f"suffix k={k}, request only": lambda: SuffixSim(k, corpus=False),
        f"ngram k={k}": lambda: NGramSim(k),
        f"prompt_lookup k={k}": lambda: PromptLookupSim(k),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=Path, nargs="+", default=[DEMO / "templated.parquet", DEMO / "prompts.parquet"])
    parser.add_argument("--target", type=Path, default=DEMO / "target")
    parser.add_argument("--limit", type=int, default=None, help="the first N prompts of each file")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, nargs="+", default=[8], help="slots of the replay (generation: 8)")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--scaled", type=int, default=32, help="the scaled suffix chain's cap")
    parser.add_argument("--tree", default="8x4", help="NODESxDEPTH of the suffix tree row")
    parser.add_argument("--prompt-context", type=int, default=16)
    parser.add_argument("--check-baselines", type=int, default=0, metavar="ROWS",
                        help="compare the ngram / prompt_lookup simulations with the engine's drafters first")
    parser.add_argument("--json", type=Path, help="also write the tables here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    nodes, depth = (int(v) for v in args.tree.split("x"))
    out = {}
    for path in args.prompts:
        rows = load_rows(path, args.target, args.limit, args.max_new_tokens, batch_size=8)
        if args.check_baselines:
            check_baselines(rows, args.k, args.check_baselines)
        tokens = sum(len(r.completion) for r in rows)
        for batch in args.batch:
            print(f"\n{path.name}: {len(rows)} rows, {tokens} completion tokens, replayed with {batch} slots")
            out.setdefault(path.name, {}).setdefault(str(batch), {}).update(
                replay_table(rows, batch, args, (nodes, depth)))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


def replay_table(rows: list[Row], batch: int, args, tree: tuple[int, int]) -> dict:
    """Every drafter replayed on `rows` with `batch` slots, one printed line each, then the calibration of the
    scaled chains. Returns the numbers by drafter (the --json file's entries)."""
    print(f"  {'drafter':<38} {'acceptance':>10} {'tokens/fwd':>10} {'drafts/round':>12} {'rounds drafted':>14}")
    calibrations, results = {}, {}
    for name, make in drafters(args.k, args.scaled, tree, args.prompt_context).items():
        t = replay(rows, make(), batch)
        if "scaled" in name:
            calibrations[name] = t.calibration
        print(f"  {name:<38} {t.acceptance:>10.3f} {t.tokens_per_forward:>10.2f} "
              f"{t.proposed / t.rounds:>12.2f} {t.drafted_rounds / t.rounds:>14.1%}")
        results[name] = {
            "acceptance": t.acceptance, "tokens_per_forward": t.tokens_per_forward,
            "drafts_per_round": t.proposed / t.rounds, "rounds_drafted": t.drafted_rounds / t.rounds,
            "proposed": t.proposed, "accepted": t.accepted, "forwards": t.forwards, "tokens": t.tokens}
    print_calibrations(calibrations)
    return results


def print_calibrations(calibrations: dict) -> None:
    """For each scaled chain: its nodes binned by probability, their mean probability and the share accepted."""
    for name, calibration in calibrations.items():
        print(f"  calibration of {name}: chain nodes by probability (given the match): how many, "
              f"their mean probability, the share accepted")
        for b, (n, kept, total) in sorted(calibration.items()):
            print(f"    {b / 5:.1f}-{(b + 1) / 5:.1f}: {n:>6} nodes, mean {total / n:.2f}, accepted {kept / n:.2f}")


if __name__ == "__main__":
    main()
