"""A row's grammar state through rounds of speculation (engine/grammar/grammar.py): whatever a round looks ahead at (the
masks of its verify positions, how much of a proposal the grammar takes, the continuation it forces) leaves the
row's matcher exactly where the emitted tokens put it, and every mask equals that of a fresh matcher fed the
same tokens.

Why: llguidance 1.9.1 can leave a matcher wrong after `rollback` over tokens past which it computed a mask
(`test_llguidance_rollback_after_a_mask`, which documents the library's behaviour: if it starts failing,
the library was fixed). SmolLM2 under a real-world JSON schema then emitted `':'` where drafter none emitted
`":"` (issue 58, item 0). The tokenizer here is a byte-level BPE trained on JSON, so that, as in real
vocabularies, one token spans a key's end and the next value's start (`":["`, `":{"`)."""

from __future__ import annotations

import json
import random

import llguidance
import llguidance.hf
import llguidance.torch
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from batchspec.engine.grammar.grammar import Grammars
from batchspec.engine.grammar.grammar_text import grammar_text
from batchspec.engine.types import Constraint

# The schema of issue 58's reproduction: "additionalFields" is not a keyword, so every object the schema does
# not describe (api_method_arguments' other keys and their values) takes any JSON.
PIWIK = {"additionalFields": False, "properties": {
    "api_method": {"type": "string"},
    "api_method_arguments": {"properties": {"idGoal": {"type": "string"}}, "type": "object"},
    "frequency": {"type": "string"}, "period": {"type": "string"}, "site_id": {"type": "string"}},
    "required": ["site_id"], "title": "Piwik Core Collector Query", "type": "object"}
VERO = {"additionalProperties": False, "properties": {
    "type": {"maxLength": 255, "type": "string"}, "unsubscribed_at": {"_format": "date-time", "type": "string"},
    "user": {"properties": {"email": {"_format": "email", "type": ["string", "null"]},
                            "id": {"maxLength": 255, "type": ["string", "null"]}}, "type": "object"}},
    "type": "object"}
DOCUMENTS = [  # (schema, a document it accepts): the emitted text of the stress test below
    (PIWIK, {"api_method": "Piwik", "api_method_arguments": {"type": "object", "properties": {"idGoal": {
        "type": "string"}}, "required": {"type": "string", "site": ["a", "b"]}, "x": [{"y": 1}, [2, "3"]]},
        "site_id": "42"}),
    (VERO, {"type": "unsubscribed", "unsubscribed_at": "2024-01-01", "user": {
        "email": "a@b.c", "id": None, "properties": {"email": {"type": ["string", "null"]}}, "more": [{}, []]}}),
]
CORPUS = [json.dumps(doc, separators=(",", ":")) for _, doc in DOCUMENTS] + [
    '{"a":{"b":["x","y"],"c":{"d":"e"}}}', '{"type":"object","required":["site_id"]}', '{"k":{"type":"string"}}',
    '{"n":[1,2,{"m":null}],"s":"t"}'] * 8


@pytest.fixture(scope="module")
def tokenizer():
    """A byte-level BPE trained on JSON (no pre-tokenizing split, so merges cross punctuation)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=360, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def fresh_mask(tokenizer, schema: dict, tokens: list[int]) -> torch.Tensor:
    """The mask after `tokens` from a matcher that consumed nothing else: [words] int32."""
    env = llguidance.hf.from_tokenizer(tokenizer, n_vocab=len(tokenizer), eos_token=[tokenizer.eos_token_id])
    matcher = llguidance.LLMatcher(env, grammar_text(Constraint.of("json_schema", schema)), log_level=0)
    assert matcher.consume_tokens(tokens), matcher.get_error()
    mask = torch.full((1, (len(tokenizer) + 31) // 32), -1, dtype=torch.int32)
    llguidance.torch.fill_next_token_bitmask(matcher, mask, 0)
    return mask[0]


def seated(tokenizer, schema: dict) -> Grammars:
    grammars = Grammars(tokenizer, vocab_size=len(tokenizer), eos_ids=[tokenizer.eos_token_id])
    grammars.seat(0, Constraint.of("json_schema", schema))
    return grammars


def test_llguidance_rollback_after_a_mask(tokenizer):
    """The library's behaviour the engine steers around: consume `":["`, compute a mask, roll back, consume
    `":{"`: the mask is that of a string in an array (it allows `",`), not of an object's key."""
    env = llguidance.hf.from_tokenizer(tokenizer, n_vocab=len(tokenizer), eos_token=[tokenizer.eos_token_id])
    matcher = llguidance.LLMatcher(env, grammar_text(Constraint.of("json_schema", PIWIK)), log_level=0)
    emitted = encode(tokenizer, '{"api_method_arguments":{"a')
    draft, then = encode(tokenizer, '":["'), encode(tokenizer, '":{"')
    assert len(draft) == 1 and len(then) == 1  # one token each, as in SmolLM2's vocabulary
    assert matcher.consume_tokens(emitted + draft)
    llguidance.torch.fill_next_token_bitmask(matcher, torch.zeros(1, (len(tokenizer) + 31) // 32, dtype=torch.int32))
    assert matcher.rollback(len(draft)) and matcher.consume_tokens(then)
    mask = torch.full((1, (len(tokenizer) + 31) // 32), -1, dtype=torch.int32)
    llguidance.torch.fill_next_token_bitmask(matcher, mask, 0)
    assert not torch.equal(mask[0], fresh_mask(tokenizer, PIWIK, emitted + then))


@pytest.mark.parametrize("emitted,draft,then", [
    ('{"api_method_arguments":{"a', '":["', '":{"'),
    ('{"api_method_arguments":{"required', '":["site_', '":{"'),
    ('{"api_method_arguments":{"type":"object","required', '":["', '":{"'),
    ('{"api_method_arguments":{"a', '":[1,"x', '":"'),
])
def test_a_round_that_masked_drafts_leaves_the_row_where_its_tokens_put_it(tokenizer, emitted, draft, then):
    """A round masks a draft the target does not take; the row emits other tokens; the next round's first mask
    is the one a fresh matcher gives after the emitted tokens (before the fix: an array's string)."""
    grammars = seated(tokenizer, PIWIK)
    emitted, draft, then = encode(tokenizer, emitted), encode(tokenizer, draft), encode(tokenizer, then)
    assert grammars.advance(0, emitted) == (len(emitted), None)
    assert grammars.legal(0, draft) == len(draft)
    grammars.forced(0, 4)
    grammars.masks([0], [draft], len(draft) + 1)
    assert grammars.advance(0, then) == (len(then), None)
    assert torch.equal(grammars.masks([0], [[]], 1)[0, 0], fresh_mask(tokenizer, PIWIK, emitted + then))


def allowed_tokens(mask: torch.Tensor) -> list[int]:
    return [t for t in range(32 * mask.numel()) if (int(mask[t // 32]) >> (t % 32)) & 1]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("document", range(len(DOCUMENTS)))
def test_masks_equal_a_fresh_matchers_through_rounds_of_random_drafts(tokenizer, document, seed):
    """A document emitted a few tokens a round; each round drafts a few of its true next tokens, then turns off
    them along tokens its grammar allows (picked at random from a fresh matcher's masks), asks legal and
    forced, and masks the drafts. Every mask of every round, at every position the drafts reach, equals a fresh
    matcher's after the emitted tokens and the drafts before it. Exact; four seeds a document."""
    schema, doc = DOCUMENTS[document]
    tokens = encode(tokenizer, json.dumps(doc, separators=(",", ":")))
    rng, grammars, at, checked = random.Random(seed), seated(tokenizer, schema), 0, 0
    eos = tokenizer.eos_token_id
    while at < len(tokens):
        draft = tokens[at: at + rng.randint(0, 2)]
        for _ in range(rng.randint(0, 3)):
            options = [t for t in allowed_tokens(fresh_mask(tokenizer, schema, tokens[:at] + draft)) if t != eos]
            merged = [t for t in options if len(tokenizer.decode([t])) > 1]  # tokens across punctuation
            if not options:
                break
            draft.append(rng.choice(merged if merged and rng.random() < 0.7 else options))
        legal = grammars.legal(0, draft)
        assert legal == len(draft)
        grammars.forced(0, 4)
        masks = grammars.masks([0], [draft], len(draft) + 1)[0]
        for t in range(legal + 1):
            assert torch.equal(masks[t], fresh_mask(tokenizer, schema, tokens[:at] + draft[:t])), (at, draft, t)
            checked += t > 0
        step = rng.randint(1, 3)
        assert grammars.advance(0, tokens[at: at + step])[1] is None
        at += step
    assert grammars.complete(0) and checked >= 20  # masks past a draft compared
