"""Host cost of the suffix index per round, next to the target's verify forward, at batch 1..64.

    python tools/suffix_cost.py                                  # batch 1, 8, 32, 64; 200k-token corpus
    python tools/suffix_cost.py --batch 8 64 --segments 1 2 4 --repeats 5

A round of a suffix drafter is, per running row, one proposal (a chain of up to --k tokens) and one
extend of the tokens the row emitted (--emit, ~2: accepted drafts + the target's token); and now and
then a row finishes, its completion joins the job-wide structure (which makes every row redo its match
in the newest segment) and a new row starts. This tool times exactly that on real token sequences,
the CPython standard library through the demo tokenizer (the target's training text):

  - the job-wide structure is seeded with --corpus-tokens tokens of it, cut into completions of 128;
  - each row is its own stretch of other files, its prompt between 200 and 1,800 tokens (spread over the
    rows), so that over the rounds rows hold a few hundred to 2,000 tokens;
  - per round: every row proposes and extends; rows finish at the rate of 64-token completions
    (batch * emit / 64 per round: one every 32 rounds at batch 1, two per round at batch 64), each
    adding its output (~64 tokens) to the job-wide structure; as many new rows start, timed apart (a
    prompt is indexed once, next to a prefill forward of the same prompt that this does not time);
  - the verify forward is the demo target's (`batchspec.engine.model.timing.time_step`): every row 5 tokens (k = 4 + 1;
    a tree of N nodes: N + 1) over a KV cache of --kv-len entries, fp32, eager, as the CPU path runs it
    (the demo target has 1,024 positions: the rows' longer sequences are the index's side only).

A repeat times --rounds rounds (their mean: finishing rounds cost more) and a forward (median of 3);
repeats interleave both sides and the median over --repeats is printed. On a shared machine both sides slow down together: the ratio is the number.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from batchspec.engine.drafters.suffix_index import SuffixIndex  # noqa: E402

DEMO = ROOT / "batchspec" / "assets" / "demo"


def stdlib_tokens(tokenizer, needed: int) -> list[list[int]]:
    """Token ids of the standard library's top-level modules, file by file, until `needed` tokens."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    out, total = [], 0
    for path in files:
        ids = tokenizer(path.read_text(encoding="utf-8", errors="replace"))["input_ids"]
        out.append(ids)
        total += len(ids)
        if total >= needed:
            return out
    raise SystemExit(f"the standard library has only {total} tokens, {needed} needed")


class Workload:
    """Rows over real text: prompts, their continuations, and completions that finish."""

    def __init__(self, texts: list[list[int]], batch: int, segments: int, corpus: list[list[int]], k: int, emit: int,
                 tree: tuple[int, int] | None = None):
        self.k, self.emit, self.tree = k, emit, tree
        stream = [t for text in texts for t in text]
        self.streams = [stream[i * 4000:(i + 1) * 4000] for i in range(len(stream) // 4000)]
        self.index = SuffixIndex(corpus_max_tokens=sum(len(c) for c in corpus) * 5 // 4, corpus_segments=segments)
        started = time.perf_counter()
        self.index.add_corpus(corpus)
        self.corpus_s = time.perf_counter() - started
        self.batch, self.next_stream, self.owed = batch, 0, 0.0
        self.rows: dict[int, tuple[list[int], int, int]] = {}  # key -> (stream, prompt length, position)
        for key in range(batch):
            self.admit(key, 200 + 1600 * key // max(1, batch - 1))

    def admit(self, key: int, prompt_len: int) -> float:
        stream = self.streams[self.next_stream % len(self.streams)]
        self.next_stream += 1
        started = time.perf_counter()
        self.index.start(key, stream[:prompt_len])
        elapsed = time.perf_counter() - started
        self.rows[key] = (stream, prompt_len, prompt_len)
        return elapsed

    def round(self, finish_rate: float) -> tuple[float, float, int]:
        """One round: (seconds of proposals + extends + finishes, seconds of new rows' starts, prompt
        tokens started). finish_rate rows finish per round on average (a fraction accumulates)."""
        index, k, emit = self.index, self.k, self.emit
        self.owed += finish_rate
        finishes = int(self.owed)
        self.owed -= finishes
        started = time.perf_counter()
        for key, (stream, prompt_len, pos) in self.rows.items():
            if self.tree:
                index.propose_tree(key, *self.tree)
            else:
                index.propose(key, k)
            index.extend(key, stream[pos:pos + emit])
            self.rows[key] = (stream, prompt_len, pos + emit)
        done = sorted(self.rows, key=lambda key: self.rows[key][2] - self.rows[key][1], reverse=True)[:finishes]
        for key in done:
            # A completion of 64 tokens joins the job-wide structure (the row's own output is used as is).
            index.finish(key)
        steady = time.perf_counter() - started
        start_s, prompt_tokens = 0.0, 0
        for key in done:
            prompt_len = 200 + 1600 * (self.next_stream % 8) // 7
            start_s += self.admit(key, prompt_len)
            prompt_tokens += prompt_len
        return steady, start_s, prompt_tokens

    def warm(self, rounds: int) -> None:
        """Run rows until their outputs are ~64 tokens, so that finishes add typical completions."""
        for _ in range(rounds):
            self.round(0.0)


def forward_seconds(runners: dict, batch: int, kv_len: int, width: int) -> float:
    """The verify forward at `batch`: `width` tokens per row over `kv_len` cached entries (median of 3)."""
    from batchspec.engine.model.timing import time_step  # deferred, as torch: --help needs neither

    return time_step(runners[batch], width, kv_len, repeats=3)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--segments", type=int, nargs="+", default=[4], help="corpus_segments settings to time")
    parser.add_argument("--corpus-tokens", type=int, default=200_000)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--emit", type=int, default=2, help="tokens each row emits per round")
    parser.add_argument("--tree", help="NODESxDEPTH: time tree proposals (propose_tree) instead of chains of k")
    parser.add_argument("--rounds", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kv-len", type=int, default=512)
    parser.add_argument("--target", type=Path, default=DEMO / "target")
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)
    tree = tuple(int(v) for v in args.tree.split("x")) if args.tree else None
    width = tree[0] + 1 if tree else args.k + 1  # tokens per row in the verify forward
    tokenizer = AutoTokenizer.from_pretrained(str(args.target))
    rows_needed = max(args.batch) * 4000 * 2
    corpus, rest, total = split_corpus(stdlib_tokens(tokenizer, args.corpus_tokens + rows_needed), args.corpus_tokens)
    runners = load_runners(args)

    proposal = f"trees of {tree[0]} nodes, depth <= {tree[1]}" if tree else f"chains of k <= {args.k}"
    print(f"suffix index host cost per round vs the demo target's verify forward ({width} tokens per row over "
          f"{args.kv_len} cached, fp32, {args.threads} threads); corpus {total} tokens; {proposal}, "
          f"{args.emit} tokens emitted per row per round")
    workloads = build_workloads(args, rest, corpus, tree, total)
    print_table(time_rounds(args, workloads, runners, width))


def split_corpus(texts: list[list[int]], corpus_tokens: int) -> tuple[list[list[int]], list[list[int]], int]:
    """(the job-wide corpus: the first texts cut into completions of 128 tokens until `corpus_tokens`, the texts
    after it for the rows, the corpus's tokens)."""
    corpus, rest, total = [], [], 0
    for text in texts:
        if total < corpus_tokens:
            for i in range(0, len(text), 128):
                if total < corpus_tokens:
                    corpus.append(text[i:i + 128])
                    total += len(corpus[-1])
        else:
            rest.append(text)
    return corpus, rest, total


def load_runners(args) -> dict:
    """The demo target and a ModelRunner over it for each batch size: the verify forward's side."""
    import torch
    from transformers import AutoModelForCausalLM

    from batchspec.engine.model.graphs import StepGraphs
    from batchspec.engine.model.runner import ModelRunner

    model = AutoModelForCausalLM.from_pretrained(str(args.target), dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    capacity = max(args.kv_len + 8, 64)
    return {b: ModelRunner(model, num_slots=b, capacity=capacity, max_position=model.config.max_position_embeddings,
                           graphs=StepGraphs(None, model.device), name="suffix_cost") for b in args.batch}


def build_workloads(args, rest: list[list[int]], corpus: list[list[int]], tree, total: int) -> dict:
    """A warmed-up Workload per (corpus_segments, batch), and what indexing the corpus took per setting."""
    workloads = {}
    for segments in args.segments:
        for b in args.batch:
            w = Workload(rest, b, segments, corpus, args.k, args.emit, tree)
            w.warm(32)  # outputs of ~64 tokens before timing
            workloads[(segments, b)] = w
    for segments in args.segments:
        w = next(w for (s, _), w in workloads.items() if s == segments)
        print(f"  corpus_segments={segments}: indexing the corpus took {w.corpus_s:.2f} s "
              f"({w.corpus_s / total * 1e6:.1f} us/token), {w.index.corpus_tokens} tokens kept in "
              f"{w.index.corpus_states} states")
    return workloads


def time_rounds(args, workloads: dict, runners: dict, width: int) -> dict:
    """Per (corpus_segments, batch), a (suffix seconds per round, forward seconds, start seconds per prompt token,
    finishes per round) per repeat; the repeats interleave both sides so that they see the same machine load."""
    results: dict[tuple[int, int], list[tuple[float, float, float, float]]] = {}
    for _ in range(args.repeats):  # interleaved: both sides see the same machine load
        for b in args.batch:
            fwd = forward_seconds(runners, b, args.kv_len, width)
            for segments in args.segments:
                w = workloads[(segments, b)]
                rate = b * args.emit / 64
                rounds = [w.round(rate) for _ in range(args.rounds)]
                steady = statistics.mean(r[0] for r in rounds)
                per_token = sum(r[1] for r in rounds) / max(1, sum(r[2] for r in rounds))
                results.setdefault((segments, b), []).append((steady, fwd, per_token, rate))
    return results


def print_table(results: dict) -> None:
    """The medians over the repeats, one line per (corpus_segments, batch)."""
    print(f"\n  {'segments':>8} {'batch':>5} {'finishes/round':>14} {'suffix ms/round':>15} {'us/row':>7} "
          f"{'verify fwd ms':>13} {'suffix/fwd':>10} {'start us/prompt token':>21}")
    for (segments, b), runs in sorted(results.items()):
        steady = statistics.median(r[0] for r in runs)
        fwd = statistics.median(r[1] for r in runs)
        ratio = statistics.median(r[0] / r[1] for r in runs)
        start = statistics.median(r[2] for r in runs)
        print(f"  {segments:>8} {b:>5} {runs[0][3]:>14.3g} {steady * 1e3:>15.2f} {steady / b * 1e6:>7.0f} "
              f"{fwd * 1e3:>13.1f} {ratio:>10.1%} {start * 1e6:>21.1f}")


if __name__ == "__main__":
    main()
