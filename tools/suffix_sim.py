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
import hashlib
import json
import os
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from batchspec.engine.drafters.suffix_index import SuffixIndex  # noqa: E402

DEMO = ROOT / "batchspec" / "assets" / "demo"
CACHE = ROOT / "outputs" / "suffix_sim"


# ---- the workload ------------------------------------------------------------------------------------

@dataclass(slots=True)
class Row:
    id: str
    prompt_ids: list[int]
    completion: list[int]


def load_rows(prompts_path: Path, target: Path, limit: int | None, max_new_tokens: int, batch_size: int) -> list[Row]:
    """Prompts -> greedy completions by the public API, cached by (prompts, target, settings)."""
    import pyarrow.parquet as pq

    table = pq.read_table(prompts_path, columns=["id", "prompt"]).to_pylist()[:limit]
    ids, prompts = [r["id"] for r in table], [r["prompt"] for r in table]
    weights = (target / "model.safetensors").stat().st_size
    key = hashlib.sha256(json.dumps([prompts, str(target), weights, max_new_tokens]).encode()).hexdigest()[:16]
    cache = CACHE / f"{prompts_path.stem}-{key}.json"
    if cache.exists():
        data = json.loads(cache.read_text())
    else:
        import batchspec
        from transformers import AutoTokenizer

        print(f"generating {len(prompts)} greedy completions of {prompts_path.name} (cached in {cache}) ...",
              file=sys.stderr)
        results = batchspec.generate(prompts, ids=ids, target=str(target), drafter="none",
                                     max_new_tokens=max_new_tokens, batch_size=batch_size)
        tokenizer = AutoTokenizer.from_pretrained(str(target))
        data = []
        for prompt, result in zip(prompts, results):
            prompt_ids = tokenizer(prompt)["input_ids"]
            assert len(prompt_ids) == result.prompt_tokens, "the engine tokenizes prompts as tokenizer(prompt)"
            data.append({"id": result.id, "prompt_ids": prompt_ids, "completion": result.completion_token_ids})
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(data))
    return [Row(d["id"], d["prompt_ids"], d["completion"]) for d in data]


# ---- drafters on host lists ---------------------------------------------------------------------------

class SuffixSim:
    """The suffix index as a drafter: a chain of up to k (scaled by the match), or a tree."""

    def __init__(self, k: int, *, corpus: bool = True, tree: tuple[int, int] | None = None, **settings):
        self.k, self.tree = k, tree
        self.probs: list[float] = []  # of the last proposal
        self.index = SuffixIndex(corpus_max_tokens=settings.pop("corpus_max_tokens", 200_000) if corpus else 0,
                                 **settings)

    def start(self, key, sequence):
        self.index.start(key, sequence)

    def propose(self, key, budget) -> tuple[list[int], list[int]]:
        if self.tree:
            nodes, depth = self.tree
            tokens, parents, self.probs = self.index.propose_tree(key, nodes, min(depth, budget))
            return tokens, parents
        tokens, self.probs = self.index.propose(key, min(self.k, budget))
        return tokens, list(range(-1, len(tokens) - 1))

    def extend(self, key, tokens):
        self.index.extend(key, tokens)

    def finish(self, key):
        self.index.finish(key)


class NGramSim:
    """`ngram`: frequency tables over the request's own tokens, contexts of 3, 2, 1 tokens (longest
    first), the most frequent continuation (ties: the most recently seen), chained on a tentative context."""

    def __init__(self, k: int, max_order: int = 4, min_order: int = 2):
        self.k, self.max_order, self.min_order = k, max_order, min_order
        self.tables: dict = {}
        self.history: dict = {}

    def start(self, key, sequence):
        self.tables[key], self.history[key] = defaultdict(dict), []
        self.extend(key, sequence)

    def extend(self, key, tokens):
        history, table = self.history[key], self.tables[key]
        for token in tokens:
            history.append(token)
            pos = len(history) - 1
            for order in range(self.min_order, self.max_order + 1):
                if pos >= order - 1:
                    entry = table[tuple(history[pos - order + 1:pos])].setdefault(token, [0, 0])
                    entry[0] += 1
                    entry[1] = pos

    def propose(self, key, budget):
        table, out = self.tables[key], []
        context = list(self.history[key][-(self.max_order - 1):])
        while len(out) < min(self.k, budget):
            best = None
            for order in range(self.max_order, self.min_order - 1, -1):
                if len(context) >= order - 1:
                    counts = table.get(tuple(context[len(context) - order + 1:]))
                    if counts:
                        best = max(counts.items(), key=lambda kv: kv[1])[0]
                        break
            if best is None:
                break
            out.append(best)
            context = (context[1:] if len(context) >= self.max_order - 1 else context) + [best]
        return out, list(range(-1, len(out) - 1))

    def finish(self, key):
        del self.tables[key], self.history[key]


class PromptLookupSim:
    """`prompt_lookup`: the continuation of the most recent earlier occurrence of the trailing n-gram,
    n from 3 down to 1 (an occurrence must end before the last token)."""

    def __init__(self, k: int, max_n: int = 3, min_n: int = 1):
        self.k, self.max_n, self.min_n = k, max_n, min_n
        self.seqs: dict = {}

    def start(self, key, sequence):
        self.seqs[key] = list(sequence)

    def extend(self, key, tokens):
        self.seqs[key].extend(tokens)

    def propose(self, key, budget):
        seq, length = self.seqs[key], len(self.seqs[key])
        for n in range(self.max_n, self.min_n - 1, -1):
            if length <= n:
                continue
            tail = seq[length - n:]
            for where in range(length - n - 1, -1, -1):  # most recent first; must end before the last token
                if seq[where:where + n] == tail:
                    out = seq[where + n:where + n + min(self.k, budget)]
                    return out, list(range(-1, len(out) - 1))
        return [], []

    def finish(self, key):
        del self.seqs[key]


# ---- the replay ----------------------------------------------------------------------------------------

@dataclass(slots=True)
class Tally:
    tokens: int = 0
    forwards: int = 0
    proposed: int = 0
    accepted: int = 0
    rounds: int = 0
    drafted_rounds: int = 0
    # calibration of a chain's probabilities: bin -> [nodes, accepted nodes, sum of their probabilities]
    calibration: dict = field(default_factory=lambda: defaultdict(lambda: [0, 0, 0.0]))

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.tokens / self.forwards


def accepted_length(tokens: list[int], parents: list[int], truth: list[int]) -> int:
    """The deepest path of the draft (a chain or a tree) that equals the start of `truth`."""
    node, depth = -1, 0
    while depth < len(truth):
        node = next((i for i, (t, p) in enumerate(zip(tokens, parents)) if p == node and t == truth[depth]), None)
        if node is None:
            break
        depth += 1
    return depth


def replay(rows: list[Row], drafter, batch: int) -> Tally:
    """B slots, rows admitted in order; see the module docstring."""
    tally = Tally()
    queue = list(range(len(rows)))[::-1]
    active: dict[int, int] = {}  # row -> tokens of its completion emitted so far (the prefill emitted one)
    slots: list[int | None] = [None] * batch

    def admit():
        for s in range(batch):
            if slots[s] is None and queue:
                r = queue.pop()
                slots[s] = r
                row = rows[r]
                drafter.start(r, row.prompt_ids + row.completion[:1])
                active[r] = 1
                tally.forwards += 1  # the prefill
                tally.tokens += len(row.completion)

    admit()
    while active:
        for s in range(batch):  # one verify round for every running row
            r = slots[s]
            if r is None:
                continue
            row, done = rows[r], active[r]
            left = len(row.completion) - done
            if left > 0:
                tokens, parents = drafter.propose(r, left - 1) if left > 1 else ([], [])
                kept = accepted_length(tokens, parents, row.completion[done:])
                probs = getattr(drafter, "probs", None)
                if probs and not getattr(drafter, "tree", None):  # a chain's node i is kept iff i < kept
                    for i, p in enumerate(probs):
                        entry = tally.calibration[min(int(p * 5), 4)]
                        entry[0] += 1
                        entry[1] += i < kept
                        entry[2] += p
                emitted = row.completion[done:done + kept + 1]
                tally.proposed += len(tokens)
                tally.accepted += kept
                tally.rounds += 1
                tally.drafted_rounds += bool(tokens)
                tally.forwards += 1
                drafter.extend(r, emitted)
                active[r] = done + len(emitted)
        for s in range(batch):  # rows that are done leave, in slot order
            r = slots[s]
            if r is not None and active[r] >= len(rows[r].completion):
                drafter.finish(r)
                del active[r]
                slots[s] = None
        admit()
    return tally


def check_baselines(rows: list[Row], k: int, count: int) -> None:
    """The re-implemented ngram / prompt_lookup against the engine's drafters, every position of the
    first `count` rows."""
    import torch

    from batchspec.engine.drafters import NGramDrafter, PromptLookupDrafter
    from batchspec.engine.round import Round, RoundBuffers

    cpu = torch.device("cpu")
    buffers = RoundBuffers(1, k, 32, cpu, noise=False, probs=False, trees=False)
    for name, real, sim in (("ngram", NGramDrafter(), NGramSim(k)), ("prompt_lookup", PromptLookupDrafter(),
                                                                      PromptLookupSim(k))):
        checked = 0
        for r, row in enumerate(rows[:count]):
            seq = row.prompt_ids + row.completion[:1]
            real.admit([0], [list(seq)])
            sim.start(r, list(seq))
            for token in row.completion[1:]:
                round = Round(rows=[0], rows_t=torch.tensor([0]), span=slice(0, 1), lengths=[len(seq)],
                              lengths_t=torch.tensor([len(seq)]), running=[0], room=[k], limits=[k],
                              static=False, buffers=buffers)
                draft = real.propose(round)
                want = draft.tokens[0, : int(draft.num_tokens[0])].tolist()
                got = sim.propose(r, k)[0]
                if got != want:
                    raise SystemExit(f"{name}: the simulation proposes {got}, the drafter {want} (row {row.id})")
                seq.append(token)
                real.extend([0], [[token]], [0])
                sim.extend(r, [token])
                checked += 1
            real.release([0])
            sim.finish(r)
        print(f"check: {name} simulation == engine drafter on {checked} positions of {count} rows", file=sys.stderr)


def drafters(k: int, scaled: int, tree: tuple[int, int], prompt_context: int):
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


def main(argv: list[str] | None = None) -> None:
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
    args = parser.parse_args(argv)
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
            print(f"  {'drafter':<38} {'acceptance':>10} {'tokens/fwd':>10} {'drafts/round':>12} {'rounds drafted':>14}")
            calibrations = {}
            for name, make in drafters(args.k, args.scaled, (nodes, depth), args.prompt_context).items():
                t = replay(rows, make(), batch)
                if "scaled" in name:
                    calibrations[name] = t.calibration
                print(f"  {name:<38} {t.acceptance:>10.3f} {t.tokens_per_forward:>10.2f} "
                      f"{t.proposed / t.rounds:>12.2f} {t.drafted_rounds / t.rounds:>14.1%}")
                out.setdefault(path.name, {}).setdefault(str(batch), {})[name] = {
                    "acceptance": t.acceptance, "tokens_per_forward": t.tokens_per_forward,
                    "drafts_per_round": t.proposed / t.rounds, "rounds_drafted": t.drafted_rounds / t.rounds,
                    "proposed": t.proposed, "accepted": t.accepted, "forwards": t.forwards, "tokens": t.tokens}
            for name, calibration in calibrations.items():
                print(f"  calibration of {name}: chain nodes by probability (given the match): how many, "
                      f"their mean probability, the share accepted")
                for b, (n, kept, total) in sorted(calibration.items()):
                    print(f"    {b / 5:.1f}-{(b + 1) / 5:.1f}: {n:>6} nodes, mean {total / n:.2f}, accepted {kept / n:.2f}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
