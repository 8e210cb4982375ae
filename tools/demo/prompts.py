"""Prompts: def/class prefixes cut from the held-out files (shipped), and the target's greedy continuations of
prompts cut the same way from the train files (the draft's second distillation stage)."""

from __future__ import annotations

import ast
import random
import textwrap
from pathlib import Path

from .corpus import read_text


def file_prompts(text: str, tokenizer, min_tokens: int, max_tokens: int, body_lines: int = 3) -> list[str]:
    """Prefixes of each def/class in `text`: decorators + header + the first body lines, dedented.

    Only blocks with at least two more lines after the prefix qualify (so there is something to
    continue). The prompt ends at the end of a line, without the newline: a trailing newline would
    be tokenized apart from the next line's indentation, unlike anything seen in training.
    """
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    lines = text.splitlines()
    nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    prompts = []
    for node in sorted(nodes, key=lambda n: n.lineno):
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
        body_start = node.body[0].lineno
        for n_body in range(body_lines, 0, -1):
            end = body_start - 1 + n_body  # exclusive index into lines
            if node.end_lineno < end + 2:
                continue
            prompt = textwrap.dedent("\n".join(lines[start - 1 : end])).rstrip()
            if min_tokens <= len(tokenizer(prompt)["input_ids"]) <= max_tokens:
                prompts.append(prompt)
                break
    return prompts


def train_continuations(root: Path, train: list[Path], tokenizer, target, draft, *, n: int, new_tokens: int,
                        seed: int) -> list[list[int]]:
    """`<s>` + prompt + the target's greedy continuation, for n prompts cut from the TRAIN files the same
    way as the held-out prompts: the text the target writes when the benchmark runs, on which the
    draft is then distilled (it learns where the target goes, not only where the corpus goes).

    Generated with batchspec itself, drafting with the draft as it is so far: greedy output is exact.
    """
    import batchspec  # the tool drives the package it ships assets for

    candidates = [p for rel in train for p in file_prompts(read_text(root, rel), tokenizer, 20, 150)]
    rng = random.Random(seed)
    rng.shuffle(candidates)
    prompts = candidates[:n]
    results = batchspec.generate(prompts, target=target, draft=draft, tokenizer=tokenizer, drafter="model", k=3,
                                 batch_size=16, max_new_tokens=new_tokens, adaptive=False)
    return [tokenizer(p)["input_ids"] + r.completion_token_ids for p, r in zip(prompts, results)]


def build_prompts(root: Path, heldout: list[Path], tokenizer, n: int, min_tokens: int, max_tokens: int
                  ) -> list[dict]:
    """`n` prompts spread evenly over all candidates of the held-out files (in file, then line order)."""
    candidates, seen = [], set()
    for rel in heldout:
        for prompt in file_prompts(read_text(root, rel), tokenizer, min_tokens, max_tokens):
            if prompt not in seen:
                seen.add(prompt)
                candidates.append((prompt, rel.as_posix()))
    picks = [candidates[i * len(candidates) // n] for i in range(min(n, len(candidates)))]
    return [{"id": f"heldout-{i:04d}", "prompt": p, "source_file": f} for i, (p, f) in enumerate(picks)]
