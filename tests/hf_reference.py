"""Hugging Face `generate` as the reference for greedy parity on real models, with an independent llguidance
logits processor (batchspec.bench_grammar) for constrained rows.

A real model's references take minutes on 2 cores (Gemma-3-270M: eight prompts of up to 2,000 tokens), so
they are kept beside the converted model, under what they depend on: the model's files (names, sizes, times),
the prompt, the token count, the constraint and the versions of transformers, torch and llguidance. Any change
to one of those computes them again; deleting the model's folder deletes them."""

from __future__ import annotations

import hashlib
import json
import os
from importlib.metadata import version
from pathlib import Path

import torch
import transformers
from transformers import LogitsProcessorList

from batchspec.bench import grammar
from batchspec.bench.grammar import GrammarLogitsProcessor
from batchspec.engine.types import Constraint

FOLDER = "hf-references"


def hf_generate(model, tokenizer, prompt: str, max_new_tokens: int, constraint: Constraint | None = None,
                model_dir: Path | None = None) -> list[int]:
    """The greedy completion's token ids; read from, or written to, `model_dir`/hf-references when given."""
    path = None
    if model_dir is not None:
        path = Path(model_dir) / FOLDER / f"{reference_key(model_dir, prompt, max_new_tokens, constraint)}.json"
        if path.exists():
            return json.loads(path.read_text())["tokens"]
    tokens = _generate(model, tokenizer, prompt, max_new_tokens, constraint)
    if path is not None:
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"tokens": tokens}))
        tmp.replace(path)  # atomic: the other worker may write the same reference
    return tokens


def reference_key(model_dir: Path, prompt: str, max_new_tokens: int, constraint: Constraint | None) -> str:
    """What a reference depends on, hashed; a constrained one also on the logits processor's source."""
    files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in Path(model_dir).iterdir() if p.is_file())
    parts = [files, prompt, max_new_tokens, transformers.__version__, torch.__version__]
    if constraint is not None:
        parts += [constraint.kind, constraint.value, version("llguidance"), Path(grammar.__file__).read_text()]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


def _generate(model, tokenizer, prompt: str, max_new_tokens: int, constraint: Constraint | None) -> list[int]:
    enc = tokenizer(prompt, return_tensors="pt")
    processors = None
    if constraint is not None:
        processors = LogitsProcessorList([GrammarLogitsProcessor(
            tokenizer, [constraint], vocab_size=model.get_output_embeddings().weight.shape[0],
            eos_ids=[model.generation_config.eos_token_id], prompt_len=enc["input_ids"].shape[1])])
    with torch.no_grad():
        out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens, logits_processor=processors)
    return out[0, enc["input_ids"].shape[1]:].tolist()
