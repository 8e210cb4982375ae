"""EAGLE-3's training-time test: the head drafts `steps` tokens from every position of a sequence at once,
each step reading its own previous output, with exactly the attention inference uses.

At inference a chain drafted from position i (after the target verified tokens 0..i+1) runs step 0 at
RoPE position i, step 1 at i+1, ...; the head's cache then holds step-0 keys for positions 0..i (made
from the target's features: the verify pass refreshes them) and the chain's own keys of steps 1..j-1.
So step j of the chain from i attends to step-0 keys at positions <= i and to the keys its own chain
wrote at steps 1..j. Unrolled over all i at once, the keys of step s are stored as block s of the
cache (T keys each) and step j's mask is [causal T x T | identity | ... | identity]: row i sees block 0
up to i and, in every later block, only column i (its own chain). This is SpecForge's `cache_hidden`
attention (sdpa backend: `position_ids + lck`, diagonal scores for the later steps) written as one
mask, so the head's ordinary `forward` runs it through a DynamicCache.

Inputs of step j at row i (as SpecForge's `padding(input_ids, left=False)` per step): the token at
position i+1+j (the target's token: where all earlier drafts were accepted, which is the only case in
which step j matters, the drafted token equals it), and the head's step j-1 output at row i. Step j
at row i predicts the token at position i+2+j; the target's distribution for it is its logits at i+1+j.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from ..eagle.head import EagleHead


def ttt_mask(length: int, step: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """Additive mask [1, 1, T, (step+1)*T] for draft step `step` over T rows (see the module docstring)."""
    blocks = [torch.ones(length, length, dtype=torch.bool, device=device).tril()]
    blocks += [torch.eye(length, dtype=torch.bool, device=device)] * step
    allowed = torch.cat(blocks, dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)[None, None]


def shifted_tokens(input_ids: torch.Tensor, step: int, pad_id: int = 0) -> torch.Tensor:
    """input_ids [b, N] -> [b, N-1]: row i holds the token at position i+1+step (pad_id past the end)."""
    b, n = input_ids.shape
    out = input_ids.new_full((b, n - 1), pad_id)
    out[:, : max(n - 1 - step, 0)] = input_ids[:, 1 + step:]
    return out


def unroll(head: EagleHead, input_ids: torch.Tensor, features: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Draft `steps` tokens from every position of right-padded sequences.

    input_ids [b, N]; features [b, N, 3*Ht] (the target's, at every position). Returns one tensor per
    step, out_j [b, N-1, H]: head.logits(out_j)[:, i] is step j's prediction of the token at i+2+j.
    Padding needs no mask: a real row never attends to a later position, and each step's extra keys
    are the row's own.
    """
    length = input_ids.shape[1] - 1
    positions = torch.arange(length, device=input_ids.device).expand(input_ids.shape[0], length)
    hidden = features[:, :length]
    cache = DynamicCache()
    outs = []
    for j in range(steps):
        mask = ttt_mask(length, j, features.dtype, input_ids.device)
        hidden = head(shifted_tokens(input_ids, j), hidden, positions + j, mask, cache)
        outs.append(hidden)
    return outs


def sees_future(head: EagleHead, input_ids: torch.Tensor, features: torch.Tensor, steps: int) -> float:
    """How much `unroll`'s output at rows before the middle changes when every later position changes
    (tokens and features): 0 where the attention keeps to its mask. Training that sees later positions
    learns from the answers: near-perfect on its data, useless on new rows. Returns the largest change
    relative to the output's scale. input_ids [b, N], features [b, N, 3*Ht]; N > 2 * (steps + 2)."""
    cut = input_ids.shape[1] // 2
    rows = cut - 1 - steps  # rows whose every input (tokens up to row + 1 + steps, keys up to the row) is before cut
    other_ids = input_ids.clone()
    other_ids[:, cut:] = (other_ids[:, cut:] + 1) % head.config.target_vocab_size
    other_features = features.clone()
    other_features[:, cut:] = features[:, cut:].roll(1, dims=0) * 2 + 1
    with torch.no_grad():
        first = unroll(head, input_ids, features, steps)
        second = unroll(head, other_ids, other_features, steps)
    return max(float((a[:, :rows] - b[:, :rows]).abs().max() / a[:, :rows].abs().max().clamp_min(1e-6))
               for a, b in zip(first, second))
