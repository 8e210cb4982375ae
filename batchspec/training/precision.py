"""The training step's precision: bf16 autocast where it pays (a GPU), fp32 elsewhere."""

from __future__ import annotations

import torch


def autocast_enabled(kind: str, mode: str = "auto") -> bool:
    """Whether the training step runs under bf16 autocast on a device of this kind ("cpu", "cuda", ...).
    "auto": on a GPU only. On a 2-core EPYC with AVX512-BF16, bf16 steps of the demo head were 1.3x faster
    (0.16-0.18 s against 0.22-0.23 s), but they left the process's later fp32 forwards about 16% slower
    (drafter none 865 -> 730 tokens/s after 30 s of such training; 881 -> 874 after fp32 training): a job that
    trains its own head decodes in that process afterwards, and train_draft times the target there."""
    if mode not in ("auto", "bfloat16", "off"):
        raise ValueError(f"autocast must be auto, bfloat16 or off, got {mode!r}")
    return mode == "bfloat16" or (mode == "auto" and kind == "cuda")


def training_autocast(device, mode: str = "auto") -> torch.autocast:
    """bf16 autocast for the training step. The weights, the optimiser and the loss stay fp32 (the saved
    head is fp32); only matmul inputs round to bf16, which the head's drafting does not need to match:
    verification by the target keeps the output exact whatever the head proposes."""
    kind = torch.device(device).type
    return torch.autocast(kind if kind in ("cuda", "cpu") else "cpu", dtype=torch.bfloat16,
                          enabled=autocast_enabled(kind, mode))
