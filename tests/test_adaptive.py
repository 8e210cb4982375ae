"""The adaptive-k bandit on synthetic throughput curves."""

from __future__ import annotations

import random

import pytest

from batchspec.adaptive import AdaptiveK


def simulate(rate_of_k, k_max=4, rounds=400, noise=0.15, seed=0):
    """Run the controller against tokens/s = rate_of_k(k) * (1 +- noise); return the k chosen per round."""
    rng = random.Random(seed)
    controller, chosen = AdaptiveK(k_max), []
    for _ in range(rounds):
        k = controller.choose()
        chosen.append(k)
        rate = rate_of_k(k) * (1 + rng.uniform(-noise, noise))
        controller.observe(k, tokens=8, seconds=8 / rate)
    return chosen


CURVES = [
    # name, tokens/s for k = 0..4, acceptable picks after exploration
    ("useless_draft", [100, 60, 50, 45, 40], {0}),
    ("good_draft", [100, 150, 180, 190, 185], {2, 3, 4}),
    ("peak_in_middle", [100, 130, 140, 110, 90], {1, 2}),
]


@pytest.mark.parametrize("name,curve,good", CURVES, ids=[c[0] for c in CURVES])
def test_converges_to_a_near_best_k(name, curve, good):
    chosen = simulate(lambda k: curve[k])
    steady = chosen[50:]
    share = sum(k in good for k in steady) / len(steady)
    assert share > 0.85, (name, share)
    mean_rate = sum(curve[k] for k in steady) / len(steady)
    assert mean_rate >= 0.9 * max(curve)


def test_useless_draft_costs_under_five_percent_over_a_long_job():
    curve = [100, 60, 50, 45, 40]
    chosen = simulate(lambda k: curve[k], rounds=2000)
    time_spent = sum(1 / curve[k] for k in chosen)
    assert time_spent <= 1.05 * len(chosen) / curve[0]


def test_follows_a_change_in_acceptance():
    state = {"round": 0}
    good, bad = [100, 150, 180, 190, 185], [100, 60, 50, 45, 40]

    def rate(k):
        state["round"] += 1
        return (good if state["round"] < 300 else bad)[k]

    chosen = simulate(rate, rounds=900)
    assert sum(k == 0 for k in chosen[-300:]) / 300 > 0.85
