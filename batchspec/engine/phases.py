"""Wall seconds per phase of the rounds (admit, draft, verify, accept, bookkeeping): what the bench's and the
job summary's phase split reads."""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

PHASES = ("admit", "draft", "verify", "accept", "bookkeeping")


class PhaseTimes:
    """Adds each phase's seconds to `seconds`. A GPU runs ahead of the host: a phase's time is exact there only
    with `sync` (a device sync at each phase's end, which costs speed). `counter` (host_device.LaunchCounter, or
    None) is told the phase, so that kernel launches are counted per phase."""

    def __init__(self, device: torch.device, *, sync: bool = False, counter=None):
        self.device, self.counter = device, counter
        self.sync = sync and device.type == "cuda"
        self.seconds = dict.fromkeys(PHASES, 0.0)

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)

    @contextmanager
    def __call__(self, name: str):
        if self.counter is not None:
            self.counter.phase = name
        started = time.perf_counter()
        try:
            yield
        finally:
            if self.sync:
                torch.cuda.synchronize(self.device)
            self.seconds[name] += time.perf_counter() - started
