"""A job that trains its own EAGLE-3 head from its first rows, then drafts with it."""

from __future__ import annotations

import pytest

import batchspec
from batchspec.eagle.selftrain import Phase, SelfTrainingGenerator, break_even_row
from conftest import MAX_NEW
from tiny import PROMPTS

# before (rows, tokens, seconds), training seconds, after, expected break-even row
BREAK_EVEN = [
    ((100, 6400, 20.0), 30.0, (100, 6400, 10.0), 100 + 300 + 1),  # 0.2 s/row plain, 0.1 drafted: 30 s back in 300 rows
    ((100, 6400, 20.0), 30.0, (100, 6400, 20.0), None),  # drafting no faster: never
    ((0, 0, 0.0), 30.0, (100, 6400, 10.0), None),  # nothing measured before
]


@pytest.mark.parametrize("before,train_s,after,expected", BREAK_EVEN)
def test_break_even_row(before, train_s, after, expected):
    assert break_even_row(Phase(*before), train_s, Phase(*after)) == expected


def test_first_rows_train_a_head_that_drafts_the_rest_and_a_resume_reuses_it(llama_pair, tmp_path):
    models = batchspec.load_models(str(llama_pair.target))

    def build(drafter, head):
        return batchspec.build_generator(models, drafter=drafter, head=head, k=3, batch_size=4, max_new_tokens=MAX_NEW)

    ids = [str(i) for i in range(2 * len(PROMPTS))]
    requests = [batchspec.Request(i, p) for i, p in zip(ids, PROMPTS * 2)]
    generator = SelfTrainingGenerator(models, build, out_dir=tmp_path, rows=12, minutes=0.05, heldout=2)
    results = {r.id: r for r in generator.run(requests)}
    assert [results[i].completion_token_ids for i in ids] == llama_pair.reference * 2  # exact throughout
    report = generator.report()
    assert report["rows_before"] == 12 and report["rows_after"] == 12 and not report["resumed_with_saved_head"]
    assert (tmp_path / "eagle_head" / "config.json").exists() and report["train_s"] > 0
    assert all(results[i].draft_tokens > 0 for i in ids[12:])  # the second half drafted with the head
    assert generator.stats.requests == 24  # one run's statistics across both phases
    again = SelfTrainingGenerator(models, build, out_dir=tmp_path, rows=12, minutes=0.05)
    assert again.resumed and again.report()["rows_before"] == 0
    rerun = {r.id: r for r in again.run(requests[:4])}
    assert [rerun[i].completion_token_ids for i in ids[:4]] == llama_pair.reference[:4]
    assert all(r.draft_tokens > 0 for r in rerun.values())
