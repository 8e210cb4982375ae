"""The captured path's memory as computed before anything is allocated, and the buckets a budget allows."""

from __future__ import annotations

import pytest

from batchspec.engine.model.graphs import CaptureError
from batchspec.engine.model.memory import GRAPH_BYTES, MiB, Shape, estimate, fit_buckets

LLAMA_3B = Shape(hidden=3072, intermediate=8192, heads=24, kv_heads=8, head_dim=128, vocab=128256, layers=28)
BUCKETS = [64, 128, 256, 512, 1024, 2048, 2054]


def memory(buckets, **kw):
    return estimate(LLAMA_3B, num_slots=64, widths=[1, 2, 3, 4, 5], buckets=buckets, dtype_bytes=2, **kw)


def test_one_logits_buffer_not_one_per_graph():
    """Buffers do not grow with the number of graphs (the old design kept a [B, T, V] logits buffer per
    captured shape: ~80 MB each at this size, several GB over widths x buckets)."""
    few, many = memory(BUCKETS[-1:]), memory(BUCKETS)
    assert few.buffers == many.buffers < 100 * MiB
    assert many.graphs > few.graphs and many.pool == few.pool  # the pool is the largest step's, shared


@pytest.mark.parametrize("budget_mib,expected", [(None, BUCKETS), (2950, [128, 512, 2048, 2054]), (2900, [512, 2054]),
                                                  (2860, [2054])])
def test_fewer_buckets_within_a_budget(budget_mib, expected):
    chosen, m = fit_buckets(BUCKETS, budget_mib and budget_mib * MiB, memory)
    assert chosen == expected
    assert budget_mib is None or m.total <= budget_mib * MiB


def test_a_budget_below_the_largest_step_is_one_line():
    with pytest.raises(CaptureError, match="over the budget of 1,000 MiB: lower batch_size or max_seq_len"):
        fit_buckets(BUCKETS, 1000 * MiB, memory)
    assert memory(BUCKETS, noise=True).buffers > memory(BUCKETS).buffers  # coupled noise adds a buffer
    assert GRAPH_BYTES > 0


def test_packed_trees_have_steps_and_a_buffer_of_their_own():
    """Packed, a tree of 9 verify positions (2x4) runs steps of its own per token bucket up to 64 x 9 tokens (23
    buckets at batch 64: 1 .. 32, then 64 .. 576 in steps of 32), and the packed logits buffer holds its 576
    tokens; unpacked it is one forward per length bucket."""
    chains = memory(BUCKETS, packed_chain=5)
    trees = estimate(LLAMA_3B, num_slots=64, widths=[1, 2, 3, 4, 5, 9], buckets=BUCKETS, dtype_bytes=2,
                     packed_chain=5, tree_widths=(9,))
    unpacked = estimate(LLAMA_3B, num_slots=64, widths=[1, 2, 3, 4, 5, 9], buckets=BUCKETS, dtype_bytes=2)
    # the tree's packed steps, its gather and its acceptance width
    assert trees.graphs - chains.graphs == len(BUCKETS) * 23 + 2
    assert unpacked.graphs < trees.graphs
    assert trees.buffers - chains.buffers > 64 * 4 * LLAMA_3B.vocab * 2  # the wider output and packed buffers
    # A tree as wide as the widest chain (2x2, 5 positions) still has steps of its own: 15 token buckets a length
    # bucket (1 .. 32, then 64 .. 320 in steps of 32), its gather and acceptance shared with the chain of 5.
    same_width = memory(BUCKETS, packed_chain=5, tree_widths=(5,))
    assert same_width.graphs - chains.graphs == len(BUCKETS) * 15
