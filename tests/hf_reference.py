"""Hugging Face `generate` as the reference for greedy parity on real models, with an independent llguidance
logits processor (batchspec.bench_grammar) for constrained rows."""

from __future__ import annotations

import torch
from transformers import LogitsProcessorList

from batchspec.bench.grammar import GrammarLogitsProcessor
from batchspec.types import Constraint


def hf_generate(model, tokenizer, prompt: str, max_new_tokens: int, constraint: Constraint | None = None) -> list[int]:
    """The greedy completion's token ids."""
    enc = tokenizer(prompt, return_tensors="pt")
    processors = None
    if constraint is not None:
        processors = LogitsProcessorList([GrammarLogitsProcessor(
            tokenizer, [constraint], vocab_size=model.get_output_embeddings().weight.shape[0],
            eos_ids=[model.generation_config.eos_token_id], prompt_len=enc["input_ids"].shape[1])])
    with torch.no_grad():
        out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens, logits_processor=processors)
    return out[0, enc["input_ids"].shape[1]:].tolist()
