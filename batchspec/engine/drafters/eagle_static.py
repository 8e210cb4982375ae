"""EAGLE's static path (EagleDrafter's `static_steps`, drafters/eagle.py): one captured step per drafted token,
each slot's first step computing the head entries it lacks from the stash, and the stash's captured update from
the verify pass's features along each slot's accepted path."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import torch

from ..types import TreeSpec
from ..model.graphs import StepGraphs
from ..model.host_device import HostBuffer
from ..round import RoundBuffers, RoundShape
from ..model.runner import ModelRunner
from ..sampling import SamplingParams
from ..slots import SlotState
from .choosing import choose_draft, lay_out_static_tree

if TYPE_CHECKING:  # a drafter is below the Acceptor, which it is only handed
    from ..accept import Acceptor


class EagleStaticSteps:
    """Draft step i of every slot at fixed addresses. Built with the head's runner, the step graphs, the
    sampling, the drafter's stash [B, E, F] and output [B, 1, H] buffers (shared with its eager path: written in
    place, never replaced) and catch_up (the entries a first step computes); `bind` then gives it the generator's
    device state and declares the steps."""

    def __init__(self, runner: ModelRunner, graphs: StepGraphs, sampling: SamplingParams, *, stash: torch.Tensor,
                 out: torch.Tensor, catch_up: int):
        self.runner, self.graphs, self.sampling = runner, graphs, sampling
        self.stash, self.out, self.catch_up = stash, out, catch_up
        self.num_slots, self.device = stash.shape[0], stash.device
        self._presence: torch.Tensor | None = None  # [B, V] the drafts' growing repetition context

    def bind(self, shapes: list[RoundShape], target: ModelRunner, state: SlotState, buffers: RoundBuffers,
             acceptor: Acceptor) -> None:
        """Each drafting step of each shape over each bucket, and the stash's update for each verify width."""
        self._target, self._state, self._buffers, self._acceptor = target, state, buffers, acceptor
        self._where = HostBuffer((2, self.num_slots), self.device)  # each slot's first entry to compute, and how many
        self._where_args = torch.zeros(2, self.num_slots, dtype=torch.long, device=self.device)
        if state.presence is not None:
            self._presence = torch.zeros_like(state.presence)
        specs = [None] + sorted({shape.tree for shape in shapes if shape.tree is not None}, key=str)
        k_max = max((shape.drafts for shape in shapes if shape.tree is None), default=0)
        for bucket in self.runner.buckets:
            for spec in specs:
                for i in range(max(spec.depth if spec is not None else k_max, 1)):
                    self.graphs.declare(self._key(i, bucket, spec), partial(self._static_step, i=i, kv_len=bucket,
                                        spec=spec), self._static_args(spec), size=bucket * self.num_slots)
        for shape in shapes:
            width = shape.width
            self.graphs.declare(("eagle", "stash", width), self._stash_step, self._stash_args(width))

    def stash_from(self, width: int) -> None:
        """Every slot's stash from the last verify pass (of `width` positions a row), along its accepted path."""
        self.graphs.run(("eagle", "stash", width), self._stash_step, self._stash_args(width))

    def _stash_args(self, width: int) -> tuple:
        return (self._target.static_steps.features_buffer(width), self._acceptor.path_out)

    def _stash_step(self, features: torch.Tensor, path: torch.Tensor) -> None:
        """Every slot's stash from the verify pass's features along its accepted path (static)."""
        along = path[:, : min(features.shape[1], path.shape[1])]
        gathered = features.gather(1, along[:, :, None].expand(-1, -1, features.shape[-1]))[:, : self.catch_up]
        self.stash[:, : gathered.shape[1]] = gathered.to(self.stash.dtype)

    def _key(self, i: int, bucket: int, spec: TreeSpec | None) -> tuple:
        return ("eagle", i, bucket, str(spec) if spec is not None else "chain")

    def _static_args(self, spec: TreeSpec | None) -> tuple:
        b = self._buffers
        rejection = not (self.sampling.greedy or self.sampling.coupled)
        probs = (b.q_at if spec is not None else b.probs) if rejection else None
        return (self._state.tokens, self._where_args, b.drafts, b.num_drafts, b.gumbel, probs)

    def run(self, lengths: list[int], starts: list[int], counts: list[int], steps: int, spec: TreeSpec | None) -> None:
        """`steps` drafts of every slot (rows of these lengths L), the first step computing `counts` head entries
        from `starts` (EagleDrafter._first_entries)."""
        where = self._where.put([starts, counts])
        bucket = self.runner.bucket(min(max(lengths) + steps, self.runner.capacity))
        for i in range(steps):
            args = self._static_args(spec)
            self.graphs.run(self._key(i, bucket, spec), partial(self._static_step, i=i, kv_len=bucket, spec=spec),
                            (args[0], where) + args[2:])

    def _static_step(self, seqs, where, drafts, num, gumbel, probs, *, i: int, kv_len: int,
                     spec: TreeSpec | None) -> None:
        """Draft i of every slot (static shapes): step 0 computes each slot's missing entries (where [2, B]:
        the first, and how many) from the stash and returns the draft after them; step i feeds draft i - 1
        with the head's own output."""
        runner, state, n_slots = self.runner, self._state, self.num_slots
        lengths = self._target.lengths[:n_slots] + 1
        branching = spec.branching if spec is not None else 0
        if i == 0:
            starts, counts = where[0], where[1]
            width = self.catch_up
            positions = (starts[:, None] + 1 + torch.arange(width, device=self.device)).clamp(max=seqs.shape[1] - 1)
            runner.set_lengths(slice(None, n_slots), starts)
            last = (counts - 1).clamp(min=0)[:, None]
            logits = runner.static_steps.logits(seqs, seqs.gather(1, positions), kv_len=kv_len,
                                        extra={"hidden": self.stash}, keep=last)[:, 0]
            self.out.copy_(runner.features.gather(1, last[:, :, None].expand(-1, -1, runner.features.shape[-1])))
            if self._presence is not None:
                self._presence.copy_(state.presence)
            if spec is not None:
                lay_out_static_tree(spec, num, drafts, self._buffers, self.device)
        else:
            fed = (i - 1) * max(branching, 1)
            runner.set_lengths(slice(None, n_slots), lengths - 2 + i)
            logits = runner.static_steps.logits(seqs, drafts[:, fed : fed + 1], kv_len=kv_len,
                                        extra={"hidden": self.out})[:, -1]
            self.out.copy_(runner.features)
        token = choose_draft(logits, i, self.sampling, lengths, state.noise_keys, self._presence, gumbel, drafts,
                             probs, branching, None if self.sampling.greedy else state.sampling)
        if self._presence is not None:
            self._presence[runner.slot_index, token] = True
