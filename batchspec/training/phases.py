"""A self-training job's bookkeeping (selftrain.py): each phase's rows, tokens and time, the training budget,
the trial's verdict and its file, the break-even row, and the completions a resumed fallback starts from."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from ..util.files import atomic_write

log = logging.getLogger("batchspec")
VERDICT_FILE = "selftrain.json"  # inside the head's folder: the first phase's rate and the trial's verdict


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


def written_completions(out_dir: str | Path, tokenizer, max_tokens: int | None = None) -> list[list[int]] | None:
    """The newest completions, up to about max_tokens, that a job has written to out_dir/data so far (None if
    none): a resumed fallback's corpus."""
    from ..sources.corpus import load_corpus  # deferred: a verdict is read without loading transformers

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
