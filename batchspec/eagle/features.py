"""What an EAGLE-3 head reads from its target: hidden states of three layers, and (for training) the
input of the target's LM head, from which the target's next-token distribution is recomputed."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import HeadError


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
