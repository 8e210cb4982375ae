"""Structured output (engine/grammar/grammar.py): constraints are checked and refused per row, the output is what the
target gives under the same constraint without speculation (greedy: token for token against Hugging Face
`generate` with a logits processor on llguidance's own matcher; sampled: the masked distribution, by
chi-square), with every drafter, at batch 1, 3 and 8, eager and static."""

from __future__ import annotations

import json
import math
from pathlib import Path

import llguidance
import llguidance.hf
import llguidance.torch
import pytest
import torch
from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

import batchspec
from batchspec.engine.grammar.grammar_text import grammar_text
from batchspec.engine.sampling import SamplingParams, to_probs
from batchspec.engine.types import Constraint, RowParams
from conftest import MAX_NEW
from test_sampling_e2e import chi2_critical, chi_square, first_two_counts
from tiny import PROMPTS, build_tokenizer, save_model

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "n": {"type": "integer"},
                                           "ok": {"type": "boolean"}},
          "required": ["name", "n", "ok"], "additionalProperties": False}
# One constraint per prompt, of every kind (the prompts' own params: per-row constraints).
CONSTRAINTS = [
    dict(json_schema=SCHEMA), dict(regex=r"(def|class) [a-z_]+\((a|b|x|y)(, (a|b|x|y))*\):"),
    dict(choice=["hello world", "hello batch", "the dog sleeps."]), dict(json_object=True),
    dict(grammar='start: "print(" NUM ("+" NUM)* ")"\nNUM: /[0-9]+/'), dict(json_schema=json.dumps(SCHEMA)),
]


def bitmask_allows(mask: torch.Tensor, vocab: int) -> torch.Tensor:
    """One [words] int32 bitmask -> [vocab] bool, bit by bit (apart from the engine's vectorised unpacking)."""
    words = mask.tolist()
    return torch.tensor([bool((words[t // 32] >> (t % 32)) & 1) for t in range(vocab)])


class GrammarProcessor(LogitsProcessor):
    """The reference: one llguidance matcher for a batch-1 `generate`, advanced by each new token."""

    def __init__(self, env, grammar: str, prompt_len: int, vocab: int, eos_ids: list[int]):
        self.matcher = llguidance.LLMatcher(env, grammar)
        self.prompt_len, self.vocab, self.eos_ids = prompt_len, vocab, eos_ids
        self.mask = llguidance.torch.allocate_token_bitmask(1, vocab)

    def __call__(self, input_ids, scores):
        if input_ids.shape[1] > self.prompt_len:
            assert self.matcher.consume_token(int(input_ids[0, -1])), self.matcher.get_error()
        llguidance.torch.fill_next_token_bitmask(self.matcher, self.mask, 0)
        allowed = bitmask_allows(self.mask[0], self.vocab)
        allowed[self.eos_ids] = bool(allowed[self.eos_ids[0]])  # every EOS id ends a row where the grammar accepts
        return scores.masked_fill(~allowed[: scores.shape[1]], float("-inf"))


@pytest.fixture(scope="module")
def references(pair):
    """HF greedy new tokens of each prompt under its constraint (constraints cycled over the prompts)."""
    model = AutoModelForCausalLM.from_pretrained(pair.target, dtype=torch.float32)
    vocab = model.get_output_embeddings().weight.shape[0]
    # llguidance takes only EOS ids of the tokenizer's vocabulary; the first EOS is the tokenizer's own.
    env = llguidance.hf.from_tokenizer(pair.tokenizer, n_vocab=vocab,
                                       eos_token=[t for t in pair.eos_ids if t < len(pair.tokenizer)])
    out = []
    for i, prompt in enumerate(PROMPTS):
        kind, value = next(iter(CONSTRAINTS[i % len(CONSTRAINTS)].items()))
        grammar = grammar_text(Constraint.of(kind, value))
        enc = pair.tokenizer(prompt, return_tensors="pt")
        processor = GrammarProcessor(env, grammar, enc["input_ids"].shape[1], vocab, pair.eos_ids)
        with torch.no_grad():
            ids = model.generate(**enc, do_sample=False, max_new_tokens=MAX_NEW,
                                 logits_processor=LogitsProcessorList([processor]))
        out.append(ids[0, enc["input_ids"].shape[1]:].tolist())
    return out


def run(pair, drafter: str, batch_size: int, **kw):
    params = [RowParams(**CONSTRAINTS[i % len(CONSTRAINTS)]) for i in range(len(PROMPTS))]
    draft = pair.target if drafter == "model-identical" else pair.draft if drafter == "model-random" else None
    return batchspec.generate(PROMPTS, target=str(pair.target), draft=str(draft) if draft else None,
                              drafter="model" if draft else drafter, batch_size=batch_size, k=3,
                              max_new_tokens=MAX_NEW, params=params, **kw)


def test_references_end_both_ways(pair, references):
    """The references are a strong test only if some outputs end on EOS (a whole match) and some are cut."""
    ends = [ref[-1] in pair.eos_ids for ref in references]
    assert 1 <= sum(ends) < len(references), ends
    cut = run(pair, "none", 8, adaptive=False)
    assert any(r.structured_complete is False and r.finish_reason == "length" for r in cut)


@pytest.mark.parametrize("batch_size", [1, 3, 8])
@pytest.mark.parametrize("drafter", ["none", "ngram", "prompt_lookup", "suffix", "model-random", "model-identical"])
def test_greedy_parity_under_constraints(pair, references, drafter, batch_size):
    results = run(pair, drafter, batch_size, adaptive=False)
    for prompt, result, expected in zip(PROMPTS, results, references):
        assert result.error is None, result.error
        assert result.completion_token_ids == expected, (prompt, result.completion)
        ended = expected[-1] in pair.eos_ids  # an EOS only where the grammar accepts
        assert result.finish_reason == ("stop" if ended else "length")
        assert result.structured_complete is True if ended else result.structured_complete is not None
    if drafter == "none":  # forced drafts are the only drafts: a key, a quote, a choice's rest
        assert sum(r.forced_tokens for r in results) > 0
        assert all(r.draft_tokens == r.forced_tokens for r in results)


STATIC = [(d, 3) for d in ("none", "ngram", "prompt_lookup", "suffix", "model-random", "model-identical")] + \
    [("none", 1), ("prompt_lookup", 8), ("model-random", 1), ("suffix", 8)]


@pytest.mark.parametrize("drafter,batch_size", STATIC)
def test_greedy_parity_under_constraints_static(pair, references, drafter, batch_size):
    """The static path (every slot every round): masks on the captured verify's logits, first tokens drawn
    under the grammar at admission and reaching the host with the next round; adaptive at batch 8. Every
    drafter at batch 3, some at 1 and 8 (the eager test runs every drafter at each)."""
    results = run(pair, drafter, batch_size, adaptive=batch_size == 8, compile="static")
    assert [r.completion_token_ids for r in results] == references


def test_refused_drafts_are_cut_and_forced_ones_added_before_verification(tokenizer):
    """constrain_drafts on a host draft: a proposal is cut at the first token its grammar refuses; a row
    whose grammar forces its next tokens drafts them unless its proposal starts with them; unconstrained
    rows and rows awaiting their first token keep theirs."""
    from dataclasses import replace

    from batchspec.engine.grammar.constrain import constrain_drafts
    from batchspec.engine.drafters.base import host_draft
    from batchspec.engine.grammar.grammar import Grammars
    from batchspec.engine.round import Plan, RoundBuffers
    from batchspec.engine.slots import SlotTable
    from batchspec.engine.types import Request

    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    grammars = Grammars(tokenizer, vocab_size=len(tokenizer), eos_ids=[tokenizer.eos_token_id])
    choice = Constraint.of("choice", ["hello world", "hello batch"])
    slots = SlotTable(4)
    for slot in range(4):
        slots.occupy(slot, Request(str(slot), "x"), [0], max_new_tokens=50, stop=(), logprobs=None)
        slots[slot].awaiting_first = slot == 3
        grammars.seat(slot, choice if slot != 2 else None)
    assert grammars.advance(1, encode("hello")) == (len(encode("hello")), None)
    buffers = RoundBuffers(4, 8, len(tokenizer), torch.device("cpu"), noise=False, probs=False, trees=False)
    proposals = [encode("hello b") + encode("x"), encode(" bat"), encode("zzz"), encode("zzz")]
    plan = Plan([0, 1, 2, 3], None, None, [2, 7, 2, 2], None, [0, 1, 2, 3], [50] * 4, [4] * 4)
    draft, forced = constrain_drafts(plan, host_draft(buffers, proposals), grammars, slots, buffers, limit=4)
    kept = draft.host_tokens
    assert kept[0] == encode("hello b")  # cut before "x"; it covers the forced "hello " (other tokens)
    assert kept[1] == encode(" bat")  # covers the forced " "
    assert kept[2] == encode("zzz") and kept[3] == encode("zzz")  # unconstrained; awaiting its first token
    assert forced is None and draft.host_num == [len(k) for k in kept]
    proposals = [encode("hel"), [], encode("zzz"), encode("zzz")]
    draft, forced = constrain_drafts(plan, host_draft(buffers, proposals), grammars, slots, buffers, limit=4)
    kept = draft.host_tokens
    assert kept[0] == grammars.forced(0, 4) and tokenizer.decode(kept[0]) == "hello "  # shorter: forced instead
    assert kept[1] == encode(" ")  # no proposal: the forced space
    assert forced == [len(kept[0]), 1, 0, 0]
    unconstrained = host_draft(buffers, [[], [], encode("zzz"), encode("zzz")])
    assert constrain_drafts(replace(plan, rows=[2, 2, 2, 2]), unconstrained, grammars, slots, buffers,
                            limit=4) is None


def test_adaptive_under_constraints(pair, references):
    results = run(pair, "prompt_lookup", 8, adaptive=True)
    assert [r.completion_token_ids for r in results] == references


def test_a_job_wide_constraint_and_a_row_override(llama_pair):
    """generate(json_schema=...) for every prompt; a row's own regex replaces it for that row."""
    params = [None, RowParams(regex="[0-9]{3}")]
    results = batchspec.generate(PROMPTS[:2], target=str(llama_pair.target), max_new_tokens=30, params=params,
                                 json_schema=SCHEMA)
    assert results[0].completion.startswith('{"')
    assert results[1].completion.isdigit() and len(results[1].completion) == 3
    assert results[1].structured_complete and results[1].finish_reason == "stop"
    plain = batchspec.generate(PROMPTS[:1], target=str(llama_pair.target), max_new_tokens=5)
    assert plain[0].structured_complete is None and plain[0].forced_tokens == 0


BAD = [  # row params -> what the error names
    (dict(json_schema="{not json"), "json_schema is not valid JSON"),
    (dict(json_schema=[1, 2]), "json_schema must be a JSON object"),
    (dict(json_schema={"type": "object", "properties": {"a": {"type": "nonsense"}}}), "json_schema:"),
    (dict(regex="[unclosed"), "regex:"),
    (dict(regex=""), "regex must be a non-empty string"),
    (dict(choice=[]), "choice must be a non-empty list"),
    (dict(choice="yes"), "choice must be a non-empty list"),
    (dict(choice=["yes", 3]), "choice must be a list of non-empty strings"),
    (dict(grammar="start: undefined_rule"), "grammar:"),
    (dict(json_object="yes"), "json_object must be true"),
    # Found at intake by a first mask on a copy, not after the row started with the parser's dump (issue 58).
    (dict(json_schema={"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
     "json_schema: no output can match it: no finite JSON value matches it"),
    (dict(regex="a+", choice=["a"]), "set at most one of"),
]


@pytest.mark.parametrize("params,message", BAD, ids=[m for _, m in BAD])
def test_a_bad_constraint_is_that_rows_error(llama_pair, params, message):
    """One line naming the field (the library's own message for what it refuses); the other rows run."""
    results = batchspec.generate(PROMPTS[:2], target=str(llama_pair.target), max_new_tokens=4,
                                 params=[RowParams(**params), None])
    assert results[0].finish_reason == "error" and message in results[0].error, results[0].error
    assert "\n" not in results[0].error
    assert results[1].error is None and results[1].completion_tokens == 4


def test_a_choice_of_20000_options_and_the_schema_true(llama_pair):
    """A choice list is one terminal of the grammar, so its size has no parser limit (llguidance stops a rule at
    2,000 alternatives: the 20,000-option list failed after one token); json_schema=True is the schema any JSON
    value matches, as {} is."""
    options = [f"opt{i}" for i in range(20000)] + ["return"]
    results = batchspec.generate(PROMPTS[:2], target=str(llama_pair.target), max_new_tokens=12,
                                 params=[RowParams(choice=options), RowParams(json_schema=True)])
    assert results[0].error is None and results[0].completion in options and results[0].structured_complete
    assert results[1].error is None and results[1].structured_complete is not None
    either = batchspec.generate(PROMPTS[1:2], target=str(llama_pair.target), max_new_tokens=12,
                                params=[RowParams(json_schema={})])
    assert either[0].completion_token_ids == results[1].completion_token_ids


def test_a_bad_job_wide_constraint_is_refused_up_front(llama_pair):
    with pytest.raises(ValueError, match="set at most one of"):
        batchspec.generate(PROMPTS[:1], target=str(llama_pair.target), regex="a", choice=["b"])


# ---- constrained rows inside tree rounds -------------------------------------------------------------------
# (drafter, batch size, compile, adaptive): every tree drafter eagerly at batch 3, some at 8, on the static path
# and choosing between chains and the tree (adaptive).
TREES = [(d, 3, "auto", False) for d in ("ngram", "prompt_lookup", "suffix", "model-identical")] + \
    [("ngram", 8, "auto", False), ("model-identical", 8, "auto", False), ("prompt_lookup", 3, "static", False),
     ("model-identical", 3, "static", False), ("prompt_lookup", 8, "auto", True), ("model-identical", 8, "auto", True)]


def mixed_params() -> list[RowParams | None]:
    """Every other prompt under its constraint (CONSTRAINTS cycled), the others free."""
    return [RowParams(**CONSTRAINTS[(i // 2) % len(CONSTRAINTS)]) if i % 2 == 0 else None for i in range(len(PROMPTS))]


@pytest.mark.parametrize("drafter,batch_size,compile,adaptive", TREES)
def test_constrained_rows_decode_inside_tree_rounds(pair, drafter, batch_size, compile, adaptive):
    """A job with tree drafts runs constrained rows beside free ones: in a tree round a constrained row drafts the
    tokens its grammar forces as a chain of nodes (a lookup; a draft model's rows draft none, as in its chain
    rounds), the free rows draft trees, and every output is drafter none's, token for token (greedy, fp32)."""
    draft = str(pair.target) if drafter == "model-identical" else None
    common = dict(target=str(pair.target), batch_size=batch_size, max_new_tokens=MAX_NEW, params=mixed_params())
    expected = batchspec.generate(PROMPTS, drafter="none", adaptive=False, **common)
    results = batchspec.generate(PROMPTS, draft=draft, drafter="model" if draft else drafter, k=3, tree="2x3",
                                 compile=compile, adaptive=adaptive, **common)
    assert all(r.error is None for r in results), next(r.error for r in results if r.error)
    assert [r.completion_token_ids for r in results] == [r.completion_token_ids for r in expected]
    if not adaptive:  # every round a tree (adaptive may choose chains, or to draft nothing, as it pays)
        forced_in_trees(results[::2], lookup=draft is None)
        assert sum(r.draft_tokens for r in results[1::2]) > 0 and sum(r.accepted_tokens for r in results[1::2]) > 0
    assert [r.structured_complete for r in results] == [r.structured_complete for r in expected]


def forced_in_trees(constrained: list, *, lookup: bool) -> None:
    """In tree rounds a lookup's constrained rows draft only the tokens their grammars force, and some are forced
    (the schema's keys, the regex's parentheses); a draft model's draft nothing (its rows draft no forced tokens)."""
    assert all(r.draft_tokens == r.forced_tokens for r in constrained)
    if lookup:
        assert sum(r.forced_tokens for r in constrained) > 0 and sum(r.forced_accepted for r in constrained) > 0
    else:
        assert all(r.draft_tokens == 0 for r in constrained)


@pytest.mark.parametrize("verify", ["coupled", "rejection"])
@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_sampled_constrained_rows_inside_tree_rounds(pair, drafter, verify):
    """Sampled: coupled, every output is drafter none's with the same noise; under rejection sampling (a draft
    model's tree rows verified against its q) the constrained rows keep to their grammars and the free rows draft
    trees."""
    common = dict(target=str(pair.target), batch_size=4, max_new_tokens=MAX_NEW, params=mixed_params(),
                  adaptive=False, temperature=0.8, seed=3, verify=verify)
    draft = str(pair.draft) if drafter == "model" else None
    results = batchspec.generate(PROMPTS, drafter=drafter, draft=draft, k=3, tree="2x3", **common)
    assert all(r.error is None for r in results), next(r.error for r in results if r.error)
    assert sum(r.draft_tokens for r in results[1::2]) > 0
    forced_in_trees(results[::2], lookup=draft is None)
    assert all(r.structured_complete is not None for r in results[::2])
    if verify == "coupled":
        expected = batchspec.generate(PROMPTS, drafter="none", **common)
        assert [r.completion_token_ids for r in results] == [r.completion_token_ids for r in expected]


@pytest.mark.parametrize("drafter,adaptive,warned", [("model", False, True), ("ngram", False, False),
                                                     ("ngram", True, False)])
def test_a_job_wide_constraint_with_only_tree_rounds(llama_pair, caplog, drafter, adaptive, warned):
    """Every row constrained and every round a tree: a lookup's rows draft what their grammars force, as chains of
    nodes; a draft model's rows draft nothing, which a warning says. Adaptive speculation prices a constrained
    row's tree as the one token it emits, so it never chooses a tree round here, and its chain rounds draft what
    the grammar forces."""
    draft = str(llama_pair.draft) if drafter == "model" else None
    with caplog.at_level("WARNING", logger="batchspec"):
        results = batchspec.generate(PROMPTS[:4], target=str(llama_pair.target), drafter=drafter, draft=draft,
                                     tree="2x2", max_new_tokens=16, regex="(def|class) [a-z_]+\\((a|b|x|y)\\):",
                                     adaptive=adaptive)
    assert all(r.error is None for r in results)
    assert ("a constrained row drafts nothing in a tree round" in caplog.text) == warned
    trees = sum(1 for r in results for t in r.tree_per_round if t)
    assert trees == 0 if adaptive else trees > 0
    forced = sum(r.forced_tokens for r in results)
    assert forced > 0 if drafter == "ngram" else forced == 0


# ---- sampled output follows the constrained distribution ----------------------------------------------

SAMPLED_REGEX = "[abd]+"  # a few tokens of the tiny byte-level vocabulary; an EOS only after the first
SAMPLED_PROMPT = "abdabdabdab"
N = 2000  # requests per run; cells expected < 5 times are pooled; chi-square at alpha = 0.001


@pytest.fixture(scope="module")
def spread_pair(tmp_path_factory):
    tokenizer = build_tokenizer()
    root = tmp_path_factory.mktemp("spread")
    vocab = len(tokenizer) + 12
    # initializer 0.3 spreads the distributions so that the grammar's few tokens get mass
    target = save_model(root / "target", "llama", tokenizer, seed=3, vocab_size=vocab, seed_scale=0.3)
    draft = save_model(root / "draft", "llama", tokenizer, seed=4, vocab_size=vocab, seed_scale=0.3, layers=1)
    return tokenizer, target, draft


def exact_constrained_two_tokens(tokenizer, target, temperature: float) -> dict[tuple, float]:
    """P(first two tokens) under the target masked by the grammar, then the temperature; EOS first ends it."""
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    vocab = model.get_output_embeddings().weight.shape[0]
    env = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=[tokenizer.eos_token_id])
    grammar = llguidance.LLMatcher.grammar_from_regex(SAMPLED_REGEX)
    prompt = tokenizer(SAMPLED_PROMPT)["input_ids"]
    mask = llguidance.torch.allocate_token_bitmask(1, vocab)
    params = SamplingParams(temperature=temperature)

    def next_probs(output):
        matcher = llguidance.LLMatcher(env, grammar)
        assert matcher.consume_tokens(output)
        llguidance.torch.fill_next_token_bitmask(matcher, mask, 0)
        with torch.no_grad():
            logits = model(torch.tensor([prompt + output])).logits[0, -1:]
        logits = logits.masked_fill(~bitmask_allows(mask[0], vocab), float("-inf"))
        return to_probs(logits, params, None)[0].double()

    dist, first = {}, next_probs([])
    for t1 in first.nonzero().flatten().tolist():
        if t1 == tokenizer.eos_token_id:
            dist[(t1,)] = first[t1].item()
            continue
        second = next_probs([t1])
        for t2 in second.nonzero().flatten().tolist():
            dist[(t1, t2)] = (first[t1] * second[t2]).item()
    return dist


@pytest.mark.slow
@pytest.mark.parametrize("verify", ["coupled", "rejection"])
@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_sampled_output_follows_the_constrained_distribution(spread_pair, drafter, verify):
    """N requests of one prompt under a regex, each its own noise: the first two tokens (the second a
    speculative verdict over drafts the grammar may refuse) against the exact masked distribution."""
    tokenizer, target, draft = spread_pair
    exact = exact_constrained_two_tokens(tokenizer, target, temperature=1.0)
    results = batchspec.generate([SAMPLED_PROMPT] * N, ids=[f"r{i}" for i in range(N)], target=str(target),
                                 draft=str(draft), drafter=drafter, k=3, batch_size=64, max_new_tokens=4,
                                 temperature=1.0, seed=5, verify=verify, adaptive=False, regex=SAMPLED_REGEX)
    assert all(r.error is None for r in results), next(r.error for r in results if r.error)
    observed = first_two_counts(results)
    assert set(observed) <= set(exact), f"outside the constrained support: {set(observed) - set(exact)}"
    assert sum(r.draft_tokens for r in results) > N // 2, "the drafter must actually propose"
    chi2, df = chi_square(observed, exact, N)
    assert df >= 3, observed
    assert chi2 < chi2_critical(df), f"chi2={chi2:.1f} df={df} critical={chi2_critical(df):.1f}"
    assert math.isfinite(chi2)


REGEX_BOMB = "(a|b){1,5000}c(d|e){1,5000}"  # issue 58's: counted repeats build lexer states as the row goes


@pytest.mark.parametrize("drafter", ["none", "ngram", "model"])
def test_a_grammar_past_its_work_limit_ends_that_row_only(llama_pair, monkeypatch, drafter):
    """llguidance's per-step work limit (lexer fuel), lowered so that the regex passes its first mask and
    then runs out on a later token: that row ends with the limit named in one line, keeping the output its
    grammar took (no token drawn under the failed mask); the row beside it runs as it would alone. Work, not
    time, is bounded, so the row ends at the same token on every machine (fuel 60 here: 1 token, then the
    limit; at llguidance's default 200,000 the same row runs to its end)."""
    from batchspec.engine.grammar import grammar

    alone = batchspec.generate(PROMPTS[1:2], target=str(llama_pair.target), max_new_tokens=12)
    monkeypatch.setattr(grammar, "STEP_LEXER_FUEL", 60)
    results = batchspec.generate(PROMPTS[:2], target=str(llama_pair.target), draft=str(llama_pair.draft),
                                 drafter=drafter, max_new_tokens=12, params=[RowParams(regex=REGEX_BOMB), None])
    assert results[0].finish_reason == "error", results[0]
    assert results[0].error == ("structured output: the lexer's work for one token passed its limit "
                                "(lexer fuel 60 a step): simplify the constraint")
    assert results[0].completion == "a" and results[0].completion_token_ids == llama_pair.tokenizer.encode(
        "a", add_special_tokens=False)
    assert results[1].completion_token_ids == alone[0].completion_token_ids
    monkeypatch.setattr(grammar, "STEP_LEXER_FUEL", 200_000)
    whole = batchspec.generate(PROMPTS[:1], target=str(llama_pair.target), max_new_tokens=12, regex=REGEX_BOMB)
    assert whole[0].error is None and whole[0].structured_complete


def test_n_samples_each_follow_the_constraint(llama_pair):
    """n samples of one constrained prompt: each sample its own matcher (the prompt prefilled once)."""
    results = batchspec.generate(PROMPTS[:2], target=str(llama_pair.target), drafter="ngram", n=4, temperature=1.0,
                                 max_new_tokens=12, choice=["alpha", "beta gamma", "delta"], seed=1)
    assert len(results) == 8
    assert all(r.completion in ("alpha", "beta gamma", "delta") and r.structured_complete for r in results)
    assert len({r.completion for r in results}) > 1  # samples, not copies


DEMO = Path(__file__).resolve().parent.parent / "batchspec" / "assets" / "demo" / "target"


@pytest.mark.parametrize("constraint,stop,completion,reason,complete", [
    # a stop string inside the constrained output: the row is cut there, so it is not a whole match
    (dict(choice=("return", "pass")), ("ur",), "ret", "ur", False),
    (dict(regex="return|pass"), ("ur",), "ret", "ur", False),
    (dict(json_schema={"enum": ["return", "pass"]}), ("ur",), '"ret', "ur", False),
    # cut at max_new_tokens where a prefix happens to match: not complete either
    (dict(regex="[0-9]+"), (), None, None, False),
    (dict(json_schema={}), (), None, None, False),
    (dict(grammar='start: "x"+'), (), "x" * 16, None, False),
    # a whole match that ends on EOS
    (dict(choice=("return", "pass")), (), "return", 1, True),
])
def test_structured_complete_and_the_stop_reason(constraint, stop, completion, reason, complete):
    """The demo target, greedy, 16 new tokens, prompt `def f(x):\\n    ` (issue 58's items 1 and 2)."""
    result = batchspec.generate(["def f(x):\n    "], target=str(DEMO), max_new_tokens=16, stop=stop, **constraint)[0]
    if completion is not None:
        assert result.completion == completion
    assert result.stop_reason == reason
    assert result.finish_reason == ("length" if reason is None else "stop")
    assert result.structured_complete is complete


def test_a_grammar_that_ends_exactly_at_max_new_tokens_is_complete():
    """`return` in as many tokens as max_new_tokens: finish_reason length (no EOS yet), but the grammar takes
    nothing more, so the output is a whole match."""
    tokens = batchspec.generate(["def f(x):\n    "], target=str(DEMO), max_new_tokens=16,
                                choice=("return", "pass"))[0].completion_token_ids
    result = batchspec.generate(["def f(x):\n    "], target=str(DEMO), max_new_tokens=len(tokens) - 1,
                                choice=("return", "pass"))[0]
    assert result.completion == "return" and result.finish_reason == "length" and result.structured_complete
