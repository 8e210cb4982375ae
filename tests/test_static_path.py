"""The captured path checked on CPU: what a round launches outside captured steps (a bound that does not
grow with the layer count), that every step can be captured (no host sync, no data-dependent shape, no
graph break), and the admission that brings new rows' first tokens back with the next round."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

import batchspec
from batchspec.engine.model.host_device import LaunchCounter
from batchspec.engine.model.models import Models
from conftest import MAX_NEW
from tiny import PROMPTS, model_config

# Ops a round may dispatch outside captured steps on the static path (every phase but admission): host
# values copied in (budgets, a lookup's proposals, a tree) and the verdict's read. HF generate with a
# static cache dispatches 31 per decode step on a 28-layer Llama; these bounds hold at any depth.
CHAIN_BOUND, TREE_BOUND = 8, 16
ADMISSION_BOUND = 12  # per admission, whatever the prompts' lengths and the layer count

# drafter, tree, sampling
CASES = [("none", None, {}), ("model", None, {}), ("ngram", None, {}), ("prompt_lookup", None, {}),
         ("model", "2x3", {}), ("prompt_lookup", "2x3", {}),
         ("model", None, dict(temperature=0.8, top_p=0.9)),
         ("model", None, dict(temperature=0.8, verify="rejection", repetition_penalty=1.3)),
         ("model", "2x2", dict(temperature=0.8, verify="rejection"))]


def models_with_layers(tokenizer, layers: int) -> Models:
    vocab = len(tokenizer) + 12
    torch.manual_seed(0)
    target = AutoModelForCausalLM.from_config(model_config("llama", vocab, layers=layers)).eval()
    draft = AutoModelForCausalLM.from_config(model_config("llama", vocab, layers=1, hidden=32)).eval()
    return Models(target=target, draft=draft, tokenizer=tokenizer, eos_token_ids=[tokenizer.eos_token_id])


def counted_run(models: Models, drafter: str, tree: str | None, sampling: dict) -> tuple[LaunchCounter, object]:
    counter = LaunchCounter()
    generator = batchspec.build_generator(models, drafter=drafter, k=3, batch_size=4, max_new_tokens=MAX_NEW,
                                          compile="static", tree=tree, launches=counter, adaptive=False, **sampling)
    with counter:
        results = list(generator.run(batchspec.Request(str(i), p) for i, p in enumerate(PROMPTS)))
    assert len(results) == len(PROMPTS)
    return counter, generator


@pytest.fixture(scope="module")
def shallow_and_deep(tokenizer):
    return models_with_layers(tokenizer, 2), models_with_layers(tokenizer, 6)


@pytest.mark.parametrize("drafter,tree,sampling", CASES, ids=[f"{d}-{t or 'chain'}-{s.get('verify', 'coupled') if s else 'greedy'}"
                                                              for d, t, s in CASES])
def test_launches_per_round_are_bounded_and_do_not_grow_with_depth(shallow_and_deep, drafter, tree, sampling):
    counts = []
    for models in shallow_and_deep:
        counter, generator = counted_run(models, drafter, tree, sampling)
        rounds = generator.stats.rounds
        per_round = sum(n for phase, n in counter.ops.items() if phase != "admit") / rounds
        assert per_round <= (TREE_BOUND if tree else CHAIN_BOUND), (counter.ops, rounds)
        assert counter.syncs.get("accept", 0) == rounds  # the round's one host read
        assert sum(n for phase, n in counter.syncs.items() if phase != "accept") == 0  # admission included
        assert counter.in_step == []  # no host sync, no data-dependent shape inside a step
        admissions = counter.replays.get("admit", 0)
        assert counter.ops.get("admit", 0) <= ADMISSION_BOUND * admissions
        counts.append((counter.ops.get("draft", 0) + counter.ops.get("verify", 0) + counter.ops.get("accept", 0)) / rounds)
    # Model depth changes what a step computes, never what runs outside steps (rounds differ in number
    # only where the two random targets write different text).
    assert counts[0] == pytest.approx(counts[1], abs=1.0), counts


@pytest.mark.slow
@pytest.mark.parametrize("drafter,tree,sampling", [CASES[4], CASES[6], CASES[8], CASES[5]],
                         ids=["model-tree-greedy", "model-coupled", "model-tree-rejection", "lookup-tree"])
def test_every_kind_of_step_traces_as_one_graph(shallow_and_deep, drafter, tree, sampling):
    """torch.compile(fullgraph=True) refuses graph breaks: .item(), .tolist(), data-dependent branches, all of
    which would also break a CUDA graph capture. The widest step of each kind is traced (backend eager:
    tracing only)."""
    _, generator = counted_run(shallow_and_deep[0], drafter, tree, sampling)
    widest: dict[tuple, tuple] = {}
    for key, step in generator.graphs.declared.items():
        kind = key[:2] if key[0] in ("target", "draft") else key[:1]
        if kind not in widest or step.size >= widest[kind][1].size:
            widest[kind] = (key, step)
    kinds = {("accept",), ("first",), ("target", "packed"), ("target", "gather"), ("target", "prefill")}
    assert kinds <= set(widest) and ("target", "forward") not in widest  # chains and trees verify packed
    if tree:  # the widest packed verify is the tree's, its geometry among its inputs (its width in its key)
        key, step = widest[("target", "packed")]
        assert len(key) == 5 and len(step.args) == 5
    for key, step in widest.values():
        torch._dynamo.reset()
        with torch.inference_mode():
            torch.compile(step.fn, backend="eager", fullgraph=True)(*step.args)


@pytest.mark.parametrize("compile", ["off", "static"])
def test_rows_that_end_on_their_first_token(pair, compile):
    """The static path learns a new row's first token with the next round's verdict: a row that it already
    ends (max_new_tokens=1, or the first token is an EOS) must still end there, with one token."""
    first = [ref[0] for ref in pair.reference]
    eos = first[3]
    models = batchspec.load_models(str(pair.target), str(pair.draft))
    models.eos_token_ids = [eos]
    for max_new, expect in ((1, [[t] for t in first]), (4, None)):
        generator = batchspec.build_generator(models, drafter="model", k=2, batch_size=3, max_new_tokens=max_new,
                                              compile=compile)
        results = sorted(generator.run(batchspec.Request(str(i), p) for i, p in enumerate(PROMPTS)),
                         key=lambda r: int(r.id))
        for r, ref in zip(results, pair.reference):
            expected = expect[int(r.id)] if expect else (ref[:1] if ref[0] == eos else ref[: max_new])
            if expect is None and ref[0] != eos:  # the other EOS ids of the pair no longer stop it
                assert r.completion_token_ids[:1] == ref[:1]
                continue
            assert r.completion_token_ids == expected, (r.id, r.completion_token_ids, ref)
            assert r.finish_reason == ("stop" if expected[-1] == eos else "length")
            assert r.target_forwards == 1 and r.draft_tokens == 0
