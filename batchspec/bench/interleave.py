"""The benchmark's contenders interleaved round by round in one process (python -m batchspec.bench --interleave).

Why: on this project's 2-core VMs the machine's speed moves by 10-36% over minutes (drafter none's three
runs read 36.1, 44.0 and 49.1 tokens/s within one run, 2026-12-02), so contenders that run one after another,
each a job of tens of seconds, compare the machine's moments as much as the contenders: three repeats cannot
resolve the 3-5% that the adaptive floor is about. Here the batchspec contenders' jobs advance together, one
round at a time, the next round always going to the contender furthest behind in the tokens it has emitted
(every job emits the same tokens: greedy and coupled outputs are drafter none's), so that all of them run
through the same minutes, their n-th jobs side by side, and a swing of the machine's speed slows each alike.

How: a contender's `generator.step` is wrapped to yield a marker (`PAUSE`) after its round, which
`generator.run` passes on (it reads step's results with `yield from`), so that iterating a contender's run
advances it by one round. Single-threaded on purpose: threads would each get an OpenMP team of their own, whose
spinning workers would fight the running one for the cores. A contender's clock counts its own rounds and
admissions, and the start-up work of its run (as a sequential run's timer does); building its generator is not
counted (run_batchspec's rule). Each contender runs `repeats` jobs one after another, a slower one more rounds
a minute, so that all end together. Every job is one entry of its tokens_per_s, as a sequential repeat is.
Why not an equal share of time or progress by rows (SmolLM2-135M, 10 contenders, 2026-12-03): an equal share kept drafter none's
two copies within 1.7% of each other per job but ran every contender until the slowest (a draft model at
0.57x) had its jobs, 12 minutes more, and left the contenders with unequal numbers of jobs; progress by
finished rows (which finish in waves of a batch) ran contenders alone for whole waves, and the two copies of
drafter none read 14% apart in one job.

Threads: torch's thread count is one for the process, so the lanes run without the thread guard
(engine/model/threads.py), which would otherwise lower it for every lane when one lane's poll saw another process;
instead the run says how long torch's threads waited for a CPU over it (threads.waited_share): above 15%,
another process shared the cores, and a ratio is the machine's as much as the contenders'.

What it costs: a switch of contender every round (their KV caches and the drafters' tables leave the CPU's
caches). `--noise-check` adds drafter none a second time, so the table shows what the harness and the machine
do to a ratio that should be 1.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import torch

from ..engine.model.machine_cache import MAX_WAIT
from ..engine.model.threads import read_sample, waited_share
from .calibrate import sync
from .contenders import Contender, batchspec_job, finish_batchspec, requests

PAUSE = object()  # what a wrapped step yields after its round, before the round's results


def pausing(step):
    """generator.step wrapped to yield PAUSE after each round, then the round's results (a generator, so
    that `yield from self.step()` in generator.run hands PAUSE to whoever iterates the run)."""

    def wrapped():
        results = step()
        yield PAUSE
        yield from results

    return wrapped


@dataclass
class Lane:
    """One contender's jobs in an interleaved run: the one running, its results so far, its clock."""

    contender: Contender
    jobs_done: int = 0
    clock: float = 0.0  # seconds of this contender's work over the whole run (finished jobs and the running one)
    rounds: int = 0  # rounds of the running job
    tokens: int = 0  # tokens its finished jobs emitted
    generator: object | None = None
    running: Iterator | None = None
    started: float = 0.0  # the clock when the running job started
    results: list = field(default_factory=list)


def interleave(lanes_of: list[Contender], models, prompts: list[str], args) -> None:
    """Run `args.repeats` jobs of each batchspec contender, interleaved one round at a time (the module's
    docstring); each job's tokens/s is appended to its contender's tokens_per_s."""
    lanes = [Lane(c) for c in lanes_of]
    device = models.target.device
    before, started = read_sample(), time.perf_counter()
    while any(lane.jobs_done < args.repeats for lane in lanes):
        lane = min(lanes, key=lambda x: (x.jobs_done >= args.repeats, emitted(x), x.clock))
        if lane.running is None:
            start(lane, models, prompts, args)
        sync(device)
        t0 = time.perf_counter()
        item = next(lane.running, None)
        sync(device)
        lane.clock += time.perf_counter() - t0
        if item is PAUSE:
            lane.rounds += 1
        elif item is not None:
            lane.results.append(item)
        else:
            finish(lane, len(prompts))
    for lane in lanes:
        print(f"  interleaved: {lane.contender.name:32s} {lane.jobs_done} jobs, {lane.clock:7.1f} s", flush=True)
    threads = torch.get_num_threads()
    wait = waited_share(before, read_sample(), time.perf_counter() - started, threads)
    if wait is not None:
        print(f"  interleaved: torch's {threads} threads waited {wait:.0%} of the run for a CPU" + (
            f" (over {MAX_WAIT:.0%}: another process shared the cores; read the ratios with care)"
            if wait > MAX_WAIT else ""), flush=True)


def emitted(lane: Lane) -> int:
    """Tokens the lane has emitted: its finished jobs', and its running job's finished rows' (counted as a
    round releases them, before its pause) and running rows'."""
    generator, running = lane.generator, 0
    if generator is not None:
        slots = generator.scheduler.slots
        running = generator.stats.completion_tokens + sum(slots[s].num_output for s in slots.active())
    return lane.tokens + running


def start(lane: Lane, models, prompts: list[str], args) -> None:
    """A new job on the lane: its generator (built off the clock) and the run it iterates."""
    lane.generator = batchspec_job(lane.contender, models, args)
    lane.generator.step = pausing(lane.generator.step)
    lane.running, lane.results, lane.rounds, lane.started = lane.generator.run(requests(prompts, args)), [], 0, lane.clock


def finish(lane: Lane, count: int) -> None:
    """The lane's job ended: its rate and outputs into the contender's, as a sequential repeat's."""
    c, generator = lane.contender, lane.generator
    del generator.step  # the class's own again: a contender that keeps its generator (not --fresh) reuses it
    rate, outputs = finish_batchspec(c, generator, lane.results, count, lane.clock - lane.started)
    if lane.rounds != generator.stats.rounds:  # every round must have paused, or the clock mixed contenders
        raise RuntimeError(f"interleave: {c.name} paused {lane.rounds} times in {generator.stats.rounds} rounds")
    c.tokens_per_s.append(rate)
    c.outputs = c.outputs or outputs
    lane.tokens += generator.stats.completion_tokens
    lane.jobs_done, lane.running, lane.generator = lane.jobs_done + 1, None, None
    print(f"  job {lane.jobs_done}: {c.name:32s} {rate:8.1f} tok/s", flush=True)
