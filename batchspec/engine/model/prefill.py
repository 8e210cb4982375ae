"""The static path's admission work on a runner's cache: prompts prefilled in captured chunks of C tokens
for P rows (P a power of two; padding rows write into the scratch slot), and a prompt's cache copied to
the slots of its other samples, each a step declared at start.

`StaticPrefill` is a part of its runner (`runner.static_prefill`): it calls the runner's raw forward (`call`)
and cache copy (`copy_entries`), and owns the logits after each slot's last prefilled token."""

from __future__ import annotations

from functools import partial

import torch

from .host_device import HostBuffer
from .shapes import PREFILL_CHUNK, row_buckets


class StaticPrefill:
    def __init__(self, runner):  # the ModelRunner this is a part of (runner.py imports this module)
        self.runner, self.graphs, self.name = runner, runner.graphs, runner.name
        self.num_slots, self.device = runner.num_slots, runner.device
        max_chunks = (runner.capacity + PREFILL_CHUNK - 1) // PREFILL_CHUNK
        self._chunks = HostBuffer((max_chunks, 4, self.num_slots), self.device)
        self._pairs = HostBuffer((2, self.num_slots), self.device)  # copy's src, dst
        self._offsets = torch.arange(PREFILL_CHUNK, device=self.device)
        self._last: torch.Tensor | None = None  # [num_slots + 1, V] each slot's logits after its last prefilled token

    @torch.inference_mode()
    def prefill(self, seqs: torch.Tensor, rows: list[int], starts: list[int], ends: list[int]) -> torch.Tensor:
        """Write seqs[row, starts[i]:ends[i]] (seqs: [num_slots, S], every slot's sequence on the device)
        into slot rows[i] at those positions, in captured chunks of PREFILL_CHUNK tokens for P rows (P the
        smallest row bucket >= len(rows); padding rows write into the scratch slot), and set the lengths
        to `ends`. No host sync. Returns the logits after each slot's last token, [num_slots + 1, V] by
        slot (valid for `rows`)."""
        runner = self.runner
        runner.check(max(ends))
        width = next(p for p in row_buckets(self.num_slots) if p >= len(rows))
        chunks = []
        for c in range(max((e - s + PREFILL_CHUNK - 1) // PREFILL_CHUNK for s, e in zip(starts, ends))):
            live = [(r, s + c * PREFILL_CHUNK, e) for r, s, e in zip(rows, starts, ends) if s + c * PREFILL_CHUNK < e]
            pad = width - len(live)
            chunks.append([[r for r, _, _ in live] + [runner.scratch] * pad,
                           [p for _, p, _ in live] + [0] * pad,
                           [min(PREFILL_CHUNK, e - p) for _, p, e in live] + [1] * pad,
                           [int(e - p <= PREFILL_CHUNK) for _, p, e in live] + [0] * pad])
        table = self._chunks.put(chunks)  # [chunks, 4, P]: one copy for the whole admission
        last = self.last_logits()
        for c, chunk in enumerate(chunks):
            bucket = runner.bucket(min(max(chunk[1]) + PREFILL_CHUNK, runner.capacity))
            key = (self.name, "prefill", width, bucket)
            self.graphs.run(key, partial(self._prefill_step, kv_len=bucket), (seqs, table[c], last))
        return last

    @torch.inference_mode()
    def copy_prefix(self, src: list[int], dst: list[int], length: int) -> None:
        """Slot dst[i] takes slot src[i]'s first `length` cache entries, its length and its last prefill
        logits (samples of one prompt share its prefill): a step per row bucket, no host sync."""
        width = next(p for p in row_buckets(self.num_slots) if p >= len(src))
        pad = width - len(src)
        scratch = self.runner.scratch
        pairs = self._pairs.put([src + [scratch] * pad, dst + [scratch] * pad])
        bucket = self.runner.bucket(length)
        self.graphs.run((self.name, "copy", width, bucket), partial(self._copy_step, length=bucket), (pairs,))

    def _copy_step(self, pairs: torch.Tensor, *, length: int) -> None:
        self.runner.copy_entries(pairs[0], pairs[1], length)
        last = self.last_logits()
        last[pairs[1]] = last[pairs[0]]

    def last_logits(self) -> torch.Tensor:
        if self._last is None:
            runner = self.runner
            self._last = torch.zeros(self.num_slots + 1, runner.vocab_size, dtype=runner.model.dtype,
                                     device=self.device)
        return self._last

    def _prefill_step(self, seqs: torch.Tensor, chunk: torch.Tensor, last: torch.Tensor, *, kv_len: int) -> None:
        """One chunk: chunk [4, P] = slot, start, count, final per row. Writes C tokens per row from `start`
        (those past `count` are padding past the new length), sets lengths = start + count, and for rows
        whose prompt ends in this chunk stores the logits after their last token in last[slot]."""
        rows, starts, counts, final = chunk
        read = rows.clamp(max=seqs.shape[0] - 1)  # the scratch slot reads some row's tokens: padding
        ids = seqs[read[:, None], (starts[:, None] + self._offsets).clamp(max=seqs.shape[1] - 1)]
        at_end = self.runner.call(ids, starts, kv_len, (counts - 1)[:, None], rows=rows)[:, 0]  # [P, V]: rows' last
        last.index_copy_(0, rows, torch.where(final[:, None].bool(), at_end, last[rows]))
        self.runner.copy_lengths(rows, starts + counts)

    def declare(self, seqs: torch.Tensor) -> None:
        """Declare a prefill chunk and a prefix copy per row bucket and attended-length bucket (captured at start
        in cuda_graphs mode)."""
        runner = self.runner
        for bucket in runner.buckets:
            for rows in row_buckets(self.num_slots):
                chunk = torch.zeros(4, rows, dtype=torch.long, device=self.device)
                chunk[0], chunk[2] = runner.scratch, 1  # padding rows until a real chunk is copied in
                self.graphs.declare((self.name, "prefill", rows, bucket), partial(self._prefill_step, kv_len=bucket),
                                    (seqs, chunk, self.last_logits()), size=rows * PREFILL_CHUNK * bucket)
                pairs = torch.full((2, rows), runner.scratch, dtype=torch.long, device=self.device)
                self.graphs.declare((self.name, "copy", rows, bucket), partial(self._copy_step, length=bucket),
                                    (pairs,))
