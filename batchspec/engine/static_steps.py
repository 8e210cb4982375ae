"""A ModelRunner's static steps (a mixin of ModelRunner, runner.py): the forward of every slot that is
captured, positions and mask from `lengths` on the device, and a target's packed verify (packed_static.py);
their declaration at start (a forward per width and bucket, or a packed verify per token bucket and
bucket, and the prefill chunks and prefix copies of prefill.py); and the one output buffer (logits, and
the features a drafter reads) whose contiguous prefixes the steps write."""

from __future__ import annotations

from functools import partial
from typing import Iterable

import torch

from .kv_cache import causal_mask
from .packed_static import StaticLayout, host_layout
from .shapes import PREFILL_CHUNK, row_buckets


class StaticSteps:
    def _key(self, width: int, bucket: int, last_only: bool, window: int, from_seqs: int) -> tuple:
        return (self.name, "forward", width, bucket, last_only, window, from_seqs)

    def output(self, width: int) -> torch.Tensor:
        """The static steps' logits buffer as [num_slots, width, V] (a contiguous prefix of one buffer); a
        width wider than every declared one (a step that was not declared) gets a tensor of its own."""
        if width > max(self.widths + [1]):
            return torch.empty(self.num_slots, width, self.vocab_size, dtype=self.model.dtype, device=self.device)
        if self._out is None:
            size = self.num_slots * max(self.widths + [1]) * self.vocab_size
            self._out = torch.empty(size, dtype=self.model.dtype, device=self.device)
        return self._out[: self.num_slots * width * self.vocab_size].view(self.num_slots, width, self.vocab_size)

    def _step(self, seqs, tokens, out, depth=None, ancestors=None, *, kv_len: int, last_only: bool,
              from_seqs: int) -> None:
        """The static forward of every slot, into the output buffer (and the features buffer): what is captured."""
        out.copy_(self.step_logits(seqs, tokens, depth, ancestors, kv_len=kv_len, last_only=last_only,
                                   from_seqs=from_seqs))
        if self.feature_layers:
            width = self.features.shape[1]
            self.features_buffer(width).copy_(self.features)

    def features_buffer(self, width: int) -> torch.Tensor:
        """The static steps' features as [num_slots, width, F] (a prefix of one buffer, like `output`)."""
        if self._features_out is None:
            self._features_out = torch.zeros(self.num_slots, max(self.widths + [1]), self._features_size(),
                                             dtype=self.model.dtype, device=self.device)
        return self._features_out[:, :width]

    def _feature_width(self, index: int) -> int:
        return self.model.config.get_text_config().hidden_size

    def _features_size(self) -> int:
        """F: the handed-out hidden states of one token, concatenated."""
        return sum(self._feature_width(i) for i in self.feature_layers)

    def step_logits(self, seqs, tokens, depth=None, ancestors=None, *, kv_len: int, last_only: bool = False,
                    from_seqs: int = 0, extra: dict | None = None, keep: torch.Tensor | None = None) -> torch.Tensor:
        """The static forward of every slot (positions and mask from `lengths` on the device), feeding
        `from_seqs` tokens of seqs [num_slots, S] at lengths + t, then tokens [num_slots, T']: logits
        [num_slots, T, V] (or [.., 1, V]). A building block of other static steps (a draft step)."""
        span = slice(0, self.num_slots)
        starts = self.lengths[span]
        if from_seqs:
            head = seqs.gather(1, (starts[:, None] + self._arange[:from_seqs]).clamp(max=seqs.shape[1] - 1))
            tokens = torch.cat([head, tokens], dim=1)
        to_keep = keep if keep is not None else 1 if last_only else 0
        return self._call(tokens, starts, kv_len, to_keep, depth, ancestors, self.slot_index, span, extra)

    # ---- the packed verify (packed_static.py) -------------------------------------------------------

    def verify_static(self, widths: list[int], width: int, kv_len: int, seqs: torch.Tensor,
                      drafts: torch.Tensor) -> torch.Tensor:
        """The packed verify of every slot: widths[s] tokens of slot s (its pending token, from seqs
        [num_slots, S] at lengths[s], then drafts[s, :widths[s] - 1]; drafts [num_slots, >= packed_width - 1]
        is the round's buffer), attending over the bucket of kv_len -> logits [num_slots, width, V], a view
        of the output buffer (a slot's positions past its own width repeat its last). Two steps, no sync."""
        n = self.token_bucket(sum(widths))
        layout, table = host_layout(widths, width, n, self.scratch)
        columns = max(n, width)
        self._plan.put([row + [0] * (columns - len(row)) for row in layout + table])
        plan, bucket = self._plan.device, self.bucket(kv_len)
        self.graphs.run((self.name, "packed", n, bucket), partial(self._packed_step, n=n, kv_len=bucket),
                        (seqs, drafts, plan))
        out = self.output(width)
        self.graphs.run((self.name, "gather", width), partial(self._gather_step, width=width), (plan, out))
        if self.feature_layers:
            self.features = self.features_buffer(width)
        return out

    def token_bucket(self, tokens: int) -> int:
        """The token bucket a packed verify of `tokens` real tokens runs at (the rest is padding)."""
        return next(b for b in self.token_buckets if b >= max(tokens, 1))

    def _packed_step(self, seqs: torch.Tensor, drafts: torch.Tensor, plan: torch.Tensor, *, n: int,
                     kv_len: int) -> None:
        """The captured packed verify of n tokens (plan rows 0-1: slot, t of each) into the packed buffers."""
        slots, t = plan[0, :n], plan[1, :n]
        width = self.packed_width
        starts = self.lengths[: self.num_slots]
        pending = seqs.gather(1, starts[:, None].clamp(max=seqs.shape[1] - 1))
        tokens = torch.cat([pending, drafts[:, : width - 1]], dim=1)  # [S, W]: what each slot may verify
        ids = tokens[slots.clamp(max=self.num_slots - 1), t]
        index = (self.lengths[slots] + t).clamp(max=self.capacity - 1)  # padding: the scratch slot
        positions = starts[:, None] + self._arange[:width]
        mask = causal_mask(positions, kv_len, self.model.dtype)
        windowed = causal_mask(positions, kv_len, self.model.dtype, self.window.size) if self.window else None
        logits, features = self._call_packed(ids, index, StaticLayout(slots, t, index, mask, kv_len, windowed))
        buffers = self.packed_buffers()
        buffers[0][:n].copy_(logits)
        if features is not None:
            buffers[1][:n].copy_(features)

    def _gather_step(self, plan: torch.Tensor, out: torch.Tensor, *, width: int) -> None:
        """Each slot's verify positions (plan rows 2..: [num_slots, >= width]) from the packed buffers into the
        output."""
        index = plan[2:, :width]
        logits, features = self.packed_buffers()
        out.copy_(logits[index])
        if features is not None:
            self.features_buffer(width).copy_(features[index])

    def packed_buffers(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The packed verify's logits [n_max, V] and features [n_max, F] (None without feature layers)."""
        if self._packed is None:
            n = self.token_buckets[-1]
            features = None
            if self.feature_layers:
                features = torch.zeros(n, self._features_size(), dtype=self.model.dtype, device=self.device)
            self._packed = (torch.zeros(n, self.vocab_size, dtype=self.model.dtype, device=self.device), features)
        return self._packed

    def declare_packed(self, seqs: torch.Tensor, drafts: torch.Tensor) -> None:
        """Declare the packed verify: a step per token bucket and attended-length bucket, and a gather per
        chain width (captured at start in cuda_graphs mode)."""
        for bucket in self.buckets:
            for n in self.token_buckets:
                self.graphs.declare((self.name, "packed", n, bucket), partial(self._packed_step, n=n, kv_len=bucket),
                                    (seqs, drafts, self._plan.device), size=n * bucket, compile=True)
        for width in range(1, self.packed_width + 1):
            self.graphs.declare((self.name, "gather", width), partial(self._gather_step, width=width),
                                (self._plan.device, self.output(width)), size=width)

    def declare_steps(self, tokens: torch.Tensor, seqs: torch.Tensor, *, from_seqs: int = 0,
                      trees: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
                      last_only: Iterable[int] = (), forwards: bool = True, prefill: bool = True) -> None:
        """Declare the static steps this runner may run (captured at start in cuda_graphs mode): for each
        width T and bucket, a forward feeding `from_seqs` tokens from `seqs` and tokens[:, :T - from_seqs]
        (a tree width reads its depth/ancestors buffers from `trees`: T -> (depth, ancestors); widths in
        `last_only` keep only the last logits), and with `prefill` a prefill chunk per row bucket."""
        self.declared_io = (tokens, seqs, from_seqs, dict(trees or {}))
        for bucket in self.buckets:
            for width in self.widths if forwards else ():
                only = width in set(last_only)
                tree = (trees or {}).get(width)
                if self.packed_width and tree is None:  # chains verify packed (declare_packed)
                    continue
                window = tree[1].shape[2] if tree is not None else 0
                args = (seqs, tokens[:, : width - from_seqs], self.output(1 if only else width)) + (tree or ())
                self.graphs.declare(self._key(width, bucket, only, window, from_seqs),
                                    partial(self._step, kv_len=bucket, last_only=only, from_seqs=from_seqs), args,
                                    size=width * bucket * self.num_slots, compile=True)
            for rows in row_buckets(self.num_slots) if prefill else ():
                chunk = torch.zeros(4, rows, dtype=torch.long, device=self.device)
                chunk[0], chunk[2] = self.scratch, 1  # padding rows until a real chunk is copied in
                self.graphs.declare((self.name, "prefill", rows, bucket), partial(self._prefill_step, kv_len=bucket),
                                    (seqs, chunk, self.last_logits()), size=rows * PREFILL_CHUNK * bucket)
                pairs = torch.full((2, rows), self.scratch, dtype=torch.long, device=self.device)
                self.graphs.declare((self.name, "copy", rows, bucket), partial(self._copy_step, length=bucket), (pairs,))
