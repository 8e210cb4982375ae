"""A slot's life in one place (engine/slot_life.py): whenever a slot is free, the parts that keep state per slot
have forgotten its last row, and whenever it runs a row, that row's state is there.

The parts checked: the host record (SlotTable), the slot's device state (`busy`), the target's cache length (a
running row's: its host length L less the pending token), a
lookup drafter's queue, and a constrained row's grammar matcher. (Adaptive speculation's per-row acceptance is
reset when the next row takes the slot.) Checked at every Result of jobs whose slots are reused several times
(11 rows, 3 slots), on the eager (packed) path and the static one, with rows of several lengths, constrained
and not."""

from __future__ import annotations

import pytest

import batchspec
from batchspec.engine.types import RowParams

PROMPTS = ["def add(a, b):", "Hello world", "import os", "x = [1, 2, 3]", "for i in range(3):", "print('a')",
           "class A:", "return None", "while True:", "y = x + 1", "# a comment"]


def requests():
    # every third row constrained; lengths vary so that rows finish in different rounds
    return [batchspec.Request(str(i), prompt, params=RowParams(max_new_tokens=3 + 2 * (i % 5),
                                                             **({"regex": "[a-z ]+"} if i % 3 == 0 else {})))
            for i, prompt in enumerate(PROMPTS)]


def check(generator, constrained_seen: list[int]) -> tuple[int, int]:
    """The invariant over every slot -> (free slots, busy slots); counts constrained running rows seen."""
    table, drafter = generator.scheduler.slots, generator.drafter
    lengths, busy = generator.runner.lengths.tolist(), generator.state.busy.tolist()
    free = 0
    for slot, record in enumerate(table.records):
        if record is None:
            free += 1
            assert not busy[slot] and lengths[slot] == 0, slot
            assert slot not in generator.grammars.rows and slot not in generator.grammars.failed, slot
            assert slot not in drafter.pending, slot
        else:
            assert busy[slot] and slot in drafter.pending, slot
            if not record.awaiting_first:  # the host's L (prompt + output) and the target's cache, L - 1, agree
                assert lengths[slot] == record.length - 1 == len(record.prompt_ids) + len(record.output) - 1, slot
            constrained = record.request.params is not None and record.request.params.regex is not None
            assert (slot in generator.grammars.rows) == constrained, slot
            constrained_seen.append(constrained)
    return free, len(table.records) - free


@pytest.mark.parametrize("compile", ["off", "static"])
def test_a_free_slot_is_forgotten_by_every_part(llama_pair, compile):
    models = batchspec.load_models(str(llama_pair.target))
    generator = batchspec.build_generator(models, drafter="ngram", k=2, batch_size=3, max_new_tokens=16,
                                          compile=compile, adaptive=True)
    seen, results, constrained = set(), [], []
    for result in generator.run(requests()):
        results.append(result)
        free, running = check(generator, constrained)
        seen.add(running)
    assert sorted(r.id for r in results) == sorted(str(i) for i in range(len(PROMPTS)))
    assert all(r.error is None for r in results), [r.error for r in results]
    assert check(generator, constrained) == (3, 0)  # all released at the end
    assert max(seen) >= 1 and any(constrained) and not all(constrained)  # both kinds ran beside finished rows
