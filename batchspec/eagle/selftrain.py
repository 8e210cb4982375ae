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

`SelfTrainingGenerator` has the generator's interface (run, stats, stop_admitting, timings, capture_s),
so the job loop drives it unchanged. A resumed job that finds the saved head and the trial's verdict
(`selftrain.json` beside it) drafts as the verdict says from its first row; without a verdict it runs the
trial again. The same process, the same target weights: training reads the rows' token ids, not text.
What it did goes to the job's summary (`report()`): rows and tokens/s of each phase, the training time,
the held-out acceptance, the verdict, and the break-even row (after which the whole job, training
included, is ahead of decoding every row at the first phase's rate).
"""

from __future__ import annotations

import gc
import json
import logging
import time
from dataclasses import asdict, dataclass
from itertools import chain, islice
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch

from ..types import FINISH_ERROR, Request, Result, RunStats
from .data import Sample
from .evaluate import acceptance, head_matches
from .features import sequence_states
from ..files import atomic_write
from .formats import save_head
from .init import head_for_target, scale_fc
from .loop import LoopOptions, NonFiniteLoss, train_loop
from .vocab import vocab_for

log = logging.getLogger("batchspec")
HEAD_FOLDER = "eagle_head"  # inside the job's output folder
VERDICT_FILE = "selftrain.json"  # inside the head's folder: the first phase's rate and the trial's verdict
NOT_TRAINED = "not trained"  # the verdict when no head was trained (the report's not_trained says why)


class NoHead(Exception):
    """The job trains no head (the reason is the message)."""


@dataclass
class Phase:
    rows: int = 0
    tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.seconds if self.seconds else None

    def add(self, other: "Phase") -> None:
        self.rows, self.tokens, self.seconds = (self.rows + other.rows, self.tokens + other.tokens,
                                                self.seconds + other.seconds)


def break_even_row(before: Phase, train_s: float, after: Phase) -> int | None:
    """The row count at which the job, training included, has taken no longer than decoding every row at
    the first phase's rate: None while the second phase is not faster, or was not measured."""
    if not (before.rows and after.rows and before.seconds and after.seconds):
        return None
    plain, drafted = before.seconds / before.rows, after.seconds / after.rows  # seconds per row
    if drafted >= plain:
        return None
    # before.seconds + train_s + (n - before.rows) * drafted = n * plain
    return before.rows + int(round(train_s / (plain - drafted))) + 1


# The default budget is at most this share of the time the rest of the job is projected to take, so that a
# head that loses its trial costs a short job little (a 3,000-row demo job paid a minute for a head that
# lost, 0.96x a plain job, 2026-11-25); a job too short for TRAIN_MIN_S of training trains no head at all.
TRAIN_SHARE = 0.15
TRAIN_MIN_S = 10.0


def training_seconds(minutes: float | None, first_phase_s: float, rest_s: float | None = None) -> float:
    """The training budget: `minutes`, or by default as long as the first rows took, within 1 to 10 minutes and
    at most TRAIN_SHARE of `rest_s` (the rest of the job's projected time at the first rows' rate, when the job
    knows its length). 0 (train no head) when that leaves less than TRAIN_MIN_S. On the demo target over 3,000
    rows (2 CPU cores, OMP_WAIT_POLICY=PASSIVE), 3 minutes of training made the whole job 0.91x a plain one;
    1 minute, 1.16x; with OpenMP's spinning threads (batchspec's default since) plain decoding doubled in
    speed and the same job with 1 minute was 0.96x (docs/eagle.md)."""
    if minutes is not None:
        return minutes * 60
    budget = min(600.0, max(60.0, first_phase_s))
    if rest_s is not None:
        budget = min(budget, TRAIN_SHARE * rest_s)
    return budget if budget >= TRAIN_MIN_S else 0.0


def verdict_of(head_rate: float | None, first_rate: float | None, fallback: str) -> str:
    """Which drafter drafts the rows after the trial: "head" unless it ran measurably slower (tokens/s) than the
    fallback did on the first rows. The fallback's rate there is, if anything, low (suffix decoding starts
    with nothing learnt), so a tie goes to the head."""
    return fallback if head_rate and first_rate and head_rate < first_rate else "head"


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
            from .formats import load_head

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

    # ---- the generator's interface ----------------------------------------------------------------

    def __getattr__(self, name):  # k_max, trees, max_seq_len, adaptive, timings, capture_s: the current one's
        return getattr(self.__dict__["generator"], name)

    @property
    def stats(self) -> RunStats:
        return self.generator.stats

    def stop_admitting(self) -> None:
        self._stop = True
        self.generator.stop_admitting()

    @property
    def lost(self) -> bool:
        """Whether the head lost its trial (the verdict names the fallback it lost to)."""
        return self.verdict not in (None, "head")

    def run(self, requests: Iterable[Request]) -> Iterator[Result]:
        pending = iter(requests)
        if self.head is None and self.verdict is None:
            samples: list[Sample] = []
            yield from self._phase(islice(pending, self.rows), self.before, samples)
            pending = self._more(pending)
            if pending is None:  # stopped, or no rows left to draft: no head to train
                return
            self.first_rate = self.before.tokens_per_s
            budget = training_seconds(self.minutes, self.before.seconds, self._rest_seconds())
            try:
                if budget == 0.0:
                    raise NoHead(f"the rest of this run (about {self.rest_s:.0f} s at the first rows' rate) is too "
                                 "short for a head to pay back its training")
                self.head = self._train(samples, budget)
            except (NoHead, NonFiniteLoss) as e:  # the fallback, warm with what it learnt, drafts every row
                reason = str(e) if isinstance(e, NoHead) else f"its training diverged ({e})"
                self.verdict, self.not_trained, self.completions = NOT_TRAINED, reason, []
                (self.head_dir / "checkpoint.pt").unlink(missing_ok=True)
                write_verdict(self.head_dir, self.first_rate, NOT_TRAINED, reason)  # a resume goes on without one
                log.warning("model.draft=train: no head: %s; %s drafts every row", reason, self.fallback)
                if not self._stop:
                    yield from self._phase(pending, self.back, None)
                return
            if self._stop:  # stopped while training: the saved head's trial runs on resume
                return
            self._switch("eagle", self.head, None)
        if self.verdict is None:  # the trial: the head against the first phase's rate
            trial = Phase()
            yield from self._phase(islice(pending, self.trial_rows), trial, None)
            self.after.add(trial)
            if self._stop and trial.rows < self.trial_rows:  # an unfinished trial decides nothing
                return
            self.verdict = verdict_of(trial.tokens_per_s, self.first_rate, self.fallback)
            write_verdict(self.head_dir, self.first_rate, self.verdict)
            log.info("self-trained head: %.1f tokens/s in its trial of %d rows against %.1f with %s: the rest "
                     "drafts with %s", trial.tokens_per_s or 0, trial.rows, self.first_rate or 0, self.fallback,
                     self.fallback if self.lost else "the head")
            pending = self._more(pending)
            if pending is None:
                return
            if self.lost:
                self._switch(self.fallback, None, self.completions)
            self.completions = []
        yield from self._phase(pending, self.back if self.lost else self.after, None)

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
        fresh = self.generator.scheduler.stats.run
        stats.widen(len(fresh.proposed_by_position), len(fresh.rounds_by_k) - 1)  # e.g. after drafter=none's k=0
        self.generator.scheduler.stats.run = stats
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
            return self._train_head(samples, budget, started)
        finally:
            self.train_s = time.perf_counter() - started

    def _train_head(self, samples: list[Sample], budget: float, started: float):
        target = self.models.target
        heldout = samples[-self.heldout:] if len(samples) > 2 * self.heldout else []
        train = samples[: len(samples) - len(heldout)]
        if not train:
            raise RuntimeError("model.draft=train: the first rows gave no completions to train a head on")
        draft_ids = vocab_for(train, target.config.get_text_config().vocab_size,
                              always=tuple(self.models.eos_token_ids)).target_ids
        torch.manual_seed(self.seed)
        head = head_for_target(target, draft_target_ids=draft_ids)
        layer_ids = head.config.target_layer_ids
        work = torch.float32 if target.device.type == "cpu" else target.dtype
        states = sequence_states(target, [s.ids for s in train], layer_ids, dtype=work)
        heldout_states = sequence_states(target, [s.ids for s in heldout], layer_ids, dtype=torch.float32)
        scale_fc(head, torch.cat([st[0] for st in states[:64]]))
        spent = time.perf_counter() - started
        if self.minutes is None and budget - spent < TRAIN_MIN_S:
            raise NoHead(f"the target's features took {spent:.0f} s of the {budget:.0f} s training budget, which "
                         f"leaves less than {TRAIN_MIN_S:.0f} s to train a head")
        # No tqdm bar inside a job: its own progress (bar or log lines) reports the rows, and this logs the start/end.
        # Small batches and no loss on the prompts: with a budget of minutes, more steps over the positions the
        # head will draft at teach it most (a 60 s budget on the demo target: 3.15 tokens per forward at k=4 on
        # held-out rows against 2.97 with 8 sequences, 5 unrolled steps and the prompts' positions).
        options = LoopOptions(seconds=max(1.0, budget - spent),
                              batch_size=4, ttt_steps=4, train_on_prompt=False, eval_every=10**9, seed=self.seed,
                              show_progress=False)
        log.info("training an EAGLE-3 head on %d rows for about %.1f min", len(train), options.seconds / 60)
        self.head_dir.mkdir(parents=True, exist_ok=True)
        write_verdict(self.head_dir, self.first_rate, None)  # before the head: a saved head always has its record
        train_loop(head, target, train, states, [], [], options, self.head_dir / "checkpoint.pt", device=target.device)
        head.to(device=target.device, dtype=torch.float32).eval()
        if heldout:
            self.heldout_acceptance = asdict(acceptance(head_matches(head, heldout, heldout_states, 5), heldout, k_max=5))
        head.to(dtype=target.dtype)
        save_head(head, self.head_dir)
        (self.head_dir / "checkpoint.pt").unlink(missing_ok=True)
        log.info("trained an EAGLE-3 head on %d rows in %.0f s -> %s", len(train), time.perf_counter() - started,
                 self.head_dir)
        return head

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


def written_completions(out_dir: str | Path, tokenizer, max_tokens: int | None = None) -> list[list[int]] | None:
    """The newest completions, up to about max_tokens, that a job has written to out_dir/data so far (None if
    none): a resumed fallback's corpus."""
    from ..corpus import load_corpus

    if not any((Path(out_dir) / "data").glob("*.parquet")):
        return None
    try:
        return load_corpus(str(out_dir), tokenizer, max_tokens=max_tokens)
    except ValueError as e:  # an unreadable part: the fallback starts cold, and says so
        log.warning("the fallback drafter starts without the job's earlier rows: %s", e)
        return None


def read_verdict(head_dir: Path) -> dict:
    path = head_dir / VERDICT_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def write_verdict(head_dir: Path, first_rate: float | None, verdict: str | None, not_trained: str | None = None
                  ) -> None:
    record = {"tokens_per_s_before": first_rate, "verdict": verdict}
    if not_trained:
        record["not_trained"] = not_trained
    head_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(head_dir / VERDICT_FILE, lambda tmp: Path(tmp).write_text(json.dumps(record, indent=2) + "\n"))
