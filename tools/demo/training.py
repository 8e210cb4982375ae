"""Training: batches of windows or whole sequences, the learning-rate schedule, held-out loss, and the loop
(next-token cross-entropy for the target, KL to the target's next-token distribution for the draft)."""

from __future__ import annotations

import math
import statistics
import time

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel


def random_windows(stream: torch.Tensor, gen: torch.Generator, batch: int, seq_len: int, bos: int) -> torch.Tensor:
    """`batch` rows of `<s>` + `seq_len - 1` consecutive tokens starting at random offsets of `stream`."""
    starts = torch.randint(0, len(stream) - seq_len, (batch,), generator=gen)
    rows = torch.stack([stream[s : s + seq_len - 1] for s in starts.tolist()])
    return torch.cat([torch.full((batch, 1), bos, dtype=torch.long), rows], dim=1)


def fixed_windows(stream: torch.Tensor, seq_len: int, bos: int, limit: int | None = None) -> torch.Tensor:
    """Non-overlapping `<s>`-prefixed windows covering `stream` (the tail that does not fill one is dropped)."""
    n = (len(stream) // (seq_len - 1)) if limit is None else min(limit, len(stream) // (seq_len - 1))
    rows = stream[: n * (seq_len - 1)].view(n, seq_len - 1)
    return torch.cat([torch.full((n, 1), bos, dtype=torch.long), rows], dim=1)


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warmup, then cosine decay to 10% of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.inference_mode()
def eval_loss(model: PreTrainedModel, windows: torch.Tensor, batch: int = 8) -> float:
    """Mean next-token cross-entropy (nats) over all predicted positions of `windows`."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch):
        x = windows[i : i + batch]
        logits = model(input_ids=x).logits[:, :-1]
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum").item()
        count += x[:, 1:].numel()
    return total / count


def window_batches(stream: torch.Tensor, batch: int, seq_len: int):
    """Sampler of `<s>`-prefixed random windows of `stream`: gen -> (input_ids [batch, seq_len], no mask)."""
    return lambda gen: (random_windows(stream, gen, batch, seq_len, bos=0), None)


def sequence_batches(sequences: list[list[int]], batch: int, pad: int):
    """Sampler of whole sequences drawn at random, right-padded: gen -> (input_ids [batch, L], mask [batch, L])."""
    def sample(gen: torch.Generator):
        picks = [sequences[i] for i in torch.randint(len(sequences), (batch,), generator=gen).tolist()]
        width = max(map(len, picks))
        x = torch.tensor([s + [pad] * (width - len(s)) for s in picks])
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in picks])
        return x, mask
    return sample


def train(model: PreTrainedModel, sample, *, steps: int, lr: float, seed: int, name: str,
          eval_windows: torch.Tensor, teacher: PreTrainedModel | None = None, log_every: int = 25) -> float:
    """AdamW on batches from `sample(gen) -> (input_ids, mask or None)`; next-token CE, or the KL to
    `teacher`'s next-token distribution at every real position if a teacher is given.

    Returns the mean training loss of the last 10% of the steps.
    """
    gen = torch.Generator().manual_seed(seed)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    if teacher is not None:
        teacher.eval()
    losses, start = [], time.time()
    for step in range(steps):
        model.train()
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup=max(1, steps // 20))
        x, mask = sample(gen)
        logits = model(input_ids=x, attention_mask=mask).logits
        if teacher is None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        else:
            with torch.no_grad():
                target_logp = F.log_softmax(teacher(input_ids=x, attention_mask=mask).logits, dim=-1)
            kl = F.kl_div(F.log_softmax(logits, dim=-1), target_logp, log_target=True, reduction="none").sum(-1)
            loss = kl.mean() if mask is None else kl[mask.bool()].mean()  # [B, T] -> mean over real positions
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if (step + 1) % log_every == 0 or step + 1 == steps:
            recent = statistics.mean(losses[-log_every:])
            msg = f"[{name}] step {step + 1}/{steps} {'kl' if teacher else 'loss'} {recent:.3f}"
            if (step + 1) % (log_every * 8) == 0 or step + 1 == steps:
                msg += f" held-out loss {eval_loss(model, eval_windows):.3f}"
            print(f"{msg} ({time.time() - start:.0f}s)", flush=True)
    model.eval()
    return statistics.mean(losses[-max(1, steps // 10):]) if losses else None  # steps=0: not trained
