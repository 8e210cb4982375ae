"""The verify pass: a round's one target forward over every deciding row's pending token and drafts (static:
captured steps, a chain's packed over the running rows' own tokens (packed_static.py), a tree's over every
slot; eager: the round's rows; packed: their own widths and new prompts' chunks in one forward,
packed.py); what each forward computed goes to the run's statistics (stats.py)."""

from __future__ import annotations

import torch

from .drafters import Drafter
from .model.host_device import HostBuffer, wall
from .model.packed import layout_round
from .round import Round, Verified
from .model.runner import ModelRunner
from .slots import SlotState
from .stats import Statistics


class Verifier:
    """Runs the generator's verify passes on the target's runner; `stats` counts what they computed. A packed
    pass's prompt chunks stay cached (their slots' lengths move on, samples copy a finished prompt), and a
    drafter that reads the target's hidden states (EAGLE) takes the chunks' in before that."""

    def __init__(self, runner: ModelRunner, state: SlotState, drafter: Drafter, stats: Statistics):
        self.runner, self.state, self.drafter, self.stats = runner, state, drafter, stats
        self.device, self.static, self.packed = runner.device, runner.static, runner.packs
        self.feature_layers = runner.feature_layers
        self._fills = HostBuffer((2, runner.num_slots), runner.device)  # the slots a round prefilled, their new lengths

    def run(self, round: Round) -> Verified:
        """One target forward over [pending token, drafts] of every row -> logits [b, W, V]."""
        if self.packed:
            return self._packed(round)
        verified = (self._packed_static(round) if self.runner.packed_width and round.tree is None
                    else Verified(self._padded(round)))
        if self.static:  # a captured verify runs on the device: the idle host does the drafter's put-off work
            self.drafter.learn_pending()
        return verified

    def _padded(self, round: Round) -> torch.Tensor:
        """Every row W tokens (the static path's trees, and eager rounds that are not packed)."""
        draft, width = round.draft, round.shape.width
        num = draft.host_num or [width - 1] * len(round.rows)
        padding = sum(width - 1 - n for n in num) + (len(round.rows) - len(round.running)) * width
        self.stats.forward(len(round.rows) * width, padding, 0)
        kv_len = max(round.lengths[i] for i in round.running) + width - 1
        if self.static:
            return self.runner.forward(draft.tokens, kv_len=kv_len, tree=round.tree, seqs=self.state.tokens,
                                       from_seqs=1)
        pending = self.state.tokens[round.rows_t, round.lengths_t - 1]
        tokens = torch.cat([pending[:, None], draft.tokens], dim=1)
        return self.runner.forward(tokens, kv_len=kv_len, rows=round.span or round.rows_t, tree=round.tree)

    def _packed_static(self, round: Round) -> Verified:
        """The static path's packed verify (packed_static.py): every running row its pending token and its own
        drafts, idle slots nothing -> logits [num_slots, W, V]."""
        draft, width = round.draft, round.shape.width
        num = draft.host_num if draft.host_num is not None else [width - 1] * len(round.rows)
        running = set(round.running)
        widths = [1 + min(n, width - 1) if i in running else 0 for i, n in enumerate(num)]
        kv_len = max(round.lengths[i] for i in round.running) + width - 1
        logits = self.runner.static_steps.verify_packed(widths, width, kv_len, self.state.tokens, round.buffers.drafts)
        n = self.runner.static_steps.token_bucket(sum(widths))
        self.stats.forward(n, n - sum(widths), 0)
        return Verified(logits, (n, 0.0))  # its tokens; its time is not measured (a sync): the replay tables price it

    def _packed(self, round: Round) -> Verified:
        """The round's one target forward, packed (packed.py): per deciding row its pending token and its own
        drafts (a tree row its nodes), behind its last prompt chunk when this round ends its prompt; the
        other prompt chunks. -> logits [b, W, V] of the deciding rows (None when no row decides)."""
        tree, draft, b = round.tree, round.draft, len(round.rows)
        width = round.shape.width if b else 1
        num = draft.host_num if b and tree is None and draft.host_num is not None else [width - 1] * b
        layout = layout_round(round.rows, round.lengths, [1 + min(n, width - 1) for n in num], width, round.fills,
                              tree is not None)
        if width > 1:  # the drafts go where they will be verified: the forward reads its tokens from there
            self.state.write(round.rows_t, round.lengths_t, draft.tokens)
        batch = self.runner.pack(layout.rows, keep=layout.keep, tree=tree)
        started = wall(self.device)
        logits = self.runner.forward_packed(self.state.tokens[batch.slots, batch.index], batch)
        forward = (batch.num_tokens, wall(self.device) - started)
        filled = round.chunk_tokens
        self.stats.forward(batch.num_tokens, 0, filled, forward[1] * filled / batch.num_tokens, forward[1])
        if self.feature_layers:  # before the commit hands the other samples their copies
            self.drafter.packed_forward([(other, start, count, layout.chunk_at[slot, start])
                                         for (slot, start, count), slots in zip(round.fills, round.fill_slots)
                                         for other in slots],
                                        torch.tensor(layout.verify, device=self.device) if b else None)
        self._commit_fills(round)
        if not b:
            return Verified(None, forward)
        if layout.full:
            return Verified(logits.view(b, width, -1), forward)
        return Verified(logits[torch.tensor(layout.gather, device=self.device)], forward)

    def _commit_fills(self, round: Round) -> None:
        """The prompt chunks a packed forward wrote stay cached: their slots' lengths move to the chunks'
        ends; samples of a request whose prompt is now in copy its cache (the round's plan names them)."""
        fills = round.fills
        if not fills:
            return
        table = self._fills.put([[slot for slot, _, _ in fills], [start + count for _, start, count in fills]],
                                (2, len(fills)))
        self.runner.copy_lengths(table[0], table[1])
        for src, dst, length in round.copies:
            self.runner.copy_prefix([src], [dst], length)
            self.runner.set_lengths(dst, length)
