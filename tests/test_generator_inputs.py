"""Bad requests become error results; the overflow guard keeps long requests inside max_seq_len."""

from __future__ import annotations

import pytest

import batchspec
from batchspec.engine.types import Request, RowParams
from tiny import PROMPTS


def test_bad_prompts_are_error_rows_and_the_rest_run(llama_pair):
    models = batchspec.load_models(str(llama_pair.target), str(llama_pair.draft))
    generator = batchspec.build_generator(models, drafter="model", k=3, batch_size=2, max_new_tokens=8, max_seq_len=40)
    requests = [
        Request("ok-1", PROMPTS[0]),
        Request("null", None),
        Request("empty", "   "),
        Request("number", 42),
        Request("too-long", "hello " * 60),
        Request("bad-ids", [0, 5, 10_000]),
        Request("source-error", None, error="template field 'title' is missing"),
        Request("ok-2", PROMPTS[1], extra={"keep": 7}),
    ]
    results = {r.id: r for r in generator.run(requests)}
    assert set(results) == {r.id for r in requests}
    errors = {i: r.error for i, r in results.items() if r.finish_reason == "error"}
    assert set(errors) == {"null", "empty", "number", "too-long", "bad-ids", "source-error"}
    assert errors["null"] == "prompt is null"
    assert "must be a string or a list of token ids, got int" in errors["number"]
    assert "max_seq_len is 40" in errors["too-long"]
    assert "token id 10000" in errors["bad-ids"]
    assert errors["source-error"] == "template field 'title' is missing"
    assert results["ok-2"].extra == {"keep": 7} and results["ok-2"].to_row()["keep"] == 7
    assert results["ok-1"].completion_token_ids == llama_pair.reference[0][:8]
    assert generator.stats.errors == 6 and generator.stats.requests == 8


def test_overflow_guard_drafts_less_near_max_seq_len(llama_pair):
    """Prompts that leave only a few positions: fewer drafts, finish_reason length, same tokens as HF."""
    prompt = PROMPTS[-1]  # the longest prompt
    n_prompt = len(llama_pair.tokenizer(prompt)["input_ids"])
    for room in (1, 2, 5):
        result = batchspec.generate([prompt], target=str(llama_pair.target), draft=str(llama_pair.target),
                                    drafter="model", k=4, max_new_tokens=24, max_seq_len=n_prompt + room)[0]
        assert result.finish_reason in ("length", "stop")
        assert result.completion_tokens <= room
        assert result.completion_token_ids == llama_pair.reference[-1][:room]


def test_stop_admitting_finishes_in_flight_only(llama_pair):
    models = batchspec.load_models(str(llama_pair.target))
    generator = batchspec.build_generator(models, drafter="ngram", batch_size=2, max_new_tokens=8)
    pulled = []

    def requests():
        for i, p in enumerate(PROMPTS):
            pulled.append(i)
            yield Request(str(i), p)

    results = []
    for result in generator.run(requests()):
        results.append(result)
        generator.stop_admitting()
    assert len(results) == len(pulled) == 2


@pytest.mark.parametrize("drafter", ["none", "model", "ngram"])
def test_cut_short_keeps_the_rows_in_flight_as_far_as_they_got(llama_pair, drafter):
    """train_draft's data phase stops at a deadline: generator.cut_short hands back every running row with
    the tokens it has (a prefix of its uninterrupted greedy output, finish_reason length); run() then yields
    only the rows that had finished before the cut (the rest of that round's) and ends."""
    models = batchspec.load_models(str(llama_pair.target), str(llama_pair.draft))
    longest = max(len(r) for r in llama_pair.reference)  # the references' max_new_tokens (some end on EOS)
    generator = batchspec.build_generator(models, drafter=drafter, k=3, batch_size=3, max_new_tokens=longest)
    pulled = []

    def requests():  # the first row stops early, so that the others are mid-way when it finishes
        for i, p in enumerate(PROMPTS):
            pulled.append(i)
            yield Request(str(i), p, params=RowParams(max_new_tokens=2 if i == 0 else None))

    finished, cut = [], []
    for result in generator.run(requests()):
        finished.append(result)
        if len(finished) == 1:
            cut = generator.cut_short()
    assert cut and {r.id for r in finished}.isdisjoint(r.id for r in cut)
    assert sorted(int(r.id) for r in finished + cut) == pulled and len(pulled) < len(PROMPTS)
    for result in finished:
        want = llama_pair.reference[int(result.id)]
        assert result.completion_token_ids == (want[:2] if result.id == "0" else want)
    for result in cut:
        want = llama_pair.reference[int(result.id)]
        assert result.finish_reason == "length"
        assert result.completion_token_ids == want[: len(result.completion_token_ids)]
    assert any(0 < len(r.completion_token_ids) < len(llama_pair.reference[int(r.id)]) for r in cut)
