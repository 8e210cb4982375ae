"""ModelRunner: one model, its slot KV cache, the per-slot lengths, and the forwards over them.

Nothing else touches a model's cache. `lengths[s]` (on the device) is the number of valid cache
entries of slot s and the single source of truth for where the next forward writes; callers commit
a round's verdict by setting it (`commit`), which is also the rollback: O(1), no copy.

Two kinds of forward:
  - `prefill(rows, chunks, starts)`: eager, ragged (new prompts, a draft catching up); logits at each
    row's last new token only;
  - `forward(tokens)`: a static-shape step over every slot, T tokens per slot written at `lengths`,
    attending over a fixed length bucket (64, 128, 256, ... up to the capacity). Idle slots ride along
    as padding whose writes are never read. Positions and the mask are computed on the device from
    `lengths`, so the step needs nothing from the host and can be captured: with `capture="cuda_graphs"`
    each (T, bucket) is captured once, the first time it is needed, and replayed after (as
    nano-vllm does); with `capture="inductor"` (CPU) it is compiled by torch.compile. A shape outside
    the declared widths, or one whose capture failed, runs eagerly with one warning per shape.
  - `forward(tokens, rows=...)`: the same step over some slots only, eagerly, attending over exactly
    `kv_len` entries: the CPU path, where compute grows with the rows and idle rows would cost.

The returned logits of a captured step live in a buffer that the next replay of that shape
overwrites: read them before the next forward of the same shape.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Iterable

import torch
from transformers import PreTrainedModel

from .kv_cache import SlotKVCache, causal_mask
from .tree import TreeShape, chain_parents, tree_mask, tree_shape

log = logging.getLogger("batchspec")

CAPTURE_MODES = (None, "static", "cuda_graphs", "inductor")
SMALLEST_BUCKET = 64


def to_device(values: list, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """A host list as a tensor on `device` without a host sync: on a GPU a plain `torch.tensor(..., device=)`
    copies from pageable memory and then waits for the stream (every queued kernel); a pinned buffer
    copied with non_blocking=True is queued like a kernel instead (the caching host allocator keeps the
    buffer until the copy is done)."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


def kv_buckets(capacity: int) -> list[int]:
    """Attended lengths a static step may use: powers of two from 64, then the capacity itself."""
    out, size = [], SMALLEST_BUCKET
    while size < capacity:
        out.append(size)
        size *= 2
    return out + [capacity]


def resolve_capture(compile: str | bool | None, device: torch.device) -> str | None:
    """`compile` setting -> capture mode: auto = CUDA graphs on a GPU, nothing on CPU; on = CUDA graphs on
    a GPU, torch.compile (inductor) on CPU; off = eager; static = the static shapes of the captured path,
    run eagerly (to tell a capture problem from a shape problem)."""
    if compile in (None, "auto"):
        return "cuda_graphs" if device.type == "cuda" else None
    if compile in (False, "off"):
        return None
    if compile in (True, "on"):
        return "cuda_graphs" if device.type == "cuda" else "inductor"
    if compile == "static":
        return "static"
    raise ValueError(f"compile={compile!r}: choose auto, on, off or static")


@dataclass(slots=True)
class _Captured:
    graph: "torch.cuda.CUDAGraph | None"
    inputs: torch.Tensor  # [B, T] the replay reads
    logits: torch.Tensor  # [B, T', V] the replay writes
    depth: torch.Tensor | None = None  # [B, T] for a tree step: read by the replay too
    ancestors: torch.Tensor | None = None  # [B, T, T]


class ModelRunner:
    """Owns `model`'s slot cache (num_slots x capacity positions) and lengths [num_slots].

    widths: the step widths T this model will use (verify widths for a target, 1 and 2 for a draft),
    the shapes worth capturing. max_position clamps position ids so that padding never indexes past a
    learned position table. name appears in logs ("target", "draft").
    """

    def __init__(self, model: PreTrainedModel, *, num_slots: int, capacity: int, max_position: int,
                 capture: str | None = None, widths: Iterable[int] = (), name: str = "model"):
        if capture not in CAPTURE_MODES:
            raise ValueError(f"capture={capture!r}: choose one of {CAPTURE_MODES}")
        if capture == "cuda_graphs" and model.device.type != "cuda":
            raise ValueError("capture='cuda_graphs' needs a model on a CUDA device")
        self.model, self.name, self.capture = model, name, capture
        self.device = model.device
        self.num_slots, self.capacity, self.max_position = num_slots, capacity, max_position
        self.cache = SlotKVCache.for_model(model, num_slots, capacity)
        self.lengths = torch.zeros(num_slots, dtype=torch.long, device=self.device)
        self.slot_index = torch.arange(num_slots, device=self.device)  # every slot, in order
        self.widths = set(widths)
        self.buckets = kv_buckets(capacity)
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.capture_s = 0.0  # seconds spent capturing or compiling, over the job
        self.captured: dict[tuple[int, int, bool], _Captured] = {}
        self._failed: set[tuple[int, int, bool]] = set()
        self._warned: set[int] = set()
        self._arange = torch.arange(max(self.widths | {2}) + 1, device=self.device)
        self._pool = None
        self._compiled = None
        if capture == "inductor":
            # One graph per (T, bucket, last_only): raise Dynamo's recompile limit to fit them all.
            needed = 2 * (len(self.widths) + 1) * len(self.buckets) + 8
            limit = getattr(torch._dynamo.config, "recompile_limit", None)
            if limit is not None and limit < needed:
                torch._dynamo.config.recompile_limit = needed
            if torch._dynamo.config.cache_size_limit < needed:
                torch._dynamo.config.cache_size_limit = needed
            self._compiled = torch.compile(self._step, fullgraph=True, dynamic=False)

    # ---- lengths ---------------------------------------------------------------------------------

    def commit(self, rows: torch.Tensor | slice, lengths: torch.Tensor) -> None:
        """Set the valid length of `rows` (a rollback when it is lower): device-side, no sync."""
        self.lengths[rows] = lengths

    def release(self, slot: int) -> None:
        """A slot became idle: it rides along from position 0, far from the capacity."""
        self.lengths[slot] = 0

    # ---- eager, ragged ---------------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, rows: list[int], ids: torch.Tensor, starts: list[int], lengths: list[int]) -> torch.Tensor:
        """Write ids[i, :lengths[i]] ([b, W], right-padded) at positions starts[i].. of slot rows[i] and set
        that slot's length to the end of it. Returns the logits after each row's last token, [b, V]."""
        ends = [s + n for s, n in zip(starts, lengths)]
        if max(ends) > self.capacity:
            raise RuntimeError(f"{self.name} KV cache overflow: a row would write position {max(ends) - 1} "
                               f">= {self.capacity}")
        rows_t = to_device(rows, self.device)
        # Logits only at each row's last position: the distinct columns for every row, then each row's
        # own. A 1-D logits_to_keep works in transformers 4.56+.
        keep = sorted({n - 1 for n in lengths})
        logits = self._call(ids, to_device(starts, self.device), max(ends), to_device(keep, self.device), rows=rows_t)
        column = to_device([keep.index(n - 1) for n in lengths], self.device)
        self.lengths[rows_t] = to_device(ends, self.device)
        return logits[torch.arange(len(rows), device=self.device), column]

    # ---- the static step -------------------------------------------------------------------------

    def bucket(self, kv_len: int) -> int:
        return next(b for b in self.buckets if b >= kv_len)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, *, kv_len: int, rows: torch.Tensor | slice | None = None,
                last_only: bool = False, tree: TreeShape | None = None) -> torch.Tensor:
        """tokens [B, T] (or [b, T] for `rows`), written at cache indices lengths[row] + t, -> logits
        [B, T, V] ([.., 1, V] with last_only). Lengths are not changed: `commit` decides what stays.

        rows: None for the static step over every slot; else the slots to run eagerly, as an index
        tensor [b] or, when they are consecutive, a slice (their keys are then read as a view).
        kv_len: an upper bound, known on the host, of lengths[row] + T over the rows that matter.
        tree: the tokens are a tree per row (tree.py): position ids lengths + depth, and each query sees
        the prefix and its own ancestors; None is a chain (causal).
        """
        if kv_len > self.capacity:
            raise RuntimeError(f"{self.name} KV cache overflow: a row would write position {kv_len - 1} "
                               f">= {self.capacity}")
        depth, ancestors = (tree.depth, tree.ancestors) if tree is not None else (None, None)
        window = ancestors.shape[2] if ancestors is not None else 0  # a tree's scratch window (0: a chain)
        if rows is not None:
            span = rows if isinstance(rows, slice) else None
            index = self.slot_index[span] if span is not None else rows
            return self._call(tokens, self.lengths[index], kv_len, 1 if last_only else 0, depth, ancestors,
                              index, span)
        width = tokens.shape[1]
        key = (width, self.bucket(kv_len) if self.capture else kv_len, last_only, window)
        if self.capture in (None, "static"):
            return self._step(tokens, key[1], last_only, depth, ancestors)
        captured = self.captured.get(key)
        if captured is None and key not in self._failed:
            if width not in self.widths:
                self._warn_eager(width, "it is not one of the captured widths")
                self._failed.add(key)
            else:
                captured = self._capture(key)
        if captured is None:
            return self._step(tokens, key[1], last_only, depth, ancestors)
        if captured.graph is None:  # inductor: the compiled step takes its inputs as they come
            return self._compiled(tokens, key[1], last_only, depth, ancestors)
        captured.inputs.copy_(tokens)
        if tree is not None:
            captured.depth.copy_(depth)
            captured.ancestors.copy_(ancestors)
        captured.graph.replay()
        return captured.logits

    def _step(self, tokens: torch.Tensor, kv_len: int, last_only: bool, depth: torch.Tensor | None = None,
              ancestors: torch.Tensor | None = None) -> torch.Tensor:
        """Every slot, positions and mask from `lengths` on the device: the function that is captured."""
        return self._call(tokens, self.lengths, kv_len, 1 if last_only else 0, depth, ancestors)

    def _call(self, tokens, starts, kv_len, logits_to_keep, depth=None, ancestors=None, rows=None,
              span: slice | None = None) -> torch.Tensor:
        """One forward writing tokens [b, T] at cache indices starts [b] + t: causal, or a tree."""
        plan = self.cache.plan
        width = tokens.shape[1]
        # A tree forward may extend a window written by earlier forwards: it writes the window's last T.
        offset = 0 if ancestors is None else ancestors.shape[2] - width
        index = starts[:, None] + offset + (self._arange[:width] if width <= len(self._arange) else
                                            torch.arange(width, device=self.device))
        plan.rows, plan.span, plan.positions, plan.kv_len = rows, span, index, kv_len
        if depth is None:
            positions, mask = index, causal_mask(index, kv_len, self.model.dtype)
        else:
            positions, mask = starts[:, None] + depth, tree_mask(starts, ancestors, kv_len, self.model.dtype)
        out = self.model(
            input_ids=tokens.clamp(max=self.vocab_size - 1),  # a target-only id must not index a draft's embeddings
            position_ids=positions.clamp(max=self.max_position - 1),
            attention_mask=mask,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=logits_to_keep,
        )
        return out.logits

    @torch.inference_mode()
    def compact(self, rows: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Move cache entries of every layer: slot rows[i]'s index src[i, j] to dst[i, j] (all read before
        any is written), for a tree's accepted path. rows [b], src/dst [b, A]."""
        for layer in self.cache.layers:
            if not layer.is_initialized:
                return
            index = rows[:, None]
            keys, values = layer.keys[index, :, src], layer.values[index, :, src]  # [b, A, H, D]
            layer.keys[index, :, dst] = keys
            layer.values[index, :, dst] = values

    # ---- capture ---------------------------------------------------------------------------------

    def _capture(self, key: tuple[int, int, bool, int]) -> _Captured | None:
        width, kv_len, last_only, window = key
        started = time.perf_counter()
        inputs = torch.zeros(self.num_slots, width, dtype=torch.long, device=self.device)
        depth = ancestors = None
        if window:  # captured with a chain; replays read whatever tree is copied in
            depth = self._arange[:width].expand(self.num_slots, width).contiguous()
            ancestors = torch.ones(width, window, dtype=torch.bool, device=self.device).tril(window - width).expand(
                self.num_slots, width, window).contiguous()
        # Capturing runs the step (twice on a GPU: a warm-up, then the capture). It writes at positions
        # lengths .. lengths+T-1 of every slot, past every valid entry, so it is harmless at any time.
        try:
            if self.capture == "inductor":
                with torch.inference_mode():
                    logits = self._compiled(inputs, kv_len, last_only, depth, ancestors)
                captured = _Captured(None, inputs, logits, depth, ancestors)
            else:
                captured = self._capture_cuda_graph(inputs, kv_len, last_only, depth, ancestors)
        except Exception as e:  # noqa: BLE001 - any failure means: run this shape eagerly, and say so
            self._failed.add(key)
            self._warn_eager(width, f"capturing it failed ({type(e).__name__}: {str(e).splitlines()[0][:200]})")
            return None
        seconds = time.perf_counter() - started
        self.capture_s += seconds
        self.captured[key] = captured
        log.info("%s: captured the %d-token %s step over %d positions in %.2f s (%s)", self.name, width,
                 f"tree (window {window})" if window else "chain", kv_len, seconds, self.capture)
        return captured

    @torch.inference_mode()
    def _capture_cuda_graph(self, inputs: torch.Tensor, kv_len: int, last_only: bool, depth, ancestors) -> _Captured:
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):  # warm-up off the capture: lazy inits, cuBLAS handles, autotuning
            self._step(inputs, kv_len, last_only, depth, ancestors)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # One memory pool for every graph of this runner: they never replay concurrently.
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self._step(inputs, kv_len, last_only, depth, ancestors)
        self._pool = graph.pool()
        return _Captured(graph, inputs, logits, depth, ancestors)

    def _warn_eager(self, width: int, why: str) -> None:
        if width not in self._warned:
            self._warned.add(width)
            log.warning("%s: the %d-token step runs eagerly (%s); it will be slower than the captured ones",
                        self.name, width, why)

    # ---- measuring -------------------------------------------------------------------------------

    @torch.inference_mode()
    def time_step(self, width: int, kv_len: int, *, last_only: bool = False, repeats: int = 5,
                  tree: bool = False) -> float:
        """Median seconds of the static step of `width` tokens attending over `kv_len` (replays, when
        captured). It writes at the last `width` positions of the capacity, past every valid entry of
        every slot (those are below max_seq_len), and restores the lengths."""
        tokens = torch.zeros(self.num_slots, width, dtype=torch.long, device=self.device)
        shape = None
        if tree:  # a chain written as a tree: the same shape and work as any tree of this width
            parents = chain_parents(self.num_slots, width - 1, self.device)
            shape = tree_shape(parents, torch.ones_like(parents, dtype=torch.bool))
        saved = self.lengths.clone()
        self.lengths.fill_(self.capacity - width)
        times = []
        try:
            for _ in range(repeats + 1):  # the first one warms up (and captures)
                _sync(self.device)
                started = time.perf_counter()
                self.forward(tokens, kv_len=kv_len, last_only=last_only, tree=shape)
                _sync(self.device)
                times.append(time.perf_counter() - started)
        finally:
            self.lengths.copy_(saved)
        times = sorted(times[1:])
        return times[len(times) // 2]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
