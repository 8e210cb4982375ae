"""EAGLE's static path (a mixin of EagleDrafter, drafters/eagle.py): one captured step per drafted token, each
slot's first step computing the head entries it lacks from the stash, and the stash's captured update
from the verify pass's features along each slot's accepted path."""

from __future__ import annotations

from functools import partial

import torch

from ...types import TreeSpec
from ..graphs import HostBuffer
from ..round import Round, RoundShape
from ..slots import SlotState
from .choosing import choose_draft, lay_out_static_tree


class EagleStaticSteps:
    """Draft step i of every slot at fixed addresses (EagleDrafter's runner, graphs, stash and bound state)."""

    def _declare_steps(self, shapes: list[RoundShape], state: SlotState) -> None:
        """Each drafting step of each shape over each bucket, and the stash's update for each verify width."""
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

    def _stash_args(self, width: int) -> tuple:
        return (self._target.features_buffer(width), self._acceptor.path_out)

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

    def _static_steps(self, round: Round, steps: int, spec: TreeSpec | None) -> None:
        starts, counts = self._first_entries(round)
        where = self._where.put([starts, counts])
        bucket = self.runner.bucket(min(max(round.lengths) + steps, self.runner.capacity))
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
            logits = runner.step_logits(seqs, seqs.gather(1, positions), kv_len=kv_len,
                                        extra={"hidden": self.stash}, keep=last)[:, 0]
            self.out.copy_(runner.features.gather(1, last[:, :, None].expand(-1, -1, runner.features.shape[-1])))
            if self._presence is not None:
                self._presence.copy_(state.presence)
            if spec is not None:
                lay_out_static_tree(spec, num, drafts, self._buffers, self.device)
        else:
            fed = (i - 1) * max(branching, 1)
            runner.set_lengths(slice(None, n_slots), lengths - 2 + i)
            logits = runner.step_logits(seqs, drafts[:, fed : fed + 1], kv_len=kv_len,
                                        extra={"hidden": self.out})[:, -1]
            self.out.copy_(runner.features)
        token = choose_draft(logits, i, self.sampling, lengths, state.noise_keys, self._presence, gumbel, drafts,
                             probs, branching, None if self.sampling.greedy else state.sampling)
        if self._presence is not None:
            self._presence[runner.slot_index, token] = True

    def draft_seconds(self, k: int, kv_len: int) -> float:
        """Static: k drafted tokens cost about k head steps (the first computes a few entries more); the
        head's steps are not timed separately (0: adaptive's overhead estimate absorbs them)."""
        return 0.0
