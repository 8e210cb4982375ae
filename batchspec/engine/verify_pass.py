"""The verify pass: a round's one target forward over every deciding row's pending token and drafts, on one of
three paths chosen once, when the generator is built (`verify_pass`), so that no round asks which path it is on:

  - PackedPass (eager, a model whose attention transformers dispatches): each deciding row its own width and
    new prompts' chunks in one forward (packed.py);
  - PaddedPass (eager, other models): every round row the round's width;
  - StaticPass (captured steps, a GPU): packed over the running rows' own tokens, a tree row its nodes
    (packed_static.py); with pack_static=False every slot at the round's width.

Each sets its path up once (`prepare`: the drafter bound to the device state, a captured path's steps declared and
captured; `start_costs`: the machine's costs that adaptive speculation starts from, where rounds are priced per
row by their forwards), places a round's rows on the device the way its forward reads them (`place`: the scheduler
builds the round with them), runs the forward (`run`), and says what the round's forwards cost for adaptive
speculation's prices (`measured`). What each forward computed goes to the run's statistics (stats.py)."""

from __future__ import annotations

from functools import partial
from typing import Protocol

import torch

from .accept import Acceptor
from .control.costs import CostModel, PackedCosts, RoundTimes, StaticPackedCosts, StepTable
from .control.payoff import PayoffCheck
from .control.round_prices import start_from_machine
from .control.startup_costs import StartupCosts
from .drafters import Drafter
from .model.graphs import StepGraphs
from .model.host_device import HostBuffer, wall
from .model.timing import packed_seconds
from .model.packed import layout_round
from .round import Plan, Round, RoundBuffers, RoundShape, Verified
from .round_steps import declare_round_steps, shape_seconds
from .model.runner import ModelRunner
from .slots import SlotState
from .stats import Statistics


class VerifyPass(Protocol):
    per_row: bool  # each row verifies its own number of drafts (adaptive chooses them per row; payoff.py checks it)
    def cost_model(self, shapes: list[RoundShape]) -> CostModel: ...  # what adaptive speculation prices rounds by
    def prepare(self, shapes: list[RoundShape], acceptor: Acceptor, graphs: StepGraphs) -> None: ...  # once, at
    #    start: the drafter bound to the device state (a captured path's steps declared, then captured)
    def start_costs(self, costs: CostModel | None, payoff: PayoffCheck | None, *, batch_size: int,
                    k_max: int) -> StartupCosts: ...  # the machine's costs adaptive speculation (costs: None when
    #    off) starts from, measured or read from the cache; empty where rounds are not priced by their forwards
    def place(self, rows: list[int], lengths: list[int]) -> dict: ...  # the round's device fields (Round's
    #    rows_t, lengths_t, state, buffers) for these rows at these lengths L
    def run(self, round: Round) -> Verified: ...  # the forward over [pending token, drafts] of every row
    def measured(self, round: Round, verified: Verified, costs: CostModel | None) -> tuple | None: ...  # the
    #    round's (forward tokens, forward seconds, drafting forwards' (tokens, seconds)) for the prices, or None


def verify_pass(runner: ModelRunner, state: SlotState, buffers: RoundBuffers, drafter: Drafter, stats: Statistics, *,
                per_row: bool) -> VerifyPass:
    """The runner's path (per_row: the static path's chains are packed, each row its own drafts)."""
    if runner.packs:
        return PackedPass(runner, state, buffers, drafter, stats)
    if runner.static:
        return StaticPass(runner, state, buffers, drafter, stats, per_row=per_row)
    return PaddedPass(runner, state, buffers, drafter, stats)


class _Pass:
    """What the three paths share: the target's runner, the slots' device state, the round buffers, the drafter
    (which hears of the forwards it reads) and the statistics."""

    per_row = False

    def __init__(self, runner: ModelRunner, state: SlotState, buffers: RoundBuffers, drafter: Drafter,
                 stats: Statistics):
        self.runner, self.state, self.buffers, self.drafter, self.stats = runner, state, buffers, drafter, stats
        self.device = runner.device
        self._rows = HostBuffer((runner.num_slots,), runner.device)  # a round's rows
        self._lengths = HostBuffer((runner.num_slots,), runner.device)  # their lengths L

    def prepare(self, shapes: list[RoundShape], acceptor: Acceptor, graphs: StepGraphs) -> None:
        self.drafter.bind(shapes, self.runner, self.state, self.buffers, acceptor)

    def start_costs(self, costs: CostModel | None, payoff: PayoffCheck | None, *, batch_size: int,
                    k_max: int) -> StartupCosts:
        return StartupCosts((), ())  # rounds priced by their wall time or the captured steps' timed replays

    def _placed(self, rows_t: torch.Tensor, lengths_t: torch.Tensor | None) -> dict:
        return {"rows_t": rows_t, "lengths_t": lengths_t, "state": self.state, "buffers": self.buffers}

    def measured(self, round: Round, verified: Verified, costs: CostModel | None) -> tuple | None:
        return None  # not priced per row: adaptive learns whole rounds' wall time (costs.RoundTimes)


class PaddedPass(_Pass):
    """Eager rounds that are not packed: every row the round's width, over the round's rows of the cache."""

    def cost_model(self, shapes: list[RoundShape]) -> CostModel:
        return RoundTimes()  # whole rounds' wall time by their shape

    def place(self, rows: list[int], lengths: list[int]) -> dict:
        rows_t = self._rows.put(rows)
        return self._placed(rows_t, self.runner.lengths[rows_t] + 1)  # the cache holds seq[:L-1]

    def run(self, round: Round) -> Verified:
        count_padded(self.stats, round)
        pending = self.state.tokens[round.plan.rows_t, round.plan.lengths_t - 1]
        tokens = torch.cat([pending[:, None], round.draft.tokens], dim=1)
        return Verified(self.runner.forward(tokens, kv_len=kv_len(round), rows=round.plan.span or round.plan.rows_t,
                                            tree=round.tree))


class StaticPass(_Pass):
    """Captured steps over every slot in order (idle slots ride along): a round's verify packed over the running
    rows' own tokens (a tree row its nodes) when the runner has a packed width, else every slot at the round's
    width. While a captured verify runs on the device, the idle host does the drafter's put-off work."""

    def __init__(self, runner: ModelRunner, state: SlotState, buffers: RoundBuffers, drafter: Drafter,
                 stats: Statistics, *, per_row: bool):
        super().__init__(runner, state, buffers, drafter, stats)
        self.per_row = per_row
        self._verify = self._packed if runner.packed_width else self._padded
        if not per_row:
            self.measured = super().measured  # priced by the replay tables per round shape (StepTable)

    def cost_model(self, shapes: list[RoundShape]) -> CostModel:
        """Timed replays of the captured steps: per row when the chains are packed, else per round shape."""
        runner, drafter = self.runner, self.drafter
        if self.per_row:
            return StaticPackedCosts(measure_verify=partial(packed_seconds, runner),
                                     measure_step=partial(drafter.draft_seconds, 1), bucket_of=runner.bucket)
        return StepTable(partial(shape_seconds, shapes, runner, drafter), runner.bucket)

    def prepare(self, shapes: list[RoundShape], acceptor: Acceptor, graphs: StepGraphs) -> None:
        declare_round_steps(shapes, self.runner, self.state, self.buffers, acceptor, self.drafter, graphs)

    def place(self, rows: list[int], lengths: list[int]) -> dict:
        return self._placed(self.runner.slot_index, None)  # every slot; the steps read lengths on the device

    def run(self, round: Round) -> Verified:
        verified = self._verify(round)
        self.drafter.learn_pending()
        return verified

    def measured(self, round: Round, verified: Verified, costs: CostModel | None) -> tuple | None:
        """The packed chains' prices from the timed replays (costs.StaticPackedCosts): their forwards are not timed."""
        if costs is not None and verified.forward is not None:
            return costs.round_costs(verified.forward[0], round.shape.depth)
        return None

    def _padded(self, round: Round) -> Verified:
        count_padded(self.stats, round)
        return Verified(self.runner.forward(round.draft.tokens, kv_len=kv_len(round), tree=round.tree,
                                            seqs=self.state.tokens, from_seqs=1))

    def _packed(self, round: Round) -> Verified:
        """Every running row its pending token and its own drafts (a tree row its nodes, the first node slots),
        idle slots nothing -> logits [num_slots, W, V]. A device tree's rows (no host counts) verify it whole."""
        draft, width = round.draft, round.shape.width
        num = draft.host_num if draft.host_num is not None else [width - 1] * len(round.plan.rows)
        running = set(round.plan.running)
        widths = [1 + min(n, width - 1) if i in running else 0 for i, n in enumerate(num)]
        logits, n = self.runner.static_steps.verify_packed(widths, width, kv_len(round), self.state.tokens,
                                                           self.buffers.drafts, round.tree)
        self.stats.forward(n, n - sum(widths), 0)
        return Verified(logits, (n, 0.0))  # its tokens; its time is not measured (a sync): the replay tables price it


class PackedPass(_Pass):
    """The round's one target forward, packed (packed.py): per deciding row its pending token and its own drafts
    (a tree row its nodes), behind its last prompt chunk when this round ends its prompt; the other prompt chunks.
    A pass's prompt chunks stay cached (their slots' lengths move on, samples copy a finished prompt), and a
    drafter that reads the target's hidden states (EAGLE) takes the chunks' in before that."""

    per_row = True

    def __init__(self, runner: ModelRunner, state: SlotState, buffers: RoundBuffers, drafter: Drafter,
                 stats: Statistics):
        super().__init__(runner, state, buffers, drafter, stats)
        self._fills = HostBuffer((2, runner.num_slots), runner.device)  # the slots a round prefilled, their new lengths

    def cost_model(self, shapes: list[RoundShape]) -> CostModel:
        return PackedCosts()  # the forward by its tokens, the drafting forwards by their rows (timed eagerly)

    def start_costs(self, costs: CostModel | None, payoff: PayoffCheck | None, *, batch_size: int,
                    k_max: int) -> StartupCosts:
        """Packed rounds under adaptive speculation start from the machine's costs (round_prices.py)."""
        if costs is None:
            return StartupCosts((), ())
        return start_from_machine(costs, payoff, self.runner, self.drafter, batch_size=batch_size, k_max=k_max)

    def place(self, rows: list[int], lengths: list[int]) -> dict:
        # Host lengths: a first decision's L = P before its last chunk is cached.
        return self._placed(self._rows.put(rows), self._lengths.put(lengths))

    def measured(self, round: Round, verified: Verified, costs: CostModel | None) -> tuple | None:
        return (*verified.forward, self.drafter.step_times())  # timed eagerly (costs.PackedCosts)

    def run(self, round: Round) -> Verified:
        """-> logits [b, W, V] of the deciding rows (None when no row decides)."""
        plan, tree, draft = round.plan, round.tree, round.draft
        b = len(plan.rows)
        width = round.shape.width if b else 1
        num = draft.host_num if b and draft.host_num is not None else [width - 1] * b
        layout = layout_round(plan.rows, plan.lengths, [1 + min(n, width - 1) for n in num], width, plan.fills,
                              tree is not None)
        if width > 1:  # the drafts go where they will be verified: the forward reads its tokens from there
            self.state.write(plan.rows_t, plan.lengths_t, draft.tokens)
        batch = self.runner.pack(layout.rows, keep=layout.keep, tree=tree)
        started = wall(self.device)
        logits = self.runner.forward_packed(self.state.tokens[batch.slots, batch.index], batch)
        forward = (batch.num_tokens, wall(self.device) - started)
        filled = plan.chunk_tokens
        self.stats.forward(batch.num_tokens, 0, filled, forward[1] * filled / batch.num_tokens, forward[1])
        if self.runner.feature_layers:  # before the commit hands the other samples their copies
            self.drafter.packed_forward([(other, start, count, layout.chunk_at[slot, start])
                                         for (slot, start, count), slots in zip(plan.fills, plan.fill_slots)
                                         for other in slots],
                                        torch.tensor(layout.verify, device=self.device) if b else None)
        self._commit_fills(plan)
        if not b:
            return Verified(None, forward)
        if layout.full:
            return Verified(logits.view(b, width, -1), forward)
        return Verified(logits[torch.tensor(layout.gather, device=self.device)], forward)

    def _commit_fills(self, plan: Plan) -> None:
        """The prompt chunks a packed forward wrote stay cached: their slots' lengths move to the chunks'
        ends; samples of a request whose prompt is now in copy its cache (the round's plan names them)."""
        fills = plan.fills
        if not fills:
            return
        table = self._fills.put([[slot for slot, _, _ in fills], [start + count for _, start, count in fills]],
                                (2, len(fills)))
        self.runner.copy_lengths(table[0], table[1])
        for src, dst, length in plan.copies:
            self.runner.copy_prefix([src], [dst], length)
            self.runner.set_lengths(dst, length)


def kv_len(round: Round) -> int:
    """The cache entries a padded verify attends: the longest running row's and its drafts."""
    return max(round.plan.lengths[i] for i in round.plan.running) + round.shape.width - 1


def count_padded(stats: Statistics, round: Round) -> None:
    """A padded verify's tokens into the statistics: every row W, the padding past each row's drafts and the idle
    slots' whole rows."""
    width, num = round.shape.width, round.draft.host_num
    num = num or [width - 1] * len(round.plan.rows)
    running = round.plan.running
    padding = sum(width - 1 - num[i] for i in running) + (len(round.plan.rows) - len(running)) * width
    stats.forward(len(round.plan.rows) * width, padding, 0)
