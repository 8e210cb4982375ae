"""Spare slots (build_generator's spare_slots): prompts prefilled ahead, a wave at a time, in cache slots beyond
batch_size. What a row computes does not depend on where or when its prompt was prefilled, so every output is
the one without spare slots, token for token (greedy) and draw for draw (coupled sampling); no round decides more
than batch_size rows; the paths that cannot use them (the captured path, a drafter that reads the target's
hidden states) run without."""

from __future__ import annotations

import pytest

import batchspec
from batchspec.engine.scheduler import Scheduler
from batchspec.engine.types import RowParams

PROMPTS = ["def add(a, b):", "Hello world", "import os", "x = [1, 2, 3]", "for i in range(3):", "print('a')",
           "a = a + 1", "while True:", "class A:", "return None", "if x:", "y = 2", "z = y * 3", "pass"]


def outputs(models, spare: int, drafter: str, **kw) -> dict:
    """Every result's tokens by (id, sample), with rows of staggered lengths (they finish apart)."""
    n = kw.pop("n", 1)
    generator = batchspec.build_generator(models, drafter=drafter, batch_size=3, max_new_tokens=24,
                                          spare_slots=spare, n=n, **kw)
    requests = [batchspec.Request(str(i), p, params=RowParams(max_new_tokens=3 + (5 * i) % 19))
                for i, p in enumerate(PROMPTS)]
    results = list(generator.run(requests))
    assert all(r.error is None for r in results) and len(results) == len(PROMPTS) * n
    return {(r.id, r.sample_index): tuple(r.completion_token_ids) for r in results}


@pytest.mark.parametrize("drafter,adaptive", [("none", None), ("ngram", True), ("ngram", False), ("suffix", True),
                                              ("model", True), ("model", False)])
@pytest.mark.parametrize("spare", [1, 2, 5])
def test_greedy_outputs_equal_those_without_spare_slots(llama_pair, drafter, adaptive, spare):
    models = batchspec.load_models(str(llama_pair.target), draft=str(llama_pair.draft))
    assert outputs(models, spare, drafter, adaptive=adaptive) == outputs(models, 0, drafter, adaptive=adaptive)


def test_coupled_samples_and_their_copies_equal_those_without(llama_pair):
    """n = 2 at T = 0.7: a request's second sample copies the first's prompt cache (in a spare slot or not)."""
    models = batchspec.load_models(str(llama_pair.target), draft=str(llama_pair.draft))
    kw = dict(temperature=0.7, seed=5, n=2)
    assert outputs(models, 3, "model", **kw) == outputs(models, 0, "model", **kw)


def test_no_round_decides_more_than_batch_size_rows_and_prompts_come_in_waves(llama_pair, monkeypatch):
    """batch_size 3 with 4 spare slots (waves of 2): at most 3 rows decide in a round; while rows wait in spare
    slots, new rows are seated only when 2 or more slots are free; every seated row is prefilled before it decides."""
    real_schedule, real_intake = Scheduler._schedule_packed, Scheduler.intake
    deciding, seated = [], []

    def schedule(self):
        round = real_schedule(self)
        deciding.append(len(round.running))
        return round

    def intake(self):
        free, waiting = len(self.slots.free()), self._waiting()
        seats, errors = real_intake(self)
        if seats:
            seated.append((len(seats), free, waiting))
        return seats, errors

    monkeypatch.setattr(Scheduler, "_schedule_packed", schedule)
    monkeypatch.setattr(Scheduler, "intake", intake)
    models = batchspec.load_models(str(llama_pair.target))
    outputs(models, 4, "none")
    assert max(deciding) == 3 and len(seated) > 2
    assert seated[0][0] == 7  # the first intake fills every slot, spare ones included
    assert all(free >= 2 or not waiting for _, free, waiting in seated)


def test_paths_that_cannot_use_spare_slots_run_without(llama_pair, tmp_path):
    """The captured path runs every slot in its steps, and EAGLE prefills each prompt at admission: both ignore
    spare_slots (the generator reports 0); eagerly, a model that packs uses them."""
    models = batchspec.load_models(str(llama_pair.target), draft=str(llama_pair.draft))
    assert batchspec.build_generator(models, drafter="model", batch_size=2, spare_slots=3).spare_slots == 3
    static = batchspec.build_generator(models, drafter="model", batch_size=2, spare_slots=3, compile="static")
    assert static.spare_slots == 0 and static.runner.num_slots == 2
    from test_eagle_drafter import head_dir

    head = head_dir(tmp_path / "head", llama_pair.target)
    eagle = batchspec.build_generator(batchspec.load_models(str(llama_pair.target), head=str(head)), drafter="eagle",
                                      batch_size=2, spare_slots=3)
    assert eagle.spare_slots == 0 and eagle.runner.num_slots == 2
    with pytest.raises(ValueError, match="spare_slots=-1: need >= 0"):
        batchspec.build_generator(models, batch_size=2, spare_slots=-1)


def test_the_bench_runs_each_contender_with_each_number_of_spare_slots(llama_pair, tmp_path):
    """--spare-slots 0,2: every batchspec contender twice, named by its spare slots, each against the first drafter
    none (the one without), every output equal to it."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from batchspec.bench import main as bench

    out, prompt_file = tmp_path / "bench.json", str(tmp_path / "prompts.parquet")
    pq.write_table(pa.table({"prompt": PROMPTS[:4]}), prompt_file)
    bench.main(["--target", str(llama_pair.target), "--draft", "", "--prompts", prompt_file, "--num-prompts", "4",
                "--max-new-tokens", "8", "--row-lengths", "staggered", "--batch-size", "2", "--k", "2",
                "--repeats", "1", "--drafters", "ngram", "--no-fixed", "--no-hf-batched", "--no-hf-static",
                "--no-hf-batch1", "--fresh", "--interleave", "--spare-slots", "2,0", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["contender"] for r in rows] == [
        "batchspec none [spare 0]", "batchspec ngram adaptive k<=2 [spare 0]",
        "batchspec none [spare 2]", "batchspec ngram adaptive k<=2 [spare 2]"]
    assert rows[0]["vs_none"] == 1.0 and all(r["outputs_equal_to_none"] == 4 for r in rows)
