"""Structured output inside a round (the host's matchers are grammar.py's): the drafts a grammar forces, and
the masks of the verify positions of constrained rows, applied to the verify pass's logits."""

from __future__ import annotations

from dataclasses import replace

import torch

from ..drafters.base import host_draft
from .grammar import Grammars, apply_masks
from ..round import Draft, Plan, Round, RoundBuffers
from ..slots import SlotTable


def constrain_drafts(plan: Plan, draft: Draft, grammars: Grammars, slots: SlotTable, buffers: RoundBuffers,
                     limit: int) -> tuple[Draft, list[int] | None] | None:
    """The drafts of constrained rows, before verification: a proposal is cut at the first token its grammar
    refuses, and a row whose grammar forces its next tokens drafts them (at most `limit`, and its room)
    unless its proposal already covers them. Only drafts made on the host (none, the lookups) can be cut and
    merged: a draft model's are masked at verification instead. Rows awaiting their first token are left
    alone. draft: the plan's proposals. Returns (the drafts, each row's forced drafts or None when no row has
    any), or None when the proposals stand as they are."""
    if draft.host_tokens is None:
        return None
    merged, forced = [list(t) for t in draft.host_tokens], [0] * len(plan.rows)  # forced: drafts the grammar made
    changed = False
    for i in grammars.constrained(plan.rows):
        slot = plan.rows[i]
        if slots[slot] is None or slots[slot].awaiting_first:
            continue
        legal = grammars.legal(slot, merged[i])
        if legal < len(merged[i]):
            merged[i], changed = merged[i][:legal], True
        tokens = grammars.forced(slot, min(plan.room[i], limit))
        # A proposal the grammar takes that is as long (in bytes) as the forced ones starts with them.
        if tokens and grammars.byte_length(merged[i]) < grammars.byte_length(tokens):
            merged[i], forced[i], changed = tokens, len(tokens), True
    if not changed:
        return None
    return replace(host_draft(buffers, merged), priors=draft.priors), forced if any(forced) else None


def constrain_tree(plan: Plan, draft: Draft, grammars: Grammars, slots: SlotTable, buffers: RoundBuffers,
                   limit: int) -> tuple[Draft, list[int] | None]:
    """A tree round's constrained rows, which have no nodes (Scheduler._tree_room: each node would need the
    grammar's state after its own path), draft the tokens their grammar forces as a chain of nodes (at most
    `limit`, their room and the tree's depth), beside the free rows' trees, in place in the round's buffers. For a
    lookup's tree (made on the host, its rows' nodes known there: draft.host_num), the only kind that forces
    drafts (a drafter with forwards has limit 0, and its trees share one layout across rows). Returns (the
    drafts, each row's forced drafts or None when no row has any)."""
    if draft.host_num is None:
        return draft, None
    chains = {}
    for i in grammars.constrained(plan.rows):
        slot = plan.rows[i]
        if slots[slot] is None or slots[slot].awaiting_first:
            continue
        tokens = grammars.forced(slot, min(plan.room[i], limit, draft.spec.depth))
        if tokens:
            chains[i] = tokens
    if not chains:
        return draft, None
    nodes, device = draft.tokens.shape[1], draft.tokens.device
    index = torch.tensor(list(chains), device=device)
    counts = torch.tensor([len(t) for t in chains.values()], device=device)
    draft.tokens[index] = torch.tensor([t + [0] * (nodes - len(t)) for t in chains.values()], device=device)
    draft.parents[index] = torch.arange(-1, nodes - 1, device=device)  # node j's parent is node j - 1
    draft.valid[index] = torch.arange(nodes, device=device)[None, :] < counts[:, None]
    host_num = [len(chains[i]) if i in chains else n for i, n in enumerate(draft.host_num)]
    forced = [len(chains.get(i, ())) for i in range(len(plan.rows))]
    return replace(draft, num_tokens=buffers.put_num_drafts(host_num), host_num=host_num), forced


def mask_round(round: Round, logits: torch.Tensor, grammars: Grammars, slots: SlotTable, tokens: torch.Tensor) -> None:
    """Mask the verify positions of the round's constrained rows by their grammars, in place: logits [b, W, V],
    position t after the row's pending token and its first t drafts. Drafts made on the device come to the
    host for it (a sync, in constrained rounds only). tokens: the slots' sequences (SlotState.tokens), where
    on the static path a new row's first token waits (it reaches the host with this round's verdict)."""
    index = grammars.constrained(round.plan.rows)
    if not index:
        return
    draft, width, device = round.draft, logits.shape[1], logits.device
    rows = [round.plan.rows[i] for i in index]
    # A constrained row's drafts are a chain, in a tree round too (its forced tokens, constrain_tree, or none).
    if draft.host_tokens is not None:
        drafts = [draft.host_tokens[i] for i in index]
    elif round.tree is not None and draft.host_num is None:  # a device tree: a constrained row has no nodes
        drafts = [[] for _ in index]
    else:
        at = torch.tensor(index, device=device)
        counts = [draft.host_num[i] for i in index] if draft.host_num is not None else draft.num_tokens[at].tolist()
        drafts = [t[:n] for t, n in zip(draft.tokens[at].tolist(), counts)]
    prefixes = None
    # A new row's first token drawn at admission (the static path) is this round's pending token.
    waiting = [slots[slot].awaiting_first and slots[slot].first_drawn for slot in rows]
    if any(waiting):
        prefixes = [[int(tokens[slot, round.plan.lengths[i] - 1])] if w else []
                    for slot, i, w in zip(rows, index, waiting)]
    bitmask = grammars.masks(rows, drafts, width, prefixes)
    at = torch.tensor(index, device=device)
    constrained = logits[at]
    apply_masks(constrained, bitmask.to(device, non_blocking=True))
    logits[at] = constrained
