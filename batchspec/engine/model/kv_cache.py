"""A static KV cache of B slots whose rows each have their own length.

Layout: for every layer, keys and values of shape [B, H_kv, S, D], allocated on the first forward. A
row's token at position p lives at index p (no left padding inside the cache). A forward writes its T
new tokens per row at positions start_b .. start_b+T-1 and attends through a 4D mask in which query t
of row b sees index j iff j <= start_b + t. Rollback is therefore just lowering a row's length (the
ModelRunner owns the lengths): entries past it are never attended before they are overwritten,
because any later forward writes a position before reading it.

`attend` is the attention packed forwards run over the cache (packed.py, packed_static.py).

Hugging Face attention calls `past_key_values.update(k, v, layer_idx)` and attends over what it
returns; `SlotLayer.update` scatters at the planned per-row positions and returns the first kv_len
entries of the planned rows. Models must get explicit `position_ids` and a 4D mask (transformers
would otherwise derive one length for the whole batch from `get_seq_length()`).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import PreTrainedModel
from transformers.cache_utils import Cache, CacheLayerMixin


@dataclass(slots=True)
class WritePlan:
    """Where the next forward writes and what it attends over, set by the runner before each forward.

    rows [b] are slot indices, or None for every slot in order; span, when set, is the same rows as a
    slice of consecutive slots (the attended keys are then a view, no gather: eager rounds over a full
    batch); positions [b, T] are the positions the T new tokens take; kv_len is how many cache entries
    each row attends over (a Python int: a shape, fixed per captured graph). A packed forward (packed.py)
    sets `packed` instead: its tokens' slots and indices say where they go, and attention gets the whole
    layer cache, which packed_attention reads per group of rows."""

    rows: torch.Tensor | None = None
    span: slice | None = None
    positions: torch.Tensor | None = None
    kv_len: int = 0
    packed: object | None = None  # a packed.PackedBatch


class SlotLayer(CacheLayerMixin):
    """One layer's [B, H_kv, S, D] keys and values, allocated on first use."""

    is_compileable = False
    is_sliding = False

    def __init__(self, plan: WritePlan, num_slots: int, max_len: int):
        super().__init__()
        self.plan, self.num_slots, self.max_len = plan, num_slots, max_len

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        _, heads, _, k_dim = key_states.shape
        shape = (self.num_slots, heads, self.max_len)
        self.keys = key_states.new_zeros(*shape, k_dim)
        self.values = value_states.new_zeros(*shape, value_states.shape[-1])
        self.all_rows = torch.arange(self.num_slots, device=key_states.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """key_states/value_states [b, H, T, D] -> attended keys/values [b, H, kv_len, D]."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        plan = self.plan
        if plan.packed is not None:  # key_states [1, H, N, D]: token n into slot slots[n] at index[n]
            self.keys[plan.packed.slots, :, plan.packed.index] = key_states[0].transpose(0, 1)
            self.values[plan.packed.slots, :, plan.packed.index] = value_states[0].transpose(0, 1)
            return self.keys, self.values
        rows = (self.all_rows if plan.rows is None else plan.rows)[:, None]  # [b, 1] against positions [b, T]
        # Advanced indices on dims 0 and 2 around a slice put the index dims first: [b, T, H, D].
        self.keys[rows, :, plan.positions] = key_states.transpose(1, 2)
        self.values[rows, :, plan.positions] = value_states.transpose(1, 2)
        if plan.rows is None:
            return self.keys[:, :, : plan.kv_len], self.values[:, :, : plan.kv_len]
        if plan.span is not None:
            return self.keys[plan.span, :, : plan.kv_len], self.values[plan.span, :, : plan.kv_len]
        return self.keys[plan.rows, :, : plan.kv_len], self.values[plan.rows, :, : plan.kv_len]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.plan.kv_len, 0

    def get_seq_length(self) -> int:
        return self.plan.kv_len

    def get_max_length(self) -> int:
        return self.max_len


class SlotKVCache(Cache):
    """B slots x max_len positions for every layer of one model. It keeps no lengths: the ModelRunner
    that owns it does, and tells it through `plan` where each forward writes."""

    def __init__(self, num_layers: int, num_slots: int, max_len: int):
        self.plan = WritePlan()
        super().__init__(layers=[SlotLayer(self.plan, num_slots, max_len) for _ in range(num_layers)])
        self.num_slots, self.max_len = num_slots, max_len

    @classmethod
    def for_model(cls, model: PreTrainedModel, num_slots: int, max_len: int) -> "SlotKVCache":
        return cls(model.config.get_text_config().num_hidden_layers, num_slots, max_len)

    def compact(self, rows: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Move entries of every layer: slot rows[i]'s index src[i, j] to dst[i, j] (all read before any is
        written), for a tree's accepted path. rows [b], src/dst [b, A]."""
        for layer in self.layers:
            if not layer.is_initialized:
                return
            index = rows[:, None]
            keys, values = layer.keys[index, :, src], layer.values[index, :, src]  # [b, A, H, D]
            layer.keys[index, :, dst] = keys
            layer.values[index, :, dst] = values


@dataclass(frozen=True, slots=True)
class SlidingWindow:
    """A model whose attention layers (some or all) keep to the last `size` positions: a query at position p
    sees keys at positions p - size + 1 .. p (transformers' sliding_window_overlay). per_layer: its layers say
    which they are (config.layer_types), and the model takes a mask per layer type ({"full_attention": ...,
    "sliding_attention": ...}); otherwise every layer keeps to the window and takes the one mask (Mistral)."""

    size: int
    per_layer: bool

    @classmethod
    def of(cls, model) -> "SlidingWindow | None":
        """The model's window, or None when every layer attends to the whole sequence."""
        config = model.config.get_text_config()
        size = getattr(config, "sliding_window", None)
        if not isinstance(size, int) or size <= 0 or getattr(config, "use_sliding_window", True) is False:
            return None
        layer_types = getattr(config, "layer_types", None)
        if layer_types is not None:
            return cls(size, per_layer=True) if "sliding_attention" in layer_types else None
        return cls(size, per_layer=False)

    def model_mask(self, full: torch.Tensor, windowed: torch.Tensor) -> torch.Tensor | dict:
        """The attention_mask a model takes: a mask per layer type, or the windowed one for every layer."""
        return {"full_attention": full, "sliding_attention": windowed} if self.per_layer else windowed


def causal_mask(positions: torch.Tensor, kv_len: int, dtype: torch.dtype, window: int | None = None) -> torch.Tensor:
    """positions [b, T] -> additive 4D mask [b, 1, T, kv_len] in `dtype`: 0 where query t of row b
    attends to index j (j <= positions[b, t], and with a sliding window j > positions[b, t] - window),
    finfo(dtype).min elsewhere.

    Eager attention ADDS the mask to the scores (a bool mask there is silently wrong), and sdpa takes an
    additive float mask as well; a bool one it would convert to this every layer (~25% of an sdpa call
    at batch 8 on CPU), so one float mask per forward serves both. Built on the device from the
    positions, so a captured forward needs nothing from the host.
    """
    index = torch.arange(kv_len, device=positions.device)
    blocked = index[None, None, :] > positions[:, :, None]  # [b, T, kv]
    if window is not None:
        blocked |= index[None, None, :] <= positions[:, :, None] - window
    return torch.zeros(blocked.shape, dtype=dtype, device=positions.device).masked_fill_(
        blocked, torch.finfo(dtype).min
    )[:, None]


GPU_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
           scaling: float | None, *, softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """query [b, T, H, D], key [b, H_kv, kv, D], value [b, H_kv, kv, Dv], mask [b, 1, T, kv] additive -> [b, T, H,
    Dv]; softcap (Gemma 2) and sinks [H] (gpt-oss, a logit per head) written out as their models' eager attention
    (sdpa has neither).

    Grouped-query attention without copying keys: the H / H_kv query heads that share a key head are
    stacked along the query axis ([b, H_kv, g * T, D]), as transformers does for one query token
    (`pack_gqa`); for more tokens it repeats every key and value instead, which took half of a verify
    forward's time at batch 64 on CPU (measured)."""
    b, t, heads, dim = query.shape
    kv_heads = key.shape[1]
    g = heads // kv_heads
    q = query.permute(0, 2, 1, 3).reshape(b, kv_heads, g * t, dim)  # head h = kv head h // g, member h % g
    m = mask.expand(b, g, t, mask.shape[-1]).reshape(b, 1, g * t, mask.shape[-1]) if g > 1 else mask
    if softcap is not None or sinks is not None:
        out = _eager(q, key, value, m, dim ** -0.5 if scaling is None else scaling, softcap, sinks, g, t)
    else:
        # On a GPU not cuDNN's attention: it builds a plan per new shape (~30 ms each), and packed shapes vary.
        with sdpa_kernel(list(GPU_BACKENDS)) if q.is_cuda else nullcontext():
            out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=m, scale=scaling)
    # Dv may differ from D (MiMo-V2-Flash); a GPU's SDPA may return the output non-contiguous.
    return out.reshape(b, heads, t, value.shape[-1]).transpose(1, 2)


def _eager(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scaling: float,
           softcap: float | None, sinks: torch.Tensor | None, g: int, t: int) -> torch.Tensor:
    """attend's scores written out, q [b, H_kv, g * T, D] -> the same: capped before the mask, softmax in fp32
    (Gemma 2); a sink as one more logit per query row, dropped after the softmax (gpt-oss)."""
    scores = torch.matmul(q, key.transpose(-1, -2)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores + mask
    if sinks is None:
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    else:
        sink = sinks.reshape(q.shape[1], g, 1, 1).expand(-1, g, t, 1).reshape(1, q.shape[1], g * t, 1)
        scores = torch.cat([scores, sink.expand(q.shape[0], -1, -1, -1).to(scores.dtype)], dim=-1)
        scores = scores - scores.max(dim=-1, keepdim=True).values
        probs = torch.softmax(scores, dim=-1, dtype=scores.dtype)[..., :-1]
    return torch.matmul(probs.to(value.dtype), value)
