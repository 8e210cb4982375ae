"""A job that trains its own EAGLE-3 head: `drafter=eagle model.draft=train`.

    rows 1..N      decoded with a head-less drafter, `fallback` (suffix decoding by default: it learns from
                   the job's own rows; the rows are results, written like any other)
    training       a head for the target from those rows: the target's hidden states over prompt + output,
                   EAGLE-3's training-time test (loop.py), for a time budget (`training_seconds`: at most a
                   share of the rest of the job's projected time, and no head at all when the job ends too
                   soon for one to pay back); saved in the output folder
    trial          the next rows drafted by that head
    rows after     drafted by the head if the trial ran faster than rows 1..N did, else by `fallback` again
                   (seeded with the completions so far), so a head that does not pay costs only its trial

`SelfTrainingGenerator` has the interface the job runner reads of a generator (run, stats, stop_admitting,
k_max, trees, adaptive, max_seq_len, timings, capture_s), so the job loop drives it unchanged; `stage`
says which of the phases above it is in, and `run` runs each from there. A resumed job that finds the saved head and the trial's verdict
(`selftrain.json` beside it) drafts as the verdict says from its first row; without a verdict it runs the
trial again. The same process, the same target weights: training reads the rows' token ids, not text.
What it did goes to the job's summary (`report()`): rows and tokens/s of each phase, the training time,
the held-out acceptance, the verdict, and the break-even row (after which the whole job, training
included, is ahead of decoding every row at the first phase's rate).
"""

from __future__ import annotations

import gc
import logging
import time
from itertools import chain, islice
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch

from ..eagle.formats import load_head
from ..engine.runstats import RunStats
from ..engine.types import FINISH_ERROR, Request, Result
from .data import Sample
from .job_head import NoHead, train_job_head
from .loop import NonFiniteLoss
from .phases import (Phase, break_even_row, read_verdict, training_seconds, verdict_of, write_verdict,
                     written_completions)

log = logging.getLogger("batchspec")
HEAD_FOLDER = "eagle_head"  # inside the job's output folder
NOT_TRAINED = "not trained"  # the verdict when no head was trained (the report's not_trained says why)
FIRST, TRIAL, REST = "first rows", "trial", "rest"  # SelfTrainingGenerator.stage


class SelfTrainingGenerator:
    """build(drafter, head, corpus) -> a SpecBatchGenerator over the job's models: `build(fallback, None, None)`
    for the first `rows` rows, `build("eagle", head, None)` after, `build(fallback, None, completions)` if the
    head loses its trial of `trial_rows` rows (default rows // 2). minutes: the training budget (None:
    `training_seconds` of the first phase). rows_left: how many requests this run has left to give, counted from
    its start (None, or returning None: unknown), read when the first phase ends to project the rest of the
    job's time. corpus_max_tokens: how much of the rows already written a resumed, lost verdict reads back for
    the fallback (the suffix index holds no more)."""

    def __init__(self, models, build: Callable[..., object], *, out_dir: str | Path, rows: int = 512,
                 minutes: float | None = None, fallback: str = "suffix", trial_rows: int | None = None,
                 corpus_max_tokens: int | None = None, heldout: int = 16, seed: int = 0,
                 rows_left: Callable[[], int | None] | None = None):
        if minutes is not None and minutes <= 0:
            raise ValueError(f"minutes={minutes}: the training budget must be > 0 (None: the default)")
        self.models, self.build, self.rows, self.minutes, self.rows_left = models, build, rows, minutes, rows_left
        self.rest_s: float | None = None  # the rest of the job's projected time when the first phase ended
        self.not_trained: str | None = None  # why no head was trained, when none was
        self.fallback, self.heldout, self.seed = fallback, heldout, seed
        self.trial_rows = max(1, rows // 2) if trial_rows is None else trial_rows
        self.head_dir = Path(out_dir) / HEAD_FOLDER
        record = read_verdict(self.head_dir)
        self.resumed = (self.head_dir / "config.json").exists() or record.get("verdict") == NOT_TRAINED
        self.before, self.after, self.back, self.train_s = Phase(), Phase(), Phase(), 0.0
        self.verdict: str | None = None  # "head" or the fallback's name, once the trial has run
        self.first_rate: float | None = None  # tokens/s of the first phase (of an earlier run, when resumed)
        self.heldout_acceptance: dict | None = None
        self.completions: list[list[int]] = []  # of the rows before the verdict: the fallback's corpus if it wins
        if self.resumed:
            self.first_rate, self.verdict = record.get("tokens_per_s_before"), record.get("verdict")
            self.not_trained = record.get("not_trained")
            self.head = None if self.verdict == NOT_TRAINED else load_head(
                self.head_dir, models.target, dtype=models.target.dtype, device=models.target.device)
            # A lost verdict (whatever fallback lost to it then) and a head never trained draft with this run's
            # fallback, seeded with the completions already written, as the run that reached the verdict was.
            self.generator = (build(fallback, None, written_completions(out_dir, models.tokenizer, corpus_max_tokens))
                              if self.lost else build("eagle", self.head, None))
        else:
            self.head = None
            self.generator = build(fallback, None, None)
        self._stop = False

    # ---- the generator's interface: what the job runner reads (jobs/shard.py, job.py, summary.py) ----------

    @property
    def stats(self) -> RunStats:
        return self.generator.stats  # one run's statistics, carried across the phases' generators (_switch)

    @property
    def k_max(self) -> int:
        return self.generator.k_max

    @property
    def trees(self):
        return self.generator.trees

    @property
    def adaptive(self):
        return self.generator.adaptive

    @property
    def max_seq_len(self) -> int:
        return self.generator.max_seq_len

    @property
    def spare_slots(self) -> int:
        return self.generator.spare_slots

    @property
    def timings(self) -> dict[str, float]:
        return self.generator.timings

    @property
    def capture_s(self) -> float:
        return self.generator.capture_s

    def stop_admitting(self) -> None:
        self._stop = True
        self.generator.stop_admitting()

    @property
    def lost(self) -> bool:
        """Whether the head lost its trial (the verdict names the fallback it lost to)."""
        return self.verdict not in (None, "head")

    @property
    def stage(self) -> str:
        """Where the job is: FIRST (the fallback drafts the rows a head will be trained on), TRIAL (a head,
        trained or loaded, drafts its trial rows) or REST (the verdict is in: the rows after)."""
        if self.verdict is not None:
            return REST
        return FIRST if self.head is None else TRIAL

    def run(self, requests: Iterable[Request]) -> Iterator[Result]:
        """The rows of each stage in turn, from the stage this job is at; each stage returns the requests left,
        or None when the run ends there (stopped, no rows left, or no head to trial)."""
        pending: Iterator[Request] | None = iter(requests)
        if self.stage == FIRST:
            pending = yield from self._first_rows_and_training(pending)
        if pending is not None and self.stage == TRIAL:
            pending = yield from self._trial(pending)
        if pending is not None:
            yield from self._phase(pending, self.back if self.lost else self.after, None)

    def _first_rows_and_training(self, pending: Iterator[Request]):
        """Decode the first `rows` rows with the fallback, then train a head on them (or decide that no head
        pays: the fallback, warm with what it learnt, then drafts every row)."""
        samples: list[Sample] = []
        yield from self._phase(islice(pending, self.rows), self.before, samples)
        pending = self._more(pending)
        if pending is None:  # stopped, or no rows left to draft: no head to train
            return None
        self.first_rate = self.before.tokens_per_s
        budget = training_seconds(self.minutes, self.before.seconds, self._rest_seconds())
        try:
            if budget == 0.0:
                raise NoHead(f"the rest of this run (about {self.rest_s:.0f} s at the first rows' rate) is too "
                             "short for a head to pay back its training")
            self.head = self._train(samples, budget)
        except (NoHead, NonFiniteLoss) as e:
            reason = str(e) if isinstance(e, NoHead) else f"its training diverged ({e})"
            self.verdict, self.not_trained, self.completions = NOT_TRAINED, reason, []
            (self.head_dir / "checkpoint.pt").unlink(missing_ok=True)
            write_verdict(self.head_dir, self.first_rate, NOT_TRAINED, reason)  # a resume goes on without one
            log.warning("model.draft=train: no head: %s; %s drafts every row", reason, self.fallback)
            return None if self._stop else pending
        if self._stop:  # stopped while training: the saved head's trial runs on resume
            return None
        self._switch("eagle", self.head, None)
        return pending

    def _trial(self, pending: Iterator[Request]):
        """The head drafts `trial_rows` rows; the verdict (head or fallback, by tokens/s against the first
        rows') decides who drafts the rest, and is saved so that a resume drafts as it says."""
        trial = Phase()
        yield from self._phase(islice(pending, self.trial_rows), trial, None)
        self.after.add(trial)
        if self._stop and trial.rows < self.trial_rows:  # an unfinished trial decides nothing
            return None
        self.verdict = verdict_of(trial.tokens_per_s, self.first_rate, self.fallback)
        write_verdict(self.head_dir, self.first_rate, self.verdict)
        log.info("self-trained head: %.1f tokens/s in its trial of %d rows against %.1f with %s: the rest "
                 "drafts with %s", trial.tokens_per_s or 0, trial.rows, self.first_rate or 0, self.fallback,
                 self.fallback if self.lost else "the head")
        pending = self._more(pending)
        if pending is not None and self.lost:
            self._switch(self.fallback, None, self.completions)
        self.completions = []
        return pending

    def _more(self, pending: Iterator[Request]) -> Iterator[Request] | None:
        """`pending` if it has a request left and the job has not been stopped, else None."""
        upcoming = None if self._stop else next(pending, None)
        return None if upcoming is None else chain([upcoming], pending)

    def _switch(self, drafter: str, head, corpus) -> None:
        """Replace the generator by one drafting with `drafter`, carrying one run's statistics across the phases.
        The old one goes first, so that a GPU's memory is free for the new one's buffers and captured graphs."""
        stats = self.generator.stats
        self.generator = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.generator = self.build(drafter, head, corpus)
        self.generator.continue_stats(stats)
        if self._stop:
            self.generator.stop_admitting()

    def _phase(self, requests, phase: Phase, samples: list[Sample] | None) -> Iterator[Result]:
        """Run `requests`, adding to `phase` (a phase may run in two calls: the trial and the rows after it).
        samples: where to put the rows' token ids for training."""
        started, seconds, capture_s = time.perf_counter(), phase.seconds, self.generator.capture_s
        prompts: dict[tuple[str, int], object] = {}

        def remembered(stream):  # each request's prompt, for the rows it becomes
            for request in stream:
                if samples is not None:
                    prompts[request.id, request.sample_index] = request.prompt
                yield request

        def elapsed():  # graph capture is a one-off cost, not the drafter's rate (the trial compares rates)
            return seconds + time.perf_counter() - started - (self.generator.capture_s - capture_s)

        for result in self.generator.run(remembered(requests)):
            phase.seconds = elapsed()
            if result.finish_reason != FINISH_ERROR:
                phase.rows += 1
                phase.tokens += result.completion_tokens
                if self.verdict is None and result.completion_token_ids:
                    self.completions.append(list(result.completion_token_ids))
                if samples is not None and result.completion_token_ids:
                    prompt = self._prompt_ids(prompts.pop((result.id, result.sample_index), result.prompt))
                    samples.append(Sample(prompt + list(result.completion_token_ids), len(prompt)))
            yield result
        phase.seconds = elapsed()

    def _prompt_ids(self, prompt) -> list[int]:
        """The ids the engine ran: a token-id prompt as it is, text as `tokenizer(text)` gives them."""
        return list(prompt) if isinstance(prompt, (list, tuple)) else self.models.tokenizer(prompt)["input_ids"]

    # ---- training ---------------------------------------------------------------------------------

    def _rest_seconds(self) -> float | None:
        """The rest of this run's projected time at the first phase's rate (None: the job's length is unknown)."""
        left = self.rows_left() if self.rows_left is not None else None
        if left is None:
            return None
        # Called only when the first phase ran to its end: it took exactly `rows` requests.
        self.rest_s = max(left - self.rows, 0) * self.before.seconds / self.rows
        return self.rest_s

    def _train(self, samples: list[Sample], budget: float):
        """A head from the first phase's rows (the last `heldout` of them held out), saved atomically. Raises
        NoHead when the target's features leave less than TRAIN_MIN_S of the budget for training steps."""
        started = time.perf_counter()
        try:
            head, self.heldout_acceptance = train_job_head(
                self.models, samples, budget, started, heldout_rows=self.heldout, seed=self.seed,
                minutes=self.minutes, head_dir=self.head_dir, first_rate=self.first_rate)
            return head
        finally:
            self.train_s = time.perf_counter() - started

    def report(self) -> dict:
        """What the self-training did, for the job's summary."""
        trained = self.verdict != NOT_TRAINED
        out = {"head": str(self.head_dir) if trained else None, "resumed_with_saved_head": self.resumed and trained,
               "fallback": self.fallback,
               "rows_before": self.before.rows, "tokens_per_s_before": self.before.tokens_per_s,
               "rows_after": self.after.rows, "tokens_per_s_after": self.after.tokens_per_s,
               "train_s": round(self.train_s, 1), "verdict": self.verdict,
               "rows_back": self.back.rows, "tokens_per_s_back": self.back.tokens_per_s,
               "break_even_row": None if self.lost else break_even_row(self.before, self.train_s, self.after)}
        if self.rest_s is not None:
            out["projected_rest_s"] = round(self.rest_s, 1)
        if self.not_trained:
            out["not_trained"] = self.not_trained
        if self.heldout_acceptance:
            out["heldout_acceptance_by_position"] = self.heldout_acceptance.get("cumulative")
        return out


