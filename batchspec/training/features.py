"""What an EAGLE-3 head reads from its target: hidden states of three layers, and (for training) the
input of the target's LM head, from which the target's next-token distribution is recomputed."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..eagle.config import HeadError


@dataclass
class TargetStates:
    """One target forward over right-padded sequences.

    features [b, N, 3*Ht]: hidden_states[i] for i in the head's target_layer_ids, concatenated.
    final [b, N, Ht]: the LM head's input (hidden_states[-1]); target logits = lm_head(final).
    """

    features: torch.Tensor
    final: torch.Tensor


def concat_layers(hidden_states, layer_ids) -> torch.Tensor:
    """HF `output_hidden_states` tuple (index i = input of decoder layer i) -> [b, N, 3*Ht]."""
    return torch.cat([hidden_states[i] for i in layer_ids], dim=-1)


@torch.no_grad()  # not inference_mode: training saves these tensors for backward
def target_states(target, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, layer_ids) -> TargetStates:
    """Run the target once with `output_hidden_states=True`. input_ids, attention_mask [b, N] (right padding)."""
    out = target(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, logits_to_keep=1)
    hs = out.hidden_states
    # The LM head must read hidden_states[-1] unchanged (no soft-capping or scaling of the logits),
    # or the distributions recomputed from it would not be the target's.
    recomputed = target_logits(target, hs[-1][:, -1:]).float()
    if not torch.allclose(recomputed, out.logits[:, -1:].float(), atol=1e-3, rtol=1e-3):
        raise HeadError(f"{type(target).__name__}: its logits are not lm_head(last hidden state); "
                        "the trainer cannot recompute the target's distribution")
    return TargetStates(concat_layers(hs, layer_ids), hs[-1])


def target_logits(target, final: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """final [..., Ht] -> the target's logits [..., V] (or only the vocabulary rows `rows`, a bool mask [V])."""
    head = target.get_output_embeddings()
    weight, bias = head.weight, getattr(head, "bias", None)
    if rows is not None:
        weight = weight[: len(rows)][rows]
        bias = None if bias is None else bias[: len(rows)][rows]
    return torch.nn.functional.linear(final.to(weight.dtype), weight, bias)


def pad_batch(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [b, N] and attention mask [b, N] (1 = real token)."""
    width = max(map(len, sequences))
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
    return ids, mask


def sequence_states(target, sequences: list[list[int]], layer_ids, *, batch_size: int = 16, pad_id: int = 0,
                    dtype: torch.dtype | None = None, progress=None) -> list[tuple[torch.Tensor, ...]]:
    """(features [n, 3*Ht], final [n, Ht], greedy [n]) for each sequence, kept on the CPU (the first two
    in `dtype`); greedy[p] is the target's greedy token after position p (its logits' argmax).

    Sequences are batched in length order (less padding), results returned in input order.
    """
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    out: list = [None] * len(sequences)
    device = target.device
    for start in range(0, len(order), batch_size):
        rows = order[start: start + batch_size]
        ids, mask = pad_batch([sequences[i] for i in rows], pad_id)
        states = target_states(target, ids.to(device), mask.to(device), layer_ids)
        with torch.no_grad():
            greedy = target_logits(target, states.final).argmax(-1)
        for r, i in enumerate(rows):
            n = len(sequences[i])
            out[i] = (states.features[r, :n].to("cpu", dtype), states.final[r, :n].to("cpu", dtype),
                      greedy[r, :n].cpu())
        if progress is not None:
            progress(len(rows))
    return out


def recorded_states(target, samples, recorded: list[torch.Tensor], *, greedy_data: bool, prompt_labels: bool = True,
                    batch_size: int = 16, progress=None) -> list[tuple[torch.Tensor, ...]]:
    """What `sequence_states` gives, from the states the generating forwards recorded (record.py): per sample
    recorded [n - 1, 4 * Ht] (the head's three layers, then the LM head's input) of positions 0 .. n - 2 ->
    (features [n - 1, 3*Ht], final [n, Ht], greedy [n]); the last position ran no forward, so its final row
    is zeros and its greedy token -1 (no label). greedy[p] is the target's argmax after position p: with
    `greedy_data` (the continuations are the target's greedy ones) the next token of the continuation, else
    and at prompt positions the LM head's argmax over `final` (`batch_size` samples at a time); without
    `prompt_labels` prompt positions of greedy data get no label (-1): for training that learns only where
    the target wrote, and for held-out samples, which are scored against their tokens."""
    out = []
    todo: list[tuple[int, int, int]] = []  # (sample, first, last) positions whose argmax must be computed
    for i, (sample, rec) in enumerate(zip(samples, recorded)):
        n, ht = len(sample.ids), rec.shape[1] // 4
        final = torch.cat([rec[:, 3 * ht:], rec.new_zeros(1, ht)])
        greedy = torch.full((n,), -1, dtype=torch.long)
        start = sample.prompt_len - 1 if greedy_data else 0
        greedy[start: n - 1] = torch.tensor(sample.ids[start + 1:])
        if (start > 0 and prompt_labels) or not greedy_data:
            todo.append((i, 0, start if greedy_data else n - 1))
        out.append((rec[:, : 3 * ht], final, greedy))
    head = target.get_output_embeddings()
    weight, bias = head.weight, getattr(head, "bias", None)
    with torch.no_grad():
        for first in range(0, len(todo), batch_size):
            part = todo[first: first + batch_size]
            rows = torch.cat([out[i][1][a:b] for i, a, b in part]).to(weight.device, weight.dtype)
            tokens = torch.nn.functional.linear(rows, weight, bias).argmax(-1).cpu()
            at = 0
            for i, a, b in part:
                out[i][2][a:b] = tokens[at: at + b - a]
                at += b - a
            if progress is not None:
                progress(len(part))
    return out


def noisy(features: torch.Tensor, share: float, layers: int, generator: torch.Generator) -> torch.Tensor:
    """features [b, N, layers*Ht] plus uniform noise in +- share x each layer's RMS at the position (EAGLE-1
    adds uniform noise to the target's features: at inference the head reads states a little off the ones it
    trained on, and a head that learns its data by heart is pushed to use what generalises). Relative to the
    RMS because residual streams are tens in size on one target and ones on another."""
    b, n, width = features.shape
    per_layer = features.float().view(b, n, layers, width // layers)
    rms = per_layer.pow(2).mean(-1, keepdim=True).sqrt()
    noise = torch.rand(per_layer.shape, generator=generator).to(features.device) * 2 - 1
    return (per_layer + share * rms * noise).view(b, n, width).to(features.dtype)
