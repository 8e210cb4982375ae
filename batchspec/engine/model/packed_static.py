"""Packed verify forwards on the static path (captured on a GPU): each slot's own tokens, flattened to n.

The eager path packs each round from host specs (packed.py). A captured step needs fixed shapes and
reads everything from the device, so the static packed verify is one step per (n, attended-length
bucket) for chains, and one per (n, bucket) for each tree width, n the round's tokens rounded up to a
bucket (`shapes.token_buckets`). The host writes which slot each of the n tokens belongs to and its
offset t in that slot's row into a layout buffer (one copy per round, no sync); in the step
(StaticSteps.verify_packed, static_steps.py):

  - token (s, t) is slot s's pending token for t = 0 and its t-th draft (or tree node) after, at cache
    index lengths[s] + t and position lengths[s] + t (a tree node: lengths[s] + its depth): a row
    computes only the tokens it verifies (a tree row its nodes, its first node slots) and an idle slot
    none; the bucket's padding tokens write into the scratch slot;
  - projections, MLP and LM head run over the n tokens;
  - attention (`StaticLayout.attention`) scatters the n queries into a per-slot grid [slots + 1, W, H, D]
    (W the widest chain verify, or the tree's width; the extra row takes the padding), attends over each
    slot's cache with the mask from `lengths` (causal, or a tree's: the prefix and the node's ancestors),
    and gathers the outputs back. Attention is the one part computed at the grid's width: on a GPU at
    decode it reads each slot's cache, which costs the same whatever W.

The logits land in an [n, V] buffer; a second, small step per verify width gathers each slot's W
positions (its last repeated past its own width) into the runner's [slots, W, V] output, which
acceptance and everything after it read as on the unpacked static path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kv_cache import attend


@dataclass(frozen=True, slots=True)
class StaticLayout:
    """A static packed forward's tokens, on the device: slots [n] the cache slot each is written to (padding:
    the scratch slot, which is also the grid's extra row), t [n] its offset in its row, index [n] its cache
    index; mask [S, 1, W, kv_len] additive (S slots, W the grid's width), kv_len the entries attended."""

    slots: torch.Tensor
    t: torch.Tensor
    index: torch.Tensor
    mask: torch.Tensor
    kv_len: int
    windowed_mask: torch.Tensor | None = None  # a sliding-window layer's (None: the model has none)

    def attention(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float | None,
                  windowed: bool = False, softcap: float | None = None,
                  sinks: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        """query [1, H, n, D]; key/value the whole layer cache [S + 1, H_kv, capacity, D] -> ([1, n, H, D], None).
        windowed: the layer keeps to the model's sliding window; softcap, sinks: as kv_cache.attend."""
        q = query[0].transpose(0, 1)  # [n, H, D]
        num_slots, _, width, _ = self.mask.shape
        grid = q.new_zeros(num_slots + 1, width, q.shape[1], q.shape[2])
        grid[self.slots, self.t] = q  # padding tokens all land in the extra row (any of them wins: unused)
        mask = self.windowed_mask if windowed and self.windowed_mask is not None else self.mask
        out = attend(grid[:num_slots], key[:num_slots, :, : self.kv_len], value[:num_slots, :, : self.kv_len],
                     mask, scaling, softcap=softcap, sinks=sinks)  # [S, W, H, D]
        return out[self.slots.clamp(max=num_slots - 1), self.t][None], None


def host_layout(widths: list[int], width: int, n: int, scratch: int) -> tuple[list[list[int]], list[list[int]]]:
    """widths[s]: the tokens slot s verifies (0: none), width: the round's verify width, n: the bucket ->
    ([slots, t] of the n tokens, padding at the end in the scratch slot; table [S][width]: each slot's
    verify positions as indices into the n tokens, its last repeated past its own width, 0 for a slot with
    none)."""
    slots, offsets, table = [], [], []
    for s, w in enumerate(widths):
        first = len(slots)
        slots += [s] * w
        offsets += range(w)
        table.append([first + min(j, w - 1) if w else 0 for j in range(width)])
    pad = n - len(slots)
    return [slots + [scratch] * pad, offsets + [0] * pad], table
