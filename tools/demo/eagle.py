"""The optional EAGLE-3 head (`--eagle`, `--eagle-only`): trained with batchspec.train_draft on prompts cut from
the train files, compared with the draft model on held-out prompts, and described in its own README section."""

from __future__ import annotations

import random
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from .corpus import read_text
from .prompts import file_prompts

EAGLE_START, EAGLE_END = "<!-- eagle:start -->", "<!-- eagle:end -->"


def build_eagle(args, root: Path, train_files: list[Path], out: Path) -> dict:
    """Train the demo target's EAGLE-3 head with `python -m batchspec.train_draft` (its own time budget,
    prompts cut from the TRAIN files as the held-out prompts are cut) and ship it in OUT/eagle."""
    import tempfile

    from batchspec.training.train import TrainDraftOptions, run

    tokenizer = PreTrainedTokenizerFast.from_pretrained(out / "target")
    prompts = [p for rel in train_files for p in file_prompts(read_text(root, rel), tokenizer, 20, 150)]
    random.Random(args.seed + 20).shuffle(prompts)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "train_prompts.parquet"
        pq.write_table(pa.table({"prompt": prompts}), source)
        options = TrainDraftOptions(target=str(out / "target"), prompts=str(source), out=str(Path(tmp) / "head"),
                                    minutes=args.eagle_minutes, draft_vocab_size=args.eagle_vocab, seed=args.seed,
                                    layers=args.eagle_layers,
                                    device="cpu", dtype="float32")
        summary = run(options)
        (out / "eagle").mkdir(exist_ok=True)
        for name in ("config.json", "model.safetensors", "train_summary.txt"):
            shutil.copy(Path(tmp) / "head" / name, out / "eagle" / name)
    print((out / "eagle" / "train_summary.txt").read_text(), flush=True)
    return {"summary": summary, "prompts": len(prompts), "heldout": compare_on_heldout(out, args.eagle_compare)}


@torch.inference_mode()
def compare_on_heldout(out: Path, n: int, new_tokens: int = 64) -> dict:
    """Greedy chain drafting replayed on the target's greedy continuations of the first n shipped held-out
    prompts, for the EAGLE head and the draft model alike: acceptance by position and tokens per forward."""
    import batchspec
    from batchspec.training.data import Sample
    from batchspec.training.evaluate import acceptance, head_matches, next_token_chains
    from batchspec.training.features import sequence_states
    from batchspec.eagle.formats import load_head

    tokenizer = PreTrainedTokenizerFast.from_pretrained(out / "target")
    target = AutoModelForCausalLM.from_pretrained(out / "target", dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(out / "draft", dtype=torch.float32).eval()
    head = load_head(out / "eagle", target)
    texts = [row["prompt"] for row in pq.read_table(out / "prompts.parquet").to_pylist()[:n]]
    results = batchspec.generate(texts, target=target, draft=draft, tokenizer=tokenizer, drafter="model", k=4,
                                 batch_size=16, max_new_tokens=new_tokens)
    samples = [Sample(tokenizer(t)["input_ids"] + r.completion_token_ids, len(tokenizer(t)["input_ids"]))
               for t, r in zip(texts, results)]
    states = sequence_states(target, [s.ids for s in samples], head.config.target_layer_ids)
    eagle = acceptance(head_matches(head, samples, states, 5), samples, k_max=5)
    draft_matches = []
    for s in samples:
        ids = torch.tensor([s.ids])
        draft_matches.append(next_token_chains(draft(input_ids=ids).logits[0, :-1].argmax(-1) == ids[0, 1:], 5))
    model = acceptance(draft_matches, samples, k_max=5)
    return {"prompts": len(samples), "new_tokens": new_tokens, "eagle": eagle, "draft": model}


def eagle_section(result: dict, command: str) -> str:
    s, cmp = result["summary"], result["heldout"]
    e, d = cmp["eagle"], cmp["draft"]
    c = s.config

    def row(name, a):
        return (f"| {name} | " + " | ".join(f"{v:.2f}" for v in a.cumulative) + " | "
                + " | ".join(f"{a.tokens_per_forward[k]:.2f}" for k in (2, 4)) + " |")

    return f"""{EAGLE_START}
## EAGLE-3 head (`eagle/`)

`eagle/` is an EAGLE-3 head for the target ({s.trained_parameters / 1e6:.2f}M trained parameters, fp32;
hidden {c['hidden_size']}, reads the target's hidden states {tuple(c['target_layer_ids'])}, draft vocabulary
{c['draft_vocab_size']} of {c['target_vocab_size']}) in the EAGLE / SpecForge layout (`config.json`,
`model.safetensors`; the target's embeddings are shared), trained by `python -m batchspec.train_draft`
with a budget of {result['minutes']:g} minutes on 2 CPU cores
({command}): the target continued {s.prompts_used} of {result['prompts']} prompts cut from the train files
({s.generated_tokens:,} tokens, greedy) in {s.generation_seconds / 60:.1f} min, its features took
{s.feature_seconds / 60:.1f} min, training {s.train_seconds / 60:.1f} min ({s.steps} steps of {s.batch_size}
sequences, {s.ttt_steps} unrolled draft steps), the evaluation {s.eval_seconds / 60:.1f} min:
{s.total_seconds / 60:.1f} min in all. `eagle/train_summary.txt` is its summary.

Greedy chain drafting replayed on the target's greedy continuations ({cmp['new_tokens']} tokens) of the
first {cmp['prompts']} held-out prompts (`prompts.parquet`), both drafters on the same text:

| drafter | accepted through draft 1 | 2 | 3 | 4 | 5 | tokens per target forward, k=2 | k=4 |
|---|---|---|---|---|---|---|---|
{row("EAGLE-3 head", e)}
{row("draft model", d)}

Tokens per forward count the prefill, as the engine does.
{EAGLE_END}
"""


def update_readme_eagle(out: Path, section: str) -> None:
    """Put the eagle section (and the table row) into OUT/README.md, replacing an earlier one."""
    path = out / "README.md"
    text = path.read_text()
    if EAGLE_START in text:
        text = text[: text.index(EAGLE_START)] + text[text.index(EAGLE_END) + len(EAGLE_END) + 1:]
    row = "| `eagle/` | EAGLE-3 draft head for the target (see [below](#eagle-3-head-eagle)) |\n"
    if row not in text:
        anchor = text.index("| `prompts.parquet`")
        text = text[:anchor] + row + text[anchor:]
    path.write_text(text.rstrip("\n") + "\n\n" + section)


def run_eagle(args, argv, root: Path, train_files: list[Path]) -> None:
    """Train the head on the target in OUT and put its section into OUT/README.md (`--eagle`, `--eagle-only`)."""
    result = build_eagle(args, root, train_files, args.out)
    result["minutes"] = args.eagle_minutes
    command = "`python tools/build_demo.py " + " ".join(sys.argv[1:] if argv is None else argv) + "`"
    update_readme_eagle(args.out, eagle_section(result, command))


def finish_eagle(args, argv, root: Path, train_files: list[Path], old_readme: str) -> None:
    """After a full build: train the head (`--eagle`), or keep the head of the reused target and its README
    section, or remove a head that was trained for an earlier target."""
    out = args.out
    if args.eagle:
        run_eagle(args, argv, root, train_files)
    elif (out / "eagle").is_dir() and args.reuse_target and EAGLE_START in old_readme:  # the head still fits
        update_readme_eagle(out, old_readme[old_readme.index(EAGLE_START): old_readme.index(EAGLE_END)] + EAGLE_END + "\n")
    elif (out / "eagle").is_dir():  # a head for an earlier target: stale
        shutil.rmtree(out / "eagle")
