"""Will tree drafts pay for this pair? The best tree of N nodes against a chain of N, from measured ranks.

    python tools/tree_bound.py                                   # the shipped demo pair
    python tools/tree_bound.py --target T --draft D --prompts P.parquet --budgets 4,8,16

Greedy only. The target's greedy continuation of each prompt is computed once; the draft then reads it
teacher-forced, and at every position the tool records which rank of the draft's guesses (1 = its
argmax) is the target's token. With p_r the share of positions where rank r is right, and positions
taken as independent, the expected tokens a round emits from a tree (accepted nodes plus the bonus
token) follow a recursion over subtree sizes (Sequoia, Chen et al. 2024):

    best(n) = max over splits n = s_1 + ... + s_j of  sum_r p_r * (1 + best(s_r - 1))

a node's children being its rank-1..j guesses, each with a subtree of s_r nodes. A chain is the split
that gives all n to rank 1. Where best(N) equals the chain's, no tree of N nodes can emit more per
verified token than a chain of N. Real text is burstier than independent positions (a run of easy
tokens); the teacher-forced chain column measures that directly: the tokens a chain of N would emit
from every start position of the continuations.

The confidence table says whether the draft's probabilities could place branches (EAGLE-2 expands where
the draft is unsure): it needs top-1 accuracy to rise with the draft's top-1 probability.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from batchspec.bench.calibrate import read_prompts  # noqa: E402

DEMO = Path(__file__).resolve().parents[1] / "batchspec" / "assets" / "demo"


def best_tree_tokens(rank_hits: list[float], budget: int) -> tuple[float, tuple[int, ...]]:
    """Expected tokens per round (accepted + 1) of the best tree of `budget` nodes under independent
    positions, and the subtree sizes of the root's children by rank (a chain: (budget,))."""

    @functools.cache
    def best(n: int) -> float:  # expected accepted nodes below a node with n nodes to place
        return split(0, n)[0]

    @functools.cache
    def split(r: int, n: int) -> tuple[float, tuple[int, ...]]:  # children of rank >= r, n nodes
        choice = (0.0, ())
        if n == 0 or r >= len(rank_hits):
            return choice
        for size in range(1, n + 1):
            rest, sizes = split(r + 1, n - size)
            value = rank_hits[r] * (1 + best(size - 1)) + rest
            if value > choice[0] + 1e-12:
                choice = (value, (size, *sizes))
        return choice

    value, sizes = split(0, budget)
    return 1 + value, sizes


def chain_tokens(rank_hits: list[float], budget: int) -> float:
    """Expected tokens per round of a chain of `budget` drafts under independent positions."""
    return 1 + sum(rank_hits[0] ** j for j in range(1, budget + 1))


def teacher_forced_chain(hit_first: list[torch.Tensor], budget: int) -> float:
    """Mean tokens a chain of `budget` emits from every start position; hit_first[i]: [n] bool, the draft's
    argmax equals the target's token at each position of continuation i."""
    total = count = 0
    for hits in hit_first:
        n = len(hits)
        for start in range(n):
            run = 0
            while run < budget and start + run < n and hits[start + run]:
                run += 1
            total, count = total + run + 1, count + 1
    return total / max(count, 1)


@torch.inference_mode()
def measure(target, draft, prompts: list[list[int]], new_tokens: int, ranks: int):
    """Per continuation: the rank (0-based, `ranks` = not among the top) of the target's token among the
    draft's guesses [n], and the draft's top-1 probability [n]."""
    out = []
    for ids in prompts:
        x = torch.tensor([ids])
        seq = target.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=new_tokens,
                              pad_token_id=target.config.pad_token_id or 0)[0]
        continuation = seq[len(ids):]
        logits = draft(seq[None]).logits[0, len(ids) - 1 : len(seq) - 1].float()  # predicts each continuation token
        top = logits.softmax(-1).topk(ranks, dim=-1)
        match = top.indices.eq(continuation[:, None])
        rank = torch.where(match.any(-1), match.int().argmax(-1), torch.full_like(continuation, ranks))
        out.append((rank, top.values[:, 0]))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default=str(DEMO / "target"))
    p.add_argument("--draft", default=str(DEMO / "draft"))
    p.add_argument("--prompts", default=str(DEMO / "prompts.parquet"))
    p.add_argument("--prompt-column", default="prompt")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--budgets", default="2,4,8,12,16")
    p.add_argument("--ranks", type=int, default=6, help="draft guesses per position to consider")
    args = p.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.target)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=torch.float32).eval()
    prompts = [tokenizer(t)["input_ids"] for t in read_prompts(args.prompts, args.num_prompts, args.prompt_column, None)]
    measured = measure(target, draft, prompts, args.max_new_tokens, args.ranks)
    rank = torch.cat([r for r, _ in measured])
    q1 = torch.cat([q for _, q in measured])
    hits = [rank.eq(r).float().mean().item() for r in range(args.ranks)]
    print(f"{len(prompts)} prompts, {len(rank)} positions (teacher-forced on the target's greedy continuations)")
    print("share of positions where the draft's rank-r guess is the target's token: "
          + "  ".join(f"r{r + 1} {h:.3f}" for r, h in enumerate(hits)))
    print("draft top-1 probability -> top-1 accuracy (positions):")
    edges = [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0001]
    for lo, hi in zip(edges, edges[1:]):
        inside = (q1 >= lo) & (q1 < hi)
        if inside.any():
            print(f"  q1 in [{lo:.1f}, {min(hi, 1):.1f}): {rank[inside].eq(0).float().mean():.2f} ({int(inside.sum())})")
    print(f"{'nodes':>5}  {'chain (indep.)':>14}  {'best tree (indep.)':>18}  {'root children sizes':>20}  "
          f"{'chain (teacher-forced)':>22}")
    hit_first = [r.eq(0) for r, _ in measured]
    for n in (int(b) for b in args.budgets.split(",")):
        tree, sizes = best_tree_tokens(hits, n)
        print(f"{n:>5}  {chain_tokens(hits, n):>14.3f}  {tree:>18.3f}  {str(list(sizes)):>20}  "
              f"{teacher_forced_chain(hit_first, n):>22.3f}")


if __name__ == "__main__":
    main()
