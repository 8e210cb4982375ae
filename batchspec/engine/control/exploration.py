"""Exploration's drafts: which rows verify a first draft while a job's acceptance is still a prior, or while a
draft model's evidence may still say that drafting pays (packed_choice.py decides when and within what budget).
A drafter with forwards (a draft model, an EAGLE head) only: a lookup's rows explore by proposing, their
proposals judged by the rows' next tokens (hindsight.py), and verify nothing."""

from __future__ import annotations

import itertools

from .row_drafts import Prices


def explore(gains: list[list[float]], prices: Prices, base_tokens: int, drafted_before: list[bool] | None = None,
            lags: list[int] | None = None, wide: bool = True) -> list[int]:
    """A round's drafts while the job's acceptance is a prior: one draft on rows that can draft (gains[i] not
    empty), whether or not the choice drafted them (a few unlucky first verdicts must not end the learning: the
    demo pair's sampled drafts stopped at 1 of 3 accepted): the rows that drafted before (drafted_before[i]), at
    most an eighth of the rows new, each group the least behind first (lags[i]: the tokens row i's draft cache
    lacks, which its first draft feeds: a new row's whole sequence, a fed row's tokens since it last drafted),
    and of those as many as buy the most first drafts a second (ties: more), each row's lag priced at the
    drafting forward's price of a token (`Prices.fed`): a drafting forward costs nearly as much for one row as
    for all, and one row a round took 130 rounds to learn (p512, batch 8, T = 0.7: 0.97-1.02x drafter none
    where fixed k=2 ran 1.11x), but rows that last drafted 20 rounds before feed 20 tokens each (SmolLM2-135M
    with 6 of its layers: exploring with them unpriced spent 4% of the rounds' price against 2%, 0.98x drafter
    none). Not `wide` (a probe), an eighth of the rows in all."""
    fed = drafted_before if drafted_before is not None else [False] * len(gains)
    lag = lags if lags is not None else [0] * len(gains)
    chosen = sorted((i for i, g in enumerate(gains) if g), key=lambda i: (not fed[i], lag[i], -gains[i][0]))
    plain = prices.seconds(base_tokens, 0, 0)
    n = max(1, len(gains) // 8)  # an eighth
    chosen = ([i for i in chosen if fed[i]] + [i for i in chosen if not fed[i]][:n])[: None if wide else n]
    feeds = [0, *itertools.accumulate(lag[i] for i in chosen)]
    rows = max(range(1, len(chosen) + 1), default=1, key=lambda r: (
        r / max(prices.seconds(base_tokens + r, 1, r) + prices.fed(feeds[r]) - plain, 1e-12), r))
    keep = set(chosen[:rows])
    return [1 if i in keep else 0 for i in range(len(gains))]
