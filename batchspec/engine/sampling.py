"""Pure functions: logits -> probabilities, reproducible noise, and the acceptance rules.

Two ways to verify sampled drafts (`SamplingParams.verify`):
  - coupled (the default): the target's token at sequence position t is argmax_x(s_t(x) + G_t(x)), where
    s_t are its logits after every transform (temperature, top-k, top-p, min-p, repetition penalty) and
    G_t(x) i.i.d. Gumbel noise that is a pure function of (seed, request id, t, x): an exact draw from
    p_t = softmax(s_t) (the Gumbel-max trick), and exactly what plain decoding with that seed emits. A
    draft model proposes argmax(its own s_t + the same G_t); a draft is accepted iff it equals the
    target's token, so verification only decides how many of the target's own tokens a round emits:
    the text depends on (seed, id, prompt) alone, whatever drafted it, with whatever k, batch or order;
  - rejection (Leviathan et al. 2023): accept with probability min(1, p(x)/q(x)), resample from the
    residual; the highest acceptance a draft model can get (sum of min(p, q)), but the randomness it
    consumes depends on the drafts, so the text changes with the drafter and k.

Vocabulary of the acceptance step (as in vLLM's rejection sampler):
  - accepted tokens: the leading drafts the target agrees with (greedy: equal to its argmax;
    sampling: kept with probability min(1, p(x)/q(x)));
  - recovered token: what the target emits at the first rejected position (greedy: its argmax;
    sampling: a draw from norm(max(0, p - q)));
  - bonus token: what the target emits after every draft was accepted (argmax, or a draw from p).
A round therefore emits num_accepted + 1 tokens. Drafters without probabilities (n-gram, prompt
lookup) are a one-hot q: accept x with probability p(x), else draw from p with x removed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

# Noise streams: each decision at a token position draws from its own stream, so they are independent.
STREAM_DRAFT, STREAM_ACCEPT, STREAM_RESAMPLE, STREAM_GUMBEL = 1, 2, 3, 4
VERIFY_MODES = ("coupled", "rejection")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """One job's sampling settings; temperature 0 means greedy (top_k/top_p/min_p are then ignored,
    repetition_penalty still applies, as in Hugging Face `generate`)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int = 0
    verify: str = "coupled"  # how sampled drafts are verified: coupled | rejection (module docstring)

    def __post_init__(self):
        checks = {
            "verify": self.verify in VERIFY_MODES,
            "temperature": self.temperature >= 0,
            "top_k": self.top_k >= 0,
            "top_p": 0 < self.top_p <= 1,
            "min_p": 0 <= self.min_p <= 1,
            "repetition_penalty": self.repetition_penalty > 0,
        }
        for key, ok in checks.items():
            if not ok:
                raise ValueError(f"sampling.{key}={getattr(self, key)!r} is out of range")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def coupled(self) -> bool:
        """Sampled tokens are argmax(s + G): drafts are checked by equality, as under greedy decoding."""
        return not self.greedy and self.verify == "coupled"


def apply_repetition_penalty(logits: torch.Tensor, presence: torch.Tensor, penalty: float) -> torch.Tensor:
    """logits [..., V], presence [..., V] bool (token already in the context) -> penalized logits.

    Same rule as transformers' RepetitionPenaltyLogitsProcessor (divide positive scores, multiply
    negative ones), written over a presence mask because each verify position has its own context
    (the prompt, the output so far, and the drafts before it).
    """
    penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(presence, penalized, logits)


def warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [N, V] -> warped logits [N, V] (filtered entries -inf), in transformers' order and code."""
    if params.temperature != 1.0:
        logits = TemperatureLogitsWarper(params.temperature)(None, logits)
    if params.top_k:
        logits = TopKLogitsWarper(top_k=params.top_k)(None, logits)
    if params.top_p < 1.0:
        logits = TopPLogitsWarper(top_p=params.top_p)(None, logits)
    if params.min_p > 0.0:
        logits = MinPLogitsWarper(min_p=params.min_p)(None, logits)
    return logits


def to_probs(logits: torch.Tensor, params: SamplingParams, presence: torch.Tensor | None = None) -> torch.Tensor:
    """logits [..., V] -> the sampling distribution [..., V] (float32) after every transform."""
    shape = logits.shape
    logits = logits.float()
    if presence is not None and params.repetition_penalty != 1.0:
        logits = apply_repetition_penalty(logits, presence, params.repetition_penalty)
    logits = warp(logits.reshape(-1, shape[-1]), params)
    return torch.softmax(logits, dim=-1).reshape(shape)


def scores(logits: torch.Tensor, params: SamplingParams, presence: torch.Tensor | None = None) -> torch.Tensor:
    """logits [..., V] -> s [..., V] (float32) with softmax(s) = to_probs(logits): filtered tokens -inf.
    Greedy decoding has no sampling transforms: s is the logits after the repetition penalty."""
    shape = logits.shape
    logits = logits.float()
    if presence is not None and params.repetition_penalty != 1.0:
        logits = apply_repetition_penalty(logits, presence, params.repetition_penalty)
    if params.greedy:
        return logits
    return warp(logits.reshape(-1, shape[-1]), params).reshape(shape)


def coupled_tokens(logits: torch.Tensor, params: SamplingParams, presence: torch.Tensor | None,
                   gumbel: torch.Tensor | None) -> torch.Tensor:
    """logits [..., V], gumbel [..., V] (noise for the positions these logits decide) -> tokens [...]:
    argmax(s + G), an exact draw from p = softmax(s) (Gumbel-max); the plain argmax when greedy."""
    if params.greedy:
        return greedy_tokens(logits, params, presence)
    return (scores(logits, params, presence) + gumbel).argmax(dim=-1)


def greedy_tokens(logits: torch.Tensor, params: SamplingParams, presence: torch.Tensor | None = None) -> torch.Tensor:
    """logits [..., V] -> argmax [...] after the repetition penalty (the only transform that can move it)."""
    if presence is not None and params.repetition_penalty != 1.0:
        logits = apply_repetition_penalty(logits, presence, params.repetition_penalty)
    return logits.argmax(dim=-1)


def growing_presence(base: torch.Tensor, drafts: torch.Tensor, num_positions: int) -> torch.Tensor:
    """Context presence for each verify position: base [b, V] | drafts[:, :t] for t in 0..num_positions-1.

    drafts [b, K] -> [b, num_positions, V] bool. Padding drafts only reach positions that are never used.
    """
    b, vocab = base.shape
    seen = torch.zeros(b, num_positions, vocab, dtype=torch.int32, device=base.device)
    k = min(drafts.shape[1], num_positions - 1)
    if k > 0:
        onehot = torch.zeros(b, k, vocab, dtype=torch.int32, device=base.device)
        onehot.scatter_(2, drafts[:, :k, None].clamp(0, vocab - 1), 1)
        seen[:, 1 : k + 1] = onehot.cumsum(dim=1)
    return base[:, None, :] | (seen > 0)


# ---- reproducible noise: a pure function of (seed, request id, token position, stream) --------------

_MASK64 = (1 << 64) - 1


def _signed(x: int) -> int:
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


_C1, _C2, _GOLDEN = _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB), _signed(0x9E3779B97F4A7C15)


def request_key(seed: int, request_id: str) -> int:
    """A 63-bit key for a request's noise; the same (seed, id) gives the same key on every machine."""
    digest = hashlib.blake2b(f"{seed}\x00{request_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _shift_right(z: torch.Tensor, s: int) -> torch.Tensor:
    return (z >> s) & ((1 << (64 - s)) - 1)  # logical shift on int64


def _mix64(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finalizer on int64 tensors (wrap-around multiplication)."""
    z = (z ^ _shift_right(z, 30)) * _C1
    z = (z ^ _shift_right(z, 27)) * _C2
    return z ^ _shift_right(z, 31)


def uniforms(keys: torch.Tensor, positions: torch.Tensor, stream: int) -> torch.Tensor:
    """Counter-based U[0, 1): keys [b] int64, positions [b, ...] int64 -> float64 [b, ...].

    Depends only on (key, position, stream) — never on batch size, slot or neighbours — which is
    what makes seeded sampling reproducible across batch sizes, orderings and resumes.
    """
    return _shift_right(uniforms_bits(keys, positions, stream), 11).double() * (1.0 / (1 << 53))


def _hash32(h: torch.Tensor) -> torch.Tensor:
    """lowbias32 (C. Wellons), a 32-bit integer hash, on int32 tensors (wrap-around multiplication,
    logical shifts by masking): one cheap elementwise pass per step, over a whole [b, T, V] block."""
    h = h ^ ((h >> 16) & 0xFFFF)
    h = h * 0x7FEB352D
    h = h ^ ((h >> 15) & 0x1FFFF)
    h = h * -0x7B935975  # 0x846CA68B as a signed 32-bit constant
    return h ^ ((h >> 16) & 0xFFFF)


def _to_int32(x: torch.Tensor) -> torch.Tensor:
    """The low 32 bits of int64 values, as int32 (two's complement)."""
    low = x & 0xFFFFFFFF
    return torch.where(low >= 1 << 31, low - (1 << 32), low).to(torch.int32)


def gumbel_noise(keys: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """Counter-based Gumbel(0, 1) noise: keys [b] int64, positions [b, T] -> float32 [b, T, vocab].

    G[i, t, x] depends only on (keys[i], positions[i, t], x): a 64-bit mix of (key, position, stream) per
    position, then a 32-bit hash per token id keyed by those 64 bits, all elementwise on the device (no
    host sync, no loop over rows), so a token's noise never depends on the batch, the slot, k or the
    width of the pass. G = -log(E), E = -log(u) with u = (h + 1/2) / 2^32 strictly inside (0, 1); E is
    computed from u below 1/2 and from 1 - u above it, so float32 keeps every one of the 32 bits.
    """
    bits = uniforms_bits(keys, positions, STREAM_GUMBEL)[..., None]  # [b, T, 1] int64
    low, high = _to_int32(bits), _to_int32(_shift_right(bits, 32))
    ids = torch.arange(vocab, device=keys.device, dtype=torch.int32)
    # Distinct token ids give distinct hash inputs within a position (the multiplier is odd).
    h = _hash32((low + ids * -0x61C88647) ^ high)  # 0x9E3779B9 as a signed 32-bit constant
    # u = (h_unsigned + 1/2) / 2^32 = c + (1 if h < 0 else 0), c = h_signed / 2^32 + 2^-33 in (-1/2, 1/2).
    # -log(u) is -log(c) below 1/2 and -log1p(c) above; each element takes one term, the other is 0
    # (never a log of a negative number: that alone made the pass 10x slower on CPU).
    c = h.float() * 2.0 ** -32 + 2.0 ** -33
    negative = h < 0
    exponential = torch.log(c.masked_fill(negative, 1.0)).add_(torch.log1p(c.masked_fill_(~negative, 0.0)))
    return exponential.neg_().log_().neg_()


def uniforms_bits(keys: torch.Tensor, positions: torch.Tensor, stream: int) -> torch.Tensor:
    """The 64 random bits behind `uniforms`, as int64 [b, ...]."""
    keys = keys.reshape(-1, *([1] * (positions.dim() - 1)))
    z = _mix64(keys + _signed(stream * _GOLDEN))
    return _mix64(z + positions * _GOLDEN)


def sample(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: probs [N, V] (unnormalized ok), u [N] in [0, 1) -> tokens [N].

    Never returns a zero-probability token: with right=True the search lands on the first index whose
    cumulative mass exceeds u * total, and a zero entry does not raise the cumulative mass.
    """
    cdf = probs.double().cumsum(dim=-1)
    target = (u.double() * cdf[:, -1])[:, None]
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)


# ---- acceptance --------------------------------------------------------------------------------------


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
