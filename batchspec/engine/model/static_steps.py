"""A ModelRunner's static steps (the captured path): the forward of every slot, positions and mask from the
runner's `lengths` on the device, and a target's packed verify of chains and trees (packed_static.py); their
declaration at start (a forward per width and bucket, a packed verify per verify kind, token bucket and
bucket); and the one output buffer
(logits, and the features a drafter reads) whose contiguous prefixes the steps write.

`StaticSteps` is a part of its runner (`runner.static_steps`): it calls the runner's raw forwards (`call`,
`call_packed`) and reads its lengths, and owns nothing of the cache."""

from __future__ import annotations

from functools import partial
from typing import Iterable

import torch

from .host_device import HostBuffer
from .kv_cache import causal_mask
from .packed_static import StaticLayout, host_layout
from .shapes import token_buckets
from ..tree import TreeShape, tree_mask


class StaticSteps:
    """The static steps of `runner`'s every slot (see the module docstring). token_buckets: the token counts a
    packed chain verify runs at (only with the runner's packed_width; a tree's: `buckets_of` its width)."""

    def __init__(self, runner):  # the ModelRunner this is a part of (runner.py imports this module)
        self.runner, self.graphs, self.name = runner, runner.graphs, runner.name
        self.num_slots, self.vocab_size, self.device = runner.num_slots, runner.vocab_size, runner.device
        self.widths = runner.widths
        self.declared_io: tuple | None = None  # what `declare` was given: timing replays the same steps
        self._out: torch.Tensor | None = None  # the logits buffer, allocated with the first step
        self._features_out: torch.Tensor | None = None
        self._packed: tuple | None = None  # the packed verify's logits and features buffers
        self._no_seqs = torch.zeros(self.num_slots, 1, dtype=torch.long, device=self.device)  # for steps that read none
        self._arange = torch.arange(max(self.widths + [runner.packed_width]) + 1, device=self.device)
        if runner.packed_width:
            self.token_buckets = self.buckets_of(runner.packed_width)
            # A packed verify's host plan, one copy a round: rows 0-1 the slot and t of each token, then a row
            # per slot of its verify positions (packed_static.host_layout). A tree verifies packed at its own
            # width (one of the runner's widths), which may be wider than any chain.
            self._most_tokens = self.num_slots * max(self.widths + [runner.packed_width])
            self._plan = HostBuffer((2 + self.num_slots, self._most_tokens), self.device)

    @staticmethod
    def _key(name: str, width: int, bucket: int, last_only: bool, window: int, from_seqs: int) -> tuple:
        return (name, "forward", width, bucket, last_only, window, from_seqs)

    def output(self, width: int) -> torch.Tensor:
        """The static steps' logits buffer as [num_slots, width, V] (a contiguous prefix of one buffer); a
        width wider than every declared one (a step that was not declared) gets a tensor of its own."""
        dtype = self.runner.model.dtype
        if width > max(self.widths + [1]):
            return torch.empty(self.num_slots, width, self.vocab_size, dtype=dtype, device=self.device)
        if self._out is None:
            size = self.num_slots * max(self.widths + [1]) * self.vocab_size
            self._out = torch.empty(size, dtype=dtype, device=self.device)
        return self._out[: self.num_slots * width * self.vocab_size].view(self.num_slots, width, self.vocab_size)

    def features_buffer(self, width: int) -> torch.Tensor:
        """The static steps' features as [num_slots, width, F] (a prefix of one buffer, like `output`)."""
        if self._features_out is None:
            self._features_out = torch.zeros(self.num_slots, max(self.widths + [1]), self._features_size(),
                                             dtype=self.runner.model.dtype, device=self.device)
        return self._features_out[:, :width]

    def _features_size(self) -> int:
        """F: the handed-out hidden states of one token, concatenated."""
        return len(self.runner.feature_layers) * self.runner.model.config.get_text_config().hidden_size

    # ---- the forward of every slot ------------------------------------------------------------------

    def forward(self, tokens: torch.Tensor, *, kv_len: int, last_only: bool, tree: TreeShape | None,
                seqs: torch.Tensor | None, from_seqs: int) -> torch.Tensor:
        """ModelRunner.forward over every slot (rows=None): the declared step of this width and the bucket of
        kv_len -> a view of the output buffer [num_slots, T, V] (or [.., 1, V])."""
        runner = self.runner
        width = from_seqs + tokens.shape[1]
        out = self.output(1 if last_only else width)
        bucket = runner.bucket(kv_len)
        window = tree.ancestors.shape[2] if tree is not None else 0  # a tree's scratch window (0: a chain)
        seqs = seqs if seqs is not None else self._no_seqs
        args = (seqs, tokens, out) if tree is None else (seqs, tokens, out, tree.depth, tree.ancestors)
        self.graphs.run(self._key(self.name, width, bucket, last_only, window, from_seqs),
                        partial(self._step, kv_len=bucket, last_only=last_only, from_seqs=from_seqs), args)
        if runner.feature_layers:
            runner.features = self.features_buffer(width)
        return out

    def _step(self, seqs, tokens, out, depth=None, ancestors=None, *, kv_len: int, last_only: bool,
              from_seqs: int) -> None:
        """The static forward of every slot, into the output buffer (and the features buffer): what is captured."""
        out.copy_(self.logits(seqs, tokens, depth, ancestors, kv_len=kv_len, last_only=last_only, from_seqs=from_seqs))
        features = self.runner.features
        if self.runner.feature_layers:
            self.features_buffer(features.shape[1]).copy_(features)

    def logits(self, seqs, tokens, depth=None, ancestors=None, *, kv_len: int, last_only: bool = False,
               from_seqs: int = 0, extra: dict | None = None, keep: torch.Tensor | None = None) -> torch.Tensor:
        """The static forward of every slot (positions and mask from `lengths` on the device), feeding
        `from_seqs` tokens of seqs [num_slots, S] at lengths + t, then tokens [num_slots, T']: logits
        [num_slots, T, V] (or [.., 1, V]). A building block of other static steps (a draft step)."""
        runner = self.runner
        span = slice(0, self.num_slots)
        starts = runner.lengths[span]
        if from_seqs:
            head = seqs.gather(1, (starts[:, None] + self._arange[:from_seqs]).clamp(max=seqs.shape[1] - 1))
            tokens = torch.cat([head, tokens], dim=1)
        to_keep = keep if keep is not None else 1 if last_only else 0
        return runner.call(tokens, starts, kv_len, to_keep, depth, ancestors, runner.slot_index, span, extra)

    # ---- the packed verify (packed_static.py) -------------------------------------------------------

    def verify_packed(self, widths: list[int], width: int, kv_len: int, seqs: torch.Tensor,
                      drafts: torch.Tensor, tree: TreeShape | None = None) -> tuple[torch.Tensor, int]:
        """The packed verify of every slot: widths[s] tokens of slot s (its pending token, from seqs
        [num_slots, S] at lengths[s], then drafts[s, :widths[s] - 1]; drafts [num_slots, >= W - 1] is the
        round's buffer), attending over the bucket of kv_len -> (logits [num_slots, width, V], a view of the
        output buffer (a slot's positions past its own width repeat its last); the tokens it computed, the
        token bucket). A chain's tokens are
        causal; a tree's (tree: the round's geometry, depth [num_slots, width], ancestors [num_slots, width,
        width]) sit at lengths + depth and see their ancestors, a row's nodes its first widths[s] - 1 node
        slots. Two steps, no sync."""
        grid = width if tree is not None else self.runner.packed_width  # the attention grid's width W
        n = self.token_bucket(sum(widths), grid)
        layout, table = host_layout(widths, width, n, self.runner.scratch)
        columns = max(n, width)
        self._plan.put([row + [0] * (columns - len(row)) for row in layout + table])
        plan, bucket = self._plan.device, self.runner.bucket(kv_len)
        geometry = (tree.depth, tree.ancestors) if tree is not None else ()
        self.graphs.run(self._packed_key(n, bucket, grid, tree is not None),
                        partial(self._packed_step, n=n, kv_len=bucket, width=grid), (seqs, drafts, plan, *geometry))
        out = self.output(width)
        self.graphs.run((self.name, "gather", width), partial(self._gather_step, width=width), (plan, out))
        if self.runner.feature_layers:
            self.runner.features = self.features_buffer(width)
        return out, n

    def buckets_of(self, width: int) -> list[int]:
        """The token buckets of a packed verify whose rows verify at most `width` tokens each."""
        return token_buckets(self.num_slots, width)

    def token_bucket(self, tokens: int, width: int) -> int:
        """The token bucket a packed verify of `tokens` real tokens in a grid `width` wide runs at (the rest is
        padding): a chain's (the packed width), or a tree's."""
        buckets = self.token_buckets if width == self.runner.packed_width else self.buckets_of(width)
        return next(b for b in buckets if b >= max(tokens, 1))

    def _packed_key(self, n: int, bucket: int, width: int, tree: bool) -> tuple:
        return (self.name, "packed", n, bucket) + ((width,) if tree else ())

    def _packed_step(self, seqs: torch.Tensor, drafts: torch.Tensor, plan: torch.Tensor, depth=None, ancestors=None,
                     *, n: int, kv_len: int, width: int) -> None:
        """The captured packed verify of n tokens (plan rows 0-1: slot, t of each) into the packed buffers, in a
        grid `width` wide: a chain's (causal), or a tree's (depth [S, width], ancestors [S, width, width])."""
        runner = self.runner
        slots, t = plan[0, :n], plan[1, :n]
        owner, dtype = slots.clamp(max=self.num_slots - 1), runner.model.dtype
        starts = runner.lengths[: self.num_slots]
        pending = seqs.gather(1, starts[:, None].clamp(max=seqs.shape[1] - 1))
        tokens = torch.cat([pending, drafts[:, : width - 1]], dim=1)  # [S, W]: what each slot may verify
        ids = tokens[owner, t]
        index = (runner.lengths[slots] + t).clamp(max=runner.capacity - 1)  # padding: the scratch slot
        window = runner.window.size if runner.window else None
        if depth is None:  # a chain: token t at position lengths + t, causal
            positions = starts[:, None] + self._arange[:width]
            mask = causal_mask(positions, kv_len, dtype)
            windowed = causal_mask(positions, kv_len, dtype, window) if window else None
        else:  # a tree: node t at lengths + its depth, seeing the prefix and its ancestors (cached at lengths + u)
            positions = starts[:, None] + depth
            mask = tree_mask(starts, ancestors, kv_len, dtype)
            windowed = tree_mask(starts, ancestors, kv_len, dtype, positions, window) if window else None
        logits, features = runner.call_packed(ids, positions[owner, t] if depth is not None else index,
                                              StaticLayout(slots, t, index, mask, kv_len, windowed))
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
            n, dtype = self._most_tokens, self.runner.model.dtype
            features = None
            if self.runner.feature_layers:
                features = torch.zeros(n, self._features_size(), dtype=dtype, device=self.device)
            self._packed = (torch.zeros(n, self.vocab_size, dtype=dtype, device=self.device), features)
        return self._packed

    # ---- declared at start --------------------------------------------------------------------------

    def declare_packed(self, seqs: torch.Tensor, drafts: torch.Tensor,
                       trees: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
        """Declare the packed verify: a step per token bucket and attended-length bucket, for chains and for each
        tree width in `trees` (width -> its depth and ancestors buffers), and a gather per verify width
        (captured at start in cuda_graphs mode)."""
        plan, chain = self._plan.device, self.runner.packed_width
        kinds = [(chain, ())] + [(width, geometry) for width, geometry in sorted((trees or {}).items())]
        for bucket in self.runner.buckets:
            for width, geometry in kinds:
                for n in self.buckets_of(width):
                    self.graphs.declare(self._packed_key(n, bucket, width, bool(geometry)),
                                        partial(self._packed_step, n=n, kv_len=bucket, width=width),
                                        (seqs, drafts, plan, *geometry), size=n * bucket, compile=True)
        for width in sorted(set(range(1, chain + 1)) | set(trees or {})):
            self.graphs.declare((self.name, "gather", width), partial(self._gather_step, width=width),
                                (plan, self.output(width)), size=width)

    def declare(self, tokens: torch.Tensor, seqs: torch.Tensor, *, from_seqs: int = 0,
                trees: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
                last_only: Iterable[int] = ()) -> None:
        """Declare the forwards this runner may run (captured at start in cuda_graphs mode): for each width T
        and bucket, a forward feeding `from_seqs` tokens from `seqs` and tokens[:, :T - from_seqs] (a tree
        width reads its depth/ancestors buffers from `trees`: T -> (depth, ancestors); widths in `last_only`
        keep only the last logits). A packed runner's verifies, chains and trees, are packed instead
        (declare_packed)."""
        self.declared_io = (tokens, seqs, from_seqs, dict(trees or {}))
        if self.runner.packed_width:
            return
        for bucket in self.runner.buckets:
            for width in self.widths:
                only = width in set(last_only)
                tree = (trees or {}).get(width)
                window = tree[1].shape[2] if tree is not None else 0
                args = (seqs, tokens[:, : width - from_seqs], self.output(1 if only else width)) + (tree or ())
                self.graphs.declare(self._key(self.name, width, bucket, only, window, from_seqs),
                                    partial(self._step, kv_len=bucket, last_only=only, from_seqs=from_seqs), args,
                                    size=width * bucket * self.num_slots, compile=True)
