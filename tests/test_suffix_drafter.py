"""drafter=suffix in the engine: exact like every drafter, and learning from the rows the job finished."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import batchspec
from batchspec.sources.corpus import load_corpus
from conftest import MAX_NEW
from tiny import PROMPTS

# batch, k, tree, compile, adaptive
CASES = [(3, 4, None, "off", False), (8, 2, None, "static", True), (1, 3, "2x3", "off", False),
         (4, 4, "3x2", "static", False), (8, 4, "2x4", "off", True)]


@pytest.mark.parametrize("batch_size,k,tree,compile,adaptive", CASES,
                         ids=[f"b{b}-k{k}-{t or 'chain'}-{c}-{'adaptive' if a else 'fixed'}" for b, k, t, c, a in CASES])
def test_greedy_parity(pair, batch_size, k, tree, compile, adaptive):
    results = batchspec.generate(PROMPTS * 2, ids=[str(i) for i in range(2 * len(PROMPTS))], target=str(pair.target),
                                 drafter="suffix", k=k, batch_size=batch_size, max_new_tokens=MAX_NEW, tree=tree,
                                 compile=compile, adaptive=adaptive)
    assert [r.completion_token_ids for r in results] == pair.reference * 2
    assert sum(r.accepted_tokens for r in results) > 0


def test_coupled_sampling_is_plain_decodings(llama_pair):
    common = dict(target=str(llama_pair.target), max_new_tokens=16, temperature=0.9, top_p=0.95, seed=7)
    plain = batchspec.generate(PROMPTS * 2, ids=[str(i) for i in range(24)], drafter="none", **common)
    for tree in (None, "2x3"):
        got = batchspec.generate(PROMPTS * 2, ids=[str(i) for i in range(24)], drafter="suffix", k=4, batch_size=5,
                                 tree=tree, **common)
        assert [r.completion_token_ids for r in got] == [r.completion_token_ids for r in plain]


def test_later_rows_draft_from_earlier_ones_and_a_corpus_starts_warm(llama_pair, tmp_path):
    """Rows that repeat earlier rows' completions accept far more once those rows finished (the job-wide
    structure), and a generator seeded with a previous run's output folder accepts them from the start."""
    common = dict(target=str(llama_pair.target), drafter="suffix", k=4, batch_size=4, max_new_tokens=MAX_NEW,
                  adaptive=False)
    ids = [str(i) for i in range(2 * len(PROMPTS))]
    twice = batchspec.generate(PROMPTS * 2, ids=ids, **common)
    first, second = twice[: len(PROMPTS)], twice[len(PROMPTS):]
    def per_forward(rs):  # completion tokens per target forward
        return sum(r.completion_tokens for r in rs) / sum(r.target_forwards for r in rs)

    assert per_forward(second) > 1.3 * per_forward(first), (per_forward(first), per_forward(second))
    # A previous job's output folder: data/ parts with completion_token_ids (an error row among them).
    (tmp_path / "data").mkdir()
    rows = [r.to_row() for r in first] + [dict(first[0].to_row(), finish_reason="error", completion_token_ids=[5, 6])]
    pq.write_table(pa.Table.from_pylist([{k: v for k, v in r.items() if k in ("completion_token_ids", "finish_reason")}
                                         for r in rows]), tmp_path / "data" / "shard-00000-of-00001-part-000000.parquet")
    tokenizer = batchspec.load_models(str(llama_pair.target)).tokenizer
    assert load_corpus(str(tmp_path), tokenizer) == [r.completion_token_ids for r in first]
    warm = batchspec.generate(PROMPTS, target=str(llama_pair.target), drafter="suffix", k=4, batch_size=4,
                              max_new_tokens=MAX_NEW, adaptive=False, corpus=str(tmp_path))
    assert [r.completion_token_ids for r in warm] == [r.completion_token_ids for r in first]
    assert per_forward(warm) > 1.3 * per_forward(first), (per_forward(first), per_forward(warm))


def test_a_text_corpus_is_tokenized_without_special_tokens(llama_pair, tmp_path):
    tokenizer = batchspec.load_models(str(llama_pair.target)).tokenizer
    path = tmp_path / "texts.jsonl"
    path.write_text("\n".join(json.dumps({"text": t}) for t in ["def add(a, b):", "hello world"]) + "\n")
    assert load_corpus(str(path), tokenizer) == [tokenizer("def add(a, b):", add_special_tokens=False)["input_ids"],
                                                 tokenizer("hello world", add_special_tokens=False)["input_ids"]]
    with pytest.raises(ValueError, match="no completion_token_ids and no text column"):
        load_corpus(str(path), tokenizer, column="body")
