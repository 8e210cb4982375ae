"""The run's statistics have one owner (engine/stats.py `Statistics`): drafting counts, what the target's
forwards computed and the phases' seconds are fed to it by the round's stages, and `reset_stats` (a
benchmark's next repeat) starts all three afresh in one call. A slot's sequence is written by `SlotState.write`
alone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import batchspec
from batchspec.engine.types import RowParams

PROMPTS = ["def add(a, b):", "Hello world", "import os", "x = [1, 2, 3]", "for i in range(3):", "print('a')"]


def requests():
    return [batchspec.Request(str(i), prompt, params=RowParams(max_new_tokens=4 + 3 * (i % 3)))
            for i, prompt in enumerate(PROMPTS)]


def counts(generator) -> dict:
    """What is counted exactly (seconds aside), drafting and forwards."""
    run, forwards = generator.stats, generator.tokens
    return {"requests": run.requests, "completion_tokens": run.completion_tokens, "rounds": run.rounds,
            "draft_tokens": run.draft_tokens, "accepted_tokens": run.accepted_tokens,
            "rounds_by_k": list(run.rounds_by_k), "computed": forwards.computed, "padding": forwards.padding,
            "prefilled": forwards.prefilled}


@pytest.mark.parametrize("compile", ["off", "static"])
def test_reset_stats_starts_drafting_forwards_and_timers_afresh(llama_pair, compile):
    # A draft model: its drafts depend on each row alone (a lookup's may learn from the rows before).
    models = batchspec.load_models(str(llama_pair.target), draft=str(llama_pair.draft))
    generator = batchspec.build_generator(models, drafter="model", k=2, batch_size=3, max_new_tokens=16,
                                          compile=compile, adaptive=False)
    first = [r.completion for r in generator.run(requests())]
    before = counts(generator)
    assert before["requests"] == len(PROMPTS) and before["rounds"] > 0 and before["computed"] > 0
    assert sum(generator.timings.values()) > 0
    generator.reset_stats()
    zero = counts(generator)
    assert zero == {**{name: 0 for name in before}, "rounds_by_k": [0] * len(before["rounds_by_k"])}
    assert sum(generator.timings.values()) == 0 and generator.noise_s == 0
    again = [r.completion for r in generator.run(requests())]
    assert sorted(again) == sorted(first)
    assert counts(generator) == before  # the same rows, fixed k: the same counts, nothing left from the first run


SEQUENCE_WRITE = re.compile(r"\.tokens\b[^\n=]*\]\s*=[^=]|\.tokens\.(copy_|index_put_|scatter_|fill_|zero_)\(")


def test_a_slot_sequence_is_written_only_by_slot_state():
    engine = Path(batchspec.__file__).parent / "engine"
    found = [f"{path.relative_to(engine)}:{n}: {line.strip()}"
             for path in sorted(engine.rglob("*.py")) if path.name != "slots.py"
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if "state" in line and SEQUENCE_WRITE.search(line)]
    assert not found, "write sequences through SlotState.write:\n" + "\n".join(found)
