"""Run-wide statistics: RunStats, the aggregates over every request a generator has run, and the lines
that summaries print from them (rounds by drafts checked, a self-training job's phases)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .types import Result


def rounds_by_k_text(counts: list[int]) -> str:
    """'k=0 12%  k=1 30% ...' over the rounds of a run: what adaptive speculation chose."""
    total = sum(counts)
    return "  ".join(f"k={k} {n / total:.0%}" for k, n in enumerate(counts) if n) if total else "-"


def self_training_text(t: dict) -> str:
    """One line on a self-training job's phases (training/selftrain.py's report): the first rows with the
    fallback drafter, the training, the head's rows, and the fallback's rows after a lost trial."""
    def rate(x):
        return "-" if x is None else f"{x:.1f}"

    fallback = t.get("fallback") or "ngram"  # reports written before the fallback was a setting
    if t.get("verdict") == "not trained":  # eagle/selftrain.NOT_TRAINED: the fallback drafted every row
        rows, back = t["rows_before"], t.get("rows_back", 0)
        text = (f"{rows} rows with {fallback} {rate(t['tokens_per_s_before'])} tokens/s, then {back} more "
                f"{rate(t.get('tokens_per_s_back'))} tokens/s" if rows else
                f"{back} rows with {fallback} {rate(t.get('tokens_per_s_back'))} tokens/s")
        return text + f"; no head trained{'' if rows else ' (an earlier run)'}: {t.get('not_trained') or 'see the log'}"
    if t.get("resumed_with_saved_head"):  # the first rows and the training belong to an earlier run
        text = f"resumed with the saved head, {t['rows_after']} rows with it {rate(t['tokens_per_s_after'])} tokens/s"
    else:
        text = (f"{t['rows_before']} rows with {fallback} {rate(t['tokens_per_s_before'])} tokens/s, trained "
                f"{t['train_s']:.0f} s, {t['rows_after']} rows with the head {rate(t['tokens_per_s_after'])} tokens/s")
    if t.get("rows_back"):
        text += f", then {t['rows_back']} rows with {fallback} again {rate(t.get('tokens_per_s_back'))} tokens/s"
    if t.get("verdict") and t["verdict"] != "head":
        text += f" (the head ran slower than {fallback} in its trial)"
    if t.get("break_even_row"):
        text += f", break-even row {t['break_even_row']}"
    return text


@dataclass(slots=True)
class RunStats:
    """Aggregates over every request a generator has run (errors excluded from token counts)."""

    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    rounds: int = 0  # batched verify passes
    target_forwards: int = 0  # sum over requests of the verify passes each took part in
    draft_tokens: int = 0
    accepted_tokens: int = 0
    forced_tokens: int = 0  # drafts a grammar forced (in draft_tokens too): they say nothing about the drafter
    forced_accepted: int = 0  # ... of which accepted (in accepted_tokens too)
    rejected_rounds: int = 0  # request-rounds that ended on a rejected draft
    proposed_by_position: list[int] = field(default_factory=list)  # drafts proposed at draft position i
    accepted_by_position: list[int] = field(default_factory=list)  # ... of which accepted
    rounds_by_k: list[int] = field(default_factory=list)  # rounds whose verify pass checked k drafts (0 = plain)
    rounds_by_tree: dict[str, int] = field(default_factory=dict)  # tree rounds by tree shape ("BxD")

    def widen(self, positions: int, max_drafts: int) -> None:
        """Make room (in place: the job's statistics hold this object) for a generator that drafts at up to
        `positions` positions and `max_drafts` drafts per round, as when a run switches drafters."""
        for counts, size in ((self.proposed_by_position, positions), (self.accepted_by_position, positions),
                             (self.rounds_by_k, max_drafts + 1)):
            counts.extend([0] * (size - len(counts)))

    def add_round_row(self, drafted: int, accepted: int) -> None:
        """One request's part in a round: it proposed drafts at `drafted` positions (a chain's drafts, a
        tree's depth) and the first `accepted` of them were kept. Drafts a grammar forced may reach past k:
        the lists grow."""
        grow = drafted - len(self.proposed_by_position)
        if grow > 0:
            self.proposed_by_position += [0] * grow
            self.accepted_by_position += [0] * grow
        for i in range(drafted):
            self.proposed_by_position[i] += 1
        for i in range(accepted):
            self.accepted_by_position[i] += 1
        self.rejected_rounds += accepted < drafted

    def add_result(self, result: Result) -> None:
        """A finished request (not an error)."""
        self.requests += 1
        self.prompt_tokens += result.prompt_tokens
        self.completion_tokens += result.completion_tokens
        self.target_forwards += result.target_forwards
        self.draft_tokens += result.draft_tokens
        self.accepted_tokens += result.accepted_tokens
        self.forced_tokens += result.forced_tokens
        self.forced_accepted += result.forced_accepted

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def proposed_acceptance_rate(self) -> float | None:
        """The drafter's own drafts' acceptance: forced drafts left out."""
        drafted = self.draft_tokens - self.forced_tokens
        return (self.accepted_tokens - self.forced_accepted) / drafted if drafted else None

    @property
    def tokens_per_forward(self) -> float | None:
        return self.completion_tokens / self.target_forwards if self.target_forwards else None

    @property
    def alpha(self) -> float | None:
        """Per-draft acceptance probability under the geometric model: each draft is kept
        with probability alpha until the first rejection. Estimated as accepted / (accepted + rejections)."""
        accepted = self.accepted_tokens - self.forced_accepted  # forced rounds count no rejections either
        trials = accepted + self.rejected_rounds
        return accepted / trials if trials else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Mean number of drafts accepted per request-round."""
        return self.accepted_tokens / self.target_forwards if self.target_forwards else None

    @property
    def acceptance_by_position(self) -> list[float | None]:
        return [a / p if p else None for a, p in zip(self.accepted_by_position, self.proposed_by_position)]

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests, "errors": self.errors, "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens, "rounds": self.rounds,
            "target_forwards": self.target_forwards, "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens, "acceptance_rate": self.acceptance_rate,
            "proposed_acceptance_rate": self.proposed_acceptance_rate, "forced_tokens": self.forced_tokens,
            "forced_accepted": self.forced_accepted,
            "tokens_per_forward": self.tokens_per_forward, "mean_accepted_length": self.mean_accepted_length,
            "rejected_rounds": self.rejected_rounds, "alpha": self.alpha,
            "acceptance_by_position": self.acceptance_by_position, "rounds_by_k": list(self.rounds_by_k),
            "rounds_by_tree": dict(self.rounds_by_tree),
        }
