"""Self-distillation data: the target's own continuations of the prompts, kept as token ids on disk with
the target's hidden states of every position (recorded by the forwards that wrote them: record.py).

The head must learn where the TARGET goes, not where the corpus goes, so every training sequence is a
prompt followed by what the target itself wrote (greedy, or sampled at a temperature). Continuations
come from batchspec's generator (batched, exact: greedy output equals HF `generate`), in chunks that are
each written atomically, so a killed run resumes where it stopped and a time budget stops generation
where its share ends. Held-out prompts always get GREEDY continuations: acceptance is measured against them.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..api import build_generator, checked_request
from ..engine.model.models import load_models
from ..util.files import atomic_write
from .record import FeatureRecorder, match


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


PROMPT_ORDERS = ("shuffled", "file")  # split_prompts' orders; train_draft's --prompt-order


def split_prompts(prompts: list[list[int]], heldout_fraction: float, max_heldout: int, *, order: str = "file",
                  seed: int = 0) -> Prompts:
    """The source's prompts as (index, token ids) pairs: the held-out ones, and the training ones in the order
    they are continued (an empty list marks a row that gave no prompt). `file`: every round(1/fraction)-th
    prompt (at most max_heldout, at least one) held out, the rest in the source's order. `shuffled`: as many
    held out, evenly spread over the usable prompts (the same for every seed, so runs with different seeds
    are scored on the same prompts), the rest shuffled by `seed`. A budget usually stops generation after
    its first few chunks, and a source written topic by topic (the shipped instructions: 87 topics, then
    240) would otherwise give the head, and the held-out prompts that score it, only its first topics."""
    if order not in PROMPT_ORDERS:
        raise ValueError(f"prompt order {order!r}: choose shuffled or file")
    indexed = list(enumerate(prompts))
    held: list[tuple[int, list[int]]] = []
    if heldout_fraction > 0 and len(prompts) >= 2:
        every = max(2, round(1 / heldout_fraction))
        if order == "file":
            held = [p for p in indexed if p[0] % every == every - 1][:max_heldout] or [indexed[-1]]
        else:
            usable = [p for p in indexed if p[1]]
            count = min(max_heldout, len(usable) // every) or min(1, len(usable))
            held = [usable[(2 * j + 1) * len(usable) // (2 * count)] for j in range(count)]
    held_ids = {i for i, _ in held}
    train = [p for p in indexed if p[0] not in held_ids]
    if order == "shuffled":
        random.Random(seed).shuffle(train)
    return Prompts(train, held)


def continue_prompts(target, tokenizer, prompts: list[tuple[int, list[int]]], *, max_new_tokens: int,
                     temperature: float, seed: int, batch_size: int, layers: tuple[int, ...] | None = None,
                     deadline: float = float("inf"), keep: int = 0) -> tuple[list[Sample], list[torch.Tensor] | None]:
    """The target's continuations of `prompts` ((index, token ids) pairs), written by plain decoding (at
    batch 64 on 2 cores it outran ngram drafts: 180 against 132 tokens/s on SmolLM2; train_draft uses 128), and with `layers`
    the target's hidden states there of every position but the last, taken from the forwards that wrote
    them (record.py): [len(ids) - 1, len(layers) * Ht] per sample. Past `deadline` (time.time()), once
    `keep` rows have finished, the rows still running are cut short and kept as far as they got (the time
    spent on them is training signal too). Request ids are the
    indices, so a sampled continuation is the same whichever chunk it was generated in (coupled sampling)."""
    models = load_models(target, tokenizer=tokenizer)
    recorder = FeatureRecorder(layers) if layers else None
    longest = max(len(ids) for _, ids in prompts)
    generator = build_generator(models, drafter=recorder or "none", k=0, batch_size=batch_size,
                                max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, adaptive=False,
                                max_seq_len=longest + max_new_tokens, compile=False if recorder else "auto")
    results, cut = {}, False
    for result in generator.run(checked_request(str(i), ids) for i, ids in prompts):
        results[result.id] = result  # after the cut: the rows its round had finished, then run() ends
        if not cut and time.time() > deadline and len(results) >= keep:
            results.update((late.id, late) for late in generator.cut_short())
            cut = True
    samples, states = [], []
    for i, prompt_ids in prompts:
        result = results.get(str(i))
        if result is None or result.finish_reason == "error" or not result.completion_token_ids:
            continue
        samples.append(Sample(prompt_ids + list(result.completion_token_ids), len(prompt_ids)))
        if recorder is not None:
            states.append(match(recorder, prompt_ids, result.completion_token_ids))
    return samples, states if recorder is not None else None


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

    def save_states(self, name: str, states: list[torch.Tensor] | None) -> None:
        if states is not None:
            atomic_write(self.folder / f"{name}.pt", lambda tmp: torch.save(states, tmp))

    def load_states(self, name: str) -> list[torch.Tensor] | None:
        path = self.folder / f"{name}.pt"
        return torch.load(path, weights_only=True) if path.exists() else None

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
    # The target's recorded states per sample ([len(ids) - 1, F], record.py); None where a chunk written by an
    # earlier version has none (train.py then computes them with a forward over each sequence).
    train_states: list[torch.Tensor] | None = None
    heldout_states: list[torch.Tensor] | None = None


def generate_data(target, tokenizer, prompts: Prompts, store: SampleStore, *, max_new_tokens: int,
                  eval_new_tokens: int, temperature: float, seed: int, batch_size: int, chunk: int,
                  deadline: float, layers: tuple[int, ...] | None = None, progress=None,
                  writer=None) -> GeneratedData:
    """Held-out continuations first (greedy), then training ones chunk by chunk until all prompts are done
    or `deadline` (time.time()) passes: a chunk stops taking finished rows there (the first chunk keeps at
    least a batch's worth); whatever is on disk is reused. With `layers`, each chunk's recorded states are
    stored beside it (NAME.pt, written before NAME.json, which marks the chunk done). writer: the model that
    writes the training continuations (the target in another dtype; default the target)."""
    done = store.read("done.json")
    heldout = store.read("heldout.json")
    seconds = sum(c.get("seconds", 0.0) for c in store.chunks()) + (heldout or {}).get("seconds", 0.0)
    if heldout is None:
        t0 = time.time()
        samples, states = continue_prompts(target, tokenizer, prompts.heldout, max_new_tokens=eval_new_tokens,
                                           temperature=0.0, seed=seed, batch_size=batch_size, layers=layers)
        heldout = store.pack(samples, seconds=time.time() - t0)
        store.save_states("heldout", states)
        store.write("heldout.json", heldout)
        seconds += heldout["seconds"]
    chunks = store.chunks()
    position = sum(c["prompts"] for c in chunks)
    while done is None and position < len(prompts.train) and (time.time() < deadline or not chunks):
        t0 = time.time()
        part = prompts.train[position: position + chunk]
        samples, states = continue_prompts(writer if writer is not None else target, tokenizer, part,
                                           max_new_tokens=max_new_tokens,
                                           temperature=temperature, seed=seed, batch_size=batch_size, layers=layers,
                                           deadline=deadline, keep=batch_size if not chunks else 0)
        payload = store.pack(samples, prompts=len(part), seconds=time.time() - t0)
        name = f"train-{len(chunks):05d}"
        store.save_states(name, states)
        store.write(f"{name}.json", payload)
        chunks.append(payload)
        position += len(part)
        seconds += payload["seconds"]
        if progress is not None:
            progress(len(samples), sum(s.new_tokens for s in samples))
    if done is None:
        store.write("done.json", {"prompts_used": position})
    train = [s for c in chunks for s in store.unpack(c)]
    parts = [store.load_states(f"train-{i:05d}") for i in range(len(chunks))]
    held_states = store.load_states("heldout")
    return GeneratedData(train, store.unpack(heldout), position, len(prompts.train), seconds,
                         None if any(p is None for p in parts) else [t for p in parts for t in p], held_states)
