"""Adaptive speculation's controller and payoff check, with the cost model the round's verify path prices by
(verify_pass.py: `cost_model`; costs.py), and the machine's costs it reads at start (startup_costs.py); what each
round measured comes from its verify pass too (`measured`)."""

from __future__ import annotations

import logging

from . import startup_costs
from .adaptive import AdaptiveK
from .costs import CostModel
from ..drafters import Drafter
from .payoff import PayoffCheck
from ..types import TreeSpec
from ..model.runner import ModelRunner
from .startup_costs import StartupCosts

WARMUP_WITH_COSTS = 8  # the payoff check's warm-up rounds when the round costs were measured at start (payoff.py)
log = logging.getLogger("batchspec")


def controllers(costs: CostModel, drafter: Drafter, *, per_row: bool, k_max: int,
                trees: tuple[TreeSpec, ...]) -> tuple[AdaptiveK | None, PayoffCheck | None]:
    """Adaptive speculation's controller, pricing rounds by `costs` (the verify path's cost model,
    verify_pass.py), and the payoff check that holds it to drafter none's rate where each row gets its own number
    of drafts (per_row: packed rounds, the static path's packed chains); (None, None) when there is nothing to
    choose (k_max 0, no trees)."""
    if k_max == 0 and not trees:
        return None, None
    return AdaptiveK(k_max, policy=drafter.policy, costs=costs, trees=trees), PayoffCheck() if per_row else None


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

