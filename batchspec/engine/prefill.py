"""The static path's admission work on a runner's cache: prompts prefilled in captured chunks of C tokens
for P rows (P a power of two; padding rows write into the scratch slot), and a prompt's cache copied to
the slots of its other samples. A mixin of ModelRunner (it uses the runner's cache, lengths and steps)."""

from __future__ import annotations

from functools import partial

import torch

from .shapes import PREFILL_CHUNK, row_buckets


class StaticPrefill:
    @torch.inference_mode()
    def prefill_static(self, seqs: torch.Tensor, rows: list[int], starts: list[int], ends: list[int]) -> torch.Tensor:
        """Write seqs[row, starts[i]:ends[i]] (seqs: [num_slots, S], every slot's sequence on the device)
        into slot rows[i] at those positions, in captured chunks of PREFILL_CHUNK tokens for P rows (P the
        smallest row bucket >= len(rows); padding rows write into the scratch slot), and set the lengths
        to `ends`. No host sync. Returns the logits after each slot's last token, [num_slots + 1, V] by
        slot (valid for `rows`)."""
        self._check(max(ends))
        width = next(p for p in row_buckets(self.num_slots) if p >= len(rows))
        chunks = []
        for c in range(max((e - s + PREFILL_CHUNK - 1) // PREFILL_CHUNK for s, e in zip(starts, ends))):
            live = [(r, s + c * PREFILL_CHUNK, e) for r, s, e in zip(rows, starts, ends) if s + c * PREFILL_CHUNK < e]
            pad = width - len(live)
            chunks.append([[r for r, _, _ in live] + [self.scratch] * pad,
                           [p for _, p, _ in live] + [0] * pad,
                           [min(PREFILL_CHUNK, e - p) for _, p, e in live] + [1] * pad,
                           [int(e - p <= PREFILL_CHUNK) for _, p, e in live] + [0] * pad])
        table = self._chunks.put(chunks)  # [chunks, 4, P]: one copy for the whole admission
        last = self.last_logits()
        for c, chunk in enumerate(chunks):
            bucket = self.bucket(min(max(chunk[1]) + PREFILL_CHUNK, self.capacity))
            key = (self.name, "prefill", width, bucket)
            self.graphs.run(key, partial(self._prefill_step, kv_len=bucket), (seqs, table[c], last))
        return last

    @torch.inference_mode()
    def copy_prefix(self, src: list[int], dst: list[int], length: int) -> None:
        """Slot dst[i] takes slot src[i]'s first `length` cache entries, its length and its last prefill
        logits (samples of one prompt share its prefill). Static: a step per row bucket, no host sync."""
        if not self.static:
            self._copy(torch.tensor(src, device=self.device), torch.tensor(dst, device=self.device), length)
            return
        width = next(p for p in row_buckets(self.num_slots) if p >= len(src))
        pad = width - len(src)
        pairs = self._pairs.put([src + [self.scratch] * pad, dst + [self.scratch] * pad])
        bucket = self.bucket(length)
        self.graphs.run((self.name, "copy", width, bucket), partial(self._copy_step, length=bucket), (pairs,))

    def _copy(self, src: torch.Tensor, dst: torch.Tensor, length: int) -> None:
        for layer in self.cache.layers:
            if layer.is_initialized:
                layer.keys[dst, :, :length] = layer.keys[src, :, :length]
                layer.values[dst, :, :length] = layer.values[src, :, :length]
        self.copy_length(dst, src)
        if self._last is not None:
            self._last[dst] = self._last[src]

    def _copy_step(self, pairs: torch.Tensor, *, length: int) -> None:
        self._copy(pairs[0], pairs[1], length)

    def last_logits(self) -> torch.Tensor:
        if self._last is None:
            self._last = torch.zeros(self.num_slots + 1, self.vocab_size, dtype=self.model.dtype, device=self.device)
        return self._last

    def _prefill_step(self, seqs: torch.Tensor, chunk: torch.Tensor, last: torch.Tensor, *, kv_len: int) -> None:
        """One chunk: chunk [4, P] = slot, start, count, final per row. Writes C tokens per row from `start`
        (those past `count` are padding past the new length), sets lengths = start + count, and for rows
        whose prompt ends in this chunk stores the logits after their last token in last[slot]."""
        rows, starts, counts, final = chunk
        offsets = self._arange[:PREFILL_CHUNK]
        read = rows.clamp(max=seqs.shape[0] - 1)  # the scratch slot reads some row's tokens: padding
        ids = seqs[read[:, None], (starts[:, None] + offsets).clamp(max=seqs.shape[1] - 1)]
        at_end = self._call(ids, starts, kv_len, (counts - 1)[:, None], rows=rows)[:, 0]  # [P, V]: each row's last
        last.index_copy_(0, rows, torch.where(final[:, None].bool(), at_end, last[rows]))
        self.copy_lengths(rows, starts + counts)
