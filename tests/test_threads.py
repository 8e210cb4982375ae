"""engine/model/threads.py: the ThreadGuard's decisions on scripted CPU counters, and the real /proc reader."""

import sys

import pytest

from batchspec.engine.model.threads import CpuSample, ThreadGuard, read_sample


class Script:
    """A clock and a counter reader that replay a list of (seconds, waited_s, idle_s) readings."""

    def __init__(self, readings):
        self.readings = list(readings)
        self.now, self.sample = 0.0, CpuSample(0.0, 0.0)

    def clock(self):
        return self.now

    def read(self):
        return self.sample

    def advance(self, seconds, waited_s, idle_s):
        self.now += seconds
        self.sample = CpuSample(self.sample.waited_s + waited_s, self.sample.idle_s + idle_s)


def run(threads, steps, **options):
    """Polls once after each step of (seconds, waited_s, idle_s); returns the thread counts set."""
    script, applied = Script([]), []
    guard = ThreadGuard(threads, read=script.read, set_threads=applied.append, clock=script.clock, **options)
    for step in steps:
        script.advance(*step)
        guard.poll()
    return applied, guard


QUIET = (1.0, 0.01, 0.0)          # 1 s: the threads waited 10 ms in all, no idle core
CONTENDED = (1.0, 0.7, 0.0)       # 2 threads waited 35% of the time each
FREED = (1.0, 0.0, 1.0)           # one thread running, the other core idle all second


@pytest.mark.parametrize("threads, steps, expected", [
    (2, [QUIET] * 5, []),                                   # a quiet machine: nothing changes
    (2, [CONTENDED], [1]),                                  # contention: back off to one thread
    (2, [CONTENDED, CONTENDED, CONTENDED], [1]),            # one thread cannot back off further
    (8, [(1.0, 8 * 0.3, 0.0)] * 3, [4, 2, 1]),              # halves each time it is still contended
    (2, [CONTENDED] + [FREED] * 2, [1]),                    # freed, but holds 3 s before trying again
    (2, [CONTENDED] + [FREED] * 3, [1, 2]),                  # freed for the hold time: back to 2
    (8, [(1.0, 8 * 0.3, 0.0)] * 2 + [(1.0, 0.0, 3.0)] * 12, [4, 2, 5, 8]),  # takes back the idle cores
    (2, [CONTENDED] + [(1.0, 0.0, 0.5)] * 20, [1]),         # half a core idle is not enough to go back
    (2, [(0.5, 0.7, 0.0)], []),                             # polled before the interval: no reading yet
    (1, [CONTENDED, FREED], []),                            # one thread to begin with: nothing to guard
])
def test_guard_decisions(threads, steps, expected):
    applied, _ = run(threads, steps)
    assert applied == expected


def test_restore_sets_the_starting_count_once():
    applied, guard = run(2, [CONTENDED])
    guard.restore()
    guard.restore()
    assert applied == [1, 2] and guard.current == 2


def test_a_reader_that_fails_turns_the_guard_off():
    applied = []
    readings = iter([CpuSample(0.0, 0.0), None])
    now = [0.0]
    guard = ThreadGuard(2, read=lambda: next(readings), set_threads=applied.append, clock=lambda: now[0])
    assert guard.active
    now[0] = 2.0
    guard.poll()
    assert not guard.active and applied == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")
def test_read_sample_reads_this_process_counters():
    first = read_sample()
    assert first is not None and first.waited_s >= 0 and first.idle_s > 0
    total = sum(i * i for i in range(200_000))  # some CPU time between the readings
    second = read_sample()
    assert total > 0 and second.waited_s >= first.waited_s and second.idle_s >= first.idle_s


def test_read_sample_without_proc_is_none(tmp_path):
    assert read_sample(tmp_path) is None


def test_a_cpu_generator_is_guarded_and_gives_its_threads_back(llama_pair):
    """A generator on CPU polls a ThreadGuard; when its run ends, torch has the threads it started with
    even if the guard had backed off (here: told the cores were contended on every reading)."""
    import torch

    import batchspec
    from batchspec.engine.types import Request

    models = batchspec.load_models(str(llama_pair.target))
    generator = batchspec.build_generator(models, drafter="ngram", batch_size=2, max_new_tokens=8)
    assert generator.threads is not None and not batchspec.build_generator(
        models, drafter="ngram", batch_size=2, max_new_tokens=8, guard_threads=False).threads
    before = torch.get_num_threads()
    waited = [0.0]

    def contended():
        waited[0] += 10.0  # seconds waited per reading: far over any share of the time
        return CpuSample(waited[0], 0.0)

    try:
        generator.threads = ThreadGuard(2, interval_s=0.0, read=contended)
        requests = (Request(id=str(i), prompt=f"hello {i}") for i in range(4))
        seen = [torch.get_num_threads() for _ in generator.run(requests)]
        assert len(seen) == 4 and 1 in seen  # backed off while running
        assert torch.get_num_threads() == 2  # and gave the threads back when the run ended
    finally:
        torch.set_num_threads(before)
