"""A static KV cache of B slots whose rows each have their own length, and a forward pass over it.

Layout: for every layer, keys and values of shape [B, H_kv, S, D]. A row's token at position p lives
at index p (no left padding inside the cache). A forward pass writes its T new tokens per row at
positions start_b .. start_b+T-1 and attends through a 4D mask in which query t of row b sees index j
iff j <= start_b + t. Rollback is therefore just setting a row's length: entries past it are never
attended before they are overwritten, because any later forward writes a position before reading it.

Hugging Face attention calls `past_key_values.update(k, v, layer_idx)` and attends over what it
returns; `SlotLayer.update` scatters at the planned per-row positions and returns the used prefix.
Models must get explicit `position_ids` and a 4D mask (transformers would otherwise derive one length
for the whole batch from `get_seq_length()`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache, CacheLayerMixin


@dataclass(slots=True)
class WritePlan:
    """Where the next forward writes: rows [b] (slot indices), positions [b, T], and the attended length."""

    rows: torch.Tensor | None = None
    row_range: slice | None = None  # set when rows are consecutive slots: gather becomes a view
    positions: torch.Tensor | None = None
    kv_len: int = 0


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
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """key_states/value_states [b, H, T, D] -> attended keys/values [b, H, kv_len, D]."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        plan = self.plan
        rows = plan.rows[:, None]  # [b, 1] broadcast against positions [b, T]
        # Advanced indices on dims 0 and 2 around a slice put the index dims first: [b, T, H, D].
        self.keys[rows, :, plan.positions] = key_states.transpose(1, 2)
        self.values[rows, :, plan.positions] = value_states.transpose(1, 2)
        if plan.row_range is not None:
            return self.keys[plan.row_range, :, : plan.kv_len], self.values[plan.row_range, :, : plan.kv_len]
        return self.keys[plan.rows, :, : plan.kv_len], self.values[plan.rows, :, : plan.kv_len]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.plan.kv_len, 0

    def get_seq_length(self) -> int:
        return self.plan.kv_len

    def get_max_length(self) -> int:
        return self.max_len


class SlotKVCache(Cache):
    """B slots x max_len positions for every layer of one model; `lengths[b]` = valid entries of slot b."""

    def __init__(self, num_layers: int, num_slots: int, max_len: int):
        self.plan = WritePlan()
        super().__init__(layers=[SlotLayer(self.plan, num_slots, max_len) for _ in range(num_layers)])
        self.num_slots, self.max_len = num_slots, max_len
        self.lengths = [0] * num_slots  # host-side: the generator decides every round from them

    def rollback(self, slots: list[int], lengths: list[int]) -> None:
        """O(1) per row: entries at or past the new length become invisible, then get overwritten."""
        for slot, length in zip(slots, lengths):
            self.lengths[slot] = length

    @classmethod
    def for_model(cls, model: PreTrainedModel, num_slots: int, max_len: int) -> "SlotKVCache":
        return cls(model.config.get_text_config().num_hidden_layers, num_slots, max_len)


def causal_mask(starts: torch.Tensor, num_queries: int, kv_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive 4D mask [b, 1, T, kv_len] in `dtype`: 0 where query t of row b attends to index j
    (j <= starts[b] + t), finfo(dtype).min elsewhere.

    Eager attention ADDS the mask to the scores (a bool mask there is silently wrong), and sdpa takes an
    additive float mask as well; a bool one it would convert to this every layer (~25% of an sdpa call
    at batch 8 on CPU), so one float mask per forward serves both.
    """
    last = starts[:, None] + torch.arange(num_queries, device=starts.device)  # [b, T]
    allowed = torch.arange(kv_len, device=starts.device)[None, None, :] <= last[:, :, None]  # [b, T, kv]
    return torch.zeros(allowed.shape, dtype=dtype, device=starts.device).masked_fill_(
        ~allowed, torch.finfo(dtype).min
    )[:, None]


def forward(
    model: PreTrainedModel,
    cache: SlotKVCache,
    input_ids: torch.Tensor,
    rows: list[int],
    starts: list[int],
    max_position: int,
    logits_to_keep: int | torch.Tensor = 0,
) -> torch.Tensor:
    """Run `model` on input_ids [b, T] for slots `rows`, writing at positions starts[b] + t.

    Returns logits [b, T', V] (T' = T, or the last `logits_to_keep`). Rows shorter than T are padded
    on the right by the caller; their extra positions write stale entries that are never attended.
    Position ids are clamped to max_position - 1 so padding never indexes past a learned position table.
    """
    device = input_ids.device
    num_queries = input_ids.shape[1]
    kv_len = max(starts) + num_queries
    if kv_len > cache.max_len:
        raise RuntimeError(f"KV cache overflow: a row would write position {kv_len - 1} >= {cache.max_len}")
    starts_t = torch.tensor(starts, device=device)
    positions = starts_t[:, None] + torch.arange(num_queries, device=device)
    plan = cache.plan
    plan.rows = torch.tensor(rows, device=device)
    consecutive = rows == list(range(rows[0], rows[0] + len(rows)))
    plan.row_range = slice(rows[0], rows[0] + len(rows)) if consecutive else None
    plan.positions, plan.kv_len = positions, kv_len
    mask = causal_mask(starts_t, num_queries, kv_len, model.dtype)
    out = model(
        input_ids=input_ids,
        position_ids=positions.clamp(max=max_position - 1),
        attention_mask=mask,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=logits_to_keep,
    )
    return out.logits
