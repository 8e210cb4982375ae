"""One round's records (`Plan`, `Choice`, `Round`, `Verified`), the shape it drafts (`RoundShape`), and the device
buffers rounds reuse.

A round over b rows: every slot in order on the static path (idle slots ride along with no drafts),
the running requests on the eager path. Host lists have b entries, tensors b rows; the buffers have
one row per slot and a round uses their first b rows.

Records are values, each built once by the stage that owns it and only read after (generator.step):
  schedule  -> Plan: its rows, lengths, room, prompt chunks and the most drafts each row may propose (`limits`:
               0 for rows whose drafts cannot pay, so that a lookup does not propose them)
  draft     -> Round: the plan, the shape, each row's number of drafts (`budgets`), the drafts, the coupled
               noise, a tree's geometry and the drafts a grammar forced (drafters are asked with a Choice)
  verify    -> Verified: the target's logits and what the forward cost
  accept    -> RoundOutcome (verdict.py, through accept.py)      postprocess -> Emitted (postprocess.py)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .types import TreeSpec
from .model.host_device import HostBuffer
from .tree import TreeShape

if TYPE_CHECKING:
    from .slots import SlotState


@dataclass(frozen=True, slots=True)
class RoundShape:
    """What a round drafts: a chain of up to `drafts` tokens per row (0: plain decoding), or a `tree`."""

    drafts: int = 0
    tree: TreeSpec | None = None

    @property
    def width(self) -> int:
        """Tokens each row's verify pass reads: the pending token and the drafts (or tree nodes)."""
        return 1 + (self.tree.nodes if self.tree is not None else self.drafts)

    @property
    def depth(self) -> int:
        """The most drafts one row can have accepted."""
        return self.tree.depth if self.tree is not None else self.drafts

    def __str__(self) -> str:
        return f"tree {self.tree}" if self.tree is not None else f"k={self.drafts}"


@dataclass(frozen=True, slots=True)
class Draft:
    """What a drafter proposed: a chain of drafts per row, or (parents set) a tree of them (tree.py)."""

    tokens: torch.Tensor  # [b, W] int64, padded with 0 past num_tokens; the verify width is W + 1
    num_tokens: torch.Tensor  # [b] int64: how many of each row's tokens are proposals
    probs: torch.Tensor | None = None  # [b, W, V] q after the sampling transforms; None = one-hot q
    host_num: list[int] | None = None  # num_tokens on the host, when the drafter knows it without a sync (a tree's
    #                                    nodes are then its first host_num node slots: a packed verify reads those)
    parents: torch.Tensor | None = None  # [b, W] a tree: each node's parent (-1: the root's child)
    valid: torch.Tensor | None = None  # [b, W] bool: the tree's real nodes
    q_at: torch.Tensor | None = None  # [b, W + 1, V] a tree's q after each verify position (rejection
    #                                   sampling with drawn children); None: children are one-hot
    spec: TreeSpec | None = None  # a tree: the shape that bounds it
    priors: list[float | None] | None = None  # per row: the drafter's own chance that its first draft is right
    host_tokens: list[list[int]] | None = None  # each row's proposals on the host, when made there (lookups)

    def truncate(self, width: int) -> "Draft":
        """The same chain cut to at most `width` tokens per row (a lookup's first tokens do not depend on
        how many were asked for)."""
        host = None if self.host_num is None else [min(n, width) for n in self.host_num]
        probs = None if self.probs is None else self.probs[:, :width]
        tokens = None if self.host_tokens is None else [t[:width] for t in self.host_tokens]
        return Draft(self.tokens[:, :width], self.num_tokens.clamp(max=width), probs, host, priors=self.priors,
                     host_tokens=tokens)

    def cut(self, budgets: list[int], buffers: "RoundBuffers") -> "Draft":
        """The same chain cut to budgets[i] tokens in row i (a packed round's per-row choice; needs host_num)."""
        host = [min(n, k) for n, k in zip(self.host_num, budgets)]
        width = max(host, default=0)
        probs = None if self.probs is None else self.probs[:, :width]
        tokens = None if self.host_tokens is None else [t[:n] for t, n in zip(self.host_tokens, host)]
        return Draft(self.tokens[:, :width], buffers.put_num_drafts(host), probs, host, priors=self.priors,
                     host_tokens=tokens)


class RoundBuffers:
    """Device buffers every round writes and reads at fixed addresses (what captured steps need), one row
    per slot: drafts [B, W] and their count [B], budgets [B] (from the host), the coupled noise
    [B, W + 1, V], a draft model's q [B, W, V] and a tree's q_at [B, W + 1, V] (rejection sampling), a tree's parents/valid [B, W] and its
    geometry, and the packed verdict [B, W + 1 + 7] the round's one host read takes."""

    def __init__(self, num_slots: int, width: int, vocab_size: int, device: torch.device, *, noise: bool,
                 probs: bool, trees: bool):
        b, w = num_slots, max(width, 1)
        self.drafts = torch.zeros(b, w, dtype=torch.long, device=device)
        self.num_drafts = torch.zeros(b, dtype=torch.long, device=device)
        self._drafts_in = HostBuffer((b, w), device, into=self.drafts)  # proposals made on the host (lookups)
        self._num_in = HostBuffer((b,), device, into=self.num_drafts)
        self.gumbel = torch.zeros(b, w + 1, vocab_size, device=device) if noise else None
        self.probs = torch.zeros(b, w, vocab_size, device=device) if probs else None
        self.q_at = torch.zeros(b, w + 1, vocab_size, device=device) if probs and trees else None
        self.verdict = torch.zeros(b, w + 1 + 7, dtype=torch.long, device=device)
        self.tree: TreeShape | None = None
        if trees:
            self.parents = torch.full((b, w), -1, dtype=torch.long, device=device)
            self.valid = torch.zeros(b, w, dtype=torch.bool, device=device)
            self._parents_in = HostBuffer((b, w), device, into=self.parents)
            self._valid_in = HostBuffer((b, w), device, into=self.valid)
            self.tree = TreeShape(depth=torch.zeros(b, w + 1, dtype=torch.long, device=device),
                                  ancestors=torch.zeros(b, w + 1, w + 1, dtype=torch.bool, device=device),
                                  parent_t=torch.zeros(b, w, dtype=torch.long, device=device),
                                  rank=torch.zeros(b, w, dtype=torch.long, device=device),
                                  valid=self.valid, max_depth=w)

    def put_num_drafts(self, counts: list[int]) -> torch.Tensor:
        """Each row's number of drafts (from the host: a lookup's proposals, or the budgets) -> [b]."""
        return self._num_in.put(counts)

    def put_drafts(self, tokens: list[list[int]], b: int, width: int) -> torch.Tensor:
        """Draft tokens made on the host -> the drafts buffer's [b, width] view."""
        return self._drafts_in.put(tokens, (b, width)) if width else self.drafts[:b, :0]

    def put_tree(self, parents: list[list[int]], valid: list[list[int]], b: int, n: int) -> torch.Tensor:
        """A tree made on the host: parents into the buffer; returns valid [b, n] (bool)."""
        self._parents_in.put(parents, (b, n))
        return self._valid_in.put(valid, (b, n))


@dataclass(frozen=True, slots=True)
class Plan:
    """What a round runs, as the scheduler decided it (scheduler.schedule, built once): its rows, their lengths,
    each row's room and most drafts, and the prompt chunks its forward prefills."""

    rows: list[int]  # [b] slots in this round's forwards
    rows_t: torch.Tensor  # [b] the same on the device
    span: slice | None  # rows as a slice when they are consecutive slots (eager forwards read views)
    lengths: list[int]  # [b] each row's sequence length L (prompt + output); the pending token is at L - 1
    lengths_t: torch.Tensor  # [b] the same on the device
    running: list[int]  # indices into rows of the running requests
    room: list[int]  # [b] drafts each row has room for before its limits (0 for idle slots)
    limits: list[int]  # [b] the most drafts each row may propose (<= room; 0: it drafts nothing)
    state: SlotState | None = None  # the slots' sequences, noise keys and repetition context (device)
    buffers: RoundBuffers | None = None
    fills: list[tuple[int, int, int]] = field(default_factory=list)  # packed: prompt chunks (slot, start, count)
    fill_slots: list[list[int]] = field(default_factory=list)  # per chunk, the slots that take it: its own and the
    #   other samples of its request that copy its prompt cache (a drafter that reads hidden states takes them in)
    copies: list[tuple[int, int, int]] = field(default_factory=list)  # packed: prompt caches copied once the
    #   round's chunks are in (source slot, destination slot, entries): the other samples of a request

    @property
    def chunk_tokens(self) -> int:
        """Packed: the prompt tokens this round's forward prefills."""
        return sum(count for _, _, count in self.fills)

    @property
    def admitted(self) -> set[int]:
        """Packed: the deciding rows (as slots) whose prompt's last chunk is in this round: their first token
        comes from it."""
        chunked = {slot for slot, _, _ in self.fills}
        return {self.rows[i] for i in self.running if self.rows[i] in chunked}

    def admission_seconds(self, forward: tuple[int, float] | None) -> float:
        """Packed: the share of the forward's measured time (forward: its tokens and seconds, Verified.forward)
        that admission took, in proportion to its tokens (the prompt chunks, and one for each admitted row's
        first decision); 0 when the forward was not timed (the static path's)."""
        if not self.fills or forward is None or not forward[0]:
            return 0.0
        return forward[1] * min(1.0, (self.chunk_tokens + len(self.admitted)) / forward[0])

    @property
    def base_tokens(self) -> int:
        """Packed: the forward's tokens before any draft (one pending token a deciding row, the chunks)."""
        return len(self.rows) + self.chunk_tokens

    @property
    def running_slots(self) -> list[int]:
        return [self.rows[i] for i in self.running]


@dataclass(frozen=True, slots=True)
class Choice:
    """What a drafter is asked to draft over a plan's rows: each row's most drafts (the choice's; for a drafter
    that proposes first, asked before the choice, the plan's limits) and the coupled noise it samples with."""

    budgets: list[int]  # [b]
    gumbel: torch.Tensor | None = None  # [b, >= width, V] coupled noise for positions L .. L + width - 1


@dataclass(frozen=True, slots=True)
class Round:
    """A drafted round (the draft stage's, drafting.py, built once): its plan, the shape it drafts, each row's
    number of drafts the choice gave it, the drafts, the coupled noise, a tree's geometry, the drafts a grammar
    forced and a lookup's whole proposals. The verify pass, acceptance and postprocess only read it."""

    plan: Plan
    shape: RoundShape
    budgets: list[int]  # [b] the choice's drafts per row (<= the plan's limits; a tree: its depth)
    draft: Draft
    gumbel: torch.Tensor | None = None  # [b, >= width, V] coupled noise for positions L .. L + width - 1
    tree: TreeShape | None = None  # a tree round's geometry (rows [b])
    forced: list[int] | None = None  # [b] drafts the grammar forced in each row (structured output)
    proposed: list[list[int]] | None = None  # [b] a lookup's whole proposal per row, before the choice cut it

    def chosen_for(self, slots: list[int]) -> list[int]:
        """The drafts the choice gave these of the round's rows (what acceptance is learnt against), 0 for a row
        whose drafts a grammar forced: they say nothing about the drafter."""
        at = {slot: i for i, slot in enumerate(self.plan.rows)}
        forced = self.forced or [0] * len(self.plan.rows)
        return [0 if forced[at[slot]] else self.budgets[at[slot]] for slot in slots]

    def proposed_for(self, slots: list[int]) -> list[list[int]] | None:
        """A lookup's whole proposals of these of the round's rows (what adaptive judges in hindsight); None when
        the round has none, or a grammar forced drafts in it (its tokens then say nothing of the drafter)."""
        if self.proposed is None or self.forced is not None:
            return None
        at = {slot: i for i, slot in enumerate(self.plan.rows)}
        return [self.proposed[at[slot]] for slot in slots]


@dataclass(frozen=True, slots=True)
class Verified:
    """A round's verify pass: the target's distribution at every verify position, and what the forward cost."""

    logits: torch.Tensor | None  # [b, W, V] (None: a packed round that only prefilled)
    forward: tuple[int, float] | None = None  # packed: the forward's tokens and seconds (for adaptive's prices)
