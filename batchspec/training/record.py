"""The target's hidden states of its own continuations, taken from the forwards that write them.

train_draft needs, for every position of every training sequence, the target's hidden states at the
head's three layers and the LM head's input (features.py's TargetStates). Recomputing them with a second
forward over each finished sequence cost SmolLM2 a third of its data time; the generating forwards
compute the same states anyway. `FeatureRecorder` is drafter "none" (plain decoding, the fastest way to
write continuations at batch 64 on a CPU) that asks the target's runner for those layers, as EAGLE does,
and keeps, per slot, the prompt's states from the admission prefill and each round's pending position's
states; a finished row's states leave with its tokens, and `record` matches them to the Results.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.drafters.base import NoDrafter


@dataclass
class Recorded:
    ids: list[int]  # the slot's tokens: prompt + what it emitted
    states: torch.Tensor  # [len(ids) - 1, F]: the target's states of positions 0 .. len(ids) - 2


class FeatureRecorder(NoDrafter):
    """Plain decoding that keeps the target's states at `layers` (output_hidden_states indices) of every
    position it runs; `finished` holds those of the rows released so far."""

    def __init__(self, layers: tuple[int, ...]):
        self.feature_layers = tuple(layers)
        self.parts: dict[int, list[torch.Tensor]] = {}
        self.finished: list[Recorded] = []
        self._plan = None
        self._verify_index = None  # packed: the last forward's [b, W] verify positions (packed_forward)
        self._target = self._state = None

    def bind(self, shapes, target, state, buffers, acceptor=None):
        if target.static:
            raise ValueError("recording the target's states needs the eager path (compile=False)")
        self._target, self._state = target, state

    @torch.inference_mode()
    def admit(self, slots, prompts, features=None):
        """features: per seat the prompt's states [P, F] from an admission prefill; None when packed rounds
        prefill the prompts (packed_forward brings positions 0 .. P - 2, the first round P - 1)."""
        for i, slot in enumerate(slots):
            self.parts[slot] = [] if features is None else [features[i].to("cpu", torch.float32, copy=True)]

    @torch.inference_mode()
    def packed_forward(self, chunks, verify_index):
        """A packed forward just ran: the prompt chunks it wrote (slot, start, count, at: the chunk's first token
        in it), and each deciding row's verify positions [b, W] (None: no row decided)."""
        self._verify_index = verify_index
        features = self._target.features  # [N, F]
        for slot, start, count, at in chunks:
            self.parts[slot].append(features[at: at + count].to("cpu", torch.float32))

    def propose(self, plan, choice):
        self._plan = plan
        return super().propose(plan, choice)

    @torch.inference_mode()
    def extend(self, slots, emitted, num_accepted, path=None):
        """After a round's verdict: the pending position's states of every row that ran it (each verified just
        that token; `slots` leaves out the rows this round finished, whose states count too). The first
        token's extend after admission comes without a round: its position's states come next round."""
        if self._plan is None:
            return
        plan, self._plan = self._plan, None
        features = self._target.features  # packed [N, F] (_verify_index says where each row's tokens are) or [b, T, F]
        pending = features[self._verify_index[:, 0]] if features.dim() == 2 else features[:, 0]
        pending = pending.to("cpu", torch.float32)
        for i, slot in enumerate(plan.rows):
            self.parts[slot].append(pending[i][None])

    def release(self, slots):
        for slot in slots:
            parts = self.parts.pop(slot)
            if not parts:  # cut short before its prompt came in (generator.cut_short): nothing to keep
                continue
            states = torch.cat(parts)
            ids = self._state.tokens[slot, : len(states) + 1].tolist()
            self.finished.append(Recorded(ids, states))


def match(recorder: FeatureRecorder, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """The recorded states [len(prompt + completion) - 1, F] of the row that wrote `completion` after
    `prompt` (taken out of `recorder.finished`)."""
    sequence = list(prompt) + list(completion)
    for i, rec in enumerate(recorder.finished):
        if len(rec.ids) >= len(sequence) and rec.ids[: len(sequence)] == sequence:
            del recorder.finished[i]
            return rec.states[: len(sequence) - 1]
    raise RuntimeError("no recorded states for a finished row: the engine released it without its tokens")
