"""Session fixtures: tiny random models of three architectures saved to a temp dir, plus references.

Each target gets a second EOS id in its generation config: a token that its greedy output produces
for some prompts but not others, so the parity tests cover requests ending on EOS and on length.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: spinning threads on a busy CPU
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tiny import PROMPTS, build_tokenizer, save_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The machine's measured costs (engine/control/startup_costs.py) go to a folder of this run's, not the user's cache.
os.environ["BATCHSPEC_CACHE"] = tempfile.mkdtemp(prefix="batchspec-cache-")
atexit.register(shutil.rmtree, os.environ["BATCHSPEC_CACHE"], ignore_errors=True)  # each worker's own folder
# torch's threads per test: one for the tiny models, two for the real ones (SmolLM2, Gemma-3), set around each
# test's setup, call and teardown (pytest_runtest_protocol below). The suite runs two workers on two cores: the
# tiny models' small ops gain nothing from a second thread and lose to the other worker's (2 threads each: 105-110 s
# for 390 tests of test_greedy_parity / test_structured / test_sampling_e2e, 83-84 s on one; the whole suite 13 min
# 34 s against 12 min 40 s, 2026-12-02), while the real models' matrix products use a core the other worker leaves
# idle (test_gemma3 175 s on two threads, 197 s on one).
TINY_THREADS = int(os.environ.get("BATCHSPEC_TEST_THREADS", "1"))
REAL_MODEL_THREADS = int(os.environ.get("BATCHSPEC_TEST_REAL_MODEL_THREADS", "2"))
REAL_MODEL_GROUPS = {"gemma3", "smollm2"}  # the xdist_group of test_gemma3.py and test_real_model.py
torch.set_num_threads(TINY_THREADS)

MAX_NEW = 24
ARCHS = ("llama", "qwen2", "gpt2")


@dataclass
class TinyPair:
    arch: str
    target: Path
    draft: Path  # random, unrelated to the target (almost nothing accepted)
    tokenizer: object
    eos_ids: list[int]
    reference: list[list[int]]  # HF greedy new tokens for each of PROMPTS


def hf_greedy(model, tokenizer, prompts, max_new_tokens):
    out = []
    for prompt in prompts:
        enc = tokenizer(prompt, return_tensors="pt")
        with torch.no_grad():
            ids = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens)
        out.append(ids[0, enc["input_ids"].shape[1]:].tolist())
    return out


def pick_extra_eos(reference: list[list[int]]) -> int:
    """A token that appears (after position 2) in some but not all greedy outputs."""
    counts = Counter(t for ref in reference for t in set(ref[3:]))
    for token, n in counts.most_common():
        if 2 <= n <= len(reference) - 3:
            return token
    raise RuntimeError("no suitable extra EOS token")


@pytest.fixture
def drafting_priced_cheap(monkeypatch):
    """The machine's start-up costs pinned: a flat forward and drafting steps of 10 us, so that adaptive drafts
    from its first rounds. For tests of exactness whose point is that drafts were verified: measured under the
    suite's load (or another job's), a drafter's step can read too dear to draft at all, and the parity would
    hold without a draft (test_eagle_drafter's adaptive case, once in the 47th session; Gemma-3's and SmolLM2's
    beside a model being trained). What adaptive then learns from the rounds is its own."""
    from batchspec.engine.control import round_prices, startup_costs

    pinned = startup_costs.StartupCosts(verify=((1, 0.01), (4096, 0.0101)), step=((1, 1e-5), (64, 1e-5)))
    monkeypatch.setattr(round_prices.startup_costs, "for_runner", lambda *args, **kwargs: pinned)
    return pinned


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test on its threads (TINY_THREADS or REAL_MODEL_THREADS, above), its fixtures' setup included."""
    group = item.get_closest_marker("xdist_group")
    real = group is not None and bool(group.args) and group.args[0] in REAL_MODEL_GROUPS
    before = torch.get_num_threads()
    torch.set_num_threads(REAL_MODEL_THREADS if real else TINY_THREADS)
    try:
        return (yield)
    finally:
        torch.set_num_threads(before)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups to rename the tests by them
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (the README's test command runs two workers) the tests of the one SLURM cluster
    go to one worker: the cluster is a session fixture, and two workers would start two on one machine."""
    for item in items:
        if "slurm_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("slurm"))


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session", params=ARCHS)
def pair(request, tmp_path_factory, tokenizer) -> TinyPair:
    arch = request.param
    root = tmp_path_factory.mktemp(arch)
    vocab = len(tokenizer) + 12  # embeddings padded past the tokenizer's vocabulary
    target = save_model(root / "target", arch, tokenizer, seed=0, vocab_size=vocab)
    # What users get: transformers picks the tokenizer class from the model type (Qwen2Tokenizer for
    # qwen2, which pre-tokenizes differently), so references use the tokenizer as loaded from disk.
    loaded_tokenizer = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    model.generation_config.eos_token_id = None  # gotcha: None must be set on the model's own config
    extra = pick_extra_eos(hf_greedy(model, loaded_tokenizer, PROMPTS, MAX_NEW))
    eos_ids = [tokenizer.eos_token_id, extra]
    target = save_model(root / "target", arch, tokenizer, seed=0, vocab_size=vocab, eos_ids=eos_ids)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    reference = hf_greedy(model, loaded_tokenizer, PROMPTS, MAX_NEW)
    # The draft's embeddings are padded differently from the target's (vocab + 4 vs + 12).
    draft = save_model(root / "draft", arch, tokenizer, seed=1, vocab_size=len(tokenizer) + 4, eos_ids=eos_ids,
                       layers=1, hidden=32)
    return TinyPair(arch, target, draft, loaded_tokenizer, eos_ids, reference)


@pytest.fixture(scope="session")
def llama_pair(tmp_path_factory, tokenizer) -> TinyPair:
    root = tmp_path_factory.mktemp("llama-only")
    vocab = len(tokenizer) + 12
    target = save_model(root / "target", "llama", tokenizer, seed=0, vocab_size=vocab)
    draft = save_model(root / "draft", "llama", tokenizer, seed=1, vocab_size=vocab, layers=1, hidden=32)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    return TinyPair("llama", target, draft, tokenizer, [tokenizer.eos_token_id],
                    hf_greedy(model, tokenizer, PROMPTS, MAX_NEW))
