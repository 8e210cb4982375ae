"""Self-distillation data: the target's own continuations of the prompts, kept as token ids on disk.

The head must learn where the TARGET goes, not where the corpus goes, so every training sequence is a
prompt followed by what the target itself wrote (greedy, or sampled at a temperature). Continuations
come from `batchspec.generate` (batched, exact: greedy output equals HF `generate`), in chunks that are
each written atomically, so a killed run resumes where it stopped and a time budget can cut generation
short. Held-out prompts always get GREEDY continuations: acceptance is measured against them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from .formats import atomic_write


@dataclass
class Sample:
    ids: list[int]  # prompt tokens (as `tokenizer(prompt)` gives them) + the target's continuation
    prompt_len: int

    @property
    def new_tokens(self) -> int:
        return len(self.ids) - self.prompt_len


@dataclass
class Prompts:
    train: list[tuple[int, list[int]]]  # (index in the source, token ids as tokenizer(prompt) gives them)
    heldout: list[tuple[int, list[int]]]


def split_prompts(prompts: list[list[int]], heldout_fraction: float, max_heldout: int) -> Prompts:
    """Every round(1/fraction)-th prompt (at most max_heldout of them, at least one) is held out."""
    indexed = list(enumerate(prompts))
    if heldout_fraction <= 0 or len(prompts) < 2:
        return Prompts(indexed, [])
    every = max(2, round(1 / heldout_fraction))
    held = [p for p in indexed if p[0] % every == every - 1][:max_heldout] or [indexed[-1]]
    held_ids = {i for i, _ in held}
    return Prompts([p for p in indexed if p[0] not in held_ids], held)


def continue_prompts(target, tokenizer, prompts: list[tuple[int, list[int]]], *, max_new_tokens: int,
                     temperature: float, seed: int, batch_size: int) -> list[Sample]:
    """The target's continuations of `prompts` ((index, token ids) pairs); request ids are the indices, so
    a sampled continuation is the same whichever chunk it was generated in (coupled sampling)."""
    import batchspec  # the public API; imported here because batchspec imports this package's users

    results = batchspec.generate(
        [ids for _, ids in prompts], ids=[str(i) for i, _ in prompts], target=target, tokenizer=tokenizer,
        drafter="ngram", k=4, batch_size=batch_size, max_new_tokens=max_new_tokens, temperature=temperature,
        seed=seed,
    )
    samples = []
    for (_, prompt_ids), result in zip(prompts, results):
        if result.finish_reason == "error" or not result.completion_token_ids:
            continue
        samples.append(Sample(prompt_ids + list(result.completion_token_ids), len(prompt_ids)))
    return samples


class SampleStore:
    """Generated samples under `folder`: heldout.json, train-NNNNN.json chunks, done.json."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def write(self, name: str, payload: dict) -> None:
        atomic_write(self.folder / name, lambda tmp: Path(tmp).write_text(json.dumps(payload)))

    def read(self, name: str) -> dict | None:
        path = self.folder / name
        return json.loads(path.read_text()) if path.exists() else None

    def chunks(self) -> list[dict]:
        return [json.loads(p.read_text()) for p in sorted(self.folder.glob("train-*.json"))]

    @staticmethod
    def pack(samples: list[Sample], **extra) -> dict:
        return {"samples": [[s.prompt_len, s.ids] for s in samples], **extra}

    @staticmethod
    def unpack(payload: dict) -> list[Sample]:
        return [Sample(ids, n) for n, ids in payload["samples"]]


@dataclass
class GeneratedData:
    train: list[Sample]
    heldout: list[Sample]
    prompts_used: int  # training prompts continued
    prompts_total: int
    seconds: float  # generation time, over all (resumed) sessions


def generate_data(target, tokenizer, prompts: Prompts, store: SampleStore, *, max_new_tokens: int,
                  eval_new_tokens: int, temperature: float, seed: int, batch_size: int, chunk: int,
                  deadline: float, progress=None) -> GeneratedData:
    """Held-out continuations first (greedy), then training ones chunk by chunk until all prompts are done
    or the next chunk would end after `deadline` (time.time()); whatever is on disk is reused."""
    done = store.read("done.json")
    heldout = store.read("heldout.json")
    seconds = sum(c.get("seconds", 0.0) for c in store.chunks()) + (heldout or {}).get("seconds", 0.0)
    if heldout is None:
        t0 = time.time()
        samples = continue_prompts(target, tokenizer, prompts.heldout, max_new_tokens=eval_new_tokens,
                                   temperature=0.0, seed=seed, batch_size=batch_size)
        heldout = store.pack(samples, seconds=time.time() - t0)
        store.write("heldout.json", heldout)
        seconds += heldout["seconds"]
    chunks = store.chunks()
    position = sum(c["prompts"] for c in chunks)
    last = 0.0  # seconds the latest chunk took: start another only if it should end before the deadline
    while done is None and position < len(prompts.train) and (time.time() + last < deadline or not chunks):
        t0 = time.time()
        part = prompts.train[position: position + chunk]
        samples = continue_prompts(target, tokenizer, part, max_new_tokens=max_new_tokens,
                                   temperature=temperature, seed=seed, batch_size=batch_size)
        payload = store.pack(samples, prompts=len(part), seconds=time.time() - t0)
        store.write(f"train-{len(chunks):05d}.json", payload)
        chunks.append(payload)
        position += len(part)
        seconds += payload["seconds"]
        last = payload["seconds"]
        if progress is not None:
            progress(len(part), sum(s.new_tokens for s in store.unpack(payload)))
    if done is None:
        store.write("done.json", {"prompts_used": position})
    train = [s for c in chunks for s in store.unpack(c)]
    return GeneratedData(train, store.unpack(heldout), position, len(prompts.train), seconds)
