"""Per-row rollback: after rolling back and writing other tokens, logits equal a fresh computation."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from batchspec.engine.kv_cache import SlotKVCache, causal_mask, forward


@pytest.fixture(scope="module")
def model(pair):
    return AutoModelForCausalLM.from_pretrained(pair.target, dtype=torch.float32, attn_implementation="sdpa").eval()


def fresh_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


@torch.no_grad()
def test_rollback_then_rewrite_equals_fresh(model):
    gen = torch.Generator().manual_seed(0)
    vocab = 300
    seqs = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (7, 12, 4)]
    cache = SlotKVCache.for_model(model, num_slots=4, max_len=40)
    rows = [2, 0, 3]  # not consecutive, not in order: exercises the gather path
    width = max(len(s) for s in seqs)
    padded = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
    forward(model, cache, padded, rows, [0, 0, 0], 40)
    # Each row speculates 4 wrong tokens, is rolled back by a different amount, then writes new tokens.
    wrong = torch.randint(3, vocab, (3, 4), generator=gen)
    forward(model, cache, wrong, rows, [len(s) for s in seqs], 40)
    keep = [0, 2, 4]  # how many of the speculative tokens each row keeps
    cache.rollback(rows, [len(s) + n for s, n in zip(seqs, keep)])
    kept = [s + wrong[i, : keep[i]].tolist() for i, s in enumerate(seqs)]
    new = torch.randint(3, vocab, (3, 3), generator=gen)
    logits = forward(model, cache, new, rows, [cache.lengths[r] for r in rows], 40)
    for i, seq in enumerate(kept):
        expected = fresh_logits(model, seq + new[i].tolist())[-3:]
        torch.testing.assert_close(logits[i], expected, atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_other_slots_are_untouched_by_a_refill(model):
    cache = SlotKVCache.for_model(model, num_slots=2, max_len=32)
    a, b = [5, 6, 7, 8, 9], [10, 11, 12]
    forward(model, cache, torch.tensor([a, b + [0, 0]]), [0, 1], [0, 0], 32)
    forward(model, cache, torch.tensor([[20, 21, 22, 23, 24, 25]]), [1], [0], 32)  # slot 1 gets a new request
    logits = forward(model, cache, torch.tensor([[40]]), [0], [len(a)], 32)
    torch.testing.assert_close(logits[0, -1], fresh_logits(model, a + [40])[-1], atol=1e-4, rtol=1e-4)


def test_overflow_is_an_error_not_a_silent_write(model):
    cache = SlotKVCache.for_model(model, num_slots=1, max_len=8)
    with pytest.raises(RuntimeError, match="overflow"):
        forward(model, cache, torch.zeros(1, 4, dtype=torch.long), [0], [6], 8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_mask_is_additive_in_the_model_dtype(dtype):
    """Eager adds the mask to the scores (a bool mask would be silently wrong there); sdpa takes the same."""
    mask = causal_mask(torch.tensor([2, 0]), 2, 4, dtype)
    assert mask.dtype == dtype and mask.shape == (2, 1, 2, 4)
    allowed = mask == 0
    assert allowed[0, 0].tolist() == [[True, True, True, False], [True, True, True, True]]
    assert allowed[1, 0].tolist() == [[True, False, False, False], [True, True, False, False]]
    assert set(mask.unique().tolist()) == {0.0, torch.finfo(dtype).min}


@torch.no_grad()
def test_eager_attention_gives_the_same_logits(pair):
    eager = AutoModelForCausalLM.from_pretrained(pair.target, dtype=torch.float32, attn_implementation="eager").eval()
    cache = SlotKVCache.for_model(eager, num_slots=2, max_len=32)
    seqs = [[5, 6, 7, 8], [9, 10, 0, 0]]
    logits = forward(eager, cache, torch.tensor(seqs), [0, 1], [0, 0], 32)
    torch.testing.assert_close(logits[1, :2], fresh_logits(eager, [9, 10]), atol=1e-4, rtol=1e-4)
