"""The job loop: requests -> generator -> sink, with progress, resume bookkeeping and signals.

    outcome = run_job(requests, generator, sink, progress=Progress("auto", total=200))

run_job pulls requests lazily through the generator (which admits them as slots free up), writes a
part file every `rows_per_file` results, and flushes the rest at the end. SIGTERM, SIGUSR2 (SLURM's
pre-emption warning) and SIGINT make it stop admitting requests, finish the ones in flight, flush
and return `interrupted`; a second signal stops at once, flushing only the complete rows (a SIGTERM
within 1 s of a SIGTERM is the same one: srun delivers it twice). After a SIGTERM the rows in flight
get TERM_GRACE_S to finish, then it stops at once too. Rows not written are
simply redone by the next run (resume = rerun the same command).
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterable

from tqdm import tqdm

from .grouping import RowGroups
from .sink import ParquetSink
from ..engine.types import FINISH_ERROR, Request
from ..engine.runstats import RunStats

log = logging.getLogger("batchspec")

STOP_SIGNALS = tuple(s for s in (signal.SIGTERM, getattr(signal, "SIGUSR2", None), signal.SIGINT) if s is not None)
# SIGTERM is followed by SIGKILL: SLURM sends it KillWait (default 30 s) later at a time limit, a
# scancel or a pre-emption. Rows still in flight this long after a SIGTERM are abandoned, so that the
# complete rows are written and the process has exited before the SIGKILL.
TERM_GRACE_S = 20.0


def since(now: list[int], before: list[int]) -> list[int]:
    """Per-index counts now minus before; lists grow (a grammar's forced drafts reach past k)."""
    return [n - (before[i] if i < len(before) else 0) for i, n in enumerate(now)]


class StopNow(Exception):
    """Raised by the signal handler on the second signal: stop without finishing in-flight rows."""


@dataclass(slots=True)
class JobOutcome:
    rows: int  # results written by this run
    errors: int  # of which finish_reason == "error"
    completion_tokens: int
    wall_s: float
    interrupted_by: int | None  # the signal number, if a signal stopped the run


class StatsDelta:
    """Drafting statistics since the previous part, stored in each part file's metadata."""

    def __init__(self, stats: RunStats):
        self.stats = stats
        self.proposed = list(stats.proposed_by_position)
        self.accepted = list(stats.accepted_by_position)
        self.by_k = list(stats.rounds_by_k)
        self.by_tree = dict(stats.rounds_by_tree)
        self.rounds = stats.rounds
        self.time = time.perf_counter()

    def take(self) -> dict[str, Any]:
        s, now = self.stats, time.perf_counter()
        delta = {
            "proposed_by_position": since(s.proposed_by_position, self.proposed),
            "accepted_by_position": since(s.accepted_by_position, self.accepted),
            "rounds_by_k": since(s.rounds_by_k, self.by_k),
            "rounds_by_tree": {t: n - self.by_tree.get(t, 0) for t, n in s.rounds_by_tree.items()
                               if n > self.by_tree.get(t, 0)},
            "rounds": s.rounds - self.rounds,
            "wall_s": now - self.time,
        }
        self.proposed, self.accepted = list(s.proposed_by_position), list(s.accepted_by_position)
        self.by_k = list(s.rounds_by_k)
        self.by_tree = dict(s.rounds_by_tree)
        self.rounds, self.time = s.rounds, now
        return delta


def resolve_progress_mode(mode: str, stream) -> str:
    """auto -> bar on a terminal, log otherwise."""
    if mode == "auto":
        return "bar" if stream.isatty() else "log"
    return mode


class Progress:
    """A tqdm bar over rows on a terminal; periodic plain log lines otherwise (SLURM, cron).

    mode: auto | bar | log | off. `total` may be None (unknown length) and shrinks by `skip()` as rows
    already done by an earlier run go by.
    """

    def __init__(self, mode: str, total: int | None, every_s: float = 30.0, stream=None):
        self.stream = stream or sys.stderr
        mode = resolve_progress_mode(mode, self.stream)
        self.mode, self.total, self.every_s = mode, total, every_s
        self.rows = self.errors = self.tokens = 0
        self.start = self.last_log = time.perf_counter()
        self.bar = None
        if mode == "bar":
            self.bar = tqdm(total=total, unit="row", file=self.stream, dynamic_ncols=True, smoothing=0.1)

    def set_total(self, total: int | None) -> None:
        self.total = total
        if self.bar is not None and total is not None and total != self.bar.total:
            self.bar.total = total
            self.bar.refresh()

    def line(self, stats: RunStats) -> str:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        of = f"/{self.total}" if self.total is not None else ""
        acc = stats.acceptance_rate
        tpf = stats.tokens_per_forward
        return (
            f"rows {self.rows}{of} ({self.rows / elapsed:.2f} rows/s) | {self.tokens / elapsed:.1f} tok/s | "
            f"acceptance {'-' if acc is None else f'{acc:.3f}'} | "
            f"tokens/forward {'-' if tpf is None else f'{tpf:.2f}'} | errors {self.errors}"
        )

    def update(self, completion_tokens: int, error: bool, stats: RunStats, rows: int = 1) -> None:
        """`rows` input rows are done (a row of n samples counts once, when its last sample is)."""
        self.rows += rows
        self.errors += error
        self.tokens += completion_tokens
        if self.bar is not None:
            elapsed = max(time.perf_counter() - self.start, 1e-9)
            acc = stats.acceptance_rate
            self.bar.set_postfix_str(
                f"{self.tokens / elapsed:.0f} tok/s, acc {'-' if acc is None else f'{acc:.2f}'}, err {self.errors}",
                refresh=False,
            )
            self.bar.update(rows)
        elif self.mode == "log" and time.perf_counter() - self.last_log >= self.every_s:
            self.last_log = time.perf_counter()
            log.info(self.line(stats))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def pass_on_signal(signum: int) -> None:
    """Call the Python handler that was installed for `signum` before run_job's own (run_job restores
    it when it returns), after the rows that were complete have been written.

    Under Hydra's submitit launcher that is submitit's SIGUSR2 handler: it checkpoints the call (the
    launcher resubmits itself with the same arguments), requeues the job with `scontrol requeue` and
    exits; the requeued job skips the rows written before the signal. For SIGTERM submitit's handler
    only logs. Default and ignored handlers and Python's SIGINT handler are left alone, so a plain
    `python -m batchspec` still exits 128+N.
    """
    handler = signal.getsignal(signum)
    if callable(handler) and handler is not signal.default_int_handler:
        handler(signum, None)


class StopSignals:
    """run_job's signal handling, installed for the loop and restored after it.

    The first SIGTERM, SIGUSR2 or SIGINT stops admitting (the rows in flight finish); a second stops at
    once by raising StopNow, except a SIGTERM within 1 s of a SIGTERM (srun delivers it twice). StopNow is
    raised from a signal handler, so anywhere in the loop: never while a part is being written (a part
    renamed into data/ but not yet cleared from the buffer would be written twice), so a signal during a
    write takes effect after it. After a SIGTERM the rows in flight get TERM_GRACE_S, then it stops at once."""

    def __init__(self, generator):
        self.generator = generator
        self.received: list[int] = []
        self.writing = self.stop_after_write = self.closing = False  # closing: signals are only recorded
        self.last_signal = 0.0
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> "StopSignals":
        self.previous = {s: signal.signal(s, self.on_signal) for s in STOP_SIGNALS}
        self.previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, self.on_deadline)
        return self

    def __exit__(self, *exc) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for s, handler in self.previous.items():
            signal.signal(s, handler)

    @property
    def first(self) -> int | None:
        return self.received[0] if self.received else None

    def stop_now(self) -> None:
        if self.closing:
            return
        if self.writing:
            self.stop_after_write = True
        else:
            raise StopNow

    def on_signal(self, signum, frame) -> None:
        now = time.monotonic()
        if self.received and signum == self.received[-1] == signal.SIGTERM and now - self.last_signal < 1.0:
            return  # the same request, delivered twice by srun
        self.received.append(signum)
        self.last_signal = now
        if self.closing:
            return
        if len(self.received) == 1:
            log.warning("%s: finishing the rows in flight, then stopping (send it again to stop now)",
                        signal.Signals(signum).name)
            self.generator.stop_admitting()
            if signum == signal.SIGTERM:
                signal.setitimer(signal.ITIMER_REAL, TERM_GRACE_S)
        else:
            self.stop_now()

    def on_deadline(self, signum, frame) -> None:
        log.warning("rows still in flight %g s after SIGTERM: stopping now", TERM_GRACE_S)
        self.stop_now()

    def write(self, flush) -> None:
        """Run `flush()` with signals held off it; a second signal that came meanwhile stops now after."""
        self.writing = True
        try:
            flush()
        finally:
            self.writing = False
        if self.stop_after_write and not self.closing:
            raise StopNow


def run_job(requests: Iterable[Request], generator, sink: ParquetSink, progress: Progress,
            remaining=None, groups: RowGroups | None = None) -> JobOutcome:
    """Drive `generator.run(requests)` into `sink` until the requests run out or a signal stops it.

    `generator` is a batchspec SpecBatchGenerator (run / stats / stop_admitting). `remaining`, if
    given, is called before each progress update and returns the rows left to do (or None). `groups`
    (grouping.RowGroups) holds a request's samples until all are in (and, if asked, keeps input order).
    """
    groups = groups or RowGroups(1)
    delta = StatsDelta(generator.stats)
    flush = lambda: sink.flush(delta.take())  # noqa: E731
    start = time.perf_counter()
    rows = errors = tokens = 0
    with StopSignals(generator) as signals:
        try:
            for result in generator.run(groups.track(requests)):
                ready = groups.add(result)
                for r in ready:
                    sink.add(r)
                rows += len(ready)
                errors += sum(r.finish_reason == FINISH_ERROR for r in ready)
                tokens += result.completion_tokens
                if remaining is not None:
                    progress.set_total(remaining())
                progress.update(result.completion_tokens, result.finish_reason == FINISH_ERROR, generator.stats,
                                rows=sum(r.sample_index == 0 for r in ready))
                if sink.full:
                    signals.write(flush)
        except StopNow:
            log.warning("stopping now; rows in flight are left for the next run")
        finally:
            # The buffer holds only complete rows; write them even when stopping early. No signal may
            # interrupt this (StopNow escaping here would skip the flush and exit 1 instead of 128+N).
            signals.closing = True
            signal.setitimer(signal.ITIMER_REAL, 0)
            for r in groups.drain():
                sink.add(r)
                rows += 1
                errors += r.finish_reason == FINISH_ERROR
            signals.write(flush)
            progress.close()
    return JobOutcome(rows=rows, errors=errors, completion_tokens=tokens, wall_s=time.perf_counter() - start,
                      interrupted_by=signals.first)
