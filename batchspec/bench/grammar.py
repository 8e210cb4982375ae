"""Structured output in the benchmark: Hugging Face `generate` under the same constraints (a logits processor
on llguidance's own matcher and bitmask calls, one matcher per row of a left-padded batch), and how many
outputs parse against their schema."""

from __future__ import annotations

import json

import torch

from ..engine.grammar.grammar import Grammars, apply_masks
from ..engine.types import Constraint


class GrammarLogitsProcessor:
    """A transformers LogitsProcessor for a batch of rows, each with its constraint (None: free). The masks
    are batchspec's own (engine/grammar/grammar.py: every EOS id allowed only where the grammar accepts), so both
    sides decide under the same constraint. prompt_len: the padded prompt width of the batch."""

    def __init__(self, tokenizer, constraints: list[Constraint | None], *, vocab_size: int, eos_ids: list[int],
                 prompt_len: int):
        self.grammars = Grammars(tokenizer, vocab_size=vocab_size, eos_ids=eos_ids)
        self.slots = [i for i, c in enumerate(constraints) if c is not None]
        for i in self.slots:
            self.grammars.seat(i, constraints[i])
        self.eos_ids, self.prompt_len = set(eos_ids), prompt_len
        self.ended: set[int] = set()

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[1] > self.prompt_len:
            last = input_ids[:, -1].tolist()
            for i in self.slots:
                if i not in self.ended:  # a finished row is padded from here on: its grammar is done
                    self.grammars.advance(i, [last[i]])
                    if last[i] in self.eos_ids:
                        self.ended.add(i)
        live = [i for i in self.slots if i not in self.ended]
        if live:
            masks = self.grammars.masks(live, [[] for _ in live], 1)[:, 0]
            at = torch.tensor(live, device=scores.device)
            rows = scores[at]
            apply_masks(rows, masks.to(scores.device))
            scores = scores.clone()
            scores[at] = rows
        return scores


def schema_validity(texts: list[str], constraints: list[Constraint | None]) -> tuple[int, int]:
    """(outputs that parse as JSON and match their schema, constrained JSON outputs checked). Needs jsonschema
    for the schema check (the test extras); without it, parsing as a JSON object is what is counted."""
    try:
        import jsonschema  # deferred: optional (the test extras)
    except ImportError:
        jsonschema = None
    valid = checked = 0
    for text, constraint in zip(texts, constraints):
        if constraint is None or constraint.kind not in ("json_schema", "json_object"):
            continue
        checked += 1
        try:
            value = json.loads(text)
            if constraint.kind == "json_object":
                ok = isinstance(value, dict)
            elif jsonschema is not None:
                jsonschema.validate(value, json.loads(constraint.value))
                ok = True
            else:
                ok = True
        except Exception:  # json's and jsonschema's errors alike
            ok = False
        valid += ok
    return valid, checked
