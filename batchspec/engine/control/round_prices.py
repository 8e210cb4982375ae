"""Where adaptive speculation's prices come from on each path: the cost model it starts with and the machine's
costs it reads at start (costs.py, startup_costs.py); what each round measured comes from its verify pass
(verify_pass.py: `measured`)."""

from __future__ import annotations

import logging
from functools import partial

from . import startup_costs
from .adaptive import AdaptiveK
from .costs import CostModel, PackedCosts, RoundTimes, StaticPackedCosts, StepTable
from ..drafters import Drafter
from .payoff import PayoffCheck
from ..round import RoundShape
from ..types import TreeSpec
from ..round_steps import shape_seconds
from ..model.runner import ModelRunner
from .startup_costs import StartupCosts
from ..model.timing import packed_seconds

WARMUP_WITH_COSTS = 8  # the payoff check's warm-up rounds when the round costs were measured at start (payoff.py)
log = logging.getLogger("batchspec")


def cost_model(runner: ModelRunner, drafter: Drafter, shapes: list[RoundShape], *, static: bool,
               static_per_row: bool) -> CostModel:
    """Timed replays of the captured steps (static; per row when its chains are packed), packed rounds' forwards
    by their tokens (eager packed), or whole rounds' wall time."""
    if static_per_row:
        return StaticPackedCosts(measure_verify=partial(packed_seconds, runner),
                                 measure_step=partial(drafter.draft_seconds, 1), bucket_of=runner.bucket)
    if static:
        return StepTable(partial(shape_seconds, shapes, runner, drafter), runner.bucket)
    return PackedCosts() if runner.packs else RoundTimes()


def controllers(runner: ModelRunner, drafter: Drafter, shapes: list[RoundShape], *, k_max: int,
                trees: tuple[TreeSpec, ...], static_per_row: bool) -> tuple[AdaptiveK | None, PayoffCheck | None]:
    """Adaptive speculation's controller over the round's shapes, and the payoff check that holds it to drafter
    none's rate where the rounds' costs are measured per row (packed rounds, the static path's packed chains);
    (None, None) when there is nothing to choose (k_max 0, no trees)."""
    if k_max == 0 and not trees:
        return None, None
    costs = cost_model(runner, drafter, shapes, static=runner.static, static_per_row=static_per_row)
    payoff = PayoffCheck() if runner.packs or static_per_row else None
    return AdaptiveK(k_max, policy=drafter.policy, costs=costs, trees=trees), payoff


def start_from_machine(costs: CostModel, payoff: PayoffCheck | None, runner: ModelRunner, drafter: Drafter, *,
                       batch_size: int, k_max: int) -> StartupCosts:
    """Packed rounds start from the machine's costs, measured before the first row is admitted or read from the
    cache; the payoff check's warm-up, which learnt them, is then shortened."""
    measured = startup_costs.for_runner(runner, drafter, batch_size=batch_size, k_max=k_max)
    costs.start_from(measured)
    if payoff is not None and measured.verify:
        payoff.warmup_rounds = WARMUP_WITH_COSTS
    points = sorted(measured.verify)
    log.info("costs: the forward at %s (%s)", ", ".join(f"{n} tokens {1e3 * t:.1f} ms" for n, t in points[:4])
             + (f", ... {points[-1][0]} tokens {1e3 * points[-1][1]:.1f} ms" if len(points) > 4 else ""),
             "from the cache" if measured.cached else f"{len(points)} sizes measured in {measured.seconds:.2f} s")
    return measured

