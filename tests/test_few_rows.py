"""engine/model/few_rows.py: linears over few rows computed as W @ x.T where that was timed faster."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from batchspec.engine.model.few_rows import BUCKETS, BUDGET_S, CHOICE, FewRowLinears, bucket, weight_left


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
    linears = FewRowLinears(model, left={(40, 16): frozenset({1, 2, 3, 4})})  # up only, at most 4 rows
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
    assert set(linears.left) == {(40, 16), (16, 40)}
    assert all(chosen <= set(BUCKETS) for chosen in linears.left.values())
    assert getattr(model, CHOICE) is linears.left
    assert FewRowLinears(model).left is linears.left  # a later runner of the model does not time again


def test_a_hooked_layer_is_left_alone():
    model = TwoLayers()
    hook = model.up.forward
    hooked = model.up.forward = lambda x: hook(x)  # as accelerate's hooks replace a module's forward
    linears = FewRowLinears(model, left={(40, 16): frozenset(BUCKETS), (16, 40): frozenset(BUCKETS)})
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
    assert len(timed) == 1 and second.left == first.left
    bounded = real(FewRowLinears(TwoLayers(), left={}).linears, 1, budget_s=0.0)
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
    assert FewRowLinears.time([layer], repeats=2, budget_s=1e9) == {(40, 16): frozenset(chosen)}


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
    assert chosen == {(40, 16): frozenset(few_rows.BUCKETS[:half]), (16, 40): frozenset(few_rows.BUCKETS[:half])}


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
