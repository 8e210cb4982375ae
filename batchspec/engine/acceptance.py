"""The acceptance rules, pure functions (the vocabulary of sampling.py's docstring): exact-match acceptance
(greedy decoding and coupled sampling), Leviathan's speculative sampling, and the inverse-CDF draw both
use."""

from __future__ import annotations

import torch


def sample(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: probs [N, V] (unnormalized ok), u [N] in [0, 1) -> tokens [N].

    Never returns a zero-probability token: with right=True the search lands on the first index whose
    cumulative mass exceeds u * total, and a zero entry does not raise the cumulative mass.
    """
    cdf = probs.double().cumsum(dim=-1)
    target = (u.double() * cdf[:, -1])[:, None]
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)


def verify_greedy(target_argmax: torch.Tensor, drafts: torch.Tensor, num_drafts: torch.Tensor):
    """Exact-match acceptance.

    target_argmax [b, T] (the target's token after each of the T inputs), drafts [b, T-1] (padded),
    num_drafts [b] -> (tokens [b, T], num_accepted [b]). The round emits tokens[:, :num_accepted+1]:
    the accepted drafts equal the target's argmax, so the target's row is the output as it stands.
    """
    k = drafts.shape[1]
    valid = torch.arange(k, device=drafts.device)[None, :] < num_drafts[:, None]
    match = (target_argmax[:, :k] == drafts) & valid
    num_accepted = match.int().cumprod(dim=1).sum(dim=1)
    return target_argmax, num_accepted


def verify_sampling(
    p: torch.Tensor,
    drafts: torch.Tensor,
    num_drafts: torch.Tensor,
    q: torch.Tensor | None,
    u_accept: torch.Tensor,
    u_resample: torch.Tensor,
):
    """Lossless speculative sampling (Leviathan et al. 2023, Algorithm 1), vectorized over rows.

    p [b, T, V]: the target's distribution after each input; drafts [b, T-1]; num_drafts [b];
    q [b, T-1, V] the drafter's distribution at each draft position, or None for one-hot q;
    u_accept [b, T-1] and u_resample [b, T] in [0, 1): the noise for each position a recovered or bonus
    token may land on (index num_accepted is used).
    Returns (tokens [b, T], num_accepted [b]); the round emits tokens[:, :num_accepted+1].
    """
    b, t, vocab = p.shape
    k = t - 1
    rows = torch.arange(b, device=p.device)
    valid = torch.arange(k, device=p.device)[None, :] < num_drafts[:, None]
    p_draft = p[:, :k].gather(2, drafts[:, :, None]).squeeze(2)  # [b, K]
    q_draft = q.gather(2, drafts[:, :, None]).squeeze(2) if q is not None else torch.ones_like(p_draft)
    accept = (u_accept < p_draft / q_draft.clamp_min(1e-30)) & valid  # probability min(1, p/q)
    num_accepted = accept.int().cumprod(dim=1).sum(dim=1)

    p_next = p[rows, num_accepted]  # [b, V]: at the first rejection, or after the last draft
    rejected = (num_accepted < num_drafts)[:, None]
    m = num_accepted.clamp(max=max(k - 1, 0))
    if q is not None and k > 0:
        q_next = q[rows, m]
    else:
        q_next = torch.zeros_like(p_next)
        if k > 0:
            q_next[rows, drafts[rows, m]] = 1.0
    residual = (p_next - torch.where(rejected, q_next, torch.zeros_like(q_next))).clamp_min(0)
    # A rejection is only possible when the residual has mass; guard the measure-zero case anyway.
    dist = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_next)
    next_token = sample(dist, u_resample.gather(1, num_accepted[:, None]).squeeze(1))

    tokens = torch.cat([drafts, drafts.new_zeros(b, 1)], dim=1)
    tokens[rows, num_accepted] = next_token
    return tokens, num_accepted
