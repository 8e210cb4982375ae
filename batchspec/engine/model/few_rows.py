"""Linear layers over few rows on a CPU: the weight as the left operand, where that is measured faster.

A decode step or a verify pass multiplies each weight W [N, K] by a handful of rows x [M, K]: M is the
batch's tokens, 1 to a few dozen. `F.linear(x, W)` (x @ W.T) sends M = 1 to the BLAS's matrix-vector
product and M > 1 to its matrix product, and on the 2-core AMD EPYC (MKL) batchspec is measured on, both
read W at about 10 GB/s for M <= 8 and the product is slower at M = 2 and 3 than at 5 or 8 (SmolLM2's
whole forward at batch 1: 58-75 ms for one token, 96-126 ms for two or three, 78-91 ms for five). The same
product written as W @ x.T, with x contiguous and at least two rows, read W at about 30 GB/s: the
49,152-row LM head took 3.7 ms at M = 2 against 25.9, 4.7 ms at M = 1 (x doubled) against 11.3.

Which is faster depends on the CPU and the BLAS, so `FewRowLinears` times both on the model's own weights
when the first runner of a model is built (5.2 s for SmolLM2, 0.7 s for the demo target, Gemma-3-270M
cut at the budget): per weight shape and bucket of rows, a pass over that shape's weights (as many as make 64 MB, so
that they come from memory as in a forward), best of three, interleaved, within BUDGET_S seconds (a weight
past 64 MB is timed once, `passes`). A bucket takes W @ x.T only where it was at least 10% faster at the
bucket's top. Up to 16 rows every row count is a bucket of its own, since MKL's product is not monotone in
the rows: SmolLM2's LM head took 23.6 ms at 7 rows with `F.linear` and 11.3 at 8, its MLP's up projection
as W @ x.T 11.6 ms at 8 rows and 23.1 at 12, and with buckets of 9-16 rows chosen as one every verify pass
of 9 tokens at batch 8 (one draft) cost 81.5 ms against 58.7 for 8 tokens, where timing each count put it
at 63 (2026-12-04): a price no acceptance repays, which made a lookup's single drafts and adaptive's
probes lose. Past 16 rows the buckets are 4 rows wide to 32 and 8 to 64. Timing goes by bucket, the fewest
rows first (the largest shapes first within one), so that a budget cut leaves only wide rounds with
`F.linear`. More than 64 rows (prompt chunks, wide batches) keep `F.linear`. The choice is kept on the
model for its later runners and, when nothing else took the CPU while it was timed, in the user's cache
(machine_cache.cache_dir) by the weights' shapes, dtype, CPU and threads: a resumed or repeated job reads it
back, so every process of one machine sums in the same order. On SmolLM2 here (2026-12-04) the attention's and the
MLP's weights chose it up to 4 or 8 rows and the LM head at most counts up to 32. Used as a context around a
runner's eager forwards: each `nn.Linear` of the model gets its own forward for the block, and the model is
as it was after it.

A wide weight (an LM head: BLOCK_MIN rows or more) has a third product for more than 8 rows, W @ x.T in
blocks of BLOCK rows of W (`blocked_left`): past 8 rows MKL's product over the whole weight slows down (Gemma-3's
262,144-row head took 56 ms at 8 rows and 126-138 at 12-24 as W @ x.T, 142-172 with F.linear), and a block of
2,048 rows (5 MB) stays in the caches while all the rows multiply it: 84-110 ms at 12-24 rows, 15-25% less from
12 to 64 rows on that head and on SmolLM2's 49,152-row one, and slower at 8-10 rows (2 CPU cores, 2026-12-07).
A verify pass's logits are that product at 1 + k rows a row: at batch 8 with 2 drafts a row, 24. Timing the
blocks too, Gemma-3-270M's choice ran out of BUDGET_S at 12 rows, so a wide weight's buckets that the budget
left get WIDE_BUDGET_S of their own (11.9 s in all for that model, once a machine; its head then chose blocks
at 12, 13, 16, 20, 24, 32 and 48 rows, SmolLM2's at 24, 28 and 32).

Both orders compute the same sums in another order: logits differ in the last bits (SmolLM2: at most 6e-4
of logits in the tens), as they already do between a 1-token step and a verify pass of k + 1 tokens.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch import nn

from . import machine_cache
from .threads import read_sample

BUCKETS = tuple(range(1, 17)) + (20, 24, 28, 32, 40, 48, 56, 64)
BUDGET_S = 6.0  # the most seconds timing may take (a loaded machine took 45-73 s for the demo pair unbounded)
WIDE_BUDGET_S = 6.0  # and then for a wide weight's (an LM head's) buckets the budget left: Gemma-3-270M's
#   ran out at 12 rows, where a verify pass at batch 8 with 2 drafts a row computes its head at 24
MARGIN = 0.9  # W @ x.T (or its blocks) must take at most this share of F.linear's time (blocks: of W @ x.T's too)
SAMPLE_BYTES = 64 << 20  # the weights one timing pass reads: past the caches (32 MB of L3 here)
CHOICE = "_batchspec_few_rows"  # the model's attribute keeping the choice: timed once per model
BLOCK = 2048  # rows of W a block of `blocked_left` multiplies: 5 MB of a 640-wide fp32 head, within the caches
BLOCK_MIN = 8 * BLOCK  # a weight with fewer rows is not timed blocked (a block or a few are the whole product)
LEFT, BLOCKED = "left", "blocked"  # the products a bucket may choose over F.linear


def weight_left(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                block: int | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) computed as weight @ x.T; with `block`, over blocks of that many rows of the
    weight, each written into its rows of one output. x [..., K], weight [N, K] -> [..., N], contiguous."""
    flat = x.reshape(-1, x.shape[-1])
    rows = flat.shape[0]
    if rows == 1:  # a matrix-vector product would take the slow path again
        flat = torch.cat([flat, flat])
    if block is None:
        out = (weight @ flat.t())[:, :rows].t().contiguous()
    else:
        right = flat.t().contiguous()
        full = torch.empty(weight.shape[0], right.shape[1], dtype=right.dtype, device=right.device)  # [N, M]
        for start in range(0, weight.shape[0], block):
            torch.mm(weight[start:start + block], right, out=full[start:start + block])
        out = full[:, :rows].t().contiguous()
    if bias is not None:
        out += bias
    return out.view(*x.shape[:-1], weight.shape[0])


def blocked_left(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """weight_left in blocks of BLOCK rows of the weight."""
    return weight_left(x, weight, bias, block=BLOCK)


def product(name: str):
    """The product a bucket chose by its name (looked up when called: the tests replace them)."""
    return weight_left if name == LEFT else blocked_left


def bucket(rows: int) -> int | None:
    """The smallest bucket holding `rows`, None past the largest."""
    return next((b for b in BUCKETS if b >= rows), None)


def passes(size: int, repeats: int) -> int:
    """Timing passes for one weight of `size` bytes: `repeats`, or one for a weight past SAMPLE_BYTES. A pass
    over it is long enough to time (Gemma-3-270M's 671 MB LM head: 40-120 ms), and a best of three would
    spend the whole budget on it: 19 s for that head on a loaded machine, 4.8 s timed once, the same choice
    (buckets 8 and 16; SmolLM2's 113 MB head: the same choice too, 0.6 s against 2.3; 2026-12-03). A slice
    of its rows is no stand-in: the product's speed depends on the rows (the slice chose other buckets)."""
    return 1 if size > SAMPLE_BYTES else repeats


def _best_of(x: torch.Tensor, weights: list[torch.Tensor], repeats: int, names: list[str]) -> dict[str, float]:
    """The best of `repeats` passes over `weights` with rows x: F.linear's seconds ("linear") and each named
    product's, interleaved."""
    funcs = {"linear": F.linear, **{name: product(name) for name in names}}
    best = dict.fromkeys(funcs, float("inf"))
    for _ in range(repeats):
        for name, f in funcs.items():
            start = time.perf_counter()
            for w in weights:
                f(x, w)
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def _pick(seconds: dict[str, float]) -> str | None:
    """The product a bucket runs (None: F.linear): the faster of the others where it took at most MARGIN of
    F.linear's time, and blocks over W @ x.T only where they took at most MARGIN of its time too."""
    left, blocked = seconds.get(LEFT, float("inf")), seconds.get(BLOCKED, float("inf"))
    name, best = (BLOCKED, blocked) if blocked <= MARGIN * left else (LEFT, left)
    return name if best <= MARGIN * seconds["linear"] else None


def _timed(steps: list, won: dict, noise: torch.Generator, deadline: float) -> int:
    """Time (bucket, (shape, sampled weights, passes)) steps in order into `won` until the deadline (perf_counter
    seconds); returns how many were timed."""
    for done, (top, (shape, weights, count)) in enumerate(steps):
        if time.perf_counter() >= deadline:
            return done
        names = [LEFT, BLOCKED] if shape[0] >= BLOCK_MIN and top > 8 else [LEFT]
        seconds = _best_of(torch.randn(top, shape[1], generator=noise).to(weights[0]), weights, count, names)
        if (name := _pick(seconds)) is not None:
            won[shape][top] = name
    return len(steps)


Choice = dict[tuple[int, int], dict[int, str]]  # per weight shape (N, K): bucket -> the product it runs


class FewRowLinears:
    """For each nn.Linear of `model`: which row buckets run as W @ x.T or in blocks (`chosen[shape]`: bucket ->
    LEFT or BLOCKED). Enter around eager forwards. `chosen`: the choice per weight shape (N, K), or None to
    time it here."""

    def __init__(self, model: nn.Module, chosen: Choice | None = None, repeats: int = 3):
        # Not subclasses (they may compute otherwise), nor a layer whose forward is already replaced (a hook).
        self.linears = [m for m in model.modules() if type(m) is nn.Linear and "forward" not in m.__dict__]
        if chosen is None:
            chosen = getattr(model, CHOICE, None)
            if chosen is None:
                chosen = self.cached_or_timed(self.linears, repeats)
                setattr(model, CHOICE, chosen)
        self.chosen = chosen
        # (layer, its forward) for the layers whose shape chose another product for some bucket: the only ones touched
        self._swaps = [(m, self._forward(m)) for m in self.linears if chosen.get(tuple(m.weight.shape))]

    @classmethod
    def cached_or_timed(cls, linears: list[nn.Linear], repeats: int) -> Choice:
        """The choice the machine's cache holds for these weights, or timed (and kept if undisturbed)."""
        shapes = sorted({(tuple(m.weight.shape), str(m.weight.dtype)) for m in linears})
        key = {"shapes": [list(s) + [d] for s, d in shapes], **machine_cache.machine(torch.device("cpu")),
               "torch": torch.__version__, "timed": "every count to 16, blocks"}  # (earlier choices: not read)
        stored = machine_cache.read("few_rows", key)
        if stored is not None:
            return {tuple(s): {int(b): name for b, name in chosen} for s, chosen in stored["chosen"]}
        started, before = time.perf_counter(), read_sample()
        choice = cls.time(linears, repeats)
        if machine_cache.undisturbed(before, read_sample(), time.perf_counter() - started):
            machine_cache.write("few_rows", key, {"chosen": [[list(s), sorted(c.items())] for s, c in choice.items()]})
        return choice

    @staticmethod
    @torch.inference_mode()
    def time(linears: list[nn.Linear], repeats: int, budget_s: float = BUDGET_S) -> Choice:
        """Per weight shape, the buckets where W @ x.T (or, for a wide weight past 8 rows, its blocks) took at most
        MARGIN of F.linear's time at the bucket's top (_pick); bucket by bucket, the fewest rows first and within
        one the largest shapes (by the bytes of their weights) first, and nothing past budget_s seconds (what is
        left untimed keeps F.linear), then the wide weights' buckets left within their own budget (WIDE_BUDGET_S
        scaled as budget_s is)."""
        groups: dict[tuple[int, int], list[torch.Tensor]] = defaultdict(list)
        for m in linears:
            groups[tuple(m.weight.shape)].append(m.weight)
        won: Choice = {shape: {} for shape in groups}
        noise = torch.Generator().manual_seed(0)  # not the global generator: seeded jobs must not see the timing
        started = time.perf_counter()
        def size(weights: list[torch.Tensor]) -> int:  # bytes of one weight of the shape
            return weights[0].numel() * weights[0].element_size()
        by_size = sorted(groups.items(), key=lambda item: -size(item[1]) * len(item[1]))
        sampled = [(shape, ws[: max(1, SAMPLE_BYTES // max(size(ws), 1))], passes(size(ws), repeats))
                   for shape, ws in by_size]
        steps = list(itertools.product(BUCKETS, sampled))  # bucket by bucket
        # A wide weight's buckets that the budget left untimed get a budget of their own (see WIDE_BUDGET_S).
        timed = _timed(steps, won, noise, started + budget_s)
        _timed([step for step in steps[timed:] if step[1][0][0] >= BLOCK_MIN], won, noise,
               time.perf_counter() + WIDE_BUDGET_S * (budget_s / BUDGET_S))
        return won

    def _forward(self, module: nn.Linear):
        chosen = self.chosen[tuple(module.weight.shape)]

        def forward(x: torch.Tensor) -> torch.Tensor:
            name = chosen.get(bucket(x.numel() // x.shape[-1]))
            if name is not None:
                return product(name)(x, module.weight, module.bias)
            return F.linear(x, module.weight, module.bias)
        return forward

    def __enter__(self) -> FewRowLinears:
        for m, forward in self._swaps:
            m.forward = forward
        return self

    def __exit__(self, *exc) -> None:
        for m, _ in self._swaps:
            m.__dict__.pop("forward", None)
