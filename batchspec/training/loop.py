"""The optimisation loop: EAGLE-3 training-time test on precomputed target states, with checkpoints.

Loss: at each unrolled step j, a cross-entropy between the head's draft-vocabulary distribution and a
label from the target for the token it predicts, weighted 0.8^j (EAGLE-3). Labels:
- hard: the target's greedy token. Greedy verification accepts a draft iff it IS that token, so this is
  the objective itself; on the demo target it reached 0.66 first-draft acceptance where the soft
  labels reached 0.56 after the same 60 steps.
- soft: the target's distribution at a temperature (EAGLE-3 / SpecForge use it at 1; soft
  cross-entropy = forward KL up to a constant). Sampled verification accepts against the whole
  distribution (coupled: the draw; rejection: sum of min(p, q)), so jobs that sample want this.
With `feature_loss` w > 0, each step's loss also gets w x smooth-L1 between the head's normed output (what
its LM head reads) and the target's LM-head input for the same token (EAGLE-1's feature regression): Ht
numbers per position where the label gives one, which keeps a head short of data nearer the target's
states (docs/eagle.md has what it did on three targets).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..engine.model.threads import guard_for
from .evaluate import acceptance, head_matches
from .features import noisy, pad_batch
from ..util.files import atomic_write
from ..eagle.head import EagleHead
from .precision import training_autocast
from .ttt import unroll


@dataclass
class LoopOptions:
    lr: float | None = None  # peak learning rate; None: default_lr(the head's hidden size)
    batch_size: int = 8  # sequences per step
    ttt_steps: int = 5  # unrolled draft steps per position (EAGLE-3's test length)
    ttt_ramp: float = 0.0  # share of training over which unrolled steps grow from 1 to ttt_steps (0: none)
    step_weight: float = 0.8  # loss weight of step j: step_weight ** j
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    warmup: float = 0.03  # share of training spent warming up the learning rate
    steps: int = 0  # stop after this many steps (0: only the time budget stops it)
    seconds: float = 600.0  # training time budget (0: only `steps` stops it)
    eval_every: int = 100  # steps between held-out checks in the progress bar
    checkpoint_every: float = 60.0  # seconds between checkpoints
    train_on_prompt: bool = True  # also learn at prompt positions (the target's states are real there too)
    labels: str = "hard"  # "hard": the target's greedy token; "soft": its distribution at label_temperature
    label_temperature: float = 1.0
    feature_loss: float = 0.0  # weight of a smooth-L1 loss between the head's normed output and the target's LM-head input (EAGLE-1)
    feature_noise: float = 0.0  # uniform noise on the input features, +- this share of each layer's RMS (EAGLE-1)
    show_progress: bool = True  # the tqdm bar (off inside a job, whose own progress lines go to its log)
    autocast: str = "auto"  # bf16 matmuls in training: "auto" (on a GPU only), "bfloat16" or "off"
    seed: int = 0


@dataclass
class LoopState:
    step: int = 0
    seconds: float = 0.0  # training time, over all sessions
    loss: float | None = None  # mean of the last 20 steps
    agreement: list[float] = field(default_factory=list)  # top-1 agreement by unrolled step, last 20 steps
    history: list[dict] = field(default_factory=list)  # held-out checks during training
    skipped: int = 0  # steps whose loss or gradient was not finite (not applied)
    positions: int = 0  # labelled positions trained on (first unrolled step), over all steps


# Adam moves every weight by about lr per step, so a layer's output moves by about lr x its width: the
# peak rate that trains the demo's 256-wide head well (3e-3) sent a 3072-wide head (a Llama-3.2-3B
# target's, on an H100) to a NaN loss by step 62. Scale it as 1/width (muP's rule for Adam).
BASE_LR, BASE_WIDTH = 3e-3, 256
MAX_SKIPPED_IN_A_ROW = 20


def default_lr(hidden_size: int) -> float:
    """Peak learning rate for a head `hidden_size` wide: 3e-3 up to 256, then 3e-3 * 256 / hidden_size."""
    return BASE_LR * min(1.0, BASE_WIDTH / hidden_size)


class NonFiniteLoss(RuntimeError):
    """Training produced no finite loss for MAX_SKIPPED_IN_A_ROW steps in a row; one line."""


def progress_of(state: LoopState, options: LoopOptions) -> float:
    parts = [state.step / options.steps if options.steps else 0.0,
             state.seconds / options.seconds if options.seconds else 0.0]
    return min(1.0, max(parts))


def lr_at(progress: float, options: LoopOptions, peak: float) -> float:
    """Linear warmup, then cosine decay to 10% of the peak, over the progress fraction."""
    if progress < options.warmup:
        return peak * max(progress / options.warmup, 0.02)
    p = (progress - options.warmup) / max(1e-9, 1 - options.warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(p, 1.0))))


def steps_at(progress: float, options: LoopOptions) -> int:
    """Unrolled steps at this point of training: ttt_steps, or with ttt_ramp growing from 1 in equal parts of
    the ramp to ttt_steps at its end (an early step with fewer unrolled steps costs less, so the head sees
    more batches while it learns the first draft, which every longer chain needs)."""
    if options.ttt_ramp <= 0 or options.ttt_steps <= 1:
        return options.ttt_steps
    return min(options.ttt_steps, 1 + int((options.ttt_steps - 1) * progress / options.ttt_ramp))


def pick_batch(order: list[int], step: int, options: LoopOptions) -> list[int]:
    """A window of batch_size sequences of similar length (order: indices sorted by length), at a random
    place drawn from (seed, step), so a resumed run draws the same batches."""
    gen = torch.Generator().manual_seed(options.seed * 1_000_003 + step)
    start = int(torch.randint(0, max(1, len(order) - options.batch_size + 1), (1,), generator=gen))
    return order[start: start + options.batch_size]


class TargetHead:
    """The target's LM head restricted to the draft vocabulary (final hidden [..., Ht] -> logits [..., Vd]),
    and target id -> draft id (-1 outside the draft vocabulary)."""

    def __init__(self, target, t2d: torch.Tensor, device):
        module = target.get_output_embeddings()
        self.t2d = t2d.to(device)
        weight = module.weight.detach().to(device, torch.float32)[: len(t2d)][self.t2d]
        bias = getattr(module, "bias", None)
        self.weight = weight
        self.bias = None if bias is None else bias.detach().to(device, torch.float32)[: len(t2d)][self.t2d]
        self.draft_id = torch.where(self.t2d, self.t2d.long().cumsum(0) - 1, -1)

    def __call__(self, final: torch.Tensor) -> torch.Tensor:
        return F.linear(final.float(), self.weight, self.bias)


def batch_loss(head: EagleHead, target_head: TargetHead, samples, states, rows, options: LoopOptions, device,
               steps: int | None = None, noise: torch.Generator | None = None):
    """Weighted TTT loss over the batch `rows`, the per-step top-1 agreement with the target, and the number
    of labelled positions of the first step. `noise`: the generator of the feature noise (none: no noise).
    With a reduced draft vocabulary, labels are over the draft vocabulary (the target's distribution
    renormalised over it, as SpecForge does) and positions whose greedy token is outside it are skipped."""
    part = [samples[i] for i in rows]
    ids, _ = pad_batch([s.ids for s in part], 0)
    feats = torch.nn.utils.rnn.pad_sequence([states[i][0] for i in rows], batch_first=True)
    final = torch.nn.utils.rnn.pad_sequence([states[i][1] for i in rows], batch_first=True)
    greedy = torch.nn.utils.rnn.pad_sequence([states[i][2] for i in rows], batch_first=True)
    ids, feats, final = ids.to(device), feats.to(device, head.fc.weight.dtype), final.to(device)
    if options.feature_noise and noise is not None:
        feats = noisy(feats, options.feature_noise, head.config.feature_size // head.config.target_hidden_size, noise)
    length = ids.shape[1] - 1
    lengths = torch.tensor([len(s.ids) for s in part], device=device)[:, None]
    prompt = torch.tensor([s.prompt_len for s in part], device=device)[:, None]
    rows_i = torch.arange(length, device=device)[None]
    # The target's greedy token after position p, p = 1..N-1, as a draft id (-1: not in the draft vocabulary,
    # or no label: a recorded sequence's last position, features.recorded_states).
    greedy = greedy[:, 1:].to(device)  # [b, N-1]
    greedy = torch.where(greedy >= 0, target_head.draft_id[greedy.clamp(min=0)], -1)
    usable = greedy >= 0
    losses, agree = [], []
    for j, out in enumerate(unroll(head, ids, feats, steps or options.ttt_steps)):
        # row i of step j predicts the token at position i+2+j: the target's logits at i+1+j
        ok = F.pad(usable[:, j:], (0, j)) & (rows_i + 2 + j <= lengths)
        if not options.train_on_prompt:
            ok &= rows_i + 2 + j >= prompt
        # The LM head is most of a step's work: run it only where there is something to learn.
        logits = head.logits(out[ok]).float()  # [valid, Vd]
        label = F.pad(greedy[:, j:], (0, j))[ok]
        # the target's LM-head input for the token this step predicts (its position i+1+j), where a loss reads it
        target_final = (F.pad(final[:, 1 + j:], (0, 0, 0, j))[ok].float()
                        if options.labels != "hard" or options.feature_loss else None)
        if options.labels == "hard":
            losses.append(F.cross_entropy(logits, label) if len(label) else logits.sum() * 0)
        else:  # the target's distribution over the draft vocabulary (renormalised), at the label temperature
            with torch.no_grad():
                p = F.softmax(target_head(target_final) / options.label_temperature, -1)
            losses.append(-(p * F.log_softmax(logits, dim=-1)).sum() / max(len(p), 1))
        if options.feature_loss:
            # EAGLE-1's regression onto that state: a dense signal (Ht numbers per position against one label)
            # for heads trained on little data.
            losses[-1] = losses[-1] + options.feature_loss * F.smooth_l1_loss(head.norm(out[ok]).float(), target_final)
        agree.append(float((logits.argmax(-1) == label).sum()) / max(len(label), 1))
        if j == 0:
            positions = len(label)  # the first step's positions: what the summary counts as tokens seen
    weights = [options.step_weight ** j for j in range(len(losses))]
    loss = sum(w * l for w, l in zip(weights, losses)) / sum(weights)
    return loss, agree, positions


def step_loss(head: EagleHead, target_head: TargetHead, samples, states, order: list[int], state: LoopState,
              options: LoopOptions, device):
    """The loss of the step after `state` (batch_loss): its batch and its feature noise are drawn from (seed,
    step), so that a resumed run draws the same."""
    noise = (torch.Generator().manual_seed((options.seed * 1_000_003 + state.step) * 2 + 1)
             if options.feature_noise else None)
    return batch_loss(head, target_head, samples, states, pick_batch(order, state.step, options), options, device,
                      steps_at(progress_of(state, options), options), noise)


def quick_eval(head: EagleHead, samples, states, k: int = 4) -> dict:
    """The head's first-draft acceptance and tokens per forward at k on held-out samples (in eval mode, then
    back to training)."""
    head.eval()
    matches = head_matches(head, samples, states, k)
    head.train()
    result = acceptance(matches, samples, k_max=k)
    return {"acc1": result.cumulative[0], f"tpf{k}": result.tokens_per_forward[k]}


def progress_bar(show: bool) -> tqdm:
    """The training bar, in thousandths of the budget. Off a terminal (a log file, SLURM) a line every 30 s, not
    one per step: fast steps made megabytes of log."""
    return tqdm(total=1000, desc="training", bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed} {postfix}",
                disable=not show, mininterval=0.1 if sys.stderr.isatty() else 30.0)


def record_step(state: LoopState, recent: list, loss: float, agree: list[float], positions: int) -> list:
    """A finished step into `state`: positions seen, and the loss and per-step agreement over the last 20 steps
    (returned, with this one)."""
    state.positions += positions
    recent = (recent + [(loss, agree)])[-20:]
    state.loss = sum(r[0] for r in recent) / len(recent)
    # (with a ramp recent steps unrolled different numbers of steps: each one's mean over those that ran it)
    state.agreement = [statistics.fmean(a[j] for _, a in recent if j < len(a))
                       for j in range(max(len(a) for _, a in recent))]
    return recent


def start_optimizer(head: EagleHead, options: LoopOptions, resume: dict | None):
    """(the trainable parameters, AdamW at the peak rate, that rate, the loop's state), from `resume` if given."""
    params = [p for p in head.parameters() if p.requires_grad]
    peak_lr = options.lr if options.lr is not None else default_lr(head.config.hidden_size)
    opt = torch.optim.AdamW(params, lr=peak_lr, betas=(0.9, 0.95), weight_decay=options.weight_decay)
    if resume is None:
        return params, opt, peak_lr, LoopState()
    head.load_state_dict(resume["head"])
    opt.load_state_dict(resume["optimizer"])
    return params, opt, peak_lr, LoopState(**resume["state"])


def train_loop(head: EagleHead, target, samples, states, heldout, heldout_states, options: LoopOptions,
               checkpoint_path, resume: dict | None = None, device="cpu") -> LoopState:
    """Train `head` in place until the step or time budget is spent; checkpoint to `checkpoint_path`."""
    head.to(device).train()
    params, opt, peak_lr, state = start_optimizer(head, options, resume)
    target_head = TargetHead(target, head.t2d, device)
    order = sorted(range(len(samples)), key=lambda i: len(samples[i].ids))
    autocast = training_autocast(device, options.autocast)
    threads = guard_for(device)

    def save():
        payload = {"head": head.state_dict(), "optimizer": opt.state_dict(), "state": asdict(state)}
        atomic_write(checkpoint_path, lambda tmp: torch.save(payload, tmp))

    bar = progress_bar(options.show_progress)
    last_save, recent, shown, in_a_row = time.time(), [], {}, 0
    try:
        while progress_of(state, options) < 1.0:
            if threads is not None:
                threads.poll()
            t0 = time.time()
            for group in opt.param_groups:
                group["lr"] = lr_at(progress_of(state, options), options, peak_lr)
            with autocast:
                loss, agree, positions = step_loss(head, target_head, samples, states, order, state, options, device)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(params, options.grad_clip)
            state.step += 1
            # One non-finite step would turn every weight into NaN for good: skip it instead, and stop with a
            # clear line if it keeps happening (then the learning rate or the data is at fault, not one batch).
            if not (torch.isfinite(loss) and torch.isfinite(norm)):
                state.skipped += 1
                in_a_row += 1
                if in_a_row >= MAX_SKIPPED_IN_A_ROW:
                    raise NonFiniteLoss(f"the training loss was not finite in {in_a_row} steps in a row (step "
                                        f"{state.step}, peak learning rate {peak_lr:.2g})")
                state.seconds += time.time() - t0
                continue
            in_a_row = 0
            opt.step()
            recent = record_step(state, recent, loss.item(), agree, positions)
            if heldout and (state.step % options.eval_every == 0):
                shown = quick_eval(head, heldout[:16], heldout_states[:16])
                state.history.append({"step": state.step, "loss": recent[-1][0], **shown})
            state.seconds += time.time() - t0
            bar.set_postfix(step=state.step, loss=f"{state.loss:.3f}", acc=f"{state.agreement[0]:.2f}", refresh=False,
                            **{f"heldout_{k}": f"{v:.2f}" for k, v in shown.items()})
            bar.update(int(1000 * progress_of(state, options)) - bar.n)  # redraws at most every mininterval
            if time.time() - last_save > options.checkpoint_every:
                save()
                last_save = time.time()
    finally:  # the next guard starts from torch's count: give back what this one took
        if threads is not None:
            threads.restore()
    bar.close()
    save()
    head.eval()
    return state
