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
one verify (a chain's packed: each running row its own tokens, idle slots none; packed_static.py), one
acceptance, and one host sync; eager rounds (CPU) are packed: one forward of the deciding rows' own
tokens and of new prompts' chunks (packed.py).
Stops (EOS ids, stop strings, max_new_tokens, max_seq_len) are checked on emitted tokens only.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import Iterable, Iterator

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..runstats import RunStats
from ..types import Request, Result, TreeSpec
from .accept import Acceptor
from .adaptive import AdaptiveK
from .admission import Admitter
from .constrain import constrain_drafts, mask_round
from .costs import PackedCosts, RoundTimes, StaticPackedCosts, StepTable
from .drafters import Drafter
from .grammar import Grammars
from .graphs import HostBuffer, StepGraphs
from .intake import Defaults
from .payoff import PayoffCheck
from .round import Round, RoundBuffers, RoundShape, Verified
from .round_steps import declare_round_steps, shape_seconds
from .timing import packed_seconds
from .runner import ModelRunner
from .scheduler import Scheduler
from .shapes import kv_capacity
from .slots import SlotState
from .startup_costs import StartupCosts, cache_key, load_or_measure
from .startup_costs import measure as measure_startup
from .stops import StopRules
from .threads import ThreadGuard
from .verify_pass import TokenCounts, Verifier

PHASES = ("admit", "draft", "verify", "accept", "bookkeeping")
FILL_TOKENS = 1024  # prompt tokens a packed round prefills at most (see SpecBatchGenerator)
FORCED_DRAFTS = 4  # drafts a grammar may force per row and round with drafter none (eager path)
WARMUP_WITH_COSTS = 8  # the payoff check's warm-up rounds when the round costs were measured at start (payoff.py)
log = logging.getLogger("batchspec")


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
    (the most prompt tokens one packed round prefills), pack_static (the static path's chain verifies are
    packed, packed_static.py: every running row computes its own tokens; False: every slot the round's width).

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
                 forced_drafts: int = FORCED_DRAFTS, pack_static: bool = True):
        sampling = defaults.sampling
        if batch_size < 1 or k_max < 0 or defaults.max_new_tokens < 1 or max_seq_len < 2:
            raise ValueError(f"need batch_size >= 1, k >= 0, max_new_tokens >= 1, max_seq_len >= 2; got "
                             f"{batch_size}, {k_max}, {defaults.max_new_tokens}, {max_seq_len}")
        if trees and not drafter.policy.trees:
            raise ValueError("this drafter proposes no trees")
        self.drafter, self.sampling, self.graphs = drafter, sampling, graphs
        self.batch_size, self.max_seq_len, self.k_max, self.trees = batch_size, max_seq_len, k_max, tuple(trees)
        self.device, self.static = target.device, graphs.static
        self.threads = threads
        self.shapes = [RoundShape(drafts=k) for k in range(k_max + 1)] + [RoundShape(tree=t) for t in self.trees]
        # Forced drafts ride in the widths there are: on the static path the captured ones (k_max); a drafter
        # that drafts on the device (a draft model, EAGLE) keeps its own drafts (its caches follow them).
        self.forced_max = (0 if drafter.policy.draft_forwards else
                           min(forced_drafts, k_max) if self.static or k_max > 0 else forced_drafts)
        widest = max([shape.width for shape in self.shapes] + [self.forced_max + 1])
        capacity = kv_capacity(max_seq_len, max(k_max, self.forced_max), self.trees)
        # A drafter that reads the target's hidden states (EAGLE-3) names the layers: every forward hands them out.
        self.runner = ModelRunner(target, num_slots=batch_size, capacity=capacity, max_position=max_seq_len,
                                  graphs=graphs, widths={shape.width for shape in self.shapes}, buckets=buckets,
                                  name="target", feature_layers=drafter.feature_layers,
                                  packed_width=1 + max(k_max, self.forced_max) if pack_static else 0)
        vocab = self.runner.vocab_size
        self.state = SlotState(batch_size, capacity, vocab, self.device,
                               track_presence=sampling.repetition_penalty != 1.0)
        self.buffers = RoundBuffers(batch_size, widest - 1, vocab, self.device, noise=sampling.coupled,
                                    probs=not (sampling.greedy or sampling.coupled) and drafter.policy.draft_forwards,
                                    trees=bool(self.trees))
        stops = StopRules(tokenizer, eos_token_ids=eos_token_ids, max_seq_len=max_seq_len, device=self.device,
                          keep_stop=keep_stop)
        self.grammars = Grammars(tokenizer, vocab_size=vocab, eos_ids=sorted(stops.eos_ids))
        self.acceptor = Acceptor(self.runner, self.state, self.buffers, sampling=sampling, stops=stops, graphs=graphs,
                                 counter=graphs.counter, logprobs=defaults.max_logprobs, grammars=self.grammars)
        controller = None
        # The static path's packed chains give each row its own number of drafts too (without trees, whose
        # verify is not packed there).
        self.static_per_row = bool(self.static and self.runner.packed_width and not self.trees)
        if adaptive and (k_max > 0 or self.trees):
            controller = AdaptiveK(k_max, policy=drafter.policy, costs=self._costs(drafter), trees=self.trees)
        self.packed = self.runner.packs
        self.scheduler = Scheduler(tokenizer, stops, num_slots=batch_size, vocab_size=vocab, max_seq_len=max_seq_len,
                                   defaults=defaults, k_max=k_max, trees=self.trees, adaptive=controller,
                                   static=self.static, fill_budget=fill_tokens if self.packed else 0,
                                   grammars=self.grammars, per_row=self.static_per_row,
                                   payoff=PayoffCheck() if controller is not None and (self.packed or self.static_per_row)
                                   else None)
        self.timings = dict.fromkeys(PHASES, 0.0)  # seconds per phase (exact on a GPU only with profile)
        self.noise_s = 0.0  # seconds making coupled sampling's noise (inside the draft phase)
        self.startup: StartupCosts | None = None  # the costs adaptive speculation started from (the first run())
        self._sync_phases = profile and self.device.type == "cuda"
        self.admitter = Admitter(self.runner, self.state, self.acceptor, drafter)
        self._released = HostBuffer((batch_size,), self.device)
        self._rows = HostBuffer((batch_size,), self.device)  # an eager round's rows
        self._lengths = HostBuffer((batch_size,), self.device)  # their lengths L (packed rounds)
        self.verifier = Verifier(self.runner, self.state, drafter, self.scheduler)
        if self.static:
            declare_round_steps(self.shapes, self.runner, self.state, self.buffers, self.acceptor, drafter, graphs)
        else:
            drafter.bind(self.shapes, self.runner, self.state, self.buffers, self.acceptor)

    def _costs(self, drafter: Drafter):
        """What adaptive speculation prices rounds by (costs.py): timed replays of the captured steps (static),
        packed rounds' forwards by their tokens (eager packed), or whole rounds' wall time."""
        runner = self.runner
        if self.static_per_row:
            return StaticPackedCosts(measure_verify=partial(packed_seconds, runner),
                                     measure_step=partial(drafter.draft_seconds, 1), bucket_of=runner.bucket)
        if self.static:
            return StepTable(partial(shape_seconds, self.shapes, runner, drafter), runner.bucket)
        return PackedCosts() if runner.packs else RoundTimes()

    # ---- what callers read ----------------------------------------------------------------------

    @property
    def stats(self):
        return self.scheduler.stats.run

    @property
    def adaptive(self) -> AdaptiveK | None:
        return self.scheduler.adaptive

    @property
    def tokens(self) -> TokenCounts:
        """What target forwards computed so far (verify_pass.TokenCounts)."""
        return self.verifier.tokens

    @property
    def capture_s(self) -> float:
        """Seconds spent capturing (or compiling) steps so far."""
        return self.graphs.capture_s

    def reset_stats(self) -> None:
        """Start the run statistics and phase times afresh (a benchmark's next repeat)."""
        self.scheduler.stats.reset()
        self.timings = dict.fromkeys(PHASES, 0.0)
        self.noise_s = 0.0
        self.verifier.tokens = TokenCounts()
        self.grammars.mask_s = self.grammars.compile_s = 0.0

    def continue_stats(self, stats: RunStats) -> None:
        """Count into `stats` from now on (an earlier generator's, widened to this one's drafts): one run's
        statistics across generators that follow each other (a self-training job's phases)."""
        fresh = self.scheduler.stats.run
        stats.widen(len(fresh.proposed_by_position), len(fresh.rounds_by_k) - 1)  # e.g. after drafter=none's k=0
        self.scheduler.stats.run = stats

    def stop_admitting(self) -> None:
        """Finish the requests in flight, take no new ones; run() then returns."""
        self.scheduler.admitting = False

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
            self.startup = self._startup_costs()
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
        with self._phase("draft"):
            round = self._schedule()
            if round.rows:
                round = self._draft(round)
        with self._phase("verify"):
            verified = self.verifier.run(round)
            if self.static:  # a captured verify runs on the device: the idle host does the drafter's put-off work
                self.drafter.learn_pending()
        if not round.rows:  # a round that only prefilled
            return []
        with self._phase("accept"):
            outcome = self._accept(round, verified)
        return self._commit(round, verified, outcome, started)

    def _accept(self, round: Round, verified: Verified):
        """The round's verdict (accept.py), constrained rows first masked by their grammars at every verify
        position."""
        logits = verified.logits
        if self.grammars.rows:
            mask_round(round, logits, self.grammars, self.scheduler.slots, self.state.tokens, self.static)
        return self.acceptor.accept(round, logits)

    def _commit(self, round: Round, verified: Verified, outcome, started: float) -> list[Result]:
        """The verdict into outputs, stops and Results (postprocess.py); the drafter, the finished rows' slots
        and adaptive speculation (what the round cost, what it accepted) follow it."""
        with self._phase("bookkeeping"):
            finished, emitted = self.scheduler.postprocess(round, outcome)
            self.drafter.extend(emitted.slots, emitted.tokens, emitted.num_accepted, emitted.path)
            results = self._release(finished)
        self.scheduler.learn(round, emitted, time.perf_counter() - started, self._round_costs(round, verified),
                             tokens=[len(outcome.emitted[i]) for i in round.running], forward=verified.forward)
        return results

    def _round_costs(self, round: Round, verified: Verified) -> tuple | None:
        """A packed round's (forward tokens, forward seconds, drafting forwards' (tokens, seconds)) for adaptive
        speculation's prices: measured eagerly, from the timed replays on the static path; None otherwise."""
        if self.packed:
            return (*verified.forward, self.drafter.step_times())
        if self.static_per_row and self.scheduler.adaptive is not None and verified.forward is not None:
            return self.scheduler.adaptive.costs.round_costs(verified.forward[0], round.shape.depth)
        return None

    def _startup_costs(self) -> StartupCosts:
        """Packed rounds under adaptive speculation start from the machine's costs (startup_costs.py), measured
        before the first row is admitted or read from the cache."""
        adaptive = self.scheduler.adaptive
        if adaptive is None or not self.packed:
            return StartupCosts((), ())
        key = cache_key(self.runner.model, self.drafter, batch_size=self.batch_size, k_max=self.k_max,
                        device=self.device)
        step = self.drafter.step_seconds if self.drafter.policy.draft_forwards else None
        costs = load_or_measure(key, lambda: measure_startup(self.runner, step, batch_size=self.batch_size,
                                                             k_max=self.k_max))
        adaptive.costs.start_from(costs)
        if self.scheduler.payoff is not None and costs.verify:  # its warm-up learnt the costs: they are known
            self.scheduler.payoff.warmup_rounds = WARMUP_WITH_COSTS
        log.info("costs: %s (%s)", ", ".join(f"{n} tokens {1e3 * t:.1f} ms" for n, t in costs.verify),
                 "from the cache" if costs.cached else f"measured in {costs.seconds:.2f} s")
        return costs

    # ---- admission -------------------------------------------------------------------------------

    @torch.inference_mode()
    def _admit(self) -> list[Result]:
        with self._phase("admit"):
            seats, errors = self.scheduler.intake()
            return errors + (self._release(self.admitter.admit(seats, self.scheduler)) if seats else [])

    def _release(self, finished: list[tuple[int, Result]]) -> list[Result]:
        """Free the finished rows' slots: idle slots ride along from position 0."""
        if finished:
            slots = [slot for slot, _ in finished]
            index = self._released.put(slots)
            self.runner.reset_lengths(index)
            self.state.busy.index_fill_(0, index, False)
            self.drafter.release(slots)
            for slot in slots:
                self.grammars.release(slot)
        return [result for _, result in finished]

    # ---- a round ---------------------------------------------------------------------------------

    def _schedule(self) -> Round:
        """The scheduler's round, with its rows (and, packed, their lengths) on the device."""
        round = self.scheduler.schedule()
        if self.static:
            rows_t, lengths_t = self.runner.slot_index, None
        elif self.packed:  # host lengths: a first decision's L = P before its last chunk is cached
            rows_t, lengths_t = self._rows.put(round.rows), self._lengths.put(round.lengths)
        else:
            rows_t = self._rows.put(round.rows)
            lengths_t = self.runner.lengths[rows_t] + 1  # the cache holds seq[:L-1]
        return replace(round, state=self.state, buffers=self.buffers, rows_t=rows_t, lengths_t=lengths_t)

    def _draft(self, round: Round) -> Round:
        """The round with its shape, each row's number of drafts and the drafts: a drafter that proposes first
        (lookups) proposes its most, then the shape is chosen from what is on the table; others draft the
        chosen shape (with the coupled noise). Structured output then cuts refused drafts and adds forced ones."""
        drafter, coupled, draft = self.drafter, self.sampling.coupled, None
        if drafter.policy.propose_first and self.scheduler.adaptive is not None:
            offered = drafter.propose(replace(round, budgets=self.scheduler.skip_hopeless(round)))
            shape, budgets = self.scheduler.choose(round, offered.host_num, offered.priors)
            if shape.tree is None:
                draft = offered.cut(budgets, self.buffers) if self.scheduler.per_row else offered.truncate(shape.drafts)
        else:
            shape, budgets = self.scheduler.choose(round)
        # One new record per change the drafts need (replace costs ~10 us): the drafter reads the shape,
        # each row's budget and the noise; the verify pass and the Acceptor read what follows.
        round = replace(round, shape=shape, budgets=budgets,
                        gumbel=self._noise(round, shape.width) if coupled else None)
        if draft is None:
            draft = drafter.propose_tree(round, shape.tree) if shape.tree else drafter.propose(round)
        if shape.tree is not None:
            round = replace(round, draft=draft)
            return replace(round, tree=self.acceptor.shape_tree(round))
        forced, gumbel, widened = None, round.gumbel, False
        if self.grammars.rows:  # structured output: cut refused drafts, add forced ones
            constrained = constrain_drafts(round, draft, self.grammars, self.scheduler.slots, self.buffers,
                                           self.forced_max)
            if constrained is not None:
                draft, forced = constrained
                widened = draft.tokens.shape[1] > shape.drafts
                if widened and coupled:  # the same noise, wider
                    gumbel = self._noise(round, 1 + draft.tokens.shape[1])
        if widened or draft.tokens.shape[1] < shape.drafts:  # forced drafts, or trimmed to the longest proposal
            shape = RoundShape(drafts=draft.tokens.shape[1])
        return replace(round, shape=shape, draft=draft, forced=forced, gumbel=gumbel)

    def _noise(self, round: Round, width: int) -> torch.Tensor:
        """The coupled noise of the round's rows at positions L .. L + width - 1 (accept.py)."""
        started = time.perf_counter()
        noise = self.acceptor.noise(round, width)
        self.noise_s += time.perf_counter() - started
        return noise

    # ---- measuring -------------------------------------------------------------------------------

    @contextmanager
    def _phase(self, name: str):
        counter = self.graphs.counter
        if counter is not None:
            counter.phase = name
        started = time.perf_counter()
        try:
            yield
        finally:
            if self._sync_phases:
                torch.cuda.synchronize(self.device)
            self.timings[name] += time.perf_counter() - started
