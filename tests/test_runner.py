"""ModelRunner: per-row rollback, static steps over every slot, capture, and timing that touches nothing valid.

Every case compares logits with a fresh, cache-free computation of the same sequence."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from batchspec.engine.model.graphs import StepGraphs, resolve_capture
from batchspec.engine.model.kv_cache import causal_mask
from batchspec.engine.model.runner import ModelRunner, kv_buckets
from batchspec.engine.model.timing import time_step


@pytest.fixture(scope="module")
def model(pair):
    return AutoModelForCausalLM.from_pretrained(pair.target, dtype=torch.float32, attn_implementation="sdpa").eval()


def fresh_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def padded(seqs: list[list[int]]) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    return torch.tensor([s + [0] * (width - len(s)) for s in seqs])


def runner(model, capture=None, slots=4, capacity=40, widths=(1, 2, 3, 4), declare=False) -> ModelRunner:
    r = ModelRunner(model, num_slots=slots, capacity=capacity, max_position=capacity,
                    graphs=StepGraphs(capture, model.device), widths=widths, name="test")
    if declare:  # the static steps read their tokens from these buffers
        seqs = torch.zeros(slots, capacity, dtype=torch.long)
        r.static_steps.declare(torch.zeros(slots, max(widths), dtype=torch.long), seqs)
        r.static_prefill.declare(seqs)
    return r


def step(r: ModelRunner, tokens: torch.Tensor, rows: list[int] | None):
    """A forward of `tokens` at the current lengths: of `rows` only (eager) or of every slot (static)."""
    lengths = r.lengths.tolist()[: r.num_slots]
    if rows is None:
        return r.forward(tokens, kv_len=max(lengths) + tokens.shape[1])
    return r.forward(tokens, kv_len=max(lengths[i] for i in rows) + tokens.shape[1], rows=torch.tensor(rows))


# rows that run (None: every slot, the static step), capture mode
MODES = [([2, 0, 3], None), (None, None), (None, "static")]


@pytest.mark.parametrize("rows,capture", MODES, ids=["eager_rows", "static_shape", "static_capture_mode"])
def test_rollback_then_rewrite_equals_fresh(model, rows, capture):
    gen = torch.Generator().manual_seed(0)
    r = runner(model, capture)
    seqs = [torch.randint(3, 300, (n,), generator=gen).tolist() for n in (7, 12, 4, 9)]
    r.prefill([0, 1, 2, 3], padded(seqs), [0] * 4, [len(s) for s in seqs])
    which = rows if rows is not None else [0, 1, 2, 3]
    # Each row speculates 4 wrong tokens, is rolled back by a different amount, then writes new tokens.
    wrong = torch.randint(3, 300, (len(which), 4), generator=gen)
    step(r, wrong, rows)
    keep = [0, 2, 4, 1][: len(which)]
    for i, slot in enumerate(which):
        r.set_lengths(slot, torch.tensor(len(seqs[slot]) + keep[i]))
    kept = [seqs[slot] + wrong[i, : keep[i]].tolist() for i, slot in enumerate(which)]
    new = torch.randint(3, 300, (len(which), 3), generator=gen)
    logits = step(r, new, rows)
    for i, seq in enumerate(kept):
        torch.testing.assert_close(logits[i], fresh_logits(model, seq + new[i].tolist())[-3:], atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_other_slots_are_untouched_by_a_refill(model):
    r = runner(model, slots=2, capacity=32)
    a, b = [5, 6, 7, 8, 9], [10, 11, 12]
    r.prefill([0, 1], padded([a, b]), [0, 0], [5, 3])
    r.prefill([1], torch.tensor([[20, 21, 22, 23, 24, 25]]), [0], [6])  # slot 1 gets a new request
    logits = step(r, torch.tensor([[40]]), [0])
    torch.testing.assert_close(logits[0, -1], fresh_logits(model, a + [40])[-1], atol=1e-4, rtol=1e-4)


def test_prefill_returns_each_rows_last_logits_and_sets_lengths(model):
    r = runner(model)
    seqs = [[5, 6, 7], [8, 9, 10, 11, 12], [13]]
    last = r.prefill([3, 1, 0], padded(seqs), [0, 0, 0], [3, 5, 1])
    assert r.lengths.tolist() == [1, 5, 0, 3, 0]  # the last: the scratch slot
    for i, seq in enumerate(seqs):
        torch.testing.assert_close(last[i], fresh_logits(model, seq)[-1], atol=1e-4, rtol=1e-4)


def test_overflow_is_an_error_not_a_silent_write(model):
    r = runner(model, slots=1, capacity=8)
    with pytest.raises(RuntimeError, match="overflow"):
        r.prefill([0], torch.zeros(1, 9, dtype=torch.long), [0], [9])
    r.prefill([0], torch.zeros(1, 6, dtype=torch.long), [0], [6])
    with pytest.raises(RuntimeError, match="overflow"):
        r.forward(torch.zeros(1, 4, dtype=torch.long), kv_len=10)


def test_timing_writes_nothing_a_row_will_read(model):
    """time_step replays the step at the end of the capacity and restores the lengths: the next real
    step gives the same logits as without it."""
    seq = [5, 6, 7, 8, 9, 10]
    r = runner(model, capture="static", slots=2, capacity=24)
    r.prefill([0, 1], padded([seq, seq[:2]]), [0, 0], [6, 2])
    assert time_step(r, 3, 16, repeats=2) > 0
    assert r.lengths.tolist() == [6, 2, 0]
    logits = r.forward(torch.tensor([[11], [12]]), kv_len=8)
    torch.testing.assert_close(logits[0, -1], fresh_logits(model, seq + [11])[-1], atol=1e-4, rtol=1e-4)


def test_buckets_and_capture_modes():
    assert kv_buckets(67) == [64, 67]
    assert kv_buckets(600) == [64, 128, 256, 512, 600]
    assert kv_buckets(64) == [64]
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    table = [("auto", cpu, None), ("auto", cuda, "cuda_graphs"), ("on", cpu, "inductor"), ("on", cuda, "cuda_graphs"),
             ("inductor", cpu, "inductor"), ("inductor", cuda, "cuda_inductor"), ("off", cuda, None), (False, cuda, None),
             ("static", cpu, "static")]
    for setting, device, expected in table:
        assert resolve_capture(setting, device) == expected, (setting, device)
    with pytest.raises(ValueError, match="compile="):
        resolve_capture("fast", cpu)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_mask_is_additive_in_the_model_dtype(dtype):
    """Eager adds the mask to the scores (a bool mask would be silently wrong there); sdpa takes the same."""
    mask = causal_mask(torch.tensor([[2, 3], [0, 1]]), 4, dtype)
    assert mask.dtype == dtype and mask.shape == (2, 1, 2, 4)
    allowed = mask == 0
    assert allowed[0, 0].tolist() == [[True, True, True, False], [True, True, True, True]]
    assert allowed[1, 0].tolist() == [[True, False, False, False], [True, True, False, False]]
    assert set(mask.unique().tolist()) == {0.0, torch.finfo(dtype).min}


@torch.no_grad()
def test_eager_attention_gives_the_same_logits(pair):
    eager = AutoModelForCausalLM.from_pretrained(pair.target, dtype=torch.float32, attn_implementation="eager").eval()
    r = runner(eager, slots=2, capacity=32)
    last = r.prefill([0, 1], torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]]), [0, 0], [4, 2])
    torch.testing.assert_close(last[1], fresh_logits(eager, [9, 10])[-1], atol=1e-4, rtol=1e-4)
    logits = step(r, torch.tensor([[3, 4], [5, 6]]), None)
    torch.testing.assert_close(logits[1], fresh_logits(eager, [9, 10, 5, 6])[-2:], atol=1e-4, rtol=1e-4)


def test_a_width_that_was_not_declared_runs_eagerly_with_one_warning(model, caplog):
    r = runner(model, capture="inductor", slots=2, capacity=24, widths=(1,), declare=True)
    r.prefill([0, 1], torch.tensor([[5, 6, 7], [8, 9, 0]]), [0, 0], [3, 2])
    with caplog.at_level("WARNING", logger="batchspec"):
        for _ in range(2):
            logits = r.forward(torch.tensor([[1, 2], [3, 4]]), kv_len=8)
    assert sum("was not declared" in m for m in caplog.messages) == 1
    torch.testing.assert_close(logits[0], fresh_logits(model, [5, 6, 7, 1, 2])[-2:], atol=1e-4, rtol=1e-4)
    assert not r.graphs.compiled


@torch.no_grad()
def test_static_prefill_in_chunks_equals_fresh(model):
    """Prompts written through the static prefill steps (chunks of 64 tokens for a power-of-two number of
    rows, padding rows in the scratch slot) give the same cache as a fresh forward: the logits after each
    prompt, and the next step's."""
    r = runner(model, capture="static", slots=3, capacity=200, widths=(1,))
    gen = torch.Generator().manual_seed(1)
    seqs = torch.zeros(3, 200, dtype=torch.long)
    prompts = {0: torch.randint(3, 300, (150,), generator=gen).tolist(), 2: torch.randint(3, 300, (9,), generator=gen).tolist()}
    for slot, p in prompts.items():
        seqs[slot, : len(p)] = torch.tensor(p)
    last = r.static_prefill.prefill(seqs, [0, 2], [0, 0], [150, 9])
    assert r.lengths.tolist() == [150, 0, 9, 1]  # the scratch slot took a padding row (length 1)
    for slot, p in prompts.items():
        torch.testing.assert_close(last[slot], fresh_logits(model, p)[-1], atol=1e-4, rtol=1e-4)
    # A second admission resumes where the first stopped (a draft catching up: from a start).
    more = torch.randint(3, 300, (70,), generator=gen).tolist()
    seqs[2, 9 : 9 + 70] = torch.tensor(more)
    last = r.static_prefill.prefill(seqs, [2], [9], [79])
    torch.testing.assert_close(last[2], fresh_logits(model, prompts[2] + more)[-1], atol=1e-4, rtol=1e-4)
    logits = r.forward(torch.tensor([[7], [7], [7]]), kv_len=160)
    torch.testing.assert_close(logits[0, -1], fresh_logits(model, prompts[0] + [7])[-1], atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.xdist_group("inductor")  # beside test_greedy_parity's compiled cells: one worker compiles, the cache serves
def test_inductor_capture_matches_eager(model):
    """compile=on on CPU: the 1-token step compiled by torch.compile gives the eager logits, replayed at
    other lengths without recompiling (one compiled step per shape)."""
    seqs = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    eager = runner(model, "static", slots=3, capacity=20, widths=(1,), declare=True)
    compiled = runner(model, "inductor", slots=3, capacity=20, widths=(1,), declare=True)
    for r in (eager, compiled):
        r.prefill([0, 1, 2], padded(seqs), [0, 0, 0], [4, 2, 3])
    for t in range(3):
        token = torch.tensor([[20 + t], [30 + t], [40 + t]])
        a, b = eager.forward(token, kv_len=8).clone(), compiled.forward(token, kv_len=8)
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        for r in (eager, compiled):
            r.set_lengths(slice(0, 3), r.lengths[:3] + 1)
    assert list(compiled.graphs.compiled) == [("test", "forward", 1, 20, False, 0, 0)] and compiled.graphs.capture_s > 0


def test_the_cache_goes_by_the_name_the_model_takes(model):
    """transformers 5.24 renamed forward's `past_key_values` to `cache`; the old name warns there. Either way the
    runner passes the name the installed release takes, so no forward warns."""
    import inspect
    import warnings

    from batchspec.engine.model.model_calls import cache_argument

    params = inspect.signature(model.forward).parameters
    assert cache_argument(model) == ("cache" if "cache" in params else "past_key_values")
    r = runner(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step(r, torch.tensor([[5], [6]]), [0, 1])


@torch.no_grad()
def test_row_positions_keep_each_rows_own_logits(model):
    """Per-row logits positions on any transformers release: the runner asks for every position and a hook on
    the LM head keeps each row's own (before 5.2x a 2D logits_to_keep indexed every row with it). Equal to the
    full logits gathered; the hook passes everything through once the call is done; one hook per model."""
    from batchspec.engine.model.model_calls import RowPositions

    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 300, (3, 6), generator=gen)
    full = model(ids).logits
    positions = RowPositions.of(model)
    assert RowPositions.of(model) is positions
    for keep in ([[5], [0], [3]], [[1, 2], [4, 5], [0, 5]]):
        keep = torch.tensor(keep)
        try:
            kept = model(ids, logits_to_keep=positions.model_argument(keep)).logits
        finally:
            positions.done()
        torch.testing.assert_close(kept, torch.take_along_dim(full, keep[..., None], dim=1))
    assert positions.model_argument(1) == 1 and positions.keep is None  # an int goes to the model as it is
    torch.testing.assert_close(model(ids).logits, full)
