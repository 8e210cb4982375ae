"""The acceptance rules on hand-built distributions, the noise, and the transforms."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from batchspec.engine.acceptance import sample, verify_greedy, verify_sampling
from batchspec.engine.noise import STREAM_ACCEPT, STREAM_DRAFT, request_key, uniforms
from batchspec.engine.sampling import SamplingParams, apply_repetition_penalty, growing_presence, to_probs

P = torch.tensor([0.5, 0.3, 0.2, 0.0])
Q = torch.tensor([0.2, 0.2, 0.3, 0.3])


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * (a - b).abs().sum().item()


# ---- greedy ------------------------------------------------------------------------------------------

GREEDY_CASES = [
    # name,            target argmax,       drafts,        n, accepted
    ("perfect_match", [[5, 6, 7, 8]], [[5, 6, 7]], [3], 3),
    ("early_mismatch", [[5, 6, 7, 8]], [[4, 6, 7]], [3], 0),
    ("late_mismatch", [[5, 6, 7, 8]], [[5, 6, 1]], [3], 2),
    ("fewer_drafts", [[5, 6, 7, 8]], [[5, 6, 7]], [2], 2),  # the third draft is padding
    ("no_drafts", [[5, 6, 7, 8]], [[5, 6, 7]], [0], 0),
    ("match_after_mismatch_ignored", [[5, 6, 7, 8]], [[5, 0, 7]], [3], 1),
]


@pytest.mark.parametrize("name,argmax,drafts,n,accepted", GREEDY_CASES, ids=[c[0] for c in GREEDY_CASES])
def test_verify_greedy(name, argmax, drafts, n, accepted):
    tokens, num_accepted = verify_greedy(torch.tensor(argmax), torch.tensor(drafts), torch.tensor(n))
    assert num_accepted.tolist() == [accepted]
    assert tokens[0, : accepted + 1].tolist() == argmax[0][: accepted + 1]  # accepted drafts + recovered/bonus


# ---- sampling: deterministic cases -------------------------------------------------------------------


def one_row(p_rows, drafts, n, q_rows=None, u_accept=None, u_resample=None):
    p = torch.stack(p_rows)[None]
    q = torch.stack(q_rows)[None] if q_rows is not None else None
    k = len(drafts)
    u_accept = torch.tensor([u_accept if u_accept is not None else [0.0] * k], dtype=torch.float64)
    u_resample = torch.tensor([u_resample if u_resample is not None else [0.5] * (k + 1)], dtype=torch.float64)
    tokens, m = verify_sampling(p, torch.tensor([drafts]), torch.tensor([n]), q, u_accept, u_resample)
    return tokens[0].tolist(), int(m)


def test_sampling_perfect_match_then_bonus_from_p():
    """q == p: every draft is accepted, then the bonus comes from p at the last position."""
    bonus = torch.tensor([0.0, 0.0, 0.0, 1.0])
    tokens, m = one_row([P, P, bonus], [0, 1], 2, q_rows=[P, P], u_accept=[0.999, 0.999])
    assert m == 2 and tokens == [0, 1, 3]


def test_sampling_early_mismatch_draws_from_residual():
    """A draft with p(x) = 0 is always rejected; the recovered token comes from norm(max(0, p - q))."""
    tokens, m = one_row([P, P, P], [3, 0], 2, q_rows=[Q, Q], u_accept=[0.0, 0.0], u_resample=[0.0, 0.5, 0.5])
    assert m == 0
    residual = (P - Q).clamp_min(0)  # [0.3, 0.1, 0, 0]: u=0 -> the first token with mass
    assert tokens[0] == 0 and residual[tokens[0]] > 0


@pytest.mark.parametrize(
    "u,accepted",
    [(0.0, True), (0.66, True), (0.67, False), (0.99, False)],  # p/q = 0.2/0.3 = 0.667 for token 2
)
def test_sampling_acceptance_threshold_is_p_over_q(u, accepted):
    tokens, m = one_row([P, P], [2], 1, q_rows=[Q], u_accept=[u])
    assert (m == 1) is accepted


def test_sampling_one_hot_q_accepts_with_probability_p_and_removes_x_on_rejection():
    tokens, m = one_row([P, P], [1], 1, u_accept=[0.29])  # p(1) = 0.3
    assert m == 1
    for u in torch.linspace(0, 0.999, 50).tolist():
        tokens, m = one_row([P, P], [1], 1, u_accept=[0.31], u_resample=[u, u])
        assert m == 0 and tokens[0] != 1 and P[tokens[0]] > 0


# ---- sampling: statistics ----------------------------------------------------------------------------

N = 200_000
TV_BOUND = 0.01  # for V = 4 and N = 200k the sampling error of a TV distance is ~0.002


def draw_first_token(p: torch.Tensor, q: torch.Tensor | None, gen: torch.Generator):
    """N independent rows with one draft from q (or from a fixed one-hot proposal) and 2 positions."""
    vocab = p.shape[-1]
    if q is None:
        drafts = torch.full((N, 1), 1)
    else:
        drafts = torch.multinomial(q, N, replacement=True, generator=gen)[:, None]
    p_rows = p.expand(N, 2, vocab)
    q_rows = q.expand(N, 1, vocab) if q is not None else None
    u_accept = torch.rand(N, 1, generator=gen, dtype=torch.float64)
    u_resample = torch.rand(N, 2, generator=gen, dtype=torch.float64)
    tokens, m = verify_sampling(p_rows, drafts, torch.ones(N, dtype=torch.long), q_rows, u_accept, u_resample)
    return tokens[:, 0], m, drafts[:, 0]


@pytest.mark.parametrize("q", [Q, torch.tensor([0.25, 0.25, 0.25, 0.25]), P, None], ids=["q", "uniform", "q=p", "one-hot"])
def test_sampling_emits_target_distribution(q):
    gen = torch.Generator().manual_seed(0)
    first, m, drafts = draw_first_token(P, q, gen)
    empirical = torch.bincount(first, minlength=4).double() / N
    assert tv(empirical, P.double()) < TV_BOUND, empirical
    # acceptance rate: sum_x min(p(x), q(x)) for a full q, p(x) for a one-hot q on x
    expected_rate = torch.minimum(P, q).sum().item() if q is not None else P[1].item()
    assert abs(m.double().mean().item() - expected_rate) < 0.01
    if q is not None:  # per drafted token the acceptance probability is min(1, p/q)
        for x in range(4):
            rows = drafts == x
            if rows.sum() > 1000:
                assert abs(m[rows].double().mean().item() - min(1.0, (P[x] / q[x]).item())) < 0.015


def test_sample_inverse_cdf_distribution_and_zero_mass():
    gen = torch.Generator().manual_seed(1)
    probs = torch.tensor([[0.0, 0.1, 0.0, 0.6, 0.3, 0.0]]).expand(N, 6)
    tokens = sample(probs, torch.rand(N, generator=gen, dtype=torch.float64))
    empirical = torch.bincount(tokens, minlength=6).double() / N
    assert tv(empirical, probs[0].double()) < TV_BOUND
    assert empirical[[0, 2, 5]].sum() == 0  # zero-probability tokens are never drawn
    edges = sample(probs[:3], torch.tensor([0.0, 0.1, 1 - 2**-53], dtype=torch.float64))
    assert edges.tolist() == [1, 3, 4]


# ---- noise -------------------------------------------------------------------------------------------


def test_uniforms_are_deterministic_uniform_and_independent_of_batch():
    keys = torch.tensor([request_key(0, str(i)) for i in range(64)])
    positions = torch.arange(1000)[None, :].expand(64, 1000)
    u = uniforms(keys, positions, STREAM_ACCEPT)
    assert u.min() >= 0 and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.01 and abs(u.var().item() - 1 / 12) < 0.005
    # a row's noise does not depend on which other rows are in the batch, or where
    single = uniforms(keys[7:8], positions[7:8], STREAM_ACCEPT)
    assert torch.equal(single, u[7:8])
    # streams and seeds give different, uncorrelated noise
    other = uniforms(keys, positions, STREAM_DRAFT)
    assert abs(torch.corrcoef(torch.stack([u.flatten(), other.flatten()]))[0, 1].item()) < 0.02
    assert request_key(0, "a") != request_key(1, "a") and request_key(0, "a") == request_key(0, "a")


# ---- transforms --------------------------------------------------------------------------------------


def test_repetition_penalty_matches_transformers():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 50, generator=gen)
    context = torch.randint(0, 50, (3, 12), generator=gen)
    expected = RepetitionPenaltyLogitsProcessor(1.3)(context, logits.clone())
    presence = torch.zeros(3, 50, dtype=torch.bool).scatter_(1, context, True)
    assert torch.allclose(apply_repetition_penalty(logits, presence, 1.3), expected)


def test_growing_presence_adds_one_draft_per_position():
    base = torch.zeros(1, 6, dtype=torch.bool)
    base[0, 5] = True
    presence = growing_presence(base, torch.tensor([[1, 2, 3]]), 4)
    assert presence[0].nonzero().tolist() == [[0, 5], [1, 1], [1, 5], [2, 1], [2, 2], [2, 5], [3, 1], [3, 2], [3, 3], [3, 5]]


@pytest.mark.parametrize(
    "params,kept",
    [
        (SamplingParams(temperature=1.0, top_k=2), 2),
        (SamplingParams(temperature=1.0, top_p=0.5), 1),
        (SamplingParams(temperature=1.0, min_p=0.2), 3),  # keeps p >= 0.2 * 0.55
        (SamplingParams(temperature=0.5), 4),
    ],
)
def test_to_probs_filters(params, kept):
    logits = torch.log(torch.tensor([[0.55, 0.25, 0.15, 0.05]]))
    probs = to_probs(logits, params)
    assert int((probs > 0).sum()) == kept and torch.allclose(probs.sum(), torch.tensor(1.0))


@pytest.mark.parametrize(
    "kwargs", [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(min_p=2), dict(top_k=-1), dict(repetition_penalty=0)]
)
def test_sampling_params_reject_out_of_range(kwargs):
    with pytest.raises(ValueError, match=f"sampling.{next(iter(kwargs))}"):
        SamplingParams(**kwargs)
