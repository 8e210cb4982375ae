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
MARGIN = 0.9  # W @ x.T must take at most this share of F.linear's time
SAMPLE_BYTES = 64 << 20  # the weights one timing pass reads: past the caches (32 MB of L3 here)
CHOICE = "_batchspec_few_rows"  # the model's attribute keeping the choice: timed once per model


def weight_left(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) computed as weight @ x.T. x [..., K], weight [N, K] -> [..., N], contiguous."""
    flat = x.reshape(-1, x.shape[-1])
    rows = flat.shape[0]
    if rows == 1:  # a matrix-vector product would take the slow path again
        flat = torch.cat([flat, flat])
    out = (weight @ flat.t())[:, :rows].t().contiguous()
    if bias is not None:
        out += bias
    return out.view(*x.shape[:-1], weight.shape[0])


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


def _best_of(x: torch.Tensor, weights: list[torch.Tensor], repeats: int) -> tuple[float, float]:
    """The best of `repeats` passes over `weights` with rows x, (F.linear's seconds, W @ x.T's), interleaved."""
    best = {F.linear: float("inf"), weight_left: float("inf")}
    for _ in range(repeats):
        for f in best:
            start = time.perf_counter()
            for w in weights:
                f(x, w)
            best[f] = min(best[f], time.perf_counter() - start)
    return best[F.linear], best[weight_left]


class FewRowLinears:
    """For each nn.Linear of `model`: which row buckets run as W @ x.T (`left[shape]`). Enter around eager
    forwards. `left`: the choice per weight shape (N, K), or None to time it here."""

    def __init__(self, model: nn.Module, left: dict[tuple[int, int], frozenset[int]] | None = None,
                 repeats: int = 3):
        # Not subclasses (they may compute otherwise), nor a layer whose forward is already replaced (a hook).
        self.linears = [m for m in model.modules() if type(m) is nn.Linear and "forward" not in m.__dict__]
        if left is None:
            left = getattr(model, CHOICE, None)
            if left is None:
                left = self.cached_or_timed(self.linears, repeats)
                setattr(model, CHOICE, left)
        self.left = left
        # (layer, its forward) for the layers whose shape chose W @ x.T for some bucket: the only ones touched
        self._swaps = [(m, self._forward(m)) for m in self.linears if left.get(tuple(m.weight.shape))]

    @classmethod
    def cached_or_timed(cls, linears: list[nn.Linear], repeats: int) -> dict[tuple[int, int], frozenset[int]]:
        """The choice the machine's cache holds for these weights, or timed (and kept if undisturbed)."""
        shapes = sorted({(tuple(m.weight.shape), str(m.weight.dtype)) for m in linears})
        key = {"shapes": [list(s) + [d] for s, d in shapes], **machine_cache.machine(torch.device("cpu")),
               "torch": torch.__version__, "timed": "every count to 16"}  # (earlier buckets' choices: not read)
        stored = machine_cache.read("few_rows", key)
        if stored is not None:
            return {tuple(s): frozenset(b) for s, b in stored["left"]}
        started, before = time.perf_counter(), read_sample()
        choice = cls.time(linears, repeats)
        if machine_cache.undisturbed(before, read_sample(), time.perf_counter() - started):
            machine_cache.write("few_rows", key, {"left": [[list(s), sorted(b)] for s, b in choice.items()]})
        return choice

    @staticmethod
    @torch.inference_mode()
    def time(linears: list[nn.Linear], repeats: int, budget_s: float = BUDGET_S) -> dict[tuple[int, int], frozenset[int]]:
        """Per weight shape, the buckets where W @ x.T took at most MARGIN of F.linear's time at the bucket's top;
        bucket by bucket, the fewest rows first and within one the largest shapes (by the bytes of their
        weights) first, and nothing past budget_s seconds (what is left untimed keeps F.linear)."""
        groups: dict[tuple[int, int], list[torch.Tensor]] = defaultdict(list)
        for m in linears:
            groups[tuple(m.weight.shape)].append(m.weight)
        won: dict[tuple[int, int], set[int]] = {shape: set() for shape in groups}
        noise = torch.Generator().manual_seed(0)  # not the global generator: seeded jobs must not see the timing
        started = time.perf_counter()
        def size(weights: list[torch.Tensor]) -> int:  # bytes of one weight of the shape
            return weights[0].numel() * weights[0].element_size()
        by_size = sorted(groups.items(), key=lambda item: -size(item[1]) * len(item[1]))
        sampled = [(shape, ws[: max(1, SAMPLE_BYTES // max(size(ws), 1))], passes(size(ws), repeats))
                   for shape, ws in by_size]
        for top, (shape, weights, count) in itertools.product(BUCKETS, sampled):  # bucket by bucket
            if time.perf_counter() - started > budget_s:
                break
            linear, left = _best_of(torch.randn(top, shape[1], generator=noise).to(weights[0]), weights, count)
            if left <= MARGIN * linear:
                won[shape].add(top)
        return {shape: frozenset(b) for shape, b in won.items()}

    def _forward(self, module: nn.Linear):
        left = self.left[tuple(module.weight.shape)]

        def forward(x: torch.Tensor) -> torch.Tensor:
            if bucket(x.numel() // x.shape[-1]) in left:
                return weight_left(x, module.weight, module.bias)
            return F.linear(x, module.weight, module.bias)
        return forward

    def __enter__(self) -> FewRowLinears:
        for m, forward in self._swaps:
            m.forward = forward
        return self

    def __exit__(self, *exc) -> None:
        for m, _ in self._swaps:
            m.__dict__.pop("forward", None)
