"""Time a job run spends on input and output, measured cheaply (a clock read per chunk, not per row).

    requests = TimedStream(builder.request(row) for row in rows)   # read side
    ... run the job; sink.write_s is the write side (ParquetSink.flush times itself) ...
    io_summary(read_s=requests.seconds, write_s=sink.write_s, scan_s=..., wall_s=...)

Read time is everything spent pulling the next requests out of the source pipeline: Parquet / JSONL
/ dataset decode, shard selection, skipping done and duplicate ids, and building the prompt (a plain
column lookup, or a template / chat-template render). Tokenizing the prompt is not in it (the
generator does that when it admits the row). Write time is what the job loop spends in the sink's
flushes and close: building the Arrow table from the buffered results, and waiting for the writer
thread (ParquetSink(background=True)) where the Parquet encode, write, fsync and atomic rename run
while generation goes on. The writer thread's own time is reported too (encode_write_s); it only
costs wall time where it competes for a CPU core.
"""

from __future__ import annotations

import time
from itertools import islice
from typing import Any, Iterable, Iterator, TypeVar

T = TypeVar("T")

READ_AHEAD = 256  # items pulled per timed read; the rest of a chunk is dropped if the consumer stops early


class TimedStream(Iterable[T]):
    """Iterates `items` READ_AHEAD at a time, adding the time each pull takes to `seconds`.

    The consumer sees the same items in the same order. Items pulled but not consumed when the
    consumer stops (a signal stopped admission) are simply never used, exactly as if not read.
    """

    def __init__(self, items: Iterable[T], read_ahead: int = READ_AHEAD):
        self._items = iter(items)
        self.read_ahead = read_ahead
        self.seconds = 0.0

    def __iter__(self) -> Iterator[T]:
        items, n, clock = self._items, self.read_ahead, time.perf_counter
        while True:
            start = clock()
            try:
                chunk = list(islice(items, n))
            finally:
                self.seconds += clock() - start
            if not chunk:
                return
            yield from chunk


def io_summary(*, read_s: float, write_s: float, scan_s: float, wall_s: float,
               encode_write_s: float) -> dict[str, Any]:
    """The `io` block of summary.json: seconds the job loop spent reading the input, writing parts and
    scanning existing parts for done ids (resume); the wall time they are part of (the run without
    model loading) and their share of it; and the writer thread's seconds (overlapping the loop)."""
    busy = read_s + write_s + scan_s
    return {
        "read_s": round(read_s, 4), "write_s": round(write_s, 4), "resume_scan_s": round(scan_s, 4),
        "wall_s": round(wall_s, 4), "share": busy / wall_s if wall_s > 0 else None,
        "encode_write_s": round(encode_write_s, 4),
    }
