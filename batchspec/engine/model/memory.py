"""What the captured path costs in device memory besides weights and KV caches, computed before anything
is allocated, and the length buckets a memory budget allows.

Captured steps write into buffers allocated once (the runners' logits buffers, the round's buffers) and
take their temporaries from one memory pool that every graph of a generator shares: a capture's
temporaries are free again when it ends, so the next capture reuses them, and the pool is about the
largest single step's temporaries. Each graph also costs a little of its own (its kernels' nodes):
GRAPH_BYTES, an assumption (not measured here) that makes the graph count matter. The estimate errs
high: it counts every temporary of a layer as alive at once.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from functools import partial

import torch

from .graphs import CAPTURED, CaptureError
from .packed import supports_packing
from .shapes import kv_buckets, token_buckets

log = logging.getLogger("batchspec")

GRAPH_BYTES = 2 << 20  # per captured graph, beyond the pool (assumed)
MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class Shape:
    """What the memory of a model's steps depends on."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    layers: int

    @classmethod
    def of(cls, config) -> "Shape":
        config = config.get_text_config()
        heads = config.num_attention_heads
        hidden = config.hidden_size
        return cls(hidden, getattr(config, "intermediate_size", None) or 4 * hidden, heads,
                   getattr(config, "num_key_value_heads", None) or heads,
                   getattr(config, "head_dim", None) or hidden // heads, config.vocab_size,
                   config.num_hidden_layers)


@dataclass(frozen=True, slots=True)
class GraphMemory:
    buffers: int  # bytes of the static buffers
    pool: int  # bytes of the shared pool: the largest step's temporaries
    graphs: int  # captured steps

    @property
    def total(self) -> int:
        return self.buffers + self.pool + self.graphs * GRAPH_BYTES

    def __str__(self) -> str:
        return (f"{self.total / MiB:,.0f} MiB ({self.graphs} graphs; buffers {self.buffers / MiB:,.0f} MiB, "
                f"pool {self.pool / MiB:,.0f} MiB)")


def step_temporaries(m: Shape, rows: int, width: int, kv_len: int, dtype_bytes: int, logits_per_row: int) -> int:
    """A forward of `width` tokens for `rows` rows over `kv_len` cached entries: the live temporaries of one
    layer (hidden states, q/k/v, the additive mask, keys and values repeated to every head — sdpa with an
    explicit mask does not group them —, the attention scores in float32, the MLP's intermediates), plus
    the logits it keeps (logits_per_row per row) and, for a verify or draft step, the float32 work of
    choosing tokens from them (scores, noise, the sum)."""
    tokens = rows * width
    layer = tokens * (4 * m.hidden + 3 * m.intermediate) * dtype_bytes
    layer += rows * width * kv_len * dtype_bytes  # the mask
    layer += 2 * rows * m.heads * kv_len * m.head_dim * dtype_bytes  # repeated keys and values
    layer += rows * m.heads * width * kv_len * 4  # scores
    return layer + rows * logits_per_row * m.vocab * (dtype_bytes + 3 * 4)


def estimate(target: Shape, *, num_slots: int, widths: list[int], buckets: list[int], dtype_bytes: int,
             draft: Shape | None = None, draft_steps: int = 0, prefill_chunk: int = 64, noise: bool = False,
             probs: bool = False, packed_chain: int = 0, tree_widths: tuple[int, ...] = ()) -> GraphMemory:
    """The captured path of a generator: the target's verify widths and prefill chunks over every bucket,
    the acceptance, and a draft model's drafting steps (draft_steps per bucket) and prefill chunks.
    packed_chain: the widest chain when verifies are packed (packed_static.py: a step per token bucket
    instead of one per chain width, a gather per width, and the packed logits buffer); 0: unpacked.
    tree_widths: the trees' verify widths among `widths` (packed, each tree has steps of its own per token
    bucket up to num_slots x its width, and a gather)."""
    widest = max(widths)
    v = target.vocab
    buffers = num_slots * widest * v * dtype_bytes + (num_slots + 1) * v * dtype_bytes  # logits, prefill's last
    buffers += num_slots * widest * v * 4 * (int(noise) + 2 * int(probs))  # noise; q (and a tree's q_at)
    chunk_rows = 1 << max(num_slots - 1, 0).bit_length()
    pool = max(step_temporaries(target, num_slots, widest, buckets[-1], dtype_bytes, widest),
               step_temporaries(target, chunk_rows, prefill_chunk, buckets[-1], dtype_bytes, 1))
    rows_buckets = max(num_slots - 1, 0).bit_length() + 1
    forwards, gathers = len(widths), 0
    if packed_chain:
        trees = set(tree_widths)
        buffers += num_slots * max([packed_chain, *trees]) * v * dtype_bytes
        # A tree as wide as the widest chain still has steps of its own (their mask is its ancestors).
        forwards = len(token_buckets(num_slots, packed_chain)) + sum(len(token_buckets(num_slots, w)) for w in trees)
        gathers = len(set(range(1, packed_chain + 1)) | trees)
    graphs = len(buckets) * (forwards + rows_buckets) + len(widths) + gathers + 3  # forwards, chunks; acceptance...
    if draft is not None:
        buffers += (num_slots + 1) * draft.vocab * dtype_bytes
        pool = max(pool, step_temporaries(draft, num_slots, 2, buckets[-1], dtype_bytes, 1),
                   step_temporaries(draft, chunk_rows, prefill_chunk, buckets[-1], dtype_bytes, 1))
        graphs += len(buckets) * (draft_steps + rows_buckets)
    return GraphMemory(buffers, pool, graphs)


def fit_buckets(buckets: list[int], budget: int | None, estimate_for) -> tuple[list[int], GraphMemory]:
    """The buckets to capture within `budget` bytes (None: no budget): every other bucket below the
    capacity is dropped until the estimate fits (fewer buckets, fewer graphs; a row then attends over a
    longer padded length). Raises CaptureError when even the capacity alone does not fit."""
    memory = estimate_for(buckets)
    while budget is not None and memory.total > budget and len(buckets) > 1:
        buckets = buckets[:-1][1::2] + buckets[-1:]
        memory = estimate_for(buckets)
    if budget is not None and memory.total > budget:
        raise CaptureError(f"the captured steps need about {memory}, over the budget of {budget / MiB:,.0f} MiB: "
                          "lower batch_size or max_seq_len, or run with compile=off")
    return buckets, memory


def kv_bytes(m: Shape, *, num_slots: int, capacity: int, dtype_bytes: int) -> int:
    """Bytes of one model's KV caches: keys and values of every layer for num_slots x capacity positions."""
    return 2 * m.layers * num_slots * m.kv_heads * capacity * m.head_dim * dtype_bytes


def device_memory(device) -> int | None:
    """All the memory of `device` in bytes (a GPU's, or the machine's RAM for the CPU), or None if unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def kv_problem(models, *, num_slots: int, capacity: int, max_seq_len: int) -> str | None:
    """Why the KV caches cannot fit on the target's device at all (they are allocated at the first
    forward, where a failure would stop the job mid-run with a traceback), or None."""
    need = sum(kv_bytes(Shape.of(model.config), num_slots=num_slots, capacity=capacity,
                        dtype_bytes=model.dtype.itemsize)
               for model in (models.target, models.draft) if model is not None)
    have = device_memory(models.target.device)
    if have is None or need <= have:
        return None
    return (f"batch_size={num_slots} with max_seq_len={max_seq_len}: the KV caches need {need / (1 << 30):,.1f} GiB, "
            f"more than the {have / (1 << 30):,.1f} GiB of memory of {models.target.device}; lower batch_size or "
            "max_seq_len")


def capture_buckets(models, mode: str | None, capacity: int, *, batch_size: int, k: int, trees, sampling,
                    drafter: str, budget: int | None, pack_static: bool = True) -> list[int]:
    """The attended-length buckets of the static steps: all of them, or on a GPU as many as the memory
    budget for captured steps allows (engine/model/memory.py; default: what is free after the KV caches, less
    1 GiB). Logs the estimate when capturing."""
    buckets = kv_buckets(capacity)
    if mode not in CAPTURED:
        return buckets
    target = models.target
    widths = sorted({*range(1, k + 2), *(t.nodes + 1 for t in trees)})
    packed_chain = k + 1 if pack_static and supports_packing(target) else 0
    dtype_bytes = target.dtype.itemsize
    draft = Shape.of(models.draft.config) if drafter == "model" and models.draft is not None else None
    if budget is None:
        free = torch.cuda.mem_get_info(target.device)[0]
        kv = sum(2 * (batch_size + 1) * capacity * s.kv_heads * s.head_dim * s.layers * dtype_bytes
                 for s in filter(None, (Shape.of(target.config), draft)))
        budget = free - kv - (1 << 30)
    estimate_for = partial(estimate, Shape.of(target.config), num_slots=batch_size, widths=widths,
                           dtype_bytes=dtype_bytes, draft=draft, draft_steps=max([k, *(t.depth for t in trees)]),
                           noise=sampling.coupled, probs=not (sampling.greedy or sampling.coupled) and draft is not None,
                           packed_chain=packed_chain, tree_widths=tuple({t.nodes + 1 for t in trees}))
    chosen, memory = fit_buckets(buckets, budget, lambda b: estimate_for(buckets=b))
    log.info("captured steps: about %s%s", memory,
             "" if chosen == buckets else f"; buckets {chosen} of {buckets} to fit {budget >> 20:,} MiB")
    return chosen
