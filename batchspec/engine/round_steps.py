"""The static path's round steps at start: every step a round may run, declared by the target's runner, the
Acceptor and the drafter, then captured (cuda_graphs); and their timed replays, the device seconds of each
round shape that adaptive speculation's cost table (costs.StepTable) reads."""

from __future__ import annotations

from .accept import Acceptor
from .drafters import Drafter
from .model.graphs import StepGraphs
from .round import RoundBuffers, RoundShape
from .model.runner import ModelRunner
from .slots import SlotState
from .model.timing import time_step


def declare_round_steps(shapes: list[RoundShape], runner: ModelRunner, state: SlotState, buffers: RoundBuffers,
                        acceptor: Acceptor, drafter: Drafter, graphs: StepGraphs) -> None:
    """Declare every static step a round may run, then capture them (cuda_graphs): largest first, one pool.
    The drafter's bind comes with the steps it declares."""
    b = buffers
    trees = {}
    for shape in shapes:
        if shape.tree is not None:
            w = shape.width
            trees[w] = type(b.tree)(b.tree.depth[:, :w], b.tree.ancestors[:, :w, :w], b.tree.parent_t[:, : w - 1],
                                    b.tree.rank[:, : w - 1], b.valid[:, : w - 1], shape.tree.depth)
    geometry = {w: (t.depth, t.ancestors) for w, t in trees.items()}
    runner.static_steps.declare(b.drafts, state.tokens, from_seqs=1, trees=geometry)
    runner.static_prefill.declare(state.tokens)
    if runner.packed_width:
        runner.static_steps.declare_packed(state.tokens, b.drafts, geometry)
    acceptor.declare_steps(shapes, trees)
    drafter.bind(shapes, runner, state, b, acceptor)
    graphs.capture_all(reset=runner.reset_lengths)


def shape_seconds(shapes: list[RoundShape], runner: ModelRunner, drafter: Drafter, kv_len: int) -> list[float]:
    """Device seconds of a round's forwards at this attended length, for every shape adaptive speculation
    chooses from (chains k = 0..k_max, then the trees): timed replays of the static steps."""
    return [time_step(runner, shape.width, kv_len, tree=shape.tree is not None)
            + drafter.draft_seconds(shape.depth, kv_len) for shape in shapes]
