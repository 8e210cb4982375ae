"""The draft model's static path (ModelDrafter holds one, drafters/model.py): one captured step per drafted
token, declared at bind over every round shape and length bucket, and their timed replays
(draft_seconds, what adaptive speculation's cost table adds for a shape's drafts)."""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch

from ..types import TreeSpec
from ..model.graphs import StepGraphs
from ..round import RoundBuffers, RoundShape
from ..model.runner import ModelRunner
from ..sampling import SamplingParams
from ..slots import SlotState
from ..model.timing import median_seconds
from .choosing import choose_draft, lay_out_static_tree


class ModelStaticSteps:
    """Draft step i of every slot at fixed addresses: the draft's `runner` under `graphs`, choosing with
    `sampling` over logits that `align` maps onto the target's vocabulary. `bind` gives it the generator's
    device state and declares the steps."""

    def __init__(self, runner: ModelRunner, graphs: StepGraphs, sampling: SamplingParams,
                 align: Callable[[torch.Tensor], torch.Tensor]):
        self.runner, self.graphs, self.sampling, self.align = runner, graphs, sampling, align
        self.device = runner.device
        self._bound: tuple[torch.Tensor, SlotState, RoundBuffers] | None = None  # target lengths, state, buffers
        self._presence: torch.Tensor | None = None  # [B, V] the drafts' growing repetition context
        self._step_times: dict[int, tuple[float, float]] = {}  # bucket -> seconds of the first, a next step

    def _key(self, i: int, bucket: int, spec: TreeSpec | None) -> tuple:
        return ("draft", i, bucket, str(spec) if spec is not None else "chain")

    def _args(self, spec: TreeSpec | None) -> tuple:
        target_lengths, state, buffers = self._bound
        probs = buffers.q_at if spec is not None else buffers.probs
        return (state.tokens, buffers.drafts, buffers.num_drafts, buffers.gumbel, probs)

    def _step(self, seqs, drafts, num, gumbel, probs, *, i: int, kv_len: int, spec: TreeSpec | None) -> None:
        """Draft i for every slot (static shapes): step 0 feeds the last two tokens of each sequence, step i
        the spine token drafted by step i - 1; the last step of a tree lays out its geometry."""
        target_lengths, state, buffers = self._bound
        runner, n_slots = self.runner, self.runner.num_slots
        lengths = target_lengths[:n_slots] + 1  # L of every slot (1 for an idle one)
        branching = spec.branching if spec is not None else 0
        if i == 0:
            runner.set_lengths(slice(None, n_slots), (lengths - 2).clamp(min=0))
            logits = runner.static_steps.logits(seqs, drafts[:, :0], kv_len=kv_len, last_only=True, from_seqs=2)[:, -1]
            if self._presence is not None:
                self._presence.copy_(state.presence)
            if spec is not None:  # the tree's geometry depends only on the budgets
                lay_out_static_tree(spec, num, drafts, buffers, self.device)
        else:
            fed = (i - 1) * max(branching, 1)
            runner.set_lengths(slice(None, n_slots), lengths + i - 1)
            logits = runner.static_steps.logits(seqs, drafts[:, fed : fed + 1], kv_len=kv_len)[:, -1]
        token = choose_draft(self.align(logits), i, self.sampling, lengths, state.noise_keys, self._presence, gumbel,
                             drafts, probs, branching,
                             None if self.sampling.greedy else state.sampling)
        if self._presence is not None:
            self._presence[runner.slot_index, token] = True

    def bind(self, shapes: list[RoundShape], target: ModelRunner, state: SlotState, buffers: RoundBuffers) -> None:
        """The generator's device state; declare the steps: the draft's prefill chunks, and each drafting
        step of each shape over each bucket."""
        self._bound = (target.lengths, state, buffers)
        if state.presence is not None:
            self._presence = torch.zeros_like(state.presence)
        self.runner.static_prefill.declare(state.tokens)  # its prompts in chunks
        specs = {shape.tree for shape in shapes if shape.tree is not None}
        k_max = max((shape.drafts for shape in shapes if shape.tree is None), default=0)
        for bucket in self.runner.buckets:
            for spec in [None, *specs]:
                steps = spec.depth if spec is not None else k_max
                for i in range(steps):
                    self.graphs.declare(self._key(i, bucket, spec), partial(self._step, i=i, kv_len=bucket, spec=spec),
                                        self._args(spec), size=bucket * self.runner.num_slots)

    def run(self, steps: int, kv_len: int, spec: TreeSpec | None) -> None:
        """A round's drafting: its first `steps` steps, over the bucket of kv_len, into the round's buffers."""
        bucket = self.runner.bucket(kv_len)
        for i in range(steps):
            self.graphs.run(self._key(i, bucket, spec), partial(self._step, i=i, kv_len=bucket, spec=spec),
                            self._args(spec))

    def draft_seconds(self, k: int, kv_len: int) -> float:
        """k drafted tokens: one first step and k - 1 next steps (timed replays, per length bucket)."""
        if k == 0:
            return 0.0
        bucket = self.runner.bucket(kv_len)
        if bucket not in self._step_times:
            first = self._time(0, bucket)
            # With at most one draft a round (k = 1) there is no next step to time (none is declared).
            step = self._time(1, bucket) if self._key(1, bucket, None) in self.graphs.declared else first
            self._step_times[bucket] = (first, step)
        first, step = self._step_times[bucket]
        return first + (k - 1) * step

    def _time(self, i: int, bucket: int) -> float:
        """Median seconds of drafting step i over `bucket`: it writes only past every row's valid draft
        entries (or rewrites them with the same tokens) and restores the draft's lengths."""
        with self.runner.lengths_kept():
            return median_seconds(lambda: self.graphs.run(self._key(i, bucket, None), partial(
                self._step, i=i, kv_len=bucket, spec=None), self._args(None)), self.device)
