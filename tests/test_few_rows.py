"""engine/model/few_rows.py: linears over few rows computed as W @ x.T where that was timed faster."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from batchspec.engine.model.few_rows import (BLOCKED, BUCKETS, BUDGET_S, CHOICE, LEFT, FewRowLinears, blocked_left,
                                             bucket, weight_left)


@pytest.mark.parametrize("rows", [0, 1, 2, 3, 5, 8, 17, 64, 65])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("lead", [(), (1,), (2, 3)])
def test_weight_left_is_linear(rows, bias, lead):
    torch.manual_seed(rows)
    weight, b = torch.randn(48, 32), (torch.randn(48) if bias else None)
    x = torch.randn(*lead, rows, 32)
    out = weight_left(x, weight, b)
    assert out.shape == (*lead, rows, 48) and out.is_contiguous()
    torch.testing.assert_close(out, F.linear(x, weight, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows, expected", [(1, 1), (2, 2), (3, 3), (9, 9), (16, 16), (17, 20), (29, 32), (33, 40),
                                           (64, 64), (65, None)])
def test_bucket(rows, expected):
    """Every count of rows to 16 is a bucket of its own: MKL's product is not monotone in the rows (SmolLM2's up
    projection as W @ x.T 11.6 ms at 8 rows, 23.1 at 12; 2026-12-04), and a bucket of 9-16 rows chosen as one
    made a 9-token verify pass cost 81.5 ms against 58.7 for 8."""
    assert bucket(rows) == expected


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(16, 40), nn.Linear(40, 16, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def test_only_the_chosen_buckets_and_shapes_run_weight_left_and_the_model_is_restored(monkeypatch):
    model = TwoLayers()
    calls = []
    import batchspec.engine.model.few_rows as few_rows
    real = few_rows.weight_left

    def counted(x, w, b=None):
        calls.append((x.shape[-2], tuple(w.shape)))
        return real(x, w, b)
    monkeypatch.setattr(few_rows, "weight_left", counted)
    linears = FewRowLinears(model, {(40, 16): dict.fromkeys((1, 2, 3, 4), LEFT)})  # up only, at most 4 rows
    for rows in (1, 3, 5, 70):
        x = torch.randn(rows, 16)
        expected = model(x)
        with linears:
            torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)
        assert "forward" not in model.up.__dict__ and "forward" not in model.down.__dict__
    assert calls == [(1, (40, 16)), (3, (40, 16))]


def test_timing_chooses_per_shape_once_per_model_and_leaves_the_global_generator_alone():
    model = TwoLayers()
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    linears = FewRowLinears(model, repeats=1)
    assert torch.equal(torch.rand(3), expected)
    assert set(linears.chosen) == {(40, 16), (16, 40)}
    assert all(set(chosen) <= set(BUCKETS) and set(chosen.values()) <= {LEFT} for chosen in linears.chosen.values())
    assert getattr(model, CHOICE) is linears.chosen
    assert FewRowLinears(model).chosen is linears.chosen  # a later runner of the model does not time again


def test_a_hooked_layer_is_left_alone():
    model = TwoLayers()
    hook = model.up.forward
    hooked = model.up.forward = lambda x: hook(x)  # as accelerate's hooks replace a module's forward
    linears = FewRowLinears(model, {(40, 16): dict.fromkeys(BUCKETS, LEFT), (16, 40): dict.fromkeys(BUCKETS, LEFT)})
    with linears:
        assert model.up.__dict__["forward"] is hooked and "forward" in model.down.__dict__
        model(torch.randn(2, 16))
    assert model.up.__dict__["forward"] is hooked and "forward" not in model.down.__dict__


def test_the_choice_is_kept_for_the_next_process_and_bounded_in_time(monkeypatch, tmp_path):
    """A second model of the same shapes (as in a resumed job's process) reads the choice from the machine's
    cache instead of timing; timing stops at its budget (the buckets left keep F.linear)."""
    from batchspec.engine.model import machine_cache

    monkeypatch.setenv(machine_cache.CACHE_ENV, str(tmp_path))  # nothing cached by the tests before
    monkeypatch.setattr(machine_cache, "undisturbed", lambda *a: True)  # the other test worker shares the cores
    timed = []
    real = FewRowLinears.time

    def counting(linears, repeats, budget_s=BUDGET_S):
        timed.append(len(linears))
        return real(linears, repeats, budget_s)

    monkeypatch.setattr(FewRowLinears, "time", staticmethod(counting))
    first = FewRowLinears(TwoLayers(), repeats=1)
    second = FewRowLinears(TwoLayers(), repeats=1)
    assert len(timed) == 1 and second.chosen == first.chosen
    bounded = real(FewRowLinears(TwoLayers(), {}).linears, 1, budget_s=0.0)
    assert set(bounded) == {(40, 16), (16, 40)} and sum(len(b) > 0 for b in bounded.values()) <= 1


@pytest.mark.parametrize("linear_ms, left_ms, chosen", [
    # SmolLM2's LM head (2026-12-03): F.linear 2.5x slower at 13 rows than at 16; W @ x.T flat
    ({13: 42.1, 16: 16.8}, {13: 16.6, 16: 17.4}, {13}),
    ({13: 20.0}, {13: 18.5}, set()),  # 7.5% faster: not the 10% margin
    ({13: 20.0}, {13: 17.0}, {13}),  # 15% faster
    ({12: 11.9, 13: 20.0, 14: 11.0}, {12: 13.6, 13: 16.0, 14: 13.0}, {13}),  # each count on its own times
])
def test_a_bucket_is_chosen_by_its_own_time(linear_ms, left_ms, chosen, monkeypatch):
    """The choice for one shape, with a clock that advances by the given times (every other count costs the
    same either way)."""
    from types import SimpleNamespace

    import batchspec.engine.model.few_rows as few_rows

    now = [0.0]

    def costing(table):
        def f(x, w, b=None):
            now[0] += table.get(x.shape[0], 1.0) / 1000
        return f
    monkeypatch.setattr(few_rows, "F", SimpleNamespace(linear=costing(linear_ms)))
    monkeypatch.setattr(few_rows, "weight_left", costing(left_ms))
    monkeypatch.setattr(few_rows, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    layer = nn.Linear(16, 40)
    assert FewRowLinears.time([layer], repeats=2, budget_s=1e9) == {(40, 16): dict.fromkeys(chosen, LEFT)}


def test_a_budget_cut_leaves_only_the_widest_buckets_untimed(monkeypatch):
    """Timing goes bucket by bucket, the fewest rows first: a budget that covers half the timing leaves every
    shape chosen for the narrow buckets and nothing past them (W @ x.T wins everywhere here)."""
    from types import SimpleNamespace

    import batchspec.engine.model.few_rows as few_rows

    now = [0.0]

    def costing(ms):
        def f(x, w, b=None):
            now[0] += ms / 1000
        return f
    monkeypatch.setattr(few_rows, "F", SimpleNamespace(linear=costing(2.0)))
    monkeypatch.setattr(few_rows, "weight_left", costing(1.0))
    monkeypatch.setattr(few_rows, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    layers = [nn.Linear(16, 40), nn.Linear(40, 16)]
    half = len(few_rows.BUCKETS) // 2
    # each (bucket, shape) costs 3 ms a pass, 2 passes: the budget runs out after `half` buckets of both shapes
    chosen = FewRowLinears.time(layers, repeats=2, budget_s=(half * 2 * 6 - 1) / 1000)
    narrow = dict.fromkeys(few_rows.BUCKETS[:half], LEFT)
    assert chosen == {(40, 16): narrow, (16, 40): narrow}


@pytest.mark.parametrize("features, passes_each", [(16, 3), (4096, 1)])  # 2.6 KB: a best of 3; 672 KB past 0.5 MB: once
def test_a_weight_past_the_sample_size_is_timed_once(features, passes_each, monkeypatch):
    """Gemma-3-270M's 671 MB head spent the whole budget on a best of three (19 s on a loaded machine) for the
    choice one pass makes: with SAMPLE_BYTES at 0.5 MB, a 40 x 4096 fp32 weight (672 KB) is timed once per
    size and function, a 40 x 16 one `repeats` times."""
    from collections import Counter
    from types import SimpleNamespace

    import batchspec.engine.model.few_rows as few_rows

    calls = Counter()

    def counting(name):
        def f(x, w, b=None):
            calls[name, x.shape[0]] += 1
        return f
    monkeypatch.setattr(few_rows, "SAMPLE_BYTES", 1 << 19)
    monkeypatch.setattr(few_rows, "F", SimpleNamespace(linear=counting("linear")))
    monkeypatch.setattr(few_rows, "weight_left", counting("left"))
    FewRowLinears.time([nn.Linear(features, 40)], repeats=3, budget_s=1e9)
    sizes = few_rows.BUCKETS
    assert calls == Counter({(name, rows): passes_each for name in ("linear", "left") for rows in sizes})


@pytest.mark.parametrize("rows", [0, 1, 2, 9, 24, 65])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("lead", [(), (2,)])
@pytest.mark.parametrize("out_features", [48, 50, 16])  # 3 blocks of 16, a short last block, one block
def test_blocked_left_is_linear(rows, bias, lead, out_features, monkeypatch):
    import batchspec.engine.model.few_rows as few_rows

    monkeypatch.setattr(few_rows, "BLOCK", 16)
    torch.manual_seed(rows)
    weight, b = torch.randn(out_features, 32), (torch.randn(out_features) if bias else None)
    x = torch.randn(*lead, rows, 32)
    out = blocked_left(x, weight, b)
    assert out.shape == (*lead, rows, out_features) and out.is_contiguous()
    torch.testing.assert_close(out, F.linear(x, weight, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("linear, left, blocked, chosen", [
    (10.0, 5.0, None, LEFT),  # a narrow weight: blocks not timed
    (10.0, 9.5, None, None),  # W @ x.T 5% faster: not the 10% margin
    (20.0, 14.0, 10.0, BLOCKED),  # Gemma-3's head at 16 rows (2026-12-07): 143 / 114 / 84 ms
    (20.0, 10.0, 9.5, LEFT),  # blocks 5% faster than W @ x.T: not the margin over it
    (10.0, 12.0, 8.5, BLOCKED),  # only blocks beat F.linear
    (10.0, 12.0, 9.5, None),  # blocks within the margin of F.linear
])
def test_a_bucket_picks_the_fastest_product_by_the_margin(linear, left, blocked, chosen):
    from batchspec.engine.model.few_rows import _pick

    seconds = {"linear": linear, LEFT: left} | ({BLOCKED: blocked} if blocked is not None else {})
    assert _pick(seconds) == chosen


def test_only_a_wide_weight_past_8_rows_is_timed_in_blocks_and_its_forward_runs_them(monkeypatch):
    """With a clock where blocks are always fastest: the wide weight (BLOCK_MIN rows, here 64) chooses them past
    8 rows and W @ x.T up to 8; the narrow one never times them. The layer's forward then runs the chosen one."""
    from types import SimpleNamespace

    import batchspec.engine.model.few_rows as few_rows

    now, calls = [0.0], []

    def costing(name, ms):
        def f(x, w, b=None):
            now[0] += ms / 1000
            calls.append((name, x.shape[0], w.shape[0]))
        return f
    monkeypatch.setattr(few_rows, "BLOCK_MIN", 64)
    monkeypatch.setattr(few_rows, "F", SimpleNamespace(linear=costing("linear", 3.0)))
    monkeypatch.setattr(few_rows, "weight_left", costing(LEFT, 2.0))
    monkeypatch.setattr(few_rows, "blocked_left", costing(BLOCKED, 1.0))
    monkeypatch.setattr(few_rows, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    wide, narrow = nn.Linear(16, 64), nn.Linear(16, 40)
    chosen = FewRowLinears.time([wide, narrow], repeats=1, budget_s=1e9)
    assert chosen[(64, 16)] == {b: (BLOCKED if b > 8 else LEFT) for b in BUCKETS}
    assert chosen[(40, 16)] == dict.fromkeys(BUCKETS, LEFT)
    assert {rows for name, rows, out in calls if name == BLOCKED} == {b for b in BUCKETS if b > 8}
    assert all(out == 64 for name, _, out in calls if name == BLOCKED)
    calls.clear()
    with FewRowLinears(wide, chosen):
        for rows in (3, 12, 70):
            wide(torch.randn(rows, 16))
    assert [(name, rows) for name, rows, _ in calls] == [(LEFT, 3), (BLOCKED, 12), ("linear", 70)]


def test_a_wide_weights_buckets_that_the_budget_left_get_a_budget_of_their_own(monkeypatch):
    """Gemma-3's head ran out of the budget at 12 rows, where its verify passes compute it at 24: after the cut,
    the wide weight's remaining buckets are timed within WIDE_BUDGET_S; the narrow one's stay untimed."""
    from types import SimpleNamespace

    import batchspec.engine.model.few_rows as few_rows

    now = [0.0]

    def costing(ms):
        def f(x, w, b=None):
            now[0] += ms / 1000
        return f
    monkeypatch.setattr(few_rows, "BLOCK_MIN", 64)
    monkeypatch.setattr(few_rows, "WIDE_BUDGET_S", 10 * few_rows.BUDGET_S)  # ten times the budget
    monkeypatch.setattr(few_rows, "F", SimpleNamespace(linear=costing(2.0)))
    monkeypatch.setattr(few_rows, "weight_left", costing(1.0))
    monkeypatch.setattr(few_rows, "blocked_left", costing(0.5))
    monkeypatch.setattr(few_rows, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    wide, narrow = nn.Linear(16, 64), nn.Linear(16, 40)
    chosen = FewRowLinears.time([wide, narrow], repeats=1, budget_s=0.030)  # 5 or 6 buckets of both
    cut = max(chosen[(40, 16)])
    assert 4 <= cut < 16 and chosen[(40, 16)] == dict.fromkeys(BUCKETS[:BUCKETS.index(cut) + 1], LEFT)
    assert chosen[(64, 16)] == {b: (BLOCKED if b > 8 else LEFT) for b in BUCKETS}
    assert FewRowLinears.time([wide, narrow], repeats=1, budget_s=0.0) == {(64, 16): {}, (40, 16): {}}
