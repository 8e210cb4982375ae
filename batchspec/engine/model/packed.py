"""Packed forwards: the tokens of many rows flattened into one forward of N tokens.

Each row of a round brings its own tokens: a chunk of its prompt, its pending token, its own drafts (a
tree row its nodes). A packed forward runs all of them as one sequence [1, N], so that projections,
MLP and LM head compute exactly N tokens, never padding, and logits only at the `keep` positions.
Attention is the one place rows must stay apart: each token attends to its own slot's cache up to its
own index (a tree row: its prefix and its ancestors). `packed_attention`, registered with transformers'
AttentionInterface under ATTENTION and switched on for the forward's duration, does that per group of
rows of similar length: it gathers a group's queries into a per-row layout [b, H, T, D], attends over
the rows' cache [b, H, kv, D] (a view when they are consecutive slots) with a mask built once per
forward, through the model's own sdpa or eager attention, and scatters the outputs back to the N tokens.

Why per-row groups and not one block-diagonal mask over every row's keys (Hugging Face continuous
batching's sdpa/eager layout): that computes N x (sum of the rows' lengths) scores, b times the work
of the per-row layout at b rows; `tools/packed_attention.py` measures both.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .kv_cache import attend, causal_mask
from ..tree import tree_mask

ATTENTION = "batchspec_packed"
SHORT = 8  # rows of at most this many tokens (decoding rows) share one group; longer ones group by length
# A group's empty slots between its rows ride along (no queries) up to this many a row, at least 2; more: a gather
# of every layer's keys and values of the group's rows. A hole in a group of decoding rows (at most SHORT tokens)
# costs their few queries' attention, less than a gather of the rows' caches; in a group of prompt chunks it
# costs a whole chunk's padded attention. Measured (docs/benchmarks.md, 2026-12-06, q384 at batch 32): one a row
# took 16 spare slots from 0.95 to 0.995 of drafter none without them, and 1.003 without spare slots.
HOLES_PER_ROW = 0.25
SHORT_HOLES_PER_ROW = 1.0


@dataclass(frozen=True, slots=True)
class RowTokens:
    """One row's part of a packed forward: `count` tokens of slot `slot` written at cache indices
    start .. start + count - 1. A chain's tokens take those indices as positions; a tree row's (tree:
    index into the forward's tree rows) take start + depth and attend by its ancestors."""

    slot: int
    start: int
    count: int
    tree: int | None = None


@dataclass(frozen=True, slots=True)
class AttentionGroup:
    """Rows attended together: rows [b] (slots, or a slice of consecutive slots whose holes have no
    queries), query [b, T] each row's tokens as indices into the N (padding: 0), take [n] the real
    queries' indices into the flattened b x T layout and put [n] their indices into the N, mask
    [b, 1, T, kv_len] additive, kv_len the cache entries attended (a shape, on the host); windowed: the
    mask of a sliding-window layer (None: the model has none)."""

    rows: torch.Tensor | slice
    query: torch.Tensor
    take: torch.Tensor
    put: torch.Tensor
    mask: torch.Tensor
    kv_len: int
    windowed: torch.Tensor | None = None


@dataclass(frozen=True, slots=True)
class PackedBatch:
    """A packed forward: slots [N], index [N] the cache index each token is written at, positions [N]
    its position id, the attention groups, keep [M] the tokens whose logits come back (None: all),
    and on the host the rows in order with each row's first token in the N (`offsets`)."""

    slots: torch.Tensor
    index: torch.Tensor
    positions: torch.Tensor
    groups: tuple[AttentionGroup, ...]
    keep: torch.Tensor | None
    rows: tuple[RowTokens, ...]
    offsets: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        return self.slots.shape[0]


def pack(rows: list[RowTokens], *, device: torch.device, dtype: torch.dtype, keep: list[int] | None = None,
         tree_depth: torch.Tensor | None = None, tree_ancestors: torch.Tensor | None = None,
         window: int | None = None) -> PackedBatch:
    """Host specs of the rows (any order, each slot once) -> a PackedBatch. keep: indices into the N of
    the tokens whose logits come back. A tree row's geometry: tree_depth [t, W] and tree_ancestors
    [t, W, W] of the forward's tree rows (RowTokens.tree indexes them; a row's count is its root and first nodes,
    at most W: a tree's nodes are its first node slots). window: the model's
    sliding window (its windowed layers' masks keep to it)."""
    offsets, n = [], 0
    for row in rows:
        offsets.append(n)
        n += row.count
    slots = [row.slot for row in rows for _ in range(row.count)]
    index = [row.start + t for row in rows for t in range(row.count)]
    tensors = torch.tensor([slots, index], dtype=torch.long).to(device, non_blocking=True)
    positions = tensors[1]
    trees = [i for i, row in enumerate(rows) if row.tree is not None]
    if trees:  # a tree's tokens sit at start + depth (a row's count: its root and first nodes)
        positions = positions.clone()
        width = tree_depth.shape[1]
        # Per token: its index in the N, its entry in tree_depth (flattened) and its row's start, in one copy.
        at = torch.tensor([[offsets[i] + t, rows[i].tree * width + t, rows[i].start]
                           for i in trees for t in range(rows[i].count)], device=device)
        positions[at[:, 0]] = at[:, 2] + tree_depth.flatten()[at[:, 1]]
    groups = tuple(_group(rows, offsets, members, device, dtype, tree_depth, tree_ancestors, window)
                   for members in _grouping(rows))
    keep_t = torch.tensor(keep, dtype=torch.long).to(device, non_blocking=True) if keep is not None else None
    return PackedBatch(tensors[0], tensors[1], positions, groups, keep_t, tuple(rows), tuple(offsets))


@dataclass(frozen=True, slots=True)
class RoundLayout:
    """Where a packed round's tokens go (host lists). rows: the deciding rows in round order, each its
    last prompt chunk (if this round ends its prompt), pending token and own drafts (a tree row its nodes,
    its chunk then a row of its own), then the other prompt chunks; keep: the tokens whose logits
    acceptance reads; gather [b][W]: each deciding row's W verify positions as indices into keep (its
    last repeated past its own width); verify [b][W]: the same as indices into the N tokens; chunk_at:
    (slot, start) of each prompt chunk -> its first token's index in the N."""

    rows: list[RowTokens]
    keep: list[int]
    gather: list[list[int]]
    verify: list[list[int]]
    chunk_at: dict[tuple[int, int], int]

    @property
    def full(self) -> bool:
        """Every deciding row verifies the whole width (the logits need no gather)."""
        return len(self.keep) == sum(len(g) for g in self.gather)


def layout_round(slots: list[int], lengths: list[int], widths: list[int], width: int,
                 fills: list[tuple[int, int, int]], tree: bool) -> RoundLayout:
    """slots, lengths L, widths (1 + its drafts or a tree row's nodes) of the deciding rows, the round's verify
    width, its prompt chunks (slot, start, count) -> the RoundLayout. A deciding row's last chunk ends at
    L - 2, right before its pending token: in a chain round they are one row."""
    chunks = {slot: (start, count) for slot, start, count in fills}
    rows, context = [], []
    for i, (slot, length, w) in enumerate(zip(slots, lengths, widths)):
        start, c = (chunks.pop(slot)) if not tree and slot in chunks else (length - 1, 0)
        rows.append(RowTokens(slot, start, c + w, tree=i if tree else None))
        context.append(c)
    rows += [RowTokens(slot, start, count) for slot, (start, count) in chunks.items()]
    offsets = [0]
    for row in rows:
        offsets.append(offsets[-1] + row.count)
    keep, gather, verify = [], [], []
    for i, w in enumerate(widths):
        first, base = len(keep), offsets[i] + context[i]
        keep += range(base, base + w)
        gather.append([first + min(t, w - 1) for t in range(width)])
        verify.append([base + min(t, w - 1) for t in range(width)])
    chunk_at = {(row.slot, row.start): offset for row, offset in zip(rows, offsets) if row.tree is None}
    return RoundLayout(rows, keep, gather, verify, chunk_at)


def _grouping(rows: list[RowTokens]) -> list[list[int]]:
    """Rows (as indices) in attention groups: every tree row together, chains of at most SHORT tokens
    together, longer chains by the power of two above their length (padding below 2x)."""
    groups: dict[tuple, list[int]] = {}
    for i, row in enumerate(rows):
        if row.tree is not None:
            key = ("tree",)
        elif row.count <= SHORT:
            key = ("short",)
        else:
            key = ("long", (row.count - 1).bit_length())
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def _group(rows: list[RowTokens], offsets: list[int], members: list[int], device, dtype,
           tree_depth: torch.Tensor | None, tree_ancestors: torch.Tensor | None, window: int | None) -> AttentionGroup:
    members = sorted(members, key=lambda i: rows[i].slot)
    slots = [rows[i].slot for i in members]
    width = max(rows[i].count for i in members)
    kv_len = max(rows[i].start + rows[i].count for i in members)
    holes = slots[-1] - slots[0] + 1 - len(slots)
    # Consecutive slots are read as a view of the cache; a few holes ride along (no queries), more are
    # gathered: a gather copies every layer's keys of those rows.
    per_row = SHORT_HOLES_PER_ROW if width <= SHORT else HOLES_PER_ROW
    span = holes <= max(2, int(per_row * len(slots))) and rows[members[0]].tree is None
    layout = list(range(slots[0], slots[-1] + 1)) if span else slots
    at = {slot: r for r, slot in enumerate(layout)}
    query = [[0] * width for _ in layout]
    index = [[-1] * width for _ in layout]  # cache index of each query (-1: padding, sees nothing)
    take, put = [], []
    for i in members:
        row, r = rows[i], at[rows[i].slot]
        for t in range(row.count):
            query[r][t] = offsets[i] + t
            index[r][t] = row.start + t
            take.append(r * width + t)
            put.append(offsets[i] + t)
    q, ix, tp = (torch.tensor(x, dtype=torch.long).to(device, non_blocking=True) for x in (query, index, [take, put]))
    windowed = None
    if rows[members[0]].tree is None:
        mask = causal_mask(ix, kv_len, dtype)
        if window is not None:  # a padding query (index -1) sees nothing either way
            windowed = causal_mask(ix, kv_len, dtype, window)
    else:
        order = torch.tensor([rows[i].tree for i in members], device=device)
        starts = torch.tensor([rows[i].start for i in members], device=device)
        ancestors = tree_ancestors[order, :width, :width]  # the group's rows' first nodes: no later ones are seen
        mask = tree_mask(starts, ancestors, kv_len, dtype)
        if window is not None:
            windowed = tree_mask(starts, ancestors, kv_len, dtype, starts[:, None] + tree_depth[order, :width], window)
    rows_out = slice(slots[0], slots[-1] + 1) if span else torch.tensor(slots, device=device)
    return AttentionGroup(rows_out, q, tp[0], tp[1], mask, kv_len, windowed)


def packed_attention(module, query, key, value, attention_mask, *, packed: PackedBatch | None = None,
                     scaling: float | None = None, dropout: float = 0.0, **kwargs):
    """transformers' attention signature: query [1, H, N, D]; key/value the whole layer cache
    [slots, H_kv, capacity, D] (SlotLayer.update in a packed forward) -> ([1, N, H, D], None). A static
    packed forward (packed_static.py) brings its own layout, which attends itself. Gemma 2's `softcap` and
    gpt-oss's sinks (`s_aux`) are applied as the models' eager attention applies them, on both."""
    if packed is None:  # the layer called the attention without passing on the model's keywords (Nemotron)
        raise PackingUnsupported("the model's attention layers do not pass the forward's keywords on")
    windowed = bool(kwargs.get("sliding_window"))  # this layer keeps to the model's sliding window
    softcap, sinks = kwargs.get("softcap"), kwargs.get("s_aux")
    if not isinstance(packed, PackedBatch):
        return packed.attention(query, key, value, scaling, windowed, softcap=softcap, sinks=sinks)
    q = query[0].transpose(0, 1)  # [N, H, D]
    heads, dim = q.shape[1], value.shape[-1]  # the values' head size may differ from the queries' (MiMo-V2-Flash)
    out = q.new_empty(q.shape[0], heads, dim)
    for group in packed.groups:
        qg = q[group.query]  # [b, T, H, D]
        kg, vg = key[group.rows, :, : group.kv_len], value[group.rows, :, : group.kv_len]
        mask = group.windowed if windowed and group.windowed is not None else group.mask
        og = attend(qg, kg, vg, mask, scaling, softcap=softcap, sinks=sinks)  # [b, T, H, D]
        out[group.put] = og.reshape(-1, heads, dim)[group.take]
    return out[None], None


class PackingUnsupported(RuntimeError):  # a model that declares the attention interface but cannot pack
    pass


def supports_packing(model) -> bool:
    """Attention through transformers' AttentionInterface: eager forwards pack. Others run padded forwards."""
    return bool(getattr(model, "_supports_attention_backend", False))


@contextmanager
def packed_attention_on(model):
    """Route the model's attention through packed_attention for one forward, then back."""
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = before


def register() -> None:
    """Register the packed attention once per process."""
    if ATTENTION not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(ATTENTION, packed_attention)
