"""A job that trains its own EAGLE-3 head: `drafter=eagle model.draft=train`.

    rows 1..N    decoded by a head-less drafter (they are results, written like any other)
    training     a head for the target from those rows: the target's hidden states over prompt + output,
                 EAGLE-3's training-time test (loop.py), for a time budget; saved in the output folder
    rows N+1..   drafted by that head

`SelfTrainingGenerator` has the generator's interface (run, stats, stop_admitting, timings, capture_s),
so the job loop drives it unchanged. A resumed job that finds the saved head drafts with it from its
first row. The same process, the same target weights: training reads the rows' token ids, not text.
What it did goes to the job's summary (`report()`): rows and tokens/s before and after, the training
time, the held-out acceptance, and the break-even row (after which the whole job, training included,
is ahead of decoding every row plainly at the first phase's rate).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch

from ..types import FINISH_ERROR, Request, Result, RunStats
from .data import Sample
from .evaluate import acceptance, head_matches
from .features import sequence_states
from .formats import save_head
from .init import head_for_target, scale_fc
from .loop import LoopOptions, train_loop
from .vocab import choose_vocab, size_for_coverage

log = logging.getLogger("batchspec")
HEAD_FOLDER = "eagle_head"  # inside the job's output folder


@dataclass
class Phase:
    rows: int = 0
    tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.seconds if self.seconds else None


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


class SelfTrainingGenerator:
    """build(drafter, head) -> a SpecBatchGenerator over the job's models: `build(first_drafter, None)` for
    the first `rows` rows, `build("eagle", head)` after. minutes: the training budget."""

    def __init__(self, models, build: Callable[[str, object], object], *, out_dir: str | Path, rows: int = 512,
                 minutes: float = 3.0, first_drafter: str = "ngram", heldout: int = 16, seed: int = 0):
        self.models, self.build, self.rows, self.minutes = models, build, rows, minutes
        self.first_drafter, self.heldout, self.seed = first_drafter, heldout, seed
        self.head_dir = Path(out_dir) / HEAD_FOLDER
        self.resumed = (self.head_dir / "config.json").exists()
        if self.resumed:
            from .formats import load_head

            self.head = load_head(self.head_dir, models.target, dtype=models.target.dtype, device=models.target.device)
            self.generator = build("eagle", self.head)
        else:
            self.head = None
            self.generator = build(first_drafter, None)
        self.before, self.after, self.train_s = Phase(), Phase(), 0.0
        self.heldout_acceptance: dict | None = None
        self._stats = RunStats()
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

    def run(self, requests: Iterable[Request]) -> Iterator[Result]:
        pending = iter(requests)
        if self.head is None:
            samples: list[Sample] = []
            yield from self._phase(islice(pending, self.rows), self.before, samples)
            if self._stop:
                return
            self.head = self._train(samples)
            stats = self.generator.stats
            self.generator = self.build("eagle", self.head)
            self.generator.scheduler.stats.run = stats  # one run's statistics across both phases
        yield from self._phase(pending, self.after, None)

    def _phase(self, requests, phase: Phase, samples: list[Sample] | None) -> Iterator[Result]:
        started = time.perf_counter()
        prompts: dict[tuple[str, int], object] = {}

        def remembered(stream):  # each request's prompt, for the rows it becomes
            for request in stream:
                if samples is not None:
                    prompts[request.id, request.sample_index] = request.prompt
                yield request

        for result in self.generator.run(remembered(requests)):
            phase.seconds = time.perf_counter() - started
            if result.finish_reason != FINISH_ERROR:
                phase.rows += 1
                phase.tokens += result.completion_tokens
                if samples is not None and result.completion_token_ids:
                    prompt = self._prompt_ids(prompts.pop((result.id, result.sample_index), result.prompt))
                    samples.append(Sample(prompt + list(result.completion_token_ids), len(prompt)))
            yield result
        phase.seconds = time.perf_counter() - started

    def _prompt_ids(self, prompt) -> list[int]:
        """The ids the engine ran: a token-id prompt as it is, text as `tokenizer(text)` gives them."""
        return list(prompt) if isinstance(prompt, (list, tuple)) else self.models.tokenizer(prompt)["input_ids"]

    # ---- training ---------------------------------------------------------------------------------

    def _train(self, samples: list[Sample]):
        """A head from the first phase's rows (the last `heldout` of them held out), saved atomically."""
        started = time.perf_counter()
        target = self.models.target
        heldout = samples[-self.heldout:] if len(samples) > 2 * self.heldout else []
        train = samples[: len(samples) - len(heldout)]
        if not train:
            raise RuntimeError("model.draft=train: the first rows gave no completions to train a head on")
        counts = Counter(t for s in train for t in s.ids)
        vocab = target.config.get_text_config().vocab_size
        draft_ids = choose_vocab(counts, size_for_coverage(counts, vocab), vocab,
                                 always=tuple(self.models.eos_token_ids)).target_ids
        torch.manual_seed(self.seed)
        head = head_for_target(target, draft_target_ids=draft_ids)
        layer_ids = head.config.target_layer_ids
        work = torch.float32 if target.device.type == "cpu" else target.dtype
        states = sequence_states(target, [s.ids for s in train], layer_ids, dtype=work)
        heldout_states = sequence_states(target, [s.ids for s in heldout], layer_ids, dtype=torch.float32)
        scale_fc(head, torch.cat([st[0] for st in states[:64]]))
        spent = time.perf_counter() - started
        # No tqdm bar inside a job: its own progress (bar or log lines) reports the rows, and this logs the start/end.
        options = LoopOptions(seconds=max(1.0, self.minutes * 60 - spent), eval_every=10**9, seed=self.seed,
                              show_progress=False)
        log.info("training an EAGLE-3 head on %d rows for about %.1f min", len(train), options.seconds / 60)
        self.head_dir.mkdir(parents=True, exist_ok=True)
        train_loop(head, target, train, states, [], [], options, self.head_dir / "checkpoint.pt", device=target.device)
        head.to(device=target.device, dtype=torch.float32).eval()
        if heldout:
            self.heldout_acceptance = asdict(acceptance(head_matches(head, heldout, heldout_states, 5), heldout, k_max=5))
        head.to(dtype=target.dtype)
        save_head(head, self.head_dir)
        (self.head_dir / "checkpoint.pt").unlink(missing_ok=True)
        self.train_s = time.perf_counter() - started
        log.info("trained an EAGLE-3 head on %d rows in %.0f s -> %s", len(train), self.train_s, self.head_dir)
        return head

    def report(self) -> dict:
        """What the self-training did, for the job's summary."""
        out = {"head": str(self.head_dir), "resumed_with_saved_head": self.resumed, "rows_before": self.before.rows,
               "rows_after": self.after.rows, "tokens_per_s_before": self.before.tokens_per_s,
               "tokens_per_s_after": self.after.tokens_per_s, "train_s": round(self.train_s, 1),
               "break_even_row": break_even_row(self.before, self.train_s, self.after)}
        if self.heldout_acceptance:
            out["heldout_acceptance_by_position"] = self.heldout_acceptance.get("cumulative")
        return out
