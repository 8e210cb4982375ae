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

from dataclasses import dataclass

import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from .types import MIN_TEMPERATURE

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
    varied: bool = False  # requests may set their own temperature, top_k, top_p, min_p (RowParams)

    def __post_init__(self):
        checks = {
            "verify": self.verify in VERIFY_MODES,
            "temperature": self.temperature == 0 or self.temperature >= MIN_TEMPERATURE,  # smaller overflow logits/T
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
        """Every request decodes greedily (no request may set its own temperature)."""
        return self.temperature == 0.0 and not self.varied

    @property
    def adapts_by_default(self) -> bool:
        """Adaptive speculation is on by default where it cannot change the output: greedy decoding and
        coupled sampling (with rejection sampling the noise a token consumes depends on the drafts)."""
        return self.greedy or self.verify == "coupled"

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


def penalized(logits: torch.Tensor, params: SamplingParams, presence: torch.Tensor | None) -> torch.Tensor:
    """logits [..., V] -> float32 logits after the repetition penalty (the only transform greedy decoding has)."""
    logits = logits.float()
    if presence is not None and params.repetition_penalty != 1.0:
        logits = apply_repetition_penalty(logits, presence, params.repetition_penalty)
    return logits


@dataclass(slots=True)
class RowSampling:
    """Each row's sampling transforms on the device, [b] each (static shapes: a filter that is off is a
    value that removes nothing). A greedy row has temperature 1 and every filter off, so its scores are its
    logits; `greedy` marks it for the choice of token."""

    temperature: torch.Tensor  # float32
    top_k: torch.Tensor  # int64, 0: off
    top_p_cut: torch.Tensor  # float32 1 - top_p, computed in float64 as transformers does; 0: off
    min_p: torch.Tensor  # float32, 0: off
    greedy: torch.Tensor  # bool

    FIELDS = ("temperature", "top_k", "top_p_cut", "min_p", "greedy")

    @staticmethod
    def values(temperature: float, top_k: int, top_p: float, min_p: float) -> tuple:
        """Host values of one row, in FIELDS order."""
        greedy = temperature == 0.0
        if greedy:
            return 1.0, 0, 0.0, 0.0, True
        return temperature, top_k, 1.0 - top_p, min_p, False

    @classmethod
    def zeros(cls, n: int, device: torch.device) -> "RowSampling":
        f32 = dict(dtype=torch.float32, device=device)
        return cls(torch.ones(n, **f32), torch.zeros(n, dtype=torch.long, device=device), torch.zeros(n, **f32),
                   torch.zeros(n, **f32), torch.ones(n, dtype=torch.bool, device=device))

    def __getitem__(self, rows) -> "RowSampling":
        return RowSampling(*(getattr(self, f)[rows] for f in self.FIELDS))


def row_transforms(params: SamplingParams, table: RowSampling, rows) -> RowSampling | None:
    """The rows' own transforms from the slots' table where requests may set their own (params.varied), else
    None: every row samples as the job does, and scores() applies only the job's transforms that are on.
    The per-row path sorts the vocabulary twice for filters that may be off in every row: 158 ms against
    0.9 ms for [8, 5, 49,152] scores at temperature 0.7 on 2 CPU cores, the same scores bit for bit."""
    return table[rows] if params.varied else None


def warp_rows(s: torch.Tensor, rows: RowSampling) -> torch.Tensor:
    """s [b, ..., V] float32 -> s after each row's temperature, top-k, top-p and min-p (filtered: -inf):
    transformers' warpers, in their order and arithmetic, with a value per row."""
    shape = (-1,) + (1,) * (s.dim() - 1)
    s = s / rows.temperature.view(shape)
    vocab = s.shape[-1]
    k = rows.top_k.clamp(max=vocab).view(shape)
    ordered = s.sort(dim=-1, descending=True).values
    kth = ordered.gather(-1, (k - 1).clamp(min=0).expand(*s.shape[:-1], 1))
    s = s.masked_fill((k > 0) & (s < kth), float("-inf"))
    ascending, index = s.sort(dim=-1)
    cut = rows.top_p_cut.view(shape)
    remove = (ascending.softmax(dim=-1).cumsum(dim=-1) <= cut) & (cut > 0)
    remove[..., -1] = False  # transformers keeps at least one token
    s = s.masked_fill(remove.scatter(-1, index, remove), float("-inf"))
    probs = s.softmax(dim=-1)
    min_p = rows.min_p.view(shape)
    return s.masked_fill((min_p > 0) & (probs < min_p * probs.amax(dim=-1, keepdim=True)), float("-inf"))


def scores(logits: torch.Tensor, params: SamplingParams, presence: torch.Tensor | None = None,
           rows: RowSampling | None = None) -> torch.Tensor:
    """logits [..., V] -> s [..., V] (float32) with softmax(s) = to_probs(logits): filtered tokens -inf.
    Greedy decoding has no sampling transforms: s is the logits after the repetition penalty. rows: each
    row's transforms (its leading dimension is the rows'); None: the job's, through transformers' warpers."""
    shape = logits.shape
    logits = penalized(logits, params, presence)
    if rows is not None:
        return warp_rows(logits, rows)
    if params.greedy:
        return logits
    return warp(logits.reshape(-1, shape[-1]), params).reshape(shape)


def to_probs(logits: torch.Tensor, params: SamplingParams, presence: torch.Tensor | None = None,
             rows: RowSampling | None = None) -> torch.Tensor:
    """logits [..., V] -> the sampling distribution [..., V] (float32) after every transform."""
    return probs_of(scores(logits, params, presence, rows), rows)


def probs_of(s: torch.Tensor, rows: RowSampling | None) -> torch.Tensor:
    """Scores [b, ..., V] -> softmax(s); with rows, a greedy row's is one-hot at its argmax (rejection
    sampling against it accepts exactly what greedy decoding emits)."""
    probs = torch.softmax(s, dim=-1)
    if rows is None:
        return probs
    onehot = torch.nn.functional.one_hot(s.argmax(dim=-1), s.shape[-1]).to(probs.dtype)
    return torch.where(rows.greedy.view((-1,) + (1,) * (s.dim() - 1)), onehot, probs)


def coupled_tokens(logits: torch.Tensor, params: SamplingParams, presence: torch.Tensor | None,
                   gumbel: torch.Tensor | None, rows: RowSampling | None = None) -> torch.Tensor:
    """logits [..., V], gumbel [..., V] (noise for the positions these logits decide) -> tokens [...]:
    argmax(s + G), an exact draw from p = softmax(s) (Gumbel-max); the plain argmax when greedy (the
    job's, or a row's)."""
    if rows is None and params.greedy:
        return greedy_tokens(logits, params, presence)
    return choose(scores(logits, params, presence, rows), gumbel, rows)


def choose(s: torch.Tensor, gumbel: torch.Tensor | None, rows: RowSampling | None) -> torch.Tensor:
    """Scores [b, ..., V] -> argmax(s + G) [b, ...], a greedy row's argmax(s) (no noise: all greedy)."""
    if gumbel is None:
        return s.argmax(dim=-1)
    if rows is not None:
        gumbel = gumbel.masked_fill(rows.greedy.view((-1,) + (1,) * (s.dim() - 1)), 0.0)
    return (s + gumbel).argmax(dim=-1)


def logprobs_at(s: torch.Tensor, tokens: torch.Tensor, k: int) -> torch.Tensor:
    """Scores s [b, E, V] and the tokens chosen from them [b, E] -> [b, E, 1 + 2k] float32: each token's
    log-probability under softmax(s), then the k best log-probabilities and their token ids (as floats:
    exact below 2^24), best first. Filtered tokens have -inf."""
    lp = torch.log_softmax(s, dim=-1)
    chosen = lp.gather(-1, tokens[..., None])
    top = lp.topk(k, dim=-1)
    return torch.cat([chosen, top.values, top.indices.float()], dim=-1)


def greedy_tokens(logits: torch.Tensor, params: SamplingParams, presence: torch.Tensor | None = None) -> torch.Tensor:
    """logits [..., V] -> argmax [...] after the repetition penalty (the only transform that can move it)."""
    return penalized(logits, params, presence).argmax(dim=-1)


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
