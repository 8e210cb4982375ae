"""Coupled sampling: every sampled token is the target's own Gumbel-max draw with noise keyed by
(seed, request id, position), so the text depends on nothing else: not the drafter, k, adaptive
choices, batch size, order, shards or a resume. And each token follows p exactly.

Statistical tests state n and the threshold; each is shown to fail on a mutated noise or transform."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import batchspec
from batchspec.bench.calibrate import read_prompts
from batchspec.engine.noise import gumbel_noise
from batchspec.engine.sampling import SamplingParams, coupled_tokens, to_probs
from batchspec.jobs.config import ASSETS_DIR
from conftest_jobs import read_output, run_inprocess, tiny_job, tiny_models, write_job  # noqa: F401
from tiny import PROMPTS

ALPHA_Z = 3.09  # one-sided normal quantile for alpha = 0.001


def chi2_critical(df: int, z: float = ALPHA_Z) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (scipy is not a dependency)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


# ---- the noise -------------------------------------------------------------------------------------


def test_noise_is_a_pure_function_of_key_position_and_token():
    keys = torch.tensor([11, 2**62 + 5, -7], dtype=torch.long)
    positions = torch.tensor([[3, 4, 5], [0, 1, 2], [1000, 1001, 1002]])
    noise = gumbel_noise(keys, positions, 512)
    assert noise.shape == (3, 3, 512) and noise.dtype == torch.float32 and torch.isfinite(noise).all()
    # another batch, another slice of positions, a smaller pass: the same values
    assert torch.equal(gumbel_noise(keys[[2, 0]], positions[[2, 0], 1:], 512), noise[[2, 0], 1:])
    assert not torch.equal(noise[0, 0], noise[0, 1]) and not torch.equal(noise[0, 0], noise[1, 0])


N_NOISE = 1_310_720  # 64 keys x 5 positions x 4096 tokens


def ks_to_gumbel(values: torch.Tensor) -> float:
    x, _ = values.double().flatten().sort()
    n = len(x)
    cdf = torch.exp(-torch.exp(-x))
    grid = torch.arange(1, n + 1, dtype=torch.float64) / n
    return torch.maximum((cdf - grid).abs(), (cdf - grid + 1 / n).abs()).max().item()


def test_noise_is_gumbel_distributed():
    """Kolmogorov-Smirnov over N_NOISE values: D < 1.95 / sqrt(n) (alpha = 0.001); exponential noise
    (G without its outer -log) fails the same test."""
    keys = torch.arange(64, dtype=torch.long) * 7919
    positions = torch.arange(5)[None].expand(64, 5)
    noise = gumbel_noise(keys, positions, 4096)
    threshold = 1.95 / math.sqrt(N_NOISE)
    assert ks_to_gumbel(noise) < threshold
    assert ks_to_gumbel(torch.exp(-noise)) > threshold  # the mutant: Exp(1) variates, not Gumbel


# ---- each token follows p ----------------------------------------------------------------------------

LOGITS = torch.tensor([2.0, 1.5, 1.2, 0.9, 0.3, 0.0, -0.5, -2.0, -3.0, 0.8])
PRESENT = torch.tensor([False, True, False, False, False, True, False, False, False, False])
N_DRAWS = 200_000  # draws per case, one request key each, at one position
PARAMS = {
    "temperature": SamplingParams(temperature=1.0),
    "all_transforms": SamplingParams(temperature=0.7, top_k=8, top_p=0.95, min_p=0.02, repetition_penalty=1.3),
}


def draws(params: SamplingParams, noise_scale: float = 1.0, logits: torch.Tensor = LOGITS) -> torch.Tensor:
    keys = torch.arange(N_DRAWS, dtype=torch.long)
    noise = gumbel_noise(keys, torch.full((N_DRAWS, 1), 17), len(LOGITS))[:, 0] * noise_scale
    presence = PRESENT.expand(N_DRAWS, -1)
    return coupled_tokens(logits.expand(N_DRAWS, -1), params, presence, noise)


def chi2_against(tokens: torch.Tensor, params: SamplingParams) -> tuple[float, float]:
    p = to_probs(LOGITS[None], params, PRESENT[None])[0].double()
    counts = torch.bincount(tokens, minlength=len(LOGITS)).double()
    assert counts[p == 0].sum() == 0, "a token outside p's support was drawn"
    expected = p * N_DRAWS
    keep = expected >= 5
    chi2 = ((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum().item()
    return chi2, chi2_critical(int(keep.sum()) - 1)


@pytest.mark.parametrize("name", list(PARAMS))
def test_coupled_draws_follow_p(name):
    """N_DRAWS draws of argmax(s + G) against p = to_probs (the same transforms): chi-square below its
    alpha = 0.001 quantile. The same test fails on a mutated noise (G x 0.8: sampling at another
    temperature) and on a mutated transform (the logits scaled by 1.25 before the transforms)."""
    params = PARAMS[name]
    chi2, critical = chi2_against(draws(params), params)
    assert chi2 < critical, (chi2, critical)
    chi2, critical = chi2_against(draws(params, noise_scale=0.8), params)
    assert chi2 > critical, ("mutated noise passed", chi2, critical)
    chi2, critical = chi2_against(draws(params, logits=LOGITS * 1.25), params)
    assert chi2 > critical, ("mutated transform passed", chi2, critical)


def test_greedy_ignores_the_noise():
    params = SamplingParams(temperature=0.0, repetition_penalty=1.3)
    noise = torch.randn(4, len(LOGITS)) * 10
    tokens = coupled_tokens(LOGITS.expand(4, -1), params, PRESENT.expand(4, -1), noise)
    assert tokens.tolist() == [0] * 4


# ---- end to end: the output depends on (seed, id, prompt) alone ---------------------------------------

SAMPLING = dict(temperature=0.9, top_k=40, top_p=0.95, min_p=0.01, repetition_penalty=1.1, seed=31)
# drafter (model-identical: the target drafts for itself), k, batch size, adaptive, prompt order reversed, compile
CONFIGS = [
    ("model-random", 1, 3, False, False, "auto"),
    ("model-identical", 8, 8, True, False, "auto"),
    ("model-random", 4, 8, None, True, "auto"),
    ("ngram", 3, 8, True, False, "auto"),
    ("ngram", 8, 1, False, True, "auto"),
    ("prompt_lookup", 2, 3, None, False, "auto"),
    ("model-identical", 3, 3, True, True, "static"),
]


def generate(pair, drafter: str, k: int, batch_size: int, adaptive, reverse: bool, compile: str = "auto",
             tree: str | None = None, **kw):
    ids = [f"q{i}" for i in range(len(PROMPTS))]
    prompts = list(PROMPTS)
    if reverse:
        ids, prompts = ids[::-1], prompts[::-1]
    draft = {"model-random": pair.draft, "model-identical": pair.target}.get(drafter)
    results = batchspec.generate(
        prompts, ids=ids, target=str(pair.target), draft=str(draft) if draft else None,
        drafter="model" if draft else drafter, k=k, batch_size=batch_size, adaptive=adaptive, max_new_tokens=20,
        compile=compile, tree=tree, **{**SAMPLING, **kw},
    )
    return dict(zip(ids, results))


def test_seeded_output_ignores_drafter_k_adaptive_batch_and_order(pair, drafting_priced_cheap):
    """Llama, Qwen2 and GPT-2: every configuration emits drafter none's text (batch 1), token for token.
    Start-up costs pinned (conftest): the target drafting for itself, timed on a loaded machine, once read too
    dear for adaptive to draft at all (CI, 58th session), and the accept-all check below needs drafts."""
    plain = generate(pair, "none", 0, 1, False, False)
    for drafter, k, batch_size, adaptive, reverse, compile in CONFIGS:
        got = generate(pair, drafter, k, batch_size, adaptive, reverse, compile)
        assert {i: r.completion_token_ids for i, r in got.items()} == \
            {i: r.completion_token_ids for i, r in plain.items()}, (drafter, k, batch_size, adaptive, reverse)
        if drafter == "model-identical":  # the target drafting for itself guesses every token
            assert sum(r.accepted_tokens for r in got.values()) == sum(r.draft_tokens for r in got.values()) > 0
    other_seed = generate(pair, "none", 0, 1, False, False, seed=32)
    assert [r.completion_token_ids for r in other_seed.values()] != [r.completion_token_ids for r in plain.values()]


TREES = [("model-identical", 3, "2x3", "auto"), ("model-random", 8, "3x2", "auto"), ("ngram", 1, "2x3", "auto"),
         ("prompt_lookup", 3, "3x3", "auto"),
         # the static path's packed tree verify: a lookup's rows their own nodes, a draft model's its whole tree
         ("prompt_lookup", 8, "2x3", "static"), ("model-identical", 3, "3x2", "static")]


@pytest.mark.parametrize("drafter,batch_size,tree,compile", TREES, ids=[f"{d}-{t}-{c}" for d, _, t, c in TREES])
def test_seeded_output_with_trees_is_plain_decodings(llama_pair, drafter, batch_size, tree, compile):
    """Coupled sampling with tree drafts: the child equal to the target's own draw is followed, so the
    text is still plain decoding's for the seed."""
    plain = generate(llama_pair, "none", 0, 1, False, False)
    got = generate(llama_pair, drafter, 4, batch_size, False, False, compile=compile, tree=tree)
    assert {i: r.completion_token_ids for i, r in got.items()} == {i: r.completion_token_ids for i, r in plain.items()}
    if drafter == "model-identical":
        assert sum(r.accepted_tokens for r in got.values()) > len(PROMPTS) * 3


def test_rejection_mode_depends_on_the_drafts(llama_pair):
    """The documented contrast: Leviathan's rejection sampling spends its noise on the drafts' verdicts."""
    plain = generate(llama_pair, "none", 0, 1, False, False, verify="rejection")
    drafted = generate(llama_pair, "model-random", 4, 3, False, False, verify="rejection")
    assert [r.completion_token_ids for r in plain.values()] != [r.completion_token_ids for r in drafted.values()]


def test_adaptive_is_on_by_default_where_it_cannot_change_the_output(llama_pair):
    models = batchspec.load_models(str(llama_pair.target), str(llama_pair.draft))
    on = [dict(temperature=0.0), dict(temperature=0.8), dict(temperature=0.8, verify="coupled")]
    for kw in on:
        assert batchspec.build_generator(models, drafter="model", **kw).adaptive is not None, kw
    assert batchspec.build_generator(models, drafter="model", temperature=0.8, verify="rejection").adaptive is None


def test_demo_pair_sampled_output_ignores_the_drafter():
    demo = ASSETS_DIR / "demo"
    prompts = read_prompts(str(demo / "prompts.parquet"), 6)
    common = dict(ids=[f"d{i}" for i in range(6)], target=str(demo / "target"), draft=str(demo / "draft"),
                  max_new_tokens=24, temperature=0.7, top_p=0.9, seed=5)
    plain = batchspec.generate(prompts, drafter="none", batch_size=1, **common)
    for drafter, k, batch_size, adaptive in [("model", 4, 3, None), ("model", 2, 6, False), ("ngram", 4, 6, None),
                                             ("prompt_lookup", 3, 2, True)]:
        got = batchspec.generate(prompts, drafter=drafter, k=k, batch_size=batch_size, adaptive=adaptive, **common)
        assert [r.completion_token_ids for r in got] == [r.completion_token_ids for r in plain], (drafter, k)
        if drafter == "model" and adaptive is False:  # the trained draft guesses the target's sampled tokens often
            # (at fixed k: adaptive's drafts depend on the machine's timing, and under load a job drafted 7 of them)
            assert sum(r.accepted_tokens for r in got) / sum(r.draft_tokens for r in got) > 0.4


def test_job_output_ignores_drafter_shards_and_a_resume(tmp_path, tiny_models, monkeypatch, drafting_priced_cheap):
    """Through the job runner: plain decoding in one run; the model drafter in two shards; the n-gram
    drafter in a run cut short by source.limit and then resumed. Every row is the same. Start-up costs pinned
    (conftest), as in the test above: the check that the shards drafted must not hang on the machine's load."""
    pq.write_table(pa.table({"text": PROMPTS}), tmp_path / "in.parquet")
    sampling = {"temperature": 0.9, "top_p": 0.95, "seed": 3, "max_new_tokens": 16}
    write_job(tmp_path, "cs", tiny_job(tiny_models, {"path": "in.parquet", "prompt_column": "text"},
                                       sampling=sampling, drafter={"adaptive": None}))
    assert run_inprocess(tmp_path, "job=cs", "drafter=none", "output.dir=plain", monkeypatch=monkeypatch) == 0
    for index in (0, 1):
        assert run_inprocess(tmp_path, "job=cs", "drafter=model", "drafter.k=3", "output.dir=sharded",
                             f"shard.index={index}", "shard.count=2", monkeypatch=monkeypatch) == 0
    assert run_inprocess(tmp_path, "job=cs", "drafter=ngram", "source.limit=5", "output.dir=resumed",
                         monkeypatch=monkeypatch) == 0
    assert len(read_output(tmp_path / "resumed")) == 5
    assert run_inprocess(tmp_path, "job=cs", "drafter=ngram", "output.dir=resumed", monkeypatch=monkeypatch) == 0

    def texts(out):
        return {r["id"]: r["completion_token_ids"] for r in read_output(tmp_path / out)}

    plain = texts("plain")
    assert len(plain) == len(PROMPTS)
    assert texts("sharded") == plain and texts("resumed") == plain
    assert sum(r["draft_tokens"] for r in read_output(tmp_path / "sharded")) > 0


@pytest.mark.parametrize("drafts, width", [([0, 2, 0, 1], 3), ([1, 0, 0, 0], 2), ([0, 0, 0, 0], 3), ([2, 1, 2, 1], 3)])
def test_a_packed_rounds_noise_is_drawn_where_its_drafts_are_decided(llama_pair, drafts, width):
    """Coupled noise with each row's drafts: positions 0 .. drafts[i] of row i equal the full draw's (a row
    that drafts nothing needs its first position only), so the verdict decides exactly what it decided."""
    from batchspec.engine.round import Plan

    models = batchspec.load_models(str(llama_pair.target))
    generator = batchspec.build_generator(models, temperature=0.7, batch_size=4)
    generator.state.noise_keys.copy_(torch.arange(4) * 7919 + 3)
    rows, lengths = [2, 0, 3, 1], [5, 9, 17, 4]
    plan = Plan(rows=rows, rows_t=torch.tensor(rows), span=None, lengths=lengths, lengths_t=torch.tensor(lengths),
                running=[0, 1, 2, 3], room=[width - 1] * 4, limits=drafts)
    full = generator.acceptor.noise(plan, width)
    got = generator.acceptor.noise(plan, width, drafts)
    assert got.shape == full.shape
    for i, n in enumerate(drafts):
        assert torch.equal(got[i, : n + 1], full[i, : n + 1]), (i, n)
