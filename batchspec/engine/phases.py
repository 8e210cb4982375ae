"""A run's timers: wall seconds per phase of the rounds (admit, draft, verify, accept, bookkeeping) and what the
stages time inside those phases (coupled sampling's noise, grammars' compiling and masking). One `Timers` per
generator, handed to each stage that times something, so that the bench's phase split, the job summary and a
benchmark's next repeat (`reset`) read and clear one object."""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

PHASES = ("admit", "draft", "verify", "accept", "bookkeeping")
NOISE = "noise"  # coupled sampling's noise, inside the draft phase (drafting.py)
GRAMMAR_COMPILE = "grammar_compile"  # compiling constraints (grammar.py)
GRAMMAR_MASK = "grammar_mask"  # masks, forced continuations and advances (grammar.py)
INSIDE = (NOISE, GRAMMAR_COMPILE, GRAMMAR_MASK)


class Timers:
    """Seconds by name over a run. `phase(name)` times one of PHASES; `timed(name)` and `add` one of INSIDE. A GPU
    runs ahead of the host: a phase's time is exact there only with `sync` (a device sync at each phase's end,
    which costs speed). `counter` (host_device.LaunchCounter, or None) is told the phase, so that kernel
    launches are counted per phase."""

    def __init__(self, device: torch.device | None = None, *, sync: bool = False, counter=None):
        self.device, self.counter = device, counter
        self.sync = sync and device is not None and device.type == "cuda"
        self.reset()

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PHASES + INSIDE, 0.0)

    @property
    def phases(self) -> dict[str, float]:
        """Seconds per phase of the rounds (a round's wall time is their sum)."""
        return {name: self.seconds[name] for name in PHASES}

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] += seconds

    @contextmanager
    def timed(self, name: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - started

    @contextmanager
    def phase(self, name: str):
        if self.counter is not None:
            self.counter.phase = name
        started = time.perf_counter()
        try:
            yield
        finally:
            if self.sync:
                torch.cuda.synchronize(self.device)
            self.seconds[name] += time.perf_counter() - started
