"""IO accounting helpers: the timed request stream and the summary block."""

from __future__ import annotations

import pytest

from batchspec.jobs.iostats import TimedStream, io_summary


def test_timed_stream_yields_everything_in_order_and_reads_ahead_boundedly():
    pulled = []

    def items():
        for i in range(10):
            pulled.append(i)
            yield i

    stream = TimedStream(items(), read_ahead=4)
    it = iter(stream)
    assert [next(it) for _ in range(5)] == [0, 1, 2, 3, 4]
    assert len(pulled) == 8  # two chunks of 4: never more than read_ahead past what was consumed
    assert list(it) == [5, 6, 7, 8, 9] and stream.seconds >= 0
    assert list(TimedStream([])) == []


def test_io_summary_share():
    io = io_summary(read_s=1.0, write_s=0.5, scan_s=0.5, wall_s=10.0, encode_write_s=2.0)
    assert io == {"read_s": 1.0, "write_s": 0.5, "resume_scan_s": 0.5, "wall_s": 10.0, "share": pytest.approx(0.2),
                  "encode_write_s": 2.0}
    assert io_summary(read_s=0, write_s=0, scan_s=0, wall_s=0, encode_write_s=0)["share"] is None
