"""SpecBatchGenerator: B fixed slots; each round schedule -> draft -> verify -> accept -> postprocess.

Per slot, with seq = prompt + output so far and L = len(seq):
  - the target cache holds seq[:L-1]; the last token g = seq[L-1] is pending. A new row's prompt of P
    tokens gets there in packed rounds, its first P - 1 tokens in chunks, and its first decision is a
    round with L = P (the static path prefills the prompt at admission and draws the first token from
    its last logits, as generate does);
  - a round feeds [g, d_1 .. d_k] at positions L-1 .. L-1+k and gets the target's distribution for
    positions L .. L+k in one forward (packed: each row its own k, and prompt chunks in the same forward);
  - acceptance keeps m drafts and one more token (recovered or bonus): L' = L + m + 1;
  - the cache length is set to L' - 1, O(1): the rejected entries are stale and never attended.
The host side (requests, slots, budgets, the round's shape, stops, statistics) is the Scheduler; the
device side is the ModelRunners (target, and a draft model's), the drafter and the Acceptor. On the
static path (a GPU) every round runs as steps captured at start over every slot: one per drafted token,
one verify (packed: each running row its own tokens or tree nodes, idle slots none; packed_static.py), one
acceptance, and one host sync; eager rounds (CPU) are packed: one forward of the deciding rows' own
tokens and of new prompts' chunks (packed.py).
Stops (EOS ids, stop strings, max_new_tokens, max_seq_len) are checked on emitted tokens only.
"""

from __future__ import annotations

import logging
import time
from typing import Iterable, Iterator

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .runstats import RunStats
from .types import Request, Result, TreeSpec
from .accept import Acceptor
from .control.adaptive import AdaptiveK
from .admission import Admitter
from .grammar.constrain import mask_round
from .drafters import Drafter
from .drafting import DraftStage
from .grammar.grammar import Grammars
from .model.graphs import StepGraphs
from .intake import Defaults
from .phases import NOISE, Timers
from .round import Round, RoundBuffers, RoundShape, Verified
from .control.round_prices import controllers
from .model.runner import ModelRunner
from .scheduler import Scheduler
from .model.shapes import kv_capacity, spare_slots_in_use
from .slot_life import SlotLife
from .slots import SlotState, SlotTable
from .control.startup_costs import StartupCosts
from .stats import Statistics, TokenCounts
from .stops import StopRules
from .model.threads import ThreadGuard
from .verify_pass import verify_pass

FILL_TOKENS = 1024  # prompt tokens a packed round prefills at most (see SpecBatchGenerator)
FORCED_DRAFTS = 4  # drafts a grammar may force per row and round with drafter none (eager path)
log = logging.getLogger("batchspec")


def check_trees(trees: tuple[TreeSpec, ...], drafter: Drafter, defaults: Defaults, adaptive: bool,
                forced_max: int) -> None:
    """Tree drafts need a drafter that proposes them; with a job-wide constraint, no adaptive speculation to
    choose chain rounds and no forced drafts (forced_max 0: a draft model's or EAGLE head's rows, or a lookup's
    with k = 0 on the static path; a constrained row then drafts nothing in a tree round) nothing would draft:
    say so."""
    if trees and not drafter.policy.trees:
        raise ValueError("this drafter proposes no trees")
    if trees and defaults.constraint is not None and not adaptive and forced_max == 0:
        log.warning("every row is constrained and every round drafts a tree: a constrained row drafts nothing in a "
                    "tree round but the tokens its grammar forces, and this drafter drafts none of those, so "
                    "nothing is drafted; chain drafts (no tree) draft under the grammar")


class SpecBatchGenerator:
    """Runs requests through `batch_size` slots; yields a Result as each request finishes.

    Args are plain values: the target model and tokenizer, a Drafter (drafters/), the job's defaults
    (intake.Defaults: sampling, max_new_tokens, stop strings, n, logprobs, which requests may override),
    the slot count, max_seq_len (prompt + completion tokens per slot), the EOS ids, keep_stop (completion
    texts keep the stop string that ended them), k_max (the most drafts per row per round), adaptive (choose each round's shape), trees
    (TreeSpecs of tree rounds: without adaptive every round drafts the first tree), graphs (the
    StepGraphs that runs static steps: its mode picks the eager or the static path; shared with the
    drafter), profile (sync a GPU after each phase, so that phase times are exact), and buckets (the
    attended lengths of static steps; default: 64, 128, ... up to the capacity), threads (a ThreadGuard
    that run() polls: torch's CPU threads back off while another process shares the cores), fill_tokens
    (the most prompt tokens one packed round prefills), pack_static (the static path's verifies, chains and
    trees, are packed, packed_static.py: every running row computes its own tokens; False: every slot the round's width),
    spare_slots (cache slots beyond batch_size whose prompts packed rounds prefill ahead, in waves, while
    batch_size rows decode; unused on other paths: build_generator).

    Eager forwards of a model whose attention transformers dispatches are packed (packed.py): a round's
    one target forward carries each deciding row's pending token and its own drafts, and chunks of new
    rows' prompts (admission has no forward of its own; a row's first token comes from the round its
    last chunk lands in). Exceptions prefill at admission, as the static path does: rows that want their
    prompt's logprobs, and every row when the drafter reads the target's hidden states (EAGLE).
    """

    def __init__(self, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, drafter: Drafter,
                 defaults: Defaults, batch_size: int, max_seq_len: int, eos_token_ids: Iterable[int],
                 graphs: StepGraphs, keep_stop: bool = False, k_max: int = 4, adaptive: bool = False,
                 trees: tuple[TreeSpec, ...] = (), profile: bool = False, buckets: list[int] | None = None,
                 threads: ThreadGuard | None = None, fill_tokens: int = FILL_TOKENS,
                 forced_drafts: int = FORCED_DRAFTS, pack_static: bool = True, spare_slots: int = 0):
        sampling = defaults.sampling
        if batch_size < 1 or k_max < 0 or defaults.max_new_tokens < 1 or max_seq_len < 2:
            raise ValueError(f"need batch_size >= 1, k >= 0, max_new_tokens >= 1, max_seq_len >= 2; got "
                             f"{batch_size}, {k_max}, {defaults.max_new_tokens}, {max_seq_len}")
        self.drafter, self.sampling, self.graphs = drafter, sampling, graphs
        self.batch_size, self.max_seq_len, self.k_max, self.trees = batch_size, max_seq_len, k_max, tuple(trees)
        self.device, self.static = target.device, graphs.static
        self.threads = threads
        self.shapes = [RoundShape(drafts=k) for k in range(k_max + 1)] + [RoundShape(tree=t) for t in self.trees]
        # Forced drafts ride in the widths there are: on the static path the captured ones (k_max); a drafter
        # that drafts on the device (a draft model, EAGLE) keeps its own drafts (its caches follow them).
        self.forced_max = (0 if drafter.policy.draft_forwards else
                           min(forced_drafts, k_max) if self.static or k_max > 0 else forced_drafts)
        check_trees(trees, drafter, defaults, adaptive, self.forced_max)
        widest = max([shape.width for shape in self.shapes] + [self.forced_max + 1])
        capacity = kv_capacity(max_seq_len, max(k_max, self.forced_max), self.trees)
        # A drafter that reads the target's hidden states (EAGLE-3) names the layers: every forward hands them out.
        slots = batch_size + spare_slots
        self.runner = ModelRunner(target, num_slots=slots, capacity=capacity, max_position=max_seq_len,
                                  graphs=graphs, widths={shape.width for shape in self.shapes}, buckets=buckets,
                                  name="target", feature_layers=drafter.feature_layers,
                                  packed_width=1 + max(k_max, self.forced_max) if pack_static else 0)
        vocab = self.runner.vocab_size
        self.state = SlotState(slots, capacity, vocab, self.device,
                               track_presence=sampling.repetition_penalty != 1.0)
        self.buffers = RoundBuffers(slots, widest - 1, vocab, self.device, noise=sampling.coupled,
                                    probs=not (sampling.greedy or sampling.coupled) and drafter.policy.draft_forwards,
                                    trees=bool(self.trees))
        stops = StopRules(tokenizer, eos_token_ids=eos_token_ids, max_seq_len=max_seq_len, device=self.device,
                          keep_stop=keep_stop)
        self.timers = Timers(self.device, sync=profile, counter=graphs.counter)  # phases.py: every stage's seconds
        self.statistics = Statistics(max([k_max, *(t.depth for t in self.trees)]), k_max, self.timers)
        self.grammars = Grammars(tokenizer, vocab_size=vocab, eos_ids=sorted(stops.eos_ids), timers=self.timers)
        self.acceptor = Acceptor(self.runner, self.state, self.buffers, sampling=sampling, stops=stops, graphs=graphs,
                                 counter=graphs.counter, logprobs=defaults.max_logprobs, grammars=self.grammars)
        # The static path's packed chains give each row its own number of drafts too; with trees offered a round
        # takes one shape, priced by its timed replays (per-row choices there measured 0.74x for suffix, CPU).
        self.verify = verify_pass(self.runner, self.state, self.buffers, drafter, self.statistics,
                                  per_row=bool(self.static and self.runner.packed_width and not self.trees))
        controller, payoff = (controllers(self.verify.cost_model(self.shapes), drafter, per_row=self.verify.per_row,
                                          k_max=k_max, trees=self.trees) if adaptive else (None, None))
        self.packed = self.runner.packs
        # Spare slots serve packed rounds only (spare_slots_in_use: not with EAGLE either); elsewhere the table holds
        # batch_size slots, so no more rows than that run (the caches' spare slots stay unused).
        self.spare_slots = spare_slots_in_use(spare_slots, static=self.static, drafter=drafter) if self.packed else 0
        self.life = SlotLife(SlotTable(batch_size + self.spare_slots), grammars=self.grammars, adaptive=controller,
                             runner=self.runner, state=self.state, drafter=drafter)
        self.scheduler = Scheduler(tokenizer, stops, life=self.life, vocab_size=vocab, max_seq_len=max_seq_len,
                                   defaults=defaults, k_max=k_max, trees=self.trees, static=self.static,
                                   fill_budget=fill_tokens if self.packed else 0, per_row=self.verify.per_row,
                                   payoff=payoff, stats=self.statistics, place=self.verify.place,
                                   decoding=batch_size if self.spare_slots else None,
                                   wave=max(1, self.spare_slots // 2))
        self.startup: StartupCosts | None = None  # the costs adaptive speculation started from (the first run())
        self.admitter = Admitter(self.runner, self.state, self.acceptor, self.life)
        self.drafting = DraftStage(drafter, self.scheduler, self.acceptor, self.grammars, self.buffers,
                                   forced_max=self.forced_max, coupled=sampling.coupled, timers=self.timers,
                                   per_row=self.verify.per_row)
        self.verify.prepare(self.shapes, self.acceptor, graphs)  # the drafter bound, a captured path's steps declared

    # ---- what callers read ----------------------------------------------------------------------

    @property
    def stats(self):
        return self.statistics.run

    @property
    def adaptive(self) -> AdaptiveK | None:
        return self.scheduler.adaptive

    @property
    def tokens(self) -> TokenCounts:
        """What target forwards computed so far (stats.TokenCounts)."""
        return self.statistics.forwards

    @property
    def timings(self) -> dict[str, float]:
        """Seconds per phase of the rounds (phases.py; exact on a GPU only with profile)."""
        return self.timers.phases

    @property
    def noise_s(self) -> float:
        """Seconds spent making coupled sampling's noise (inside the draft phase)."""
        return self.timers.seconds[NOISE]

    @property
    def capture_s(self) -> float:
        """Seconds spent capturing (or compiling) steps so far."""
        return self.graphs.capture_s

    def reset_stats(self) -> None:
        """Start the run statistics and phase times afresh (a benchmark's next repeat)."""
        self.statistics.reset()

    def continue_stats(self, stats: RunStats) -> None:
        """Count into `stats` from now on (an earlier generator's, widened to this one's drafts): one run's
        statistics across generators that follow each other (a self-training job's phases)."""
        self.statistics.continue_into(stats)

    def stop_admitting(self) -> None:
        """Finish the requests in flight, take no new ones; run() then returns."""
        self.scheduler.stop_admitting()

    def cut_short(self) -> list[Result]:
        """Finish every running request now with the tokens it has (finish_reason "length"), take no new
        ones, and return their Results; run() then ends. For callers with a deadline (train_draft's data
        phase), whose rows in flight would otherwise be lost. Rows still waiting for their first token come
        back with an empty completion."""
        self.stop_admitting()
        return self._release(self.scheduler.cut_short())

    # ---- the loop --------------------------------------------------------------------------------

    def run(self, requests: Iterable[Request]) -> Iterator[Result]:
        """Pull requests lazily as slots free up; yield Results in completion order."""
        if self.startup is None:
            adaptive = self.scheduler.adaptive
            self.startup = self.verify.start_costs(adaptive.costs if adaptive is not None else None,
                                                   self.scheduler.payoff, batch_size=self.batch_size, k_max=self.k_max)
        self.scheduler.feed(requests)
        try:
            while True:
                if self.threads is not None:
                    self.threads.poll()
                yield from self._admit()
                if self.scheduler.done:
                    return
                if self.scheduler.slots.active():
                    yield from self.step()
        finally:
            if self.threads is not None:
                self.threads.restore()

    @torch.inference_mode()
    def step(self) -> list[Result]:
        """One round over the running requests: schedule -> draft -> verify -> accept -> commit; returns the
        requests it finished."""
        started = time.perf_counter()
        with self.timers.phase("draft"):
            round = self.drafting.run(self.scheduler.schedule())
        with self.timers.phase("verify"):
            verified = self.verify.run(round)
        if not round.plan.rows:  # a round that only prefilled
            return []
        with self.timers.phase("accept"):
            outcome = self._accept(round, verified)
        return self._commit(round, verified, outcome, started)

    def _accept(self, round: Round, verified: Verified):
        """The round's verdict (accept.py), constrained rows first masked by their grammars at every verify
        position."""
        logits = verified.logits
        if self.grammars.rows:
            mask_round(round, logits, self.grammars, self.scheduler.slots, self.state.tokens)
        return self.acceptor.accept(round, logits)

    def _commit(self, round: Round, verified: Verified, outcome, started: float) -> list[Result]:
        """The verdict into outputs, stops and Results (postprocess.py); the drafter, the finished rows' slots
        and adaptive speculation (what the round cost, what it accepted) follow it."""
        with self.timers.phase("bookkeeping"):
            finished, emitted = self.scheduler.outcomes.postprocess(round, outcome)
            self.life.advance(emitted.slots, emitted.tokens, emitted.num_accepted, emitted.path)
            results = self._release(finished)
        adaptive = self.scheduler.adaptive
        costs = self.verify.measured(round, verified, adaptive.costs if adaptive is not None else None)
        self.scheduler.learn(round, emitted, time.perf_counter() - started, costs,
                             tokens=[len(outcome.emitted[i]) for i in round.plan.running], forward=verified.forward,
                             ended=[r.completion_tokens for r in results if r.error is None])
        return results

    # ---- admission -------------------------------------------------------------------------------

    @torch.inference_mode()
    def _admit(self) -> list[Result]:
        with self.timers.phase("admit"):
            seats, errors = self.scheduler.intake()
            if not seats:
                return errors
            seated = self.admitter.admit(seats)  # the device side, a value the host's part reads
            finished = self.scheduler.seated(seated)
            self.admitter.extend(seated, finished)
            return errors + self._release(finished)

    def _release(self, finished: list[tuple[int, Result]]) -> list[Result]:
        """The finished rows' slots released (slot_life.py); their Results."""
        self.life.release([slot for slot, _ in finished])
        return [result for _, result in finished]
