"""What dataset jobs use per request: n samples, logprobs (against Hugging Face's own scores), prompt
logprobs, per-request sampling settings, stop reasons. Exact where the math is exact (fp32)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.generation.logits_process import (
    MinPLogitsWarper, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
)

import batchspec
from batchspec.engine.types import RowParams
from conftest import MAX_NEW
from tiny import PROMPTS

DRAFTERS = ["none", "model", "ngram", "prompt_lookup"]


def run(pair, drafter="none", **kw):
    kw.setdefault("max_new_tokens", MAX_NEW)
    return batchspec.generate(PROMPTS, target=str(pair.target), draft=str(pair.draft) if drafter == "model" else None,
                              drafter=drafter, **kw)


def hf_processed_logprobs(model, tokenizer, prompt: str, tokens: list[int], *, temperature=0.0, top_k=0, top_p=1.0,
                          min_p=0.0, repetition_penalty=1.0) -> torch.Tensor:
    """Teacher-forced: the log-softmax of transformers' processed scores at every completion position
    (the processors and warpers generate applies, in its order) -> [len(tokens), V]."""
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    full = torch.cat([ids, torch.tensor([tokens])], dim=1)
    with torch.no_grad():
        logits = model(full).logits[0, ids.shape[1] - 1 : -1].float()
    out = []
    for t in range(len(tokens)):
        s = logits[t : t + 1]
        context = full[:, : ids.shape[1] + t]
        if repetition_penalty != 1.0:
            s = RepetitionPenaltyLogitsProcessor(repetition_penalty)(context, s)
        if temperature > 0:
            for warper in ([TemperatureLogitsWarper(temperature)] + ([TopKLogitsWarper(top_k)] if top_k else [])
                           + ([TopPLogitsWarper(top_p)] if top_p < 1 else []) + ([MinPLogitsWarper(min_p)] if min_p else [])):
                s = warper(context, s)
        out.append(torch.log_softmax(s, dim=-1)[0])
    return torch.stack(out)


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_greedy_logprobs_equal_generates_output_scores(pair, drafter):
    """generate(output_scores=True) on each prompt alone: its scores' log-softmax at its tokens (= ours), and
    the 3 best alternatives, to 1e-4."""
    model = AutoModelForCausalLM.from_pretrained(pair.target, dtype=torch.float32)
    results = run(pair, drafter, k=3, batch_size=4, logprobs=3, repetition_penalty=1.2)
    for prompt, result in zip(PROMPTS, results):
        enc = pair.tokenizer(prompt, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**enc, do_sample=False, max_new_tokens=MAX_NEW, output_scores=True,
                                 return_dict_in_generate=True, repetition_penalty=1.2)
        tokens = out.sequences[0, enc["input_ids"].shape[1]:].tolist()
        assert result.completion_token_ids == tokens
        reference = torch.log_softmax(torch.stack(out.scores)[:, 0].float(), dim=-1)
        assert len(result.logprobs) == len(tokens) == len(result.top_logprobs)
        torch.testing.assert_close(torch.tensor(result.logprobs), reference[torch.arange(len(tokens)), tokens],
                                   atol=1e-4, rtol=0)
        top = reference.topk(3, dim=-1)
        torch.testing.assert_close(torch.tensor(result.top_logprobs), top.values, atol=1e-4, rtol=0)
        assert result.top_logprob_ids == top.indices.tolist()


SAMPLED = [dict(temperature=0.8), dict(temperature=1.2, top_k=20, top_p=0.9), dict(temperature=0.7, min_p=0.05)]


@pytest.mark.parametrize("verify", ["coupled", "rejection"])
@pytest.mark.parametrize("drafter", ["none", "model", "ngram"])
@pytest.mark.parametrize("sampling", SAMPLED, ids=["t0.8", "topk-topp", "minp"])
def test_sampled_logprobs_are_the_processed_distributions(llama_pair, drafter, sampling, verify):
    """Speculation does not change a token's logprob: each one equals the log-softmax of transformers'
    processed scores (temperature, top-k, top-p, min-p) at that position, teacher-forced."""
    model = AutoModelForCausalLM.from_pretrained(llama_pair.target, dtype=torch.float32)
    results = run(llama_pair, drafter, k=3, batch_size=4, logprobs=2, seed=5, verify=verify, **sampling)
    for prompt, result in zip(PROMPTS, results):
        reference = hf_processed_logprobs(model, llama_pair.tokenizer, prompt, result.completion_token_ids, **sampling)
        tokens = torch.tensor(result.completion_token_ids)
        torch.testing.assert_close(torch.tensor(result.logprobs), reference[torch.arange(len(tokens)), tokens],
                                   atol=1e-4, rtol=0)
        assert all(v > float("-inf") for v in result.logprobs)  # a sampled token is never a filtered one
        torch.testing.assert_close(torch.tensor(result.top_logprobs), reference.topk(2, dim=-1).values, atol=1e-4, rtol=0)


@pytest.mark.parametrize("compile", ["off", "static"])
def test_prompt_logprobs_are_the_models_raw_distribution(llama_pair, compile):
    model = AutoModelForCausalLM.from_pretrained(llama_pair.target, dtype=torch.float32)
    results = run(llama_pair, "ngram", k=2, batch_size=3, prompt_logprobs=2, max_new_tokens=4, compile=compile)
    for prompt, result in zip(PROMPTS, results):
        ids = llama_pair.tokenizer(prompt)["input_ids"]
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].float(), dim=-1)
        assert result.prompt_logprobs[0] is None and len(result.prompt_logprobs) == len(ids)
        torch.testing.assert_close(torch.tensor(result.prompt_logprobs[1:]), lp[torch.arange(len(ids) - 1), ids[1:]],
                                   atol=1e-4, rtol=0)
        assert result.prompt_top_logprob_ids[1:] == lp.topk(2, dim=-1).indices.tolist()


@pytest.mark.parametrize("drafter,compile,batch_size", [("none", "off", 8), ("model", "off", 3), ("ngram", "static", 5),
                                                         ("prompt_lookup", "off", 1)])
def test_n_samples_are_keyed_by_seed_id_and_index(llama_pair, drafter, compile, batch_size):
    """n samples per prompt: sample 0 is what n=1 gives, every sample is what plain decoding gives for its
    (seed, id, index), whatever the drafter, k, batch or compile mode; exactly n per prompt."""
    sampling = dict(temperature=0.9, seed=3, max_new_tokens=12)
    reference = run(llama_pair, "none", n=3, batch_size=8, **sampling)
    single = run(llama_pair, "none", batch_size=8, **sampling)
    results = run(llama_pair, drafter, n=3, k=2, batch_size=batch_size, compile=compile, **sampling)
    assert [(r.id, r.sample_index) for r in results] == [(str(i), j) for i in range(len(PROMPTS)) for j in range(3)]
    assert [r.completion_token_ids for r in results] == [r.completion_token_ids for r in reference]
    assert [r.completion_token_ids for r in reference[::3]] == [r.completion_token_ids for r in single]
    distinct = sum(len({tuple(r.completion_token_ids) for r in reference[i : i + 3]}) > 1 for i in range(0, len(reference), 3))
    assert distinct >= len(PROMPTS) - 2  # samples of one prompt differ


def test_n_with_greedy_decoding_is_refused(llama_pair):
    with pytest.raises(ValueError, match="identical copies"):
        run(llama_pair, n=2)
    results = run(llama_pair, temperature=0.7, params=[RowParams(n=2, temperature=0.0)] + [None] * (len(PROMPTS) - 1))
    assert [(r.id, r.sample_index, r.finish_reason) for r in results[:2]] == [("0", 0, "error"), ("0", 1, "error")]
    assert "identical copies" in results[0].error  # one error row per sample: a job keeps n rows per id
    assert all(r.finish_reason != "error" for r in results[2:])


@pytest.mark.parametrize("compile", ["off", "static"])
def test_per_request_settings_share_the_batch(llama_pair, compile):
    """Rows with their own temperature, top_p, top_k, max_new_tokens, stop and seed run in one batch, each
    exactly as it runs alone with those settings as the job's (coupled sampling keys on seed and id)."""
    texts = [llama_pair.tokenizer.decode(r, skip_special_tokens=True) for r in llama_pair.reference]
    settings = [dict(temperature=0.0), dict(temperature=0.8, top_p=0.9, seed=11), dict(max_new_tokens=5),
                dict(temperature=1.1, top_k=15), dict(stop=(texts[4][3:5],)), dict(temperature=0.6, min_p=0.1, seed=2)]
    params = [RowParams(**{k: (tuple(v) if k == "stop" else v) for k, v in s.items()}) for s in settings]
    params += [None] * (len(PROMPTS) - len(params))
    together = run(llama_pair, "model", k=3, batch_size=4, params=params, compile=compile)
    for i, (prompt, s) in enumerate(zip(PROMPTS, settings + [{}] * len(PROMPTS))):
        alone = batchspec.generate([prompt], ids=[str(i)], target=str(llama_pair.target),
                                   **{"max_new_tokens": MAX_NEW, **s})[0]
        assert together[i].completion_token_ids == alone.completion_token_ids, (i, s)
        assert together[i].finish_reason == alone.finish_reason


def test_bad_per_request_values_are_row_errors_naming_the_field(llama_pair):
    params = [RowParams(temperature=-1.0), RowParams(top_p=0.0), RowParams(max_new_tokens=0), RowParams(logprobs=50),
              RowParams(temperature=1e-40)]
    results = run(llama_pair, params=params + [None] * (len(PROMPTS) - len(params)), temperature=0.5)
    errors = [r.error for r in results[: len(params)]]
    for error, field in zip(errors, ["temperature", "top_p", "max_new_tokens", "logprobs", "temperature"]):
        assert error.startswith(field), errors
    assert all(r.finish_reason != "error" for r in results[len(params):])


def test_stop_reason_and_keeping_the_stop_string(pair):
    texts = [pair.tokenizer.decode(r, skip_special_tokens=True) for r in pair.reference]
    index = next(i for i, t in enumerate(texts) if len(t) > 8 and t[4:6].strip())
    stop = texts[index][4:6]
    cut, kept = (run(pair, "ngram", k=2, stop=[stop], keep_stop=keep) for keep in (False, True))
    assert cut[index].stop_reason == stop and cut[index].finish_reason == "stop"
    assert kept[index].completion == cut[index].completion + stop
    assert kept[index].completion_token_ids == cut[index].completion_token_ids
    for r, ref in zip(cut, pair.reference):
        if r.finish_reason == "stop" and r.stop_reason != stop:
            assert r.stop_reason == ref[-1] and ref[-1] in pair.eos_ids  # an EOS id
        if r.finish_reason == "length":
            assert r.stop_reason is None


def test_a_stop_string_and_an_eos_in_the_same_round(pair):
    """A row whose last token completes a stop string and whose EOS comes in the same round (the draft is the
    target, so every draft is accepted): the stop string is the reason, not a token id, and the output is cut
    before the EOS."""
    eos = set(pair.eos_ids)
    ended = [i for i, ref in enumerate(pair.reference) if ref and ref[-1] in eos and len(ref) >= 3]
    assert ended, "the references need a row that ends on EOS"
    cases = []
    for i in ended:  # the shortest visible end of the text before the EOS found nowhere before it
        text = pair.tokenizer.decode(pair.reference[i][:-1], skip_special_tokens=True)  # an EOS id may be text
        stop = next((text[-n:] for n in range(1, 12) if text[-n:].strip() and "\ufffd" not in text[-n:]
                     and text.find(text[-n:]) == len(text) - n), None)
        if stop is not None:
            cases.append((i, stop, text))
    assert cases, "no row ends in a stop string found only at its end"
    for i, stop, text in cases:
        result = batchspec.generate([PROMPTS[i]], target=str(pair.target), draft=str(pair.target), drafter="model",
                                    k=4, adaptive=False, max_new_tokens=MAX_NEW, stop=[stop])[0]
        assert result.finish_reason == "stop" and result.stop_reason == stop, (i, stop, result.stop_reason)
        assert result.completion == text[: len(text) - len(stop)]
        assert result.completion_token_ids == pair.reference[i][:-1]  # the EOS cut away with the stop
