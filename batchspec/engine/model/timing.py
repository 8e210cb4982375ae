"""Timing the target's and a drafter's forwards: what the start-up measurement (control/startup_costs.py), adaptive
speculation's cost table on the static path and calibrate measure."""

from __future__ import annotations

import itertools
import time
from typing import Callable

import torch

from .packed import RowTokens
from .runner import ModelRunner
from ..tree import TreeShape, chain_parents, tree_shape

CONTEXT = 64  # cache entries the timed rows attend over: a short prompt's (attention is a small share on CPU)


@torch.inference_mode()
def time_packed(runner, rows: int, tokens: int, *, repeats: int, warm: bool = True, last_only: bool = False) -> float:
    """Median seconds of one packed forward of `tokens` tokens over slots 0 .. rows - 1 (as even as they go: a
    round's drafts spread over its rows), written at CONTEXT.. of each, logits at every token (last_only: after
    each row's last token, as a drafting forward that feeds a row's missing tokens takes them; call before any
    row is admitted: it writes garbage past every valid entry, which the rows' own tokens overwrite before
    anything reads it). Lengths are not changed. warm: one untimed forward first (measure's passes warm once)."""
    widths = [tokens // rows + (i < tokens % rows) for i in range(rows)]
    start = max(0, min(CONTEXT, runner.capacity - widths[0]))
    # Logits at every token, as a verify needs them at every draft's position: a model whose LM head is a large
    # share of a token's work prices drafts several times too cheap otherwise (Gemma-3-270M, 262,144-token
    # head: the forward of 40 tokens 262 ms with one row's logits, against 236-279 ms for whole decoding rounds of
    # 16-19 tokens, so that drafts looked nearly free).
    last = [end - 1 for end in itertools.accumulate(w for w in widths if w)] if last_only else None
    batch = runner.pack([RowTokens(slot, start, width) for slot, width in enumerate(widths) if width], keep=last)
    ids = torch.zeros(tokens, dtype=torch.long, device=runner.device)
    return median_seconds(lambda: runner.forward_packed(ids, batch), runner.device, repeats, warm=warm)


@torch.inference_mode()
def time_rows(runner, rows: int, *, repeats: int, extra: dict | None = None) -> float:
    """Median seconds of one eager forward of one token in slots 0 .. rows - 1 attending over CONTEXT entries
    (a drafter whose model does not pack: an EAGLE head); extra: more inputs [rows, 1, ...]. The same rules as
    time_packed; the lengths come back after."""
    ids = torch.zeros(rows, 1, dtype=torch.long, device=runner.device)
    start = max(0, min(CONTEXT, runner.capacity - 1))
    with runner.lengths_kept():
        runner.set_lengths(slice(0, rows), start)
        return median_seconds(lambda: runner.forward(ids, kv_len=start + 1, rows=slice(0, rows), extra=extra),
                              runner.device, repeats)


def median_seconds(run: Callable[[], object], device: torch.device, repeats: int = 5, warm: bool = True) -> float:
    """Median wall seconds of run() over `repeats` calls after one untimed warm-up (none without `warm`), synced
    on a GPU."""
    times = []
    for _ in range(repeats + warm):
        _sync(device)
        started = time.perf_counter()
        run()
        _sync(device)
        times.append(time.perf_counter() - started)
    times = sorted(times[warm:])
    return times[len(times) // 2]


@torch.inference_mode()
def time_step(runner: ModelRunner, width: int, kv_len: int, *, last_only: bool = False, repeats: int = 5,
              tree: bool = False) -> float:
    """Median seconds of the runner's static step of `width` tokens attending over `kv_len` (replays of the
    declared step when there is one, on whatever its buffers hold). It writes at the last `width`
    positions of the capacity, past every valid entry of every slot (those are below max_seq_len), and
    restores the lengths."""
    tokens, seqs, from_seqs, trees = runner.static_steps.declared_io or (None, None, 0, {})
    if tokens is None:
        tokens = torch.zeros(runner.num_slots, width, dtype=torch.long, device=runner.device)
    shape = None
    if tree:  # the declared tree buffers, or a chain written as a tree: the same shape and work
        if width in trees:
            shape = TreeShape(trees[width][0], trees[width][1], None, None, None, width - 1)
        else:
            parents = chain_parents(runner.num_slots, width - 1, runner.device)
            shape = tree_shape(parents, torch.ones_like(parents, dtype=torch.bool))
    with runner.lengths_kept():
        runner.set_lengths(slice(None, runner.num_slots), runner.capacity - width)
        if runner.packed_width and not last_only:  # a verify is packed: every slot its whole width
            return median_seconds(lambda: runner.static_steps.verify_packed([width] * runner.num_slots, width, kv_len,
                                                                            seqs, tokens, shape),
                                  runner.device, repeats)
        return median_seconds(lambda: runner.forward(tokens[:, : width - from_seqs], kv_len=kv_len, last_only=last_only,
                                                     tree=shape, seqs=seqs, from_seqs=from_seqs),
                              runner.device, repeats)


@torch.inference_mode()
def packed_seconds(runner: ModelRunner, kv_len: int, repeats: int = 3, points: int = 5) -> list[tuple[int, float]]:
    """(tokens, median seconds) of the runner's static packed verify (packed_static.py) at up to `points` token
    buckets from half the slots to the widest (where rounds are: a line through them prices a token),
    attending over kv_len: the tokens spread over the slots as evenly as they go, written past every valid
    entry as in time_step (the lengths come back after)."""
    tokens, seqs, _, _ = runner.static_steps.declared_io
    slots, out = runner.num_slots, []
    buckets = [n for n in runner.static_steps.token_buckets if 2 * n >= slots]
    picked = sorted({buckets[round(i * (len(buckets) - 1) / max(points - 1, 1))] for i in range(points)})
    with runner.lengths_kept():
        runner.set_lengths(slice(None, slots), runner.capacity - runner.packed_width)
        for n in picked:
            widths = [n // slots + (1 if s < n % slots else 0) for s in range(slots)]
            run = lambda: runner.static_steps.verify_packed(widths, max(widths), kv_len, seqs, tokens)  # noqa: E731
            out.append((n, median_seconds(run, runner.device, repeats)))
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
