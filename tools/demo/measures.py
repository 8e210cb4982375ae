"""Measurements of the built pair: greedy agreement of draft and target, and forward timings."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache


@dataclass
class Agreement:
    rate: float  # fraction of positions where the draft's greedy token equals the target's
    positions: int
    tokens_per_verify: dict[int, float]  # greedy speculative decoding with k drafted tokens: tokens per target pass


def tokens_per_verify(matches: list[bool], k: int) -> float:
    """Tokens emitted per target forward when the draft proposes k tokens and the target accepts a prefix.

    With greedy decoding on both sides the draft's proposals follow the target's own tokens as long
    as they agree, so the accepted run at position i is the run of consecutive matches from i (at
    most k), and each target pass adds one token of its own.
    """
    pos, passes = 0, 0
    while pos < len(matches):
        run = 0
        while run < k and pos + run < len(matches) and matches[pos + run]:
            run += 1
        pos += run + 1
        passes += 1
    return len(matches) / passes


@torch.inference_mode()
def greedy_agreement(target, draft, tokenizer, prompts: list[str], max_new_tokens: int) -> Agreement:
    """Target generates greedily; compare the draft's argmax given the same prefix at every new position."""
    all_matches = []
    per_prompt = []
    for prompt in prompts:
        enc = tokenizer(prompt, return_tensors="pt")
        out = target.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens)
        new = out[0, enc["input_ids"].shape[1]:].tolist()
        if tokenizer.eos_token_id in new:
            new = new[: new.index(tokenizer.eos_token_id) + 1]
        p = enc["input_ids"].shape[1]
        draft_pred = draft(input_ids=out[:, : p + len(new) - 1]).logits[0, p - 1 :].argmax(-1).tolist()
        matches = [a == b for a, b in zip(draft_pred, new)]
        all_matches += matches
        per_prompt.append(matches)
    rate = sum(all_matches) / len(all_matches)
    tpv = {k: statistics.mean(tokens_per_verify(m, k) for m in per_prompt) for k in (2, 4)}
    return Agreement(rate, len(all_matches), tpv)


@torch.inference_mode()
def forward_ms(model, context: torch.Tensor, batch: int, new_tokens: int, reps: int = 20) -> float:
    """Median wall time (ms) of one cached forward of `new_tokens` tokens after a `context`-long prefix."""
    model.eval()
    ctx = context[None].expand(batch, -1)
    from batchspec.engine.model.model_calls import cache_argument

    cache = DynamicCache(config=model.config)
    name = cache_argument(model)
    model(input_ids=ctx, **{name: cache}, use_cache=True)
    x = context[:new_tokens][None].expand(batch, -1)
    times = []
    for i in range(reps + 3):
        t = time.perf_counter()
        model(input_ids=x, **{name: cache}, use_cache=True)
        times.append(time.perf_counter() - t)
        cache.crop(-new_tokens)  # drop the new tokens again
    return 1000 * statistics.median(times[3:])

