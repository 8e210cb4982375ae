"""A reduced draft vocabulary: the target tokens the head can propose, chosen by frequency.

As SpecForge's `process_token_dict_to_mappings`: count the tokens the target emits in the training
data, keep the `size` most frequent (ties to the lower id), sort them by target id; draft id d is
target id used[d], stored as d2t[d] = used[d] - d, and t2d[t] says whether target token t is kept.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch


@dataclass
class DraftVocab:
    target_ids: torch.Tensor  # [draft_vocab] ascending target ids
    coverage: float  # share of the counted tokens the draft vocabulary contains

    @property
    def size(self) -> int:
        return len(self.target_ids)


def choose_vocab(counts: Counter, size: int, target_vocab_size: int, always: tuple[int, ...] = ()) -> DraftVocab:
    """The `size` most frequent target tokens of `counts` (padded with the lowest unseen ids when fewer
    were seen), plus the ids in `always` (e.g. EOS), which replace the rarest picks."""
    if size >= target_vocab_size:
        return DraftVocab(torch.arange(target_vocab_size), 1.0)
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    picked = [t for t in always if 0 <= t < target_vocab_size]
    picked += [t for t in ranked if t not in picked][: size - len(picked)]
    unseen = (t for t in range(target_vocab_size) if t not in counts and t not in picked)
    while len(picked) < size:
        picked.append(next(unseen))
    total = sum(counts.values())
    coverage = sum(counts[t] for t in picked) / total if total else 1.0
    return DraftVocab(torch.tensor(sorted(picked)), coverage)


def vocab_for(samples, target_vocab_size: int, *, prompts: bool = False, size: int | None = None,
              always: tuple[int, ...] = ()) -> DraftVocab:
    """The draft vocabulary for training samples (objects with `ids` and `prompt_len`): counted over what the
    target wrote (and the prompts too with `prompts`; never the first token, the BOS), `size` tokens or as
    many as hold DEFAULT_COVERAGE (97%) of the count. A head proposes what the target writes, so the target's
    own tokens are the ones to count: on the demo target its greedy continuations needed 256 tokens for 99%,
    the prompts and continuations together 2,304 (SpecForge counts the target's tokens under its loss mask the same way)."""
    counts = Counter(t for s in samples for t in s.ids[1 if prompts else s.prompt_len:])
    return choose_vocab(counts, size or size_for_coverage(counts, target_vocab_size), target_vocab_size, always=always)


# The share of the target's tokens the default draft vocabulary holds. Each draft row costs the head's LM head
# Hd multiply-adds per position in training and in every draft step: on SmolLM2 (Hd 576) the 6,400 rows that
# hold 99% of a 20-minute run's 223k tokens were half of a head step. On that data the 4,096 that hold 96.9%
# ran 15% more training steps in the same minutes, drafted no worse (1.99 against 1.89 tokens per forward at
# k=4, one run each; with every default on fresh data 1.91-1.92 against 99%'s 1.93) and cost 2.7-3.3 ms a
# draft step against 3.5-3.9 (docs/eagle.md). The demo and code targets' vocabularies stay at the 256-row
# minimum either way.
DEFAULT_COVERAGE = 0.97


def size_for_coverage(counts: Counter, target_vocab_size: int, coverage: float = DEFAULT_COVERAGE, multiple: int = 256,
                      cap: int = 32000) -> int:
    """The smallest draft vocabulary holding `coverage` of the counted tokens, rounded up to a multiple
    of `multiple`, at most `cap` (SpecForge's usual 32,000) and the target's vocabulary."""
    total, running, size = sum(counts.values()), 0, 0
    for _, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        if total == 0 or running >= coverage * total:
            break
        running += n
        size += 1
    size = -(-max(size, 1) // multiple) * multiple
    return min(size, cap, target_vocab_size)


def d2t_t2d(target_ids: torch.Tensor, target_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The maps as files store them: d2t [draft_vocab] int64 offsets, t2d [target_vocab] bool."""
    d2t = target_ids.long() - torch.arange(len(target_ids))
    t2d = torch.zeros(target_vocab_size, dtype=torch.bool)
    t2d[target_ids.long()] = True
    return d2t, t2d
