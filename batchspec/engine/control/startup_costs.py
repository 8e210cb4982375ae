"""What a round costs on this machine, known before the first round.

Adaptive speculation prices each row's drafts by what a packed round computes (costs.PackedCosts: the target
forward's seconds by its tokens N, a drafting forward's by its rows, the rest of the round by its drafts).
Learnt from the rounds alone, those lines are unknown for the job's first rounds and noisy for its first
hundred, which is all a short job has. So at the start of a run the generator times the target's packed
forward at the N a round may have (the batch's pending tokens, every row drafting k_max, one draft a row, one
draft in all, then the sizes between and below them coarse to fine: a CPU's forward is no line in N,
row_drafts.Prices) and the drafter's forward over the batch's rows, within a time budget (2% of a 1,000-row
job of 64 tokens a row at the plain forward's time, 0.5 to 5 s), and the cost model starts from those points
(their curve) and goes on learning from the rounds. The points are kept in the user's cache under what they
depend on (the model's shapes, its dtype, the device, torch's threads, the batch size, k_max and the drafter),
so that a resumed or repeated job reads them instead of measuring again.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ... import __version__
from ..model import machine_cache
from ..model.few_rows import CHOICE
from ..model.threads import read_sample
from ..model.timing import time_packed

BUDGET_S = 5.0  # the most seconds the start-up measurement takes
MIN_BUDGET_S = 0.5  # the least: a small model's whole curve (a 1,000-row job of it takes seconds)
SHARE, JOB_ROWS, JOB_TOKENS = 0.02, 1000, 64  # the budget: this share of such a job's plain rounds
PASSES = 3  # timed forwards a size of the target's (one a pass: the budget cuts whole passes short, not sizes)
REPEATS = 3  # timed forwards of a drafting forward's point (after one untimed)
FEED_TOKENS = (16, 128)  # tokens fed past the batch's rows at which a drafting forward is timed: a fed row's lag, a prompt


@dataclass(frozen=True, slots=True)
class StartupCosts:
    """verify: (tokens, seconds) of the target's packed forward; step: (tokens, seconds) of one drafting forward
    (empty for a drafter without forwards); feed: (tokens, seconds) that a drafting forward over the batch's rows
    takes to feed that many tokens more (what rows' draft caches lack: row_drafts.Prices.fed; empty where not
    timed); seconds: what measuring took (0 when read from the cache)."""

    verify: tuple[tuple[int, float], ...]
    step: tuple[tuple[int, float], ...]
    feed: tuple[tuple[int, float], ...] = ()
    seconds: float = 0.0
    cached: bool = False
    quiet: bool = True  # nothing else took the CPU while they were measured, and more tokens cost more: cacheable

    def as_dict(self) -> dict:
        return {"verify": [list(p) for p in self.verify], "step": [list(p) for p in self.step],
                "feed": [list(p) for p in self.feed]}


def model_shape(module: torch.nn.Module) -> str:
    """What a model's cost depends on, as a digest: its class and its parameters' names, shapes and dtypes."""
    shapes = [type(module).__name__] + [f"{name}:{tuple(p.shape)}:{p.dtype}" for name, p in module.named_parameters()]
    return hashlib.sha256("\n".join(shapes).encode()).hexdigest()[:16]


def linear_choice(model: torch.nn.Module) -> str | None:
    """Which products the model's linears run (few_rows.py's choice on the model), as a digest; None if none."""
    choice = getattr(model, CHOICE, None)
    if choice is None:
        return None
    text = repr(sorted((shape, sorted(chosen.items())) for shape, chosen in choice.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_key(target, drafter, *, batch_size: int, k_max: int, device: torch.device) -> dict:
    """Everything the measured points depend on: the target's and the drafter's model shapes (a drafter with a
    `runner` has a model; the lookups share one key) and the products their linears run (a point timed under
    another choice prices another forward: on SmolLM2 a 9-row product took 21.6 ms or 13.7, 2026-12-04), the
    batch size, k_max, the machine and the versions."""
    runner = getattr(drafter, "runner", None)
    # A drafter without a model (the lookups) adds no forward: they share the target's points.
    return {"target": model_shape(target), "drafter": type(drafter).__name__ if runner is not None else "no forwards",
            "draft": model_shape(runner.model) if runner is not None else None, "batch_size": batch_size,
            "linears": [linear_choice(target), linear_choice(runner.model) if runner is not None else None],
            "k_max": k_max, **machine_cache.machine(device), "torch": torch.__version__, "batchspec": __version__,
            "logits": "every token",  # what the points priced: a verify's logits at every draft, not one row's
            "points": "coarse to fine, one forward a pass",  # token_counts and measure's passes
            "feed": list(FEED_TOKENS)}  # the drafting forward's feeding points (measure)


def load_or_measure(key: dict, measure: Callable[[], StartupCosts], folder: Path | None = None) -> StartupCosts:
    """The points the machine's cache holds under `key`, or measure() (kept in the cache if undisturbed)."""
    stored = machine_cache.read("costs", key, folder)
    if stored is not None:
        return StartupCosts(*(tuple(map(tuple, stored.get(name, ()))) for name in ("verify", "step", "feed")), cached=True)
    costs = measure()
    if costs.quiet:  # a measurement another process disturbed is used for this run only
        machine_cache.write("costs", key, {**costs.as_dict(), "measured_s": round(costs.seconds, 3)}, folder)
    return costs


def token_counts(batch_size: int, k_max: int) -> list[int]:
    """The forwards' sizes to time, most telling first: every row plain, every row drafting k_max, one draft a
    row, one draft in all; then, for the curve's shape (row_drafts.Prices), the sizes past plain (every N up to
    16 drafts past it, every 4th to 64 and every 16th beyond) and below it (rounds of fewer rows than the batch:
    every N to 8, then every 8th), each group coarse to fine (`coarse_to_fine`) and the two taken in turn, so
    that a budget cut short leaves both spans at a coarser step rather than part of one at the finest. Below
    plain because a round of fewer rows (a job's tail, a batch not yet full) is no line in N either: on a
    held-out pair at batch 8 (2 CPU cores, 2026-12-05) a forward of 2 tokens took 5.8 ms, of 3 7.8 ms and of 8
    12.2 ms, where the line through the sizes above plain priced the draft of a 2-row round about 0.4 ms. In
    turn because either alone loses: every size below plain first took the time of the sizes past it at batch
    32 (fixed p512: suffix 1.02x against 1.09x), and past it first (with a budget of a second) left none below
    (96 staggered rows at batch 32: ngram 1.18x against 1.24x)."""
    plain, full = batch_size, batch_size * (1 + k_max)
    first = list(dict.fromkeys(n for n in (plain, full, 2 * plain, plain + 1) if 0 < n <= full))
    above = [plain + j for j in range(2, plain * k_max)
             if j <= 16 or (j <= 64 and j % 4 == 0) or j % 16 == 0]
    below = [n for n in range(1, plain) if n <= 8 or n % 8 == 0]
    above = coarse_to_fine([n for n in above if n not in first], first)
    below = coarse_to_fine(below, first)
    return first + [n for pair in itertools.zip_longest(above, below) for n in pair if n is not None]


def coarse_to_fine(sizes: list[int], taken: list[int]) -> list[int]:
    """`sizes` ordered so that each next one is the farthest (in log N: a draft's share of the forward) from
    every size already taken; ties to the smaller."""
    order, taken, left = [], list(taken), sorted(sizes)
    while left:
        n = max(left, key=lambda c: (min((abs(math.log(c / t)) for t in taken), default=0.0), -c))
        order.append(n)
        taken.append(n)
        left.remove(n)
    return order


def budget(plain_seconds: float, batch_size: int) -> float:
    """The start-up measurement's seconds: SHARE of a JOB_ROWS-row job's decoding rounds (JOB_TOKENS tokens a row
    at the plain forward's `plain_seconds`; its prefill left out, so less than SHARE of such a job), within
    MIN_BUDGET_S .. BUDGET_S. On p512 at batch 64 (32 ms a plain forward) 0.64 s, where a 1,000-row job of
    staggered rows took 60 s."""
    job = JOB_ROWS * JOB_TOKENS / batch_size * plain_seconds
    return min(BUDGET_S, max(MIN_BUDGET_S, SHARE * job))


def measure(target_runner, step: Callable[[int, int], float] | None, *, batch_size: int, k_max: int,
            budget_s: float | None = None) -> StartupCosts:
    """Time the target's packed forward at token_counts (rows of 1 + j tokens) and, given step(rows, repeats)
    (a drafter's forward over that many rows, one token each), the drafting forward at the batch's rows and
    at a quarter of them (REPEATS each). The target's sizes are timed in passes of one forward each (after one
    untimed forward at the largest), a point the median of its passes: one forward a size measured p512's curve
    at batch 64 as closely as four (3-4% from the median of two such curves, 2 CPU cores, 2026-12-05) in a
    quarter of the time, so a short budget buys the curve's span. The first four sizes are always timed; after
    them nothing starts past `budget_s` (default: `budget` at the plain forward's time)."""
    started, before = time.perf_counter(), read_sample()
    spent = lambda: time.perf_counter() - started  # noqa: E731
    sizes = token_counts(batch_size, k_max)
    once = lambda n: time_packed(target_runner, batch_size, n, repeats=1, warm=False)  # noqa: E731
    once(max(sizes))  # untimed: the first forward allocates what the later ones reuse
    times = {sizes[0]: [once(sizes[0])]}
    budget_s = budget(times[sizes[0]][0], batch_size) if budget_s is None else budget_s
    # The drafting forward before the curve's passes, which spend the rest of the budget: its two points are
    # what prices a draft model's steps at all (a few ms at most).
    drafting = [] if step is None else [(rows, step(rows, REPEATS))
                                        for rows in dict.fromkeys((batch_size, max(1, batch_size // 4)))]
    feed = [] if step is None else feeding(step, batch_size, drafting[0][1])
    for sweep in range(PASSES):
        for i, n in enumerate(sizes):
            if (sweep or i >= 4) and spent() > budget_s:
                break
            if len(times.setdefault(n, [])) <= sweep:
                times[n].append(once(n))
    verify = [(n, statistics.median(times[n])) for n in sizes if times.get(n)]
    seconds = spent()
    # Kept only if no other process took the cores (the thread guard's test) and more tokens cost more: not
    # always a token more (SmolLM2 at batch 8: 75 ms at 15 tokens, 64 at 16), but no point far under one before it.
    ordered = [t for _, t in sorted(verify)]
    peaks = itertools.accumulate(ordered, max)  # the dearest size at or below each
    monotone = all(t >= 0.7 * peak for t, peak in zip(ordered[1:], peaks)) and ordered[-1] >= ordered[0]
    quiet = machine_cache.undisturbed(before, read_sample(), seconds) and monotone
    return StartupCosts(tuple(verify), tuple(drafting), tuple(feed), seconds=seconds, quiet=quiet)


def feeding(step: Callable[..., float | None], batch_size: int, plain: float) -> list[tuple[int, float]]:
    """(tokens, seconds): what a drafting forward over the batch's rows (`plain` seconds) takes more to feed
    FEED_TOKENS tokens more, the points a drafter can time. A row that drafts after rounds without drafting first
    feeds its draft cache what it lacks (a new row its whole prompt), in one forward: priced at the slope of
    forwards of a token a row (at batch 1 one point, the whole forward a token), a q384 draft model's 37-token
    prompt cost 37 ms at batch 1 where its forward took 1.5 ms at 32 tokens and 0.95 ms at 1 (2 CPU cores,
    2026-12-06), and its exploration waited so long to pay for it that the job drafted twice in ~500 rounds
    (0.98x drafter none, fixed k=4 1.93x)."""
    points = []
    for extra in FEED_TOKENS:
        seconds = step(batch_size, REPEATS, batch_size + extra)
        if seconds is not None:
            points.append((extra, max(seconds - plain, 0.0)))
    return points


def for_runner(runner, drafter, *, batch_size: int, k_max: int) -> StartupCosts:
    """The costs of a target's runner and a drafter at this batch size and k: read from the cache, or measured
    now (and cached when the machine was quiet)."""
    key = cache_key(runner.model, drafter, batch_size=batch_size, k_max=k_max, device=runner.device)
    step = drafter.step_seconds if drafter.policy.draft_forwards else None
    return load_or_measure(key, lambda: measure(runner, step, batch_size=batch_size, k_max=k_max))

