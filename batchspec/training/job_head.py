"""Training a self-training job's head (selftrain.py): from the first rows' token ids, the target's hidden
states, EAGLE-3's training-time test for the rest of the budget, held-out acceptance, saved atomically."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path

import torch

from .data import Sample
from .evaluate import acceptance, head_matches
from .features import sequence_states
from ..eagle.formats import save_head
from .init import head_for_target, scale_fc
from .loop import LoopOptions, train_loop
from .phases import TRAIN_MIN_S, write_verdict
from .vocab import vocab_for

log = logging.getLogger("batchspec")


class NoHead(Exception):
    """The job trains no head (the reason is the message)."""


def train_job_head(models, samples: list[Sample], budget: float, started: float, *, heldout_rows: int, seed: int,
                   minutes: float | None, head_dir: Path, first_rate: float | None):
    """A head for the target from a self-training job's first rows (the last `heldout_rows` held out), trained
    for what is left of `budget` seconds since `started` and saved atomically in `head_dir`:
    (head, its held-out acceptance or None). Raises NoHead when the target's features leave less than
    TRAIN_MIN_S of the budget for training steps."""
    heldout_acceptance = None
    target = models.target
    heldout = samples[-heldout_rows:] if len(samples) > 2 * heldout_rows else []
    train = samples[: len(samples) - len(heldout)]
    if not train:
        raise RuntimeError("model.draft=train: the first rows gave no completions to train a head on")
    draft_ids = vocab_for(train, target.config.get_text_config().vocab_size,
                          always=tuple(models.eos_token_ids)).target_ids
    torch.manual_seed(seed)
    head = head_for_target(target, draft_target_ids=draft_ids)
    layer_ids = head.config.target_layer_ids
    work = torch.float32 if target.device.type == "cpu" else target.dtype
    states = sequence_states(target, [s.ids for s in train], layer_ids, dtype=work)
    heldout_states = sequence_states(target, [s.ids for s in heldout], layer_ids, dtype=torch.float32)
    scale_fc(head, torch.cat([st[0] for st in states[:64]]))
    spent = time.perf_counter() - started
    if minutes is None and budget - spent < TRAIN_MIN_S:
        raise NoHead(f"the target's features took {spent:.0f} s of the {budget:.0f} s training budget, which "
                     f"leaves less than {TRAIN_MIN_S:.0f} s to train a head")
    # No tqdm bar inside a job: its own progress (bar or log lines) reports the rows, and this logs the start/end.
    # Small batches and no loss on the prompts: with a budget of minutes, more steps over the positions the
    # head will draft at teach it most (a 60 s budget on the demo target: 3.15 tokens per forward at k=4 on
    # held-out rows against 2.97 with 8 sequences, 5 unrolled steps and the prompts' positions). No feature
    # loss (LoopOptions' 0, train_draft's 10): there it gave 3.66 and 3.58 against 3.78 and 3.73 (seeds 0, 1).
    options = LoopOptions(seconds=max(1.0, budget - spent),
                          batch_size=4, ttt_steps=4, train_on_prompt=False, eval_every=10**9, seed=seed,
                          show_progress=False)
    log.info("training an EAGLE-3 head on %d rows for about %.1f min", len(train), options.seconds / 60)
    head_dir.mkdir(parents=True, exist_ok=True)
    write_verdict(head_dir, first_rate, None)  # before the head: a saved head always has its record
    train_loop(head, target, train, states, [], [], options, head_dir / "checkpoint.pt", device=target.device)
    head.to(device=target.device, dtype=torch.float32).eval()
    if heldout:
        heldout_acceptance = asdict(acceptance(head_matches(head, heldout, heldout_states, 5), heldout, k_max=5))
    head.to(dtype=target.dtype)
    save_head(head, head_dir)
    (head_dir / "checkpoint.pt").unlink(missing_ok=True)
    log.info("trained an EAGLE-3 head on %d rows in %.0f s -> %s", len(train), time.perf_counter() - started,
             head_dir)
    return head, heldout_acceptance
