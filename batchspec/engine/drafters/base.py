"""Drafters: propose up to k tokens per row, then learn from what the target accepted.

Every drafter speaks the same three verbs (cf. transformers' CandidateGenerator, made batched):
  admit(slots, sequences)          new requests now occupy these slots (sequence = prompt + first token)
  propose(ctx) -> Draft            up to ctx.k[i] tokens for row i; rows may propose 0
  commit(slots, emitted, accepted) the tokens each running row emitted this round, and how many drafts it kept
and declares a DrafterPolicy: what the adaptive controller needs to know about it, so that the
controller never looks inside a drafter. A row that proposes nothing costs only its 1-token decode in
the verify pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ...types import TreeSpec
from ..runner import to_device


@dataclass(frozen=True, slots=True)
class DrafterPolicy:
    """What choosing each round's number of drafts needs to know about a drafter.

    propose_first: proposing k_max tokens costs no more than proposing fewer and the first tokens do not
        depend on k (lookups): propose, then choose the verify width from the proposals on the table.
    bursty: proposals are right or wrong as a whole (a lookup's match) more often than token by token,
        so acceptance is modelled as first-draft acceptance times job-wide continuation rates instead of
        one geometric alpha.
    draft_forwards: each drafted token costs one forward of a draft model.
    catches_up: after rounds without drafting, the next drafted round first feeds the draft the tokens it
        missed, a cost of the plain rounds before and not of that round's k.
    """

    propose_first: bool = False
    bursty: bool = False
    draft_forwards: bool = False
    catches_up: bool = False
    trees: bool = False  # can propose trees (propose_tree)


LOOKUP_POLICY = DrafterPolicy(propose_first=True, bursty=True, trees=True)
MODEL_POLICY = DrafterPolicy(draft_forwards=True, catches_up=True, trees=True)


@dataclass(slots=True)
class DraftContext:
    """What a drafter may read in a round.

    rows/lengths/k are host lists of equal length b: the slots of this round (every slot, in order, when
    `static`; then idle slots have k = 0), each row's sequence length L (prompt + output so far) and its
    budget. rows_t [b] and lengths_t [b] are the same on the device. tokens [B, S] holds every slot's
    sequence on the device, valid up to its length.
    """

    rows: list[int]
    lengths: list[int]
    k: list[int]
    tokens: torch.Tensor
    presence: torch.Tensor | None  # [B, V] bool: tokens already in each slot's context (repetition penalty)
    noise_keys: torch.Tensor  # [B] int64
    rows_t: torch.Tensor | None = None
    lengths_t: torch.Tensor | None = None
    static: bool = False
    span: slice | None = None  # rows as a slice when they are consecutive slots (eager forwards read views)
    gumbel: torch.Tensor | None = None  # [b, >= k, V]: coupled sampling's noise of positions L .. (sampling.py)

    def __post_init__(self):
        device = self.tokens.device
        if self.rows_t is None:
            self.rows_t = to_device(self.rows, device)
        if self.lengths_t is None:
            self.lengths_t = to_device(self.lengths, device)


@dataclass(slots=True)
class Draft:
    """A chain of drafts per row, or (parents set) a tree of them (engine/tree.py)."""

    tokens: torch.Tensor  # [b, W] int64, padded with 0 past num_tokens; W sets the verify width W+1
    num_tokens: torch.Tensor  # [b] int64 on the device: how many of each row's tokens are proposals
    probs: torch.Tensor | None = None  # [b, W, V] q after the sampling transforms; None = one-hot q
    host_num: list[int] | None = None  # num_tokens on the host, when the drafter has it without a device sync
    parents: torch.Tensor | None = None  # [b, W] a tree: each node's parent (-1: the root's child)
    valid: torch.Tensor | None = None  # [b, W] bool: the tree's real nodes
    q_at: torch.Tensor | None = None  # [b, W + 1, V] a tree's q after each verify position (rejection
    #                                   sampling with drawn children); None: children are one-hot
    spec: TreeSpec | None = None  # a tree: the shape that bounds it (depth, children per node)

    def truncate(self, width: int) -> "Draft":
        """The same proposals cut to at most `width` tokens per row (a lookup's first tokens do not depend
        on how many were asked for)."""
        host = None if self.host_num is None else [min(n, width) for n in self.host_num]
        probs = None if self.probs is None else self.probs[:, :width]
        return Draft(self.tokens[:, :width], self.num_tokens.clamp(max=width), probs, host)


class Drafter(Protocol):
    policy: DrafterPolicy

    def admit(self, slots: list[int], sequences: list[list[int]]) -> None: ...
    def propose(self, ctx: DraftContext) -> Draft: ...
    def commit(self, slots: list[int], emitted: list[list[int]], num_accepted: list[int]) -> None: ...
    def draft_seconds(self, k: int, kv_len: int) -> float: ...  # device time of proposing k tokens (captured steps)
    # Drafters whose policy says `trees`:
    #   propose_tree(ctx, spec) -> Draft       a tree per row in spec.nodes node slots (the verify width is
    #                                          spec.nodes + 1); ctx.k[i] bounds row i's depth


def empty_draft(b: int, device: torch.device) -> Draft:
    return Draft(tokens=torch.zeros(b, 0, dtype=torch.long, device=device),
                 num_tokens=torch.zeros(b, dtype=torch.long, device=device), host_num=[0] * b)


def _pad(rows: list[list[int]], device: torch.device) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    return to_device([r + [0] * (width - len(r)) for r in rows], device).reshape(len(rows), width)


class NoDrafter:
    """Plain decoding on the same machinery: every round verifies just the pending token."""

    policy = DrafterPolicy()

    def __init__(self, device: torch.device):
        self.device = device

    def admit(self, slots, sequences):
        pass

    def propose(self, ctx: DraftContext) -> Draft:
        return empty_draft(len(ctx.rows), self.device)

    def commit(self, slots, emitted, num_accepted, path=None):
        pass

    def draft_seconds(self, k, kv_len):
        return 0.0


