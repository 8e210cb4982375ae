"""Adaptive speculation: choose the number of drafts per round from measured throughput.

Speculation pays only when a verify pass over k+1 tokens costs little more than a 1-token step and
enough drafts are accepted; on a CPU or at a large batch the verify pass is far from free (seed 000's
"alpha-k cliff"). Rather than predict from a model of the cost curve, this controller measures what
it wants to maximize — tokens emitted per second of round wall time, at the batch size the job is
running at — for every k in 0..k_max (0 = plain decoding), exploits the best, and re-probes the
neighbouring k now and then because acceptance drifts with the requests in the batch.

The choice never changes a greedy output (speculation is exact). It does change which noise a
sampled token consumes, so with temperature > 0 the generator keeps k fixed unless told otherwise:
seeded output must not depend on machine load.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AdaptiveK:
    """Bandit over k. Call choose() before a round and observe() after it."""

    k_max: int
    probe_rounds: int = 3  # rounds per arm when it is (re)measured
    revisit_every: int = 48  # exploit rounds between probes of the best arm's neighbours
    smoothing: float = 0.3  # weight of a new observation in an arm's rate
    rates: list[float | None] = field(init=False)  # smoothed tokens per second for each k; None = unmeasured
    _queue: list[int] = field(init=False)
    _since_probe: int = field(init=False, default=0)

    def __post_init__(self):
        self.rates = [None] * (self.k_max + 1)
        # Measure the extremes first, so a useless drafter is found out after a few rounds.
        order = [0, self.k_max] + [k for k in range(self.k_max - 1, 0, -1)]
        self._queue = [k for k in order for _ in range(self.probe_rounds)]

    @property
    def best(self) -> int:
        measured = [(rate, k) for k, rate in enumerate(self.rates) if rate is not None]
        return max(measured)[1] if measured else self.k_max

    def choose(self) -> int:
        if self._queue:
            return self._queue[0]
        self._since_probe += 1
        if self._since_probe >= self.revisit_every:
            self._since_probe = 0
            best = self.best
            self._queue = [k for k in (best - 1, best + 1) if 0 <= k <= self.k_max for _ in range(self.probe_rounds)]
            if self._queue:
                return self._queue[0]
        return self.best

    def observe(self, k: int, tokens: int, seconds: float) -> None:
        if self._queue and self._queue[0] == k:
            self._queue.pop(0)
        if seconds <= 0:
            return
        rate, old = tokens / seconds, self.rates[k]
        self.rates[k] = rate if old is None else (1 - self.smoothing) * old + self.smoothing * rate
