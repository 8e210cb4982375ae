"""How well a head drafts for its target: greedy chain drafting replayed on held-out continuations, the
cost of a head step next to a target step, and the speedup those predict.

Replay: the target wrote each held-out continuation greedily. With greedy verification a chain of k
drafts from position i keeps its leading drafts that equal the target's tokens, so the accepted length
is the run of leading matches of the head's chain (step j at row i predicts the token at i+2+j; the
training-time-test unroll computes every chain at once with the attention inference uses, with the
target's features teacher-forced and the head's own hidden states for later steps). Decoding then
replays as the engine runs it: the prefill emits the first token, every round drafts min(k, left - 1)
tokens and emits the accepted ones plus the target's own.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from ..engine.model.model_calls import cache_argument
from .features import pad_batch
from ..eagle.head import EagleHead
from .ttt import unroll

BUDGET_S = 6.0  # about the most seconds the summary's step costs take past their untimed forwards


@dataclass
class Acceptance:
    k_max: int
    sequences: int
    chains: int  # chain starts counted for the by-position rates
    cumulative: list[float]  # P(drafts 1..j all accepted), j = 1..k_max (the engine's acceptance_by_position)
    conditional: list[float]  # P(draft j accepted | drafts 1..j-1 accepted)
    tokens_per_forward: dict[int, float] = field(default_factory=dict)  # completion tokens / target forwards (prefill counted)
    tokens_per_round: dict[int, float] = field(default_factory=dict)  # tokens emitted per verify round
    # one standard error of tokens_per_forward over the prompts (the ratio's, from each prompt's tokens and
    # forwards): how far another set of as many prompts may move it (0 with fewer than two prompts)
    tokens_per_forward_se: dict[int, float] = field(default_factory=dict)


def head_matches(head: EagleHead, samples, states, k: int, batch_size: int = 8) -> list[torch.Tensor]:
    """For each sample a bool [n-1, k]: whether step j of the chain drafted from row i predicts the token
    at position i+2+j (False past the end). states: per sample (features [n, 3Ht], final)."""
    out = []
    device = head.fc.weight.device
    with torch.no_grad():
        for start in range(0, len(samples), batch_size):
            part = samples[start: start + batch_size]
            ids, _ = pad_batch([s.ids for s in part], 0)
            feats = torch.nn.utils.rnn.pad_sequence([states[start + r][0] for r in range(len(part))], batch_first=True)
            ids, feats = ids.to(device), feats.to(device, head.fc.weight.dtype)
            steps = [head.to_target_ids(head.logits(o).argmax(-1)) for o in unroll(head, ids, feats, k)]
            for r, s in enumerate(part):
                n = len(s.ids)
                m = torch.zeros(n - 1, k, dtype=torch.bool)
                truth = torch.tensor(s.ids)
                for j, pred in enumerate(steps):
                    rows = max(n - 2 - j, 0)  # row i predicts position i+2+j <= n-1
                    m[:rows, j] = pred[r, :rows].cpu() == truth[2 + j: 2 + j + rows]
                out.append(m)
    return out


def next_token_chains(next_ok: torch.Tensor, k: int) -> torch.Tensor:
    """A token-only draft model's chains: next_ok[q] says whether its greedy token after prefix 0..q is
    the token at q+1; the chain from row i drafts positions i+2.. so M[i, j] = next_ok[i+1+j]."""
    n = len(next_ok) + 1
    m = torch.zeros(n - 1, k, dtype=torch.bool)
    for j in range(k):
        rows = max(n - 2 - j, 0)
        m[:rows, j] = next_ok[1 + j: 1 + j + rows]
    return m


def replay(matches: torch.Tensor, prompt_len: int, new_tokens: int, k: int) -> tuple[int, int]:
    """(target forwards, rounds) to emit `new_tokens` greedy tokens drafting chains of k."""
    emitted, forwards, rounds = 1, 1, 0  # the prefill forward emits the first token
    while emitted < new_tokens:
        row = prompt_len + emitted - 2  # its features are the last verified position's
        width = min(k, new_tokens - emitted - 1)
        accepted = 0
        while accepted < width and bool(matches[row, accepted]):
            accepted += 1
        emitted += accepted + 1
        forwards += 1
        rounds += 1
    return forwards, rounds


def acceptance(matches: list[torch.Tensor], samples, k_max: int = 5) -> Acceptance:
    """By-position rates over every chain start in the continuations, and replayed tokens per forward."""
    room, reached, accepted, chains = [0] * k_max, [0] * k_max, [0] * k_max, 0
    for m, s in zip(matches, samples):
        for row in range(s.prompt_len - 1, len(s.ids) - 2):
            chains += 1
            depth = min(k_max, len(s.ids) - 2 - row)  # drafts that still have a token to check against
            kept = 0
            while kept < depth and bool(m[row, kept]):
                kept += 1
            for j in range(depth):
                room[j] += 1
                reached[j] += j <= kept
                accepted[j] += j < kept
    cumulative = [a / n if n else 0.0 for a, n in zip(accepted, room)]
    conditional = [a / n if n else 0.0 for a, n in zip(accepted, reached)]
    result = Acceptance(k_max, len(samples), chains, cumulative, conditional)
    written = [(m, s) for m, s in zip(matches, samples) if s.new_tokens > 0]
    tokens = sum(s.new_tokens for _, s in written)
    for k in range(1, k_max + 1):
        runs = [replay(m, s.prompt_len, s.new_tokens, k) for m, s in written]
        forwards, rounds = sum(r[0] for r in runs), sum(r[1] for r in runs)
        result.tokens_per_forward[k] = tokens / forwards if forwards else 1.0
        result.tokens_per_round[k] = (tokens - len(runs)) / rounds if rounds else 1.0
        result.tokens_per_forward_se[k] = ratio_standard_error([(s.new_tokens, r[0]) for (_, s), r in zip(written, runs)])
    return result


def ratio_standard_error(pairs: list[tuple[int, int]]) -> float:
    """One standard error of sum(t) / sum(f) over n (t, f) pairs drawn at random (the delta method: the
    residuals t - R f around the ratio R, scaled by the mean f); 0 for fewer than two pairs."""
    n = len(pairs)
    if n < 2:
        return 0.0
    ratio = sum(t for t, _ in pairs) / max(sum(f for _, f in pairs), 1)
    mean_f = sum(f for _, f in pairs) / n
    residual = sum((t - ratio * f) ** 2 for t, f in pairs) / (n - 1)
    return (residual / n) ** 0.5 / max(mean_f, 1e-12)


@dataclass
class StepCosts:
    batch: int
    context: int
    target_ms: list[float]  # one target forward of 1, 2, ..., k_max+1 tokens per row
    head_first_ms: list[float]  # the head's first step over 1..k_max+1 new tokens (reads target features)
    head_step_ms: float  # one later draft step (1 token per row, the head's own hidden state)

    def round_ms(self, k: int) -> float:
        """A round of k drafts: the head over the (up to k+1) verified tokens, k-1 more steps, the verify."""
        return self.head_first_ms[k] + (k - 1) * self.head_step_ms + self.target_ms[k]

    def speedup(self, tokens_per_round: float, k: int) -> float:
        """Predicted tokens/s over plain decoding (one target forward of 1 token per token)."""
        return tokens_per_round * self.target_ms[0] / self.round_ms(k)


def _median_ms(run, reset, repeats: int, budget_s: float = float("inf")) -> float:
    """Median milliseconds of run() (reset() after each) over `repeats` timed runs after two untimed ones,
    fewer once the timed runs have taken `budget_s` seconds (at least one)."""
    times = []
    for i in range(repeats + 2):
        t = time.perf_counter()
        run()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        reset()
        if i >= 2 and sum(times[2:]) > budget_s:
            break
    return 1000 * statistics.median(times[2:])


@torch.no_grad()
def measure_costs(target, head: EagleHead, *, batch: int = 8, context: int = 128, k_max: int = 5,
                  repeats: int = 7, budget_s: float = BUDGET_S) -> StepCosts:
    """Median forward times with `context` tokens cached (DynamicCache for both, eager): up to `repeats` timed
    forwards a point, fewer where the points' share of `budget_s` runs out (7 repeats of the 13 points took 23 s
    of a 40 s smoke run on SmolLM2 at batch 8, whatever the training budget)."""
    device, c = target.device, head.config
    per_point = budget_s / (2 * (k_max + 1) + 1)
    ids = torch.randint(3, c.target_vocab_size, (batch, context + k_max + 1), device=device)
    cache = DynamicCache(config=target.config)
    name = cache_argument(target)
    target(input_ids=ids[:, :context], **{name: cache}, use_cache=True)
    target_ms = []
    for width in range(1, k_max + 2):
        target_ms.append(_median_ms(
            lambda: target(input_ids=ids[:, context: context + width], **{name: cache}, use_cache=True,
                           logits_to_keep=width, output_hidden_states=True),
            lambda: cache.crop(-width), repeats, per_point))
    dtype = head.fc.weight.dtype
    feats = torch.randn(batch, context + k_max + 1, c.feature_size, device=device, dtype=dtype)
    pos = torch.arange(context + k_max + 1, device=device).expand(batch, -1)
    hcache = DynamicCache()
    head(ids[:, :context], feats[:, :context], pos[:, :context], past_key_values=hcache)

    def head_step(width: int, hidden):
        out = head(ids[:, context: context + width], hidden, pos[:, context: context + width], past_key_values=hcache)
        head.to_target_ids(head.logits(out[:, -1:]).argmax(-1))
    first = [_median_ms(lambda: head_step(w, feats[:, context: context + w]), lambda: hcache.crop(-w), repeats,
                        per_point) for w in range(1, k_max + 2)]
    own = torch.randn(batch, 1, c.hidden_size, device=device, dtype=dtype)
    step = _median_ms(lambda: head_step(1, own), lambda: hcache.crop(-1), repeats, per_point)
    return StepCosts(batch, context, target_ms, first, step)
