"""The static shapes: how long a slot's cache is, how many slots there are, and the attended lengths and row
counts steps come in."""

from __future__ import annotations

SMALLEST_BUCKET = 64
PREFILL_CHUNK = 64  # tokens per row of a captured prefill step


def kv_buckets(capacity: int) -> list[int]:
    """Attended lengths a static step may use: powers of two from 64, then the capacity itself."""
    out, size = [], SMALLEST_BUCKET
    while size < capacity:
        out.append(size)
        size *= 2
    return out + [capacity]


def kv_capacity(max_seq_len: int, k_max: int, trees=()) -> int:
    """Cache entries per slot: max_seq_len plus the widest verify pass past it (rows that draft fewer than
    the widest still write its padding; a tree's nodes take scratch entries past its root), plus one
    entry that is never valid, where padding past the end may land."""
    return max_seq_len + max([k_max, *(t.nodes for t in trees)]) + 2


def row_buckets(num_slots: int) -> list[int]:
    """Row counts of captured prefill steps: powers of two, then num_slots."""
    out, size = [], 1
    while size < num_slots:
        out.append(size)
        size *= 2
    return out + [num_slots]


def token_buckets(num_slots: int, width: int) -> list[int]:
    """Token counts of static packed verify steps (packed_static.py) for `num_slots` slots of at most `width`
    tokens: powers of two below num_slots (rounds with idle slots), then steps of half the slots up to
    num_slots * width, so that a round computes at most about num_slots / 2 padding tokens."""
    out, size = [], 1
    while size < num_slots:
        out.append(size)
        size *= 2
    step = max(1, num_slots // 2)
    return out + list(range(num_slots, num_slots * width, step)) + [num_slots * width]


def spare_slots_in_use(spare_slots: int, *, static: bool, drafter) -> int:
    """The spare slots (build_generator's) a generator can use: none on the captured path (every slot rides along
    in its steps) or with a drafter that reads the target's hidden states (EAGLE prefills each prompt at
    admission, so no prompt waits prefilled). drafter: a drafter's name, or a Drafter."""
    if spare_slots < 0:
        raise ValueError(f"spare_slots={spare_slots}: need >= 0")
    reads_features = drafter == "eagle" if isinstance(drafter, str) else bool(drafter.feature_layers)
    return 0 if static or reads_features else spare_slots
