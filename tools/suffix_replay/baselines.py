"""The re-implemented `ngram` and `prompt_lookup` checked against the engine's drafters, position by position."""

from __future__ import annotations

import sys

from .drafters import NGramSim, PromptLookupSim
from .workload import Row


def check_baselines(rows: list[Row], k: int, count: int) -> None:
    """The re-implemented ngram / prompt_lookup against the engine's drafters, every position of the
    first `count` rows."""
    import torch

    from batchspec.engine.drafters import NGramDrafter, PromptLookupDrafter
    from batchspec.engine.round import Choice, Plan, RoundBuffers

    cpu = torch.device("cpu")
    buffers = RoundBuffers(1, k, 32, cpu, noise=False, probs=False, trees=False)
    for name, real, sim in (("ngram", NGramDrafter(), NGramSim(k)), ("prompt_lookup", PromptLookupDrafter(),
                                                                      PromptLookupSim(k))):
        checked = 0
        for r, row in enumerate(rows[:count]):
            seq = row.prompt_ids + row.completion[:1]
            real.admit([0], [list(seq)])
            sim.start(r, list(seq))
            for token in row.completion[1:]:
                plan = Plan(rows=[0], rows_t=torch.tensor([0]), span=slice(0, 1), lengths=[len(seq)],
                            lengths_t=torch.tensor([len(seq)]), running=[0], room=[k], limits=[k],
                            buffers=buffers)
                draft = real.propose(plan, Choice([k]))
                want = draft.tokens[0, : int(draft.num_tokens[0])].tolist()
                got = sim.propose(r, k)[0]
                if got != want:
                    raise SystemExit(f"{name}: the simulation proposes {got}, the drafter {want} (row {row.id})")
                seq.append(token)
                real.extend([0], [[token]], [0])
                sim.extend(r, [token])
                checked += 1
            real.release([0])
            sim.finish(r)
        print(f"check: {name} simulation == engine drafter on {checked} positions of {count} rows", file=sys.stderr)
