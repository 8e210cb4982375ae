"""torch's CPU threads on a machine that may be shared: spin while the cores are ours, back off when not.

torch's OpenMP threads wait for work by spinning (GNU OpenMP's default: a bounded spin, then sleep).
Measured on a quiet 2-core VM (demo target, batch 8, drafter none, 2026-11-25): 824 tokens/s with
that default against 365 with OMP_WAIT_POLICY=PASSIVE (threads sleep at once, and waking a sleeping
vCPU costs more than the small ops of a small model). But with one other busy process on the same 2
cores, spinning threads fight it for the CPU: the same run took over 240 s instead of 21 s with
PASSIVE. One thread has no OpenMP barriers to spin in, so it is safe on a busy CPU (458 tokens/s there).

So batchspec keeps OpenMP's default and a `ThreadGuard` watches, about once a second, how long this
process's threads waited for a CPU (`/proc/self/task/*/schedstat`): when they waited for more than
`max_wait` of the time, another process wants these cores, and torch drops to half its threads (down to
one); when the cores the process may run on (`sched_getaffinity`) sat idle for at least a core's worth
of the time, it takes threads back, up to the number it started with.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

log = logging.getLogger("batchspec")


@dataclass(frozen=True)
class CpuSample:
    """Cumulative counters at one moment: seconds this process's threads spent waiting for a CPU, and
    seconds the CPUs it may run on spent idle (summed over those CPUs)."""

    waited_s: float
    idle_s: float


def read_sample(proc: Path = Path("/proc")) -> CpuSample | None:
    """The counters from Linux's /proc; None where they are missing (another OS, a locked-down container)."""
    try:
        waited_ns = 0
        for task in (proc / "self" / "task").iterdir():
            try:
                waited_ns += int((task / "schedstat").read_text().split()[1])
            except (FileNotFoundError, ProcessLookupError):  # the thread ended while we looked
                continue
        cpus = {f"cpu{i}" for i in os.sched_getaffinity(0)}
        idle_ticks = 0
        for line in (proc / "stat").read_text().splitlines():
            fields = line.split()
            if fields and fields[0] in cpus:
                idle_ticks += int(fields[4]) + int(fields[5])  # idle + iowait
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return CpuSample(waited_ns / 1e9, idle_ticks / os.sysconf("SC_CLK_TCK"))


def waited_share(before: CpuSample | None, after: CpuSample | None, seconds: float, threads: int) -> float | None:
    """The share of `seconds` that `threads` threads waited for a CPU between two read_sample() readings (None
    where /proc cannot tell)."""
    if before is None or after is None or seconds <= 0:
        return None
    return (after.waited_s - before.waited_s) / (seconds * threads)


def guard_for(device) -> "ThreadGuard | None":
    """A guard over torch's current thread count where `device` is the CPU; None elsewhere (a GPU's host
    threads mostly wait on the device)."""
    import torch  # deferred: the module's /proc readings load without torch

    return ThreadGuard(torch.get_num_threads()) if torch.device(device).type == "cpu" else None


class ThreadGuard:
    """Adjusts torch's thread count to the CPU's load; call `poll()` often (it is a clock read when not due).

    threads: the count to use while the cores are free (torch.get_num_threads() at the start).
    interval_s: how often to look. max_wait: the share of the time each thread may wait for a CPU before
    the guard backs off. hold_s: how long to stay backed off before trying more threads again.
    """

    def __init__(self, threads: int, *, interval_s: float = 1.0, max_wait: float = 0.15, hold_s: float = 3.0,
                 read: Callable[[], CpuSample | None] = read_sample, set_threads: Callable[[int], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        if set_threads is None:
            import torch  # deferred, as in guard_for
            set_threads = torch.set_num_threads
        self.threads = self.current = max(1, threads)
        self.interval_s, self.max_wait, self.hold_s = interval_s, max_wait, hold_s
        self.read, self.set_threads, self.clock = read, set_threads, clock
        self.changes = 0
        self.last = read() if self.threads > 1 else None
        self.last_at = self.lowered_at = clock()

    @property
    def active(self) -> bool:
        return self.last is not None

    def poll(self) -> None:
        if self.last is None:
            return
        now = self.clock()
        wall = now - self.last_at
        if wall < self.interval_s:
            return
        sample = self.read()
        if sample is None:
            self.last = None
            return
        waited = waited_share(self.last, sample, wall, self.current)
        idle_cores = (sample.idle_s - self.last.idle_s) / wall
        self.last, self.last_at = sample, now
        if self.current > 1 and waited > self.max_wait:
            self._use(max(1, self.current // 2), f"its threads waited {waited:.0%} of the time for a CPU")
            self.lowered_at = now
        elif self.current < self.threads and idle_cores >= 0.9 and now - self.lowered_at >= self.hold_s:
            self._use(min(self.threads, self.current + int(idle_cores + 0.1)), f"{idle_cores:.1f} cores idle")

    def restore(self) -> None:
        """Back to the count it started with (call when the work it guarded ends: the next guard starts
        from torch's count then)."""
        if self.current != self.threads:
            self.current = self.threads
            self.set_threads(self.threads)

    def _use(self, threads: int, why: str) -> None:
        level = logging.WARNING if self.changes == 0 else logging.INFO
        log.log(level, "CPU threads %d -> %d: %s (another process shares these cores; batchspec adjusts as "
                "the load changes)", self.current, threads, why)
        self.current = threads
        self.changes += 1
        self.set_threads(threads)
