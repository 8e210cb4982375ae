"""Timing static steps by replaying them: what adaptive speculation's cost table and calibrate measure."""

from __future__ import annotations

import time
from typing import Callable

import torch

from .runner import ModelRunner
from .tree import TreeShape, chain_parents, tree_shape


def median_seconds(run: Callable[[], object], device: torch.device, repeats: int = 5) -> float:
    """Median wall seconds of run() over `repeats` calls after one untimed warm-up, synced on a GPU."""
    times = []
    for _ in range(repeats + 1):
        _sync(device)
        started = time.perf_counter()
        run()
        _sync(device)
        times.append(time.perf_counter() - started)
    times = sorted(times[1:])
    return times[len(times) // 2]


@torch.inference_mode()
def time_step(runner: ModelRunner, width: int, kv_len: int, *, last_only: bool = False, repeats: int = 5,
              tree: bool = False) -> float:
    """Median seconds of the runner's static step of `width` tokens attending over `kv_len` (replays of the
    declared step when there is one, on whatever its buffers hold). It writes at the last `width`
    positions of the capacity, past every valid entry of every slot (those are below max_seq_len), and
    restores the lengths."""
    tokens, seqs, from_seqs, trees = runner.declared_io or (None, None, 0, {})
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
        return median_seconds(lambda: runner.forward(tokens[:, : width - from_seqs], kv_len=kv_len, last_only=last_only,
                                                     tree=shape, seqs=seqs, from_seqs=from_seqs),
                              runner.device, repeats)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
