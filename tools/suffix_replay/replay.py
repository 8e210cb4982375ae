"""The replay: B slots take the rows in order, and every round each running row proposes, keeps what equals its
real continuation plus the target's own token, and the drafter learns it (tools/suffix_sim.py's docstring)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from .workload import Row


@dataclass(slots=True)
class Tally:
    tokens: int = 0
    forwards: int = 0
    proposed: int = 0
    accepted: int = 0
    rounds: int = 0
    drafted_rounds: int = 0
    # calibration of a chain's probabilities: bin -> [nodes, accepted nodes, sum of their probabilities]
    calibration: dict = field(default_factory=lambda: defaultdict(lambda: [0, 0, 0.0]))

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.tokens / self.forwards


def accepted_length(tokens: list[int], parents: list[int], truth: list[int]) -> int:
    """The deepest path of the draft (a chain or a tree) that equals the start of `truth`."""
    node, depth = -1, 0
    while depth < len(truth):
        node = next((i for i, (t, p) in enumerate(zip(tokens, parents)) if p == node and t == truth[depth]), None)
        if node is None:
            break
        depth += 1
    return depth


def replay(rows: list[Row], drafter, batch: int) -> Tally:
    """B slots, rows admitted in order; see the module docstring."""
    tally = Tally()
    queue = list(range(len(rows)))[::-1]
    active: dict[int, int] = {}  # row -> tokens of its completion emitted so far (the prefill emitted one)
    slots: list[int | None] = [None] * batch

    def admit():
        for s in range(batch):
            if slots[s] is None and queue:
                r = queue.pop()
                slots[s] = r
                row = rows[r]
                drafter.start(r, row.prompt_ids + row.completion[:1])
                active[r] = 1
                tally.forwards += 1  # the prefill
                tally.tokens += len(row.completion)

    admit()
    while active:
        for s in range(batch):  # one verify round for every running row
            r = slots[s]
            if r is None:
                continue
            row, done = rows[r], active[r]
            left = len(row.completion) - done
            if left > 0:
                tokens, parents = drafter.propose(r, left - 1) if left > 1 else ([], [])
                kept = accepted_length(tokens, parents, row.completion[done:])
                probs = getattr(drafter, "probs", None)
                if probs and not getattr(drafter, "tree", None):  # a chain's node i is kept iff i < kept
                    for i, p in enumerate(probs):
                        entry = tally.calibration[min(int(p * 5), 4)]
                        entry[0] += 1
                        entry[1] += i < kept
                        entry[2] += p
                emitted = row.completion[done:done + kept + 1]
                tally.proposed += len(tokens)
                tally.accepted += kept
                tally.rounds += 1
                tally.drafted_rounds += bool(tokens)
                tally.forwards += 1
                drafter.extend(r, emitted)
                active[r] = done + len(emitted)
        for s in range(batch):  # rows that are done leave, in slot order
            r = slots[s]
            if r is not None and active[r] >= len(rows[r].completion):
                drafter.finish(r)
                del active[r]
                slots[s] = None
        admit()
    return tally
