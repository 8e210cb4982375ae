"""The round's draft stage: a Plan in, the drafted Round out (built once; the verify pass and the Acceptor only
read it): the shape and each row's number of drafts the choice gave it, the drafts, the coupled noise, a tree's
geometry and a grammar's forced drafts.

Two orders, by what the drafter can tell before it drafts:
  - a drafter that proposes first (host lookups: ngram, prompt_lookup, suffix) proposes its most (the plan's
    limits); adaptive speculation then chooses the shape and each row's budget from what is on the table (and
    the drafter's own priors), and the proposals are cut to it;
  - others (a draft model, an EAGLE head) are asked for the chosen budgets (a Choice), with the coupled noise.
Structured output then cuts drafts the grammar refuses and adds the tokens it forces (constrain.py); in a tree
round a constrained row's forced tokens are its chain of nodes.
"""

from __future__ import annotations

import torch

from .accept import Acceptor
from .grammar.constrain import constrain_drafts, constrain_tree
from .drafters import Drafter
from .grammar.grammar import Grammars
from .phases import NOISE, Timers
from .drafters.base import empty_draft
from .round import Choice, Draft, Plan, Round, RoundBuffers, RoundShape
from .scheduler import Scheduler


class DraftStage:
    """Builds a round's drafts. Plain arguments: the drafter, the scheduler (which chooses shapes and budgets),
    the Acceptor (the coupled noise, a tree's geometry), the grammars and buffers of structured output, the
    most drafts a grammar may force per row (`forced_max`), whether sampling is coupled, and the run's timers
    (the noise's seconds)."""

    def __init__(self, drafter: Drafter, scheduler: Scheduler, acceptor: Acceptor, grammars: Grammars,
                 buffers: RoundBuffers, *, forced_max: int, coupled: bool, timers: Timers, per_row: bool):
        self.drafter, self.scheduler, self.acceptor = drafter, scheduler, acceptor
        self.grammars, self.buffers = grammars, buffers
        self.forced_max, self.coupled, self.timers = forced_max, coupled, timers
        # Chosen once, by the verify pass (per_row: each row verifies its own number of drafts): such rows take
        # their own cut of a lookup's proposals and coupled noise only where their drafts can be decided; a
        # padded verify's rows share the round's width.
        self._cut = self._cut_rows if per_row else self._cut_round
        self._noise_drafts = self._budgets if per_row else self._every_position

    def run(self, plan: Plan) -> Round:
        """The plan's drafted round (a plan without rows, one that only prefills, drafts nothing)."""
        drafter, scheduler, draft, proposed = self.drafter, self.scheduler, None, None
        if not plan.rows:
            return Round(plan, RoundShape(), [], empty_draft(self.buffers, 0))
        if drafter.policy.propose_first and scheduler.adaptive is not None:
            offered = drafter.propose(plan, Choice(plan.limits))
            shape, budgets = scheduler.choose(plan, offered.host_num, offered.priors)
            if shape.tree is None:
                draft = self._cut(offered, shape, budgets)
                proposed = offered.host_tokens  # what the cut left unverified, adaptive judges in hindsight
        else:
            shape, budgets = scheduler.choose(plan)
        gumbel = None
        if self.coupled:
            gumbel = self._noise(plan, shape.width, self._noise_drafts(shape, budgets))
        if draft is None:  # the drafters that draft after the choice (a draft model samples with the coupled noise)
            choice = Choice(budgets, gumbel)
            draft = drafter.propose_tree(plan, choice, shape.tree) if shape.tree else drafter.propose(plan, choice)
        if shape.tree is not None:
            forced = None
            if self.grammars.rows and self.forced_max:  # a lookup's tree (a drafter with forwards forces none)
                draft, forced = constrain_tree(plan, draft, self.grammars, self.scheduler.slots, self.buffers,
                                               self.forced_max)
            tree = self.acceptor.shape_tree(draft, shape.tree.depth)
            return Round(plan, shape, budgets, draft, gumbel, tree=tree, forced=forced)
        shape, draft, forced, gumbel = self._constrain(plan, shape, draft, gumbel)
        return Round(plan, shape, budgets, draft, gumbel, forced=forced, proposed=proposed)

    def _constrain(self, plan: Plan, shape: RoundShape, draft: Draft, gumbel: torch.Tensor | None):
        """Structured output: drafts a grammar refuses are cut and the tokens it forces are added; the shape is
        the drafts' width (forced drafts widen it, a lookup's short proposals narrow it). Returns the shape, the
        drafts, each row's forced drafts (None: no row has any) and the coupled noise (wider with the drafts)."""
        forced, widened = None, False
        if self.grammars.rows:
            constrained = constrain_drafts(plan, draft, self.grammars, self.scheduler.slots, self.buffers,
                                           self.forced_max)
            if constrained is not None:
                draft, forced = constrained
                widened = draft.tokens.shape[1] > shape.drafts
                if widened and self.coupled:  # the same noise, wider
                    gumbel = self._noise(plan, 1 + draft.tokens.shape[1])
        if widened or draft.tokens.shape[1] < shape.drafts:
            shape = RoundShape(drafts=draft.tokens.shape[1])
        return shape, draft, forced, gumbel

    def _cut_rows(self, offered: Draft, shape: RoundShape, budgets: list[int]) -> Draft:
        return offered.cut(budgets, self.buffers)  # each row to its own budget

    def _cut_round(self, offered: Draft, shape: RoundShape, budgets: list[int]) -> Draft:
        return offered.truncate(shape.drafts)  # every row to the round's width

    def _budgets(self, shape: RoundShape, budgets: list[int]) -> list[int] | None:
        """A chain round's row i verifies at most budgets[i] drafts: its noise is needed at positions
        0 .. budgets[i] only (a grammar may force drafts past a budget, and a tree's nodes are not its depth:
        then every position)."""
        return budgets if shape.tree is None and not self.grammars.rows else None

    @staticmethod
    def _every_position(shape: RoundShape, budgets: list[int]) -> None:
        return None  # a padded verify's noise at every position (the static path's is every slot's anyway)

    def _noise(self, plan: Plan, width: int, drafts: list[int] | None = None) -> torch.Tensor:
        """The coupled noise of the round's rows at positions L .. L + width - 1 (accept.py); with `drafts`, only
        where a row's drafts can be decided."""
        with self.timers.timed(NOISE):
            return self.acceptor.noise(plan, width, drafts)
