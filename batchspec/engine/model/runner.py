"""ModelRunner: one model, its slot KV cache, the per-slot lengths, and the forwards over them.

Nothing else touches a model's cache. `lengths[s]` (on the device) is the number of valid cache
entries of slot s and the single source of truth for where the next forward writes; other modules read
it and change it only through the runner's methods (`set_lengths`, also the rollback: O(1), no copy;
`copy_lengths`, `copy_length`, `reset_lengths`, `lengths_kept`). The cache has one slot more than the
batch: a scratch slot that the padding rows of a prefill chunk write to.

Forwards:
  - eager (the CPU default): `prefill` of ragged new prompts, and `forward(tokens, rows=...)` of some
    slots, attending over exactly `kv_len` entries; consecutive slots are read as views, not gathered;
  - static (captured on a GPU): `forward(tokens)` of T tokens for every slot, attending over a length
    bucket (64, 128, ... up to the capacity), and prefill chunks of C tokens for P rows; positions and
    masks come from `lengths` on the device, so a step needs nothing from the host. Each (T, bucket) and
    (P, bucket) is a step of the generator's StepGraphs, declared at start and captured there, by the
    runner's two parts: `static_steps` (static_steps.py: the forwards, the packed verify, the output
    buffer) and `static_prefill` (prefill.py: prompt chunks, prefix copies). A step writes its logits into
    the runner's one output buffer (a contiguous prefix of it) and returns that view: read it before this
    runner's next forward.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Iterable, Iterator

import torch
from transformers import PreTrainedModel

from .few_rows import FewRowLinears
from .graphs import StepGraphs
from .kv_cache import SlidingWindow, SlotKVCache, causal_mask
from .model_calls import RowPositions, cache_argument
from .packed import (PackedBatch, PackingUnsupported, RowTokens, pack, packed_attention_on, register,
                     supports_packing)
from .prefill import StaticPrefill
from .shapes import PREFILL_CHUNK, kv_buckets
from .static_steps import StaticSteps
from ..tree import TreeShape, tree_mask


class ModelRunner:
    """Owns `model`'s slot cache (num_slots + 1 scratch x capacity positions) and lengths [num_slots + 1].

    graphs: the generator's StepGraphs (its mode decides eager or static forwards). widths: the step
    widths T of static forwards (verify widths for a target; 1 and 2 for a draft). max_position clamps
    position ids so that padding never indexes past a learned position table. name appears in logs.
    packed_width: a target's widest chain verify; with it the target's static verify forwards, chains and
    trees (each tree at its own width), are packed (packed_static.py; 0: not packed, and models that cannot
    pack never are).
    """

    def __init__(self, model: PreTrainedModel, *, num_slots: int, capacity: int, max_position: int,
                 graphs: StepGraphs, widths: Iterable[int] = (1,), buckets: list[int] | None = None,
                 name: str = "model", feature_layers: tuple[int, ...] = (), packed_width: int = 0):
        self.model, self.name, self.graphs = model, name, graphs
        self._cache_argument = cache_argument(model)
        self._row_positions = RowPositions.of(model)
        # Hidden states a drafter reads (EAGLE-3): output_hidden_states indices, concatenated per token.
        self.feature_layers = tuple(feature_layers)
        self.features: torch.Tensor | None = None  # [b, T, F] of the last forward (static: a buffer view)
        self.device = model.device
        self.num_slots, self.capacity, self.max_position = num_slots, capacity, max_position
        self.scratch = num_slots  # the extra slot
        self.cache = SlotKVCache.for_model(model, num_slots + 1, capacity)
        self.window = SlidingWindow.of(model)  # sliding-window layers: their masks keep to it
        # Eager forwards on a CPU: each weight shape's products over few rows in the order measured faster.
        self.linears = FewRowLinears(model) if self.device.type == "cpu" and not graphs.static else nullcontext()
        self.lengths = torch.zeros(num_slots + 1, dtype=torch.long, device=self.device)
        self.slot_index = torch.arange(num_slots, device=self.device)  # every slot, in order
        self.widths = sorted(set(widths))
        self.buckets = buckets if buckets is not None else kv_buckets(capacity)
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self._arange = torch.arange(max(self.widths + [PREFILL_CHUNK]) + 1, device=self.device)
        # Eager forwards of a model whose attention transformers dispatches are packed (packed.py); static
        # verify forwards too when asked (packed_static.py).
        packable = supports_packing(model) and self._packs_through()
        self.packs = not graphs.static and packable
        self.packed_width = packed_width if graphs.static and packable else 0
        if self.packs or self.packed_width:
            register()
        # The captured path's parts: every slot's forwards and packed verify, and the prompts' chunks.
        self.static_steps = StaticSteps(self)
        self.static_prefill = StaticPrefill(self) if graphs.static else None

    @property
    def static(self) -> bool:
        return self.graphs.static

    @torch.inference_mode()
    def _packs_through(self) -> bool:
        """Whether a packed forward reaches packed_attention in every layer: one token into the scratch slot
        (a model may declare the attention interface and still not pass the forward's keywords on)."""
        register()
        batch = self.pack([RowTokens(self.scratch, 0, 1)])
        try:
            self.call_packed(torch.zeros(1, dtype=torch.long, device=self.device), batch.positions, batch)
        except PackingUnsupported:
            return False
        return True

    # ---- lengths ---------------------------------------------------------------------------------

    # Every write of `lengths` is one of these (in place: captured steps hold the tensor), no other module's.

    def set_lengths(self, rows: torch.Tensor | slice | int, lengths: torch.Tensor | int) -> None:
        """Set the valid length of `rows` (a rollback when it is lower): device-side, no sync."""
        self.lengths[rows] = lengths

    def copy_lengths(self, index: torch.Tensor, lengths: torch.Tensor) -> None:
        """Set the lengths of the slots in `index` [n] to lengths [n] (index_copy_)."""
        self.lengths.index_copy_(0, index, lengths)

    def copy_length(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Slots dst take the lengths of slots src (a copied prefix)."""
        self.lengths[dst] = self.lengths[src]

    def reset_lengths(self, index: torch.Tensor | None = None) -> None:
        """Slots in `index` (default: every slot) hold nothing: idle, they ride along from position 0."""
        if index is None:
            self.lengths.zero_()
        else:
            self.lengths.index_fill_(0, index, 0)

    @contextmanager
    def lengths_kept(self) -> Iterator[None]:
        """The lengths as they are now come back after the block (timed replays that write past them)."""
        saved = self.lengths.clone()
        try:
            yield
        finally:
            self.lengths.copy_(saved)

    def bucket(self, kv_len: int) -> int:
        return next(b for b in self.buckets if b >= kv_len)

    # ---- eager, ragged ---------------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, rows: list[int], ids: torch.Tensor, starts: list[int], lengths: list[int], *,
                all_logits: bool = False, extra: dict | None = None) -> torch.Tensor:
        """Eagerly write ids[i, :lengths[i]] ([b, W], right-padded) at positions starts[i].. of slot rows[i]
        and set that slot's length to the end of it. Returns the logits after each row's last token [b, V]
        (all_logits: after every token, [b, W, V]). extra: more model inputs, [b, W, ...] each (an EAGLE
        head's hidden states)."""
        ends = [s + n for s, n in zip(starts, lengths)]
        self.check(max(ends))
        rows_t = torch.tensor(rows, device=self.device)
        if all_logits:
            logits = self.call(ids, torch.tensor(starts, device=self.device), max(ends), 0, rows=rows_t, extra=extra)
            self.lengths[rows_t] = torch.tensor(ends, device=self.device)
            return logits
        # Logits only at each row's last position: the distinct columns for every row, then each row's own.
        keep = sorted({n - 1 for n in lengths})
        logits = self.call(ids, torch.tensor(starts, device=self.device), max(ends),
                           torch.tensor(keep, device=self.device), rows=rows_t, extra=extra)
        column = torch.tensor([keep.index(n - 1) for n in lengths], device=self.device)
        self.lengths[rows_t] = torch.tensor(ends, device=self.device)
        return logits[torch.arange(len(rows), device=self.device), column]

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, *, kv_len: int, rows: torch.Tensor | slice | None = None,
                last_only: bool = False, tree: TreeShape | None = None, seqs: torch.Tensor | None = None,
                from_seqs: int = 0, extra: dict | None = None, keep: torch.Tensor | None = None) -> torch.Tensor:
        """tokens [b, T] written at cache indices lengths[row] + t -> logits [b, T, V] ([.., 1, V] with
        last_only). Lengths are not changed: `set_lengths` decides what stays.

        rows: the slots to run eagerly, as an index tensor [b] or, when they are consecutive, a slice
        (their keys are then read as a view); None for the static step over every slot, which feeds
        `from_seqs` tokens of each slot's own sequence first (seqs [num_slots, S] at lengths + t: e.g. the
        pending token) and then tokens [num_slots, T - from_seqs], and returns a view of the output buffer.
        kv_len: an upper bound, known on the host, of lengths[row] + T over the rows that matter.
        tree: the tokens are a tree per row (tree.py): position ids lengths + depth, and each query sees
        the prefix and its own ancestors; None is a chain (causal). extra: more model inputs [b, T, ...]
        (eager only); keep [b, n]: per row, the positions whose logits come back (eager only).
        """
        self.check(kv_len)
        if rows is None:
            return self.static_steps.forward(tokens, kv_len=kv_len, last_only=last_only, tree=tree, seqs=seqs,
                                             from_seqs=from_seqs)
        depth, ancestors = (tree.depth, tree.ancestors) if tree is not None else (None, None)
        span = rows if isinstance(rows, slice) else None
        index = self.slot_index[span] if span is not None else rows
        to_keep = keep if keep is not None else 1 if last_only else 0
        return self.call(tokens, self.lengths[index], kv_len, to_keep, depth, ancestors, index, span, extra)

    def pack(self, rows: list[RowTokens], keep: list[int] | None = None, tree: TreeShape | None = None) -> PackedBatch:
        """packed.pack for this runner's model (its device, dtype and sliding window); tree: the geometry of the
        forward's tree rows."""
        return pack(rows, device=self.device, dtype=self.model.dtype, keep=keep,
                    tree_depth=tree.depth if tree is not None else None,
                    tree_ancestors=tree.ancestors if tree is not None else None,
                    window=self.window.size if self.window is not None else None)

    @torch.inference_mode()
    def forward_packed(self, ids: torch.Tensor, batch: PackedBatch, extra: dict | None = None) -> torch.Tensor:
        """ids [N]: the tokens of a packed forward (packed.py), written where `batch` says -> logits [M, V]
        at batch.keep (every token when keep is None); the features of all N tokens, [N, F], when the
        runner hands them out. Lengths are not changed. extra: more model inputs [1, N, ...]."""
        self.check(max(row.start + row.count for row in batch.rows))
        logits, self.features = self.call_packed(ids, batch.positions, batch, batch.keep, extra)
        return logits

    def call_packed(self, ids: torch.Tensor, positions: torch.Tensor, batch, keep: torch.Tensor | None = None,
                    extra: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One packed forward of ids [N] at positions [N], written and attended as `batch` says (a PackedBatch,
        or a static layout: packed_static.py) -> (logits [M, V] at keep, or every token's; the features
        [N, F] when the runner hands them out, else None)."""
        self.cache.plan.packed = batch
        try:
            with packed_attention_on(self.model), self.linears:
                out = self.model(
                    input_ids=ids.clamp(max=self.vocab_size - 1)[None],
                    position_ids=positions.clamp(max=self.max_position - 1)[None],
                    attention_mask=None,  # the packed attention masks by its own layout
                    **{self._cache_argument: self.cache},
                    use_cache=True,
                    logits_to_keep=keep if keep is not None else 0,
                    output_hidden_states=bool(self.feature_layers),
                    packed=batch,
                    **(extra or {}),
                )
        finally:
            self.cache.plan.packed = None
        features = None
        if self.feature_layers:
            features = torch.cat([out.hidden_states[i][0] for i in self.feature_layers], dim=-1)
        return self._row_positions.narrow(out.logits, keep if keep is not None else 0)[0], features

    def call(self, tokens, starts, kv_len, logits_to_keep, depth=None, ancestors=None, rows=None,
             span: slice | None = None, extra: dict | None = None) -> torch.Tensor:
        """One forward writing tokens [b, T] at cache indices starts [b] + t: causal, or a tree."""
        plan = self.cache.plan
        width = tokens.shape[1]
        # A tree forward may extend a window written by earlier forwards: it writes the window's last T.
        offset = 0 if ancestors is None else ancestors.shape[2] - width
        index = starts[:, None] + offset + (self._arange[:width] if width <= len(self._arange) else
                                            torch.arange(width, device=self.device))
        index = index.clamp(max=self.capacity - 1)  # only padding reaches past the end (a prefill chunk's)
        plan.rows, plan.span, plan.positions, plan.kv_len = rows, span, index, kv_len
        dtype, window = self.model.dtype, self.window
        if depth is None:
            positions, mask = index, causal_mask(index, kv_len, dtype)
            if window is not None:
                mask = window.model_mask(mask, causal_mask(index, kv_len, dtype, window.size))
        else:
            positions, mask = starts[:, None] + depth, tree_mask(starts, ancestors, kv_len, dtype)
            if window is not None:
                mask = window.model_mask(mask, tree_mask(starts, ancestors, kv_len, dtype, positions, window.size))
        try:
            with self.linears:
                out = self.model(
                    input_ids=tokens.clamp(max=self.vocab_size - 1),  # a target-only id must not index a draft's embeddings
                    position_ids=positions.clamp(max=self.max_position - 1),
                    attention_mask=mask,
                    **{self._cache_argument: self.cache},
                    use_cache=True,
                    logits_to_keep=self._row_positions.model_argument(logits_to_keep),
                    output_hidden_states=bool(self.feature_layers),
                    **(extra or {}),
                )
        finally:
            self._row_positions.done()
        if self.feature_layers:
            self.features = torch.cat([out.hidden_states[i] for i in self.feature_layers], dim=-1)
        return self._row_positions.narrow(out.logits, logits_to_keep)

    def check(self, kv_len: int) -> None:
        if kv_len > self.capacity:
            raise RuntimeError(f"{self.name} KV cache overflow: a row would write position {kv_len - 1} "
                               f">= {self.capacity}")

    # ---- copies ----------------------------------------------------------------------------------

    @torch.inference_mode()
    def copy_prefix(self, src: list[int], dst: list[int], length: int) -> None:
        """Slot dst[i] takes slot src[i]'s first `length` cache entries and its length (samples of one prompt
        share its prefill; on the static path also its last prefill logits, a captured step: prefill.py)."""
        if self.static:
            self.static_prefill.copy_prefix(src, dst, length)
        else:
            self.copy_entries(torch.tensor(src, device=self.device), torch.tensor(dst, device=self.device), length)

    def copy_entries(self, src: torch.Tensor, dst: torch.Tensor, length: int) -> None:
        """Slots dst [n] take the first `length` entries of every layer and the lengths of slots src [n]."""
        for layer in self.cache.layers:
            if layer.is_initialized:
                layer.keys[dst, :, :length] = layer.keys[src, :, :length]
                layer.values[dst, :, :length] = layer.values[src, :, :length]
        self.copy_length(dst, src)

    # ---- compaction ------------------------------------------------------------------------------

    @torch.inference_mode()
    def compact(self, rows: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        """A tree's accepted path to the positions it stands for (SlotKVCache.compact; rows [b], src/dst [b, A])."""
        self.cache.compact(rows, src, dst)
