"""Between the generator and the sink: a request's n samples are written together, and with
`output.order=input` requests are written in the order they were read.

A request of n samples comes back as n Results that finish at different times. Holding them until the
last one is in means a part file never holds some of an id's samples, so resume (which skips the ids
found in part files) keeps exactly n rows per id, however a run is killed. `samples` is the job's n; a
request's own n (a `source.row_params` column) overrides it, as the engine counts it (types.sample_count).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable, Iterator

from ..engine.types import Request, Result, sample_count


class RowGroups:
    def __init__(self, samples: int, *, in_order: bool = False):
        self.samples, self.in_order = samples, in_order
        # id -> [samples expected, results so far], in the order the requests were read
        self._open: OrderedDict[str, list] = OrderedDict()

    def track(self, requests: Iterable[Request]) -> Iterator[Request]:
        """Pass the requests on, noting each one's id and sample count."""
        for request in requests:
            self._open[request.id] = [sample_count(request, self.samples), []]
            yield request

    @property
    def held(self) -> int:
        """Results waiting for their request's other samples (or, in input order, for earlier requests)."""
        return sum(len(results) for _, results in self._open.values())

    def add(self, result: Result) -> list[Result]:
        """The Results ready to write once `result` is in: its request's samples, sorted by sample_index,
        when it was the last of them (in input order: every complete request before the first open one)."""
        entry = self._open[result.id]
        entry[1].append(result)
        if not self.in_order:
            if len(entry[1]) < entry[0]:
                return []
            del self._open[result.id]
            return sorted(entry[1], key=lambda r: r.sample_index)
        ready: list[Result] = []
        while self._open:
            request_id, (expected, results) = next(iter(self._open.items()))
            if len(results) < expected:
                break
            del self._open[request_id]
            ready += sorted(results, key=lambda r: r.sample_index)
        return ready

    def drain(self) -> list[Result]:
        """Every complete request still held (a run stopping early: in input order they were waiting for
        an earlier request); incomplete ones are dropped, and resume runs them again."""
        ready: list[Result] = []
        for request_id, (expected, results) in list(self._open.items()):
            if len(results) >= expected:
                del self._open[request_id]
                ready += sorted(results, key=lambda r: r.sample_index)
        return ready
