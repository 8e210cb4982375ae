"""The record of a `train_draft` run and its one-screen summary."""

from __future__ import annotations

from dataclasses import dataclass, field

from .evaluate import StepCosts


@dataclass
class Summary:
    target: str
    out: str
    format: str
    config: dict
    trained_parameters: int
    prompts_used: int
    prompts_total: int
    train_samples: int
    train_tokens: int
    generated_tokens: int
    temperature: float
    labels: str
    heldout_samples: int
    eval_new_tokens: int
    generation_seconds: float
    feature_seconds: float
    train_seconds: float
    eval_seconds: float
    steps: int
    batch_size: int
    ttt_steps: int
    final_loss: float | None
    agreement: list[float] = field(default_factory=list)
    history: list[dict] = field(default_factory=list)
    acceptance: dict = field(default_factory=dict)  # evaluate.Acceptance as a dict
    costs: dict = field(default_factory=dict)  # evaluate.StepCosts as a dict
    lr: float | None = None  # the peak learning rate used
    skipped_steps: int = 0  # steps not applied: their loss or gradient was not finite
    positions_seen: int = 0  # labelled positions trained on, summed over steps (a position seen twice counts twice)
    ttt_ramp: float = 0.0  # share of training over which the unrolled steps grew from 1 (0: none)
    feature_loss: float = 0.0  # weight of the regression onto the target's LM-head input in the loss

    @property
    def total_seconds(self) -> float:
        return self.generation_seconds + self.feature_seconds + self.train_seconds + self.eval_seconds

    def speedups(self) -> dict[int, float]:
        costs = StepCosts(**self.costs)
        return {k: costs.speedup(self.acceptance["tokens_per_round"][k], k) for k in self.acceptance["tokens_per_round"]}


def render(s: Summary) -> str:
    c, a = s.config, s.acceptance
    k_max = a["k_max"]
    row = lambda values: "".join(f"{v:7.2f}" for v in values)  # noqa: E731
    se = a.get("tokens_per_forward_se") or {}  # a summary from before it: none
    tpf = "  ".join(f"k={k} {v:.2f}" + (f" ±{se[k]:.2f}" if k in se else "") for k, v in a["tokens_per_forward"].items())
    speedups = s.speedups()
    best = max(speedups, key=speedups.get)
    costs = s.costs
    draws = "greedy" if s.temperature == 0 else f"sampled at temperature {s.temperature:g}"
    share = lambda name, seconds: f"{name} {seconds / 60:.1f} min ({100 * seconds / max(s.total_seconds, 1e-9):.0f}%)"  # noqa: E731
    lines = [
        f"EAGLE-3 head for {s.target} -> {s.out} ({s.format} layout)",
        f"  head: hidden {c['hidden_size']}, MLP {c['intermediate_size']}, reads target hidden states "
        f"{tuple(c['target_layer_ids'])} of {c['target_num_layers']} layers, draft vocabulary "
        f"{c['draft_vocab_size']} of {c['target_vocab_size']}, {s.trained_parameters / 1e6:.2f}M trained parameters",
        f"  data: {s.train_samples} samples from {s.prompts_used} of {s.prompts_total} training prompts "
        f"({s.train_tokens:,} tokens, {s.generated_tokens:,} generated, {draws}); {s.heldout_samples} held-out "
        f"prompts x {s.eval_new_tokens} greedy tokens",
        f"  time: {share('generation', s.generation_seconds)}, {share('target features', s.feature_seconds)}, "
        f"{share('training', s.train_seconds)} ({s.steps} steps x {s.batch_size} sequences, {s.positions_seen:,} "
        f"labelled positions seen, {s.ttt_steps} unrolled steps"
        + (f" (from 1 over the first {s.ttt_ramp:.0%} of training)" if s.ttt_ramp else "")
        + f", peak lr {s.lr or 0:.2g}"
        + (f", {s.skipped_steps} skipped: loss not finite" if s.skipped_steps else "")
        + f"), {share('evaluation', s.eval_seconds)}; total {s.total_seconds / 60:.1f} min",
        f"  training loss ({s.labels} labels" + (f" + {s.feature_loss:g} x feature regression" if s.feature_loss else "")
        + f") {s.final_loss:.3f}; top-1 agreement with the target by unrolled step: "
        + " ".join(f"{v:.2f}" for v in s.agreement) if s.final_loss is not None else "  no training steps ran",
        f"  held-out acceptance (greedy chains replayed on the target's continuations, {a['chains']:,} chain starts):",
        "    draft position          " + "".join(f"{j:7d}" for j in range(1, k_max + 1)),
        "    all accepted up to it   " + row(a["cumulative"]),
        "    given the earlier ones  " + row(a["conditional"]),
        "  tokens per target forward (prefill counted" + (", ± one standard error over the held-out prompts" if se else "")
        + f"): {tpf}",
        f"  cost at batch {costs['batch']}, {costs['context']} tokens cached: target {costs['target_ms'][0]:.2f} ms "
        f"(1 token) .. {costs['target_ms'][-1]:.2f} ms ({len(costs['target_ms'])} tokens); head "
        f"{costs['head_step_ms']:.2f} ms per draft step (c = {costs['head_step_ms'] / costs['target_ms'][0]:.3f})",
        "  predicted speedup over plain decoding: " + "  ".join(f"k={k} {v:.2f}x" for k, v in speedups.items())
        + f"; best k={best}",
    ]
    if speedups[best] < 1.0:
        lines.append(f"  verdict: this head is not expected to pay (at best {speedups[best]:.2f}x plain decoding); "
                     "adaptive speculation will mostly leave it idle. More prompts and minutes help.")
    gap = overfit(s)
    if gap is not None and gap[0] == "memorised":
        lines.append(f"  warning: the head agrees {gap[1]:.2f} with the target on its training data but only "
                     f"{gap[2]:.2f} on held-out prompts: it learnt its data by heart, not the target. More prompts "
                     "help; a target whose hidden states do not foretell its next tokens (random weights, e.g. "
                     "tools/synthetic_pair.py's) is not one a head can learn.")
    elif gap is not None:
        lines.append(f"  note: the head agrees {gap[1]:.2f} with the target on its training data against {gap[2]:.2f} "
                     "on held-out prompts: it is short of data, and more prompts and minutes would likely raise it.")
    return "\n".join(lines)


# At the first draft position: training agreement minus held-out acceptance above OVERFIT_GAP is a head short
# of data; held-out acceptance also under MEMORISED_SHARE of the training agreement is one that learnt its data
# by heart. A random-weight 3B target on an H100: 0.93-0.99 against 0.03 (memorised); the SmolLM2 head of issue
# 32's first run, which did not pay: 0.77 against 0.37 (memorised); SmolLM2's best 20-minute head, which pays:
# 0.91 against 0.57 (short of data).
OVERFIT_GAP, MEMORISED_SHARE = 0.3, 0.5


def overfit(s: Summary) -> tuple[str, float, float] | None:
    """("memorised" or "short of data", training agreement, held-out acceptance) at the first draft position,
    or None where the two are within OVERFIT_GAP (or nothing was held out)."""
    if not s.agreement or not s.acceptance.get("cumulative") or not s.heldout_samples:
        return None
    train, heldout = s.agreement[0], s.acceptance["cumulative"][0]
    if train - heldout <= OVERFIT_GAP:
        return None
    return ("memorised" if heldout < MEMORISED_SHARE * train else "short of data"), train, heldout
