"""Build batchspec's offline demo pair: a small trained Llama target, a distilled draft and held-out prompts.

Everything comes from the running interpreter's standard library, so no download is needed:

1. corpus: a fixed, sorted list of pure-Python stdlib modules, split by file into train and held-out;
2. tokenizer: byte-level BPE (`<s>` BOS id 0, prepended; `</s>` EOS id 1; `<pad>` id 2) trained on
   the train files only;
3. models: a Llama target trained from scratch on next-token prediction, then a much smaller Llama
   draft distilled from it (KL to the target's next-token distribution) so that their greedy tokens agree;
4. prompts: code prefixes (a def/class header plus its first lines) taken from the held-out files;
5. measurements on held-out data (loss, greedy agreement, forward timings), printed and written to
   the README next to the assets.

Usage (about 40 minutes on 2 CPU cores)::

    python tools/build_demo.py --out batchspec/assets/demo

Fixed seeds, fp32, CPU, two torch threads; reruns on the same interpreter and machine give the same files.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import ast
import math
import platform
import random
import shutil
import statistics
import sys
import sysconfig
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (AutoModelForCausalLM, DynamicCache, LlamaConfig, PreTrainedModel, PreTrainedTokenizerFast,
                          Qwen2Config)

BOS, EOS, PAD = "<s>", "</s>", "<pad>"  # ids 0, 1, 2
# Stdlib folders left out: tests, GUI/tools, deprecated copies, codec tables and generated data.
EXCLUDED_DIRS = {
    "test", "tests", "idlelib", "lib2to3", "site-packages", "encodings", "pydoc_data", "ensurepip",
    "turtledemo", "distutils", "tkinter", "__phello__", "lib-dynload", "__pycache__", "msilib",
}
MIN_FILE_BYTES, MAX_FILE_BYTES = 1_000, 48_000  # skip stubs and the few huge modules (~4 MB in all)
HELDOUT_EVERY = 10  # every 10th file of the sorted list is held out
# The demo tokenizer's chat template (so chat jobs run offline, jobs/demo_chat.yaml): the models only
# know Python, so a conversation is written as Python comments and the answer opens "# assistant:".
CHAT_TEMPLATE = """{{- bos_token -}}
{%- for message in messages -%}
# {{ message['role'] }}: {{ message['content'] | replace('\\n', '\\n# ') }}
{% endfor -%}
{%- if add_generation_prompt -%}
# assistant:
{% endif -%}
"""


# ----------------------------------------------------------------------------------------------- corpus

def stdlib_files(root: Path) -> list[Path]:
    """Sorted stdlib-relative paths of the pure-Python modules that make up the corpus."""
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in EXCLUDED_DIRS or part.startswith("config-") for part in rel.parts[:-1]):
            continue
        if rel.name.startswith(("_sysconfigdata", "test_")):
            continue
        if MIN_FILE_BYTES <= path.stat().st_size <= MAX_FILE_BYTES:
            files.append(rel)
    return files


def split_files(files: list[Path]) -> tuple[list[Path], list[Path]]:
    """(train, held-out): file i is held out when i % HELDOUT_EVERY == HELDOUT_EVERY - 1."""
    heldout = [f for i, f in enumerate(files) if i % HELDOUT_EVERY == HELDOUT_EVERY - 1]
    train = [f for i, f in enumerate(files) if i % HELDOUT_EVERY != HELDOUT_EVERY - 1]
    return train, heldout


def read_text(root: Path, rel: Path) -> str:
    return (root / rel).read_text(encoding="utf-8", errors="replace")


# -------------------------------------------------------------------------------------------- tokenizer

def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE on `texts`; `tokenizer(text)` prepends `<s>`, decoding round-trips any text."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 0)]
    )
    assert [tok.token_to_id(t) for t in (BOS, EOS, PAD)] == [0, 1, 2]
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD)


def token_stream(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    """All texts as one 1-D tensor, each file as `<s> ... </s>`."""
    ids: list[int] = []
    for enc in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids += [tokenizer.bos_token_id, *enc, tokenizer.eos_token_id]
    return torch.tensor(ids, dtype=torch.long)


# ----------------------------------------------------------------------------------------------- models

def model_config(arch: str, vocab_size: int, hidden: int, layers: int, intermediate: int, heads: int, kv_heads: int,
                 max_positions: int):
    """A Llama (the shipped demo) or Qwen2-shaped config (`--arch qwen2`: a second architecture to try tools on)."""
    config_class = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
    return config_class(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
        tie_word_embeddings=True, bos_token_id=0, eos_token_id=1, pad_token_id=2,
    )


def new_model(config, seed: int) -> PreTrainedModel:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(torch.float32)
    model.generation_config.bos_token_id = 0
    model.generation_config.eos_token_id = 1
    model.generation_config.pad_token_id = 2
    return model


def n_params(model: torch.nn.Module) -> int:
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def random_windows(stream: torch.Tensor, gen: torch.Generator, batch: int, seq_len: int, bos: int) -> torch.Tensor:
    """`batch` rows of `<s>` + `seq_len - 1` consecutive tokens starting at random offsets of `stream`."""
    starts = torch.randint(0, len(stream) - seq_len, (batch,), generator=gen)
    rows = torch.stack([stream[s : s + seq_len - 1] for s in starts.tolist()])
    return torch.cat([torch.full((batch, 1), bos, dtype=torch.long), rows], dim=1)


def fixed_windows(stream: torch.Tensor, seq_len: int, bos: int, limit: int | None = None) -> torch.Tensor:
    """Non-overlapping `<s>`-prefixed windows covering `stream` (the tail that does not fill one is dropped)."""
    n = (len(stream) // (seq_len - 1)) if limit is None else min(limit, len(stream) // (seq_len - 1))
    rows = stream[: n * (seq_len - 1)].view(n, seq_len - 1)
    return torch.cat([torch.full((n, 1), bos, dtype=torch.long), rows], dim=1)


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warmup, then cosine decay to 10% of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.inference_mode()
def eval_loss(model: PreTrainedModel, windows: torch.Tensor, batch: int = 8) -> float:
    """Mean next-token cross-entropy (nats) over all predicted positions of `windows`."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch):
        x = windows[i : i + batch]
        logits = model(input_ids=x).logits[:, :-1]
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum").item()
        count += x[:, 1:].numel()
    return total / count


def window_batches(stream: torch.Tensor, batch: int, seq_len: int):
    """Sampler of `<s>`-prefixed random windows of `stream`: gen -> (input_ids [batch, seq_len], no mask)."""
    return lambda gen: (random_windows(stream, gen, batch, seq_len, bos=0), None)


def sequence_batches(sequences: list[list[int]], batch: int, pad: int):
    """Sampler of whole sequences drawn at random, right-padded: gen -> (input_ids [batch, L], mask [batch, L])."""
    def sample(gen: torch.Generator):
        picks = [sequences[i] for i in torch.randint(len(sequences), (batch,), generator=gen).tolist()]
        width = max(map(len, picks))
        x = torch.tensor([s + [pad] * (width - len(s)) for s in picks])
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in picks])
        return x, mask
    return sample


def train(model: PreTrainedModel, sample, *, steps: int, lr: float, seed: int, name: str,
          eval_windows: torch.Tensor, teacher: PreTrainedModel | None = None, log_every: int = 25) -> float:
    """AdamW on batches from `sample(gen) -> (input_ids, mask or None)`; next-token CE, or the KL to
    `teacher`'s next-token distribution at every real position if a teacher is given.

    Returns the mean training loss of the last 10% of the steps.
    """
    gen = torch.Generator().manual_seed(seed)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    if teacher is not None:
        teacher.eval()
    losses, start = [], time.time()
    for step in range(steps):
        model.train()
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup=max(1, steps // 20))
        x, mask = sample(gen)
        logits = model(input_ids=x, attention_mask=mask).logits
        if teacher is None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        else:
            with torch.no_grad():
                target_logp = F.log_softmax(teacher(input_ids=x, attention_mask=mask).logits, dim=-1)
            kl = F.kl_div(F.log_softmax(logits, dim=-1), target_logp, log_target=True, reduction="none").sum(-1)
            loss = kl.mean() if mask is None else kl[mask.bool()].mean()  # [B, T] -> mean over real positions
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if (step + 1) % log_every == 0 or step + 1 == steps:
            recent = statistics.mean(losses[-log_every:])
            msg = f"[{name}] step {step + 1}/{steps} {'kl' if teacher else 'loss'} {recent:.3f}"
            if (step + 1) % (log_every * 8) == 0 or step + 1 == steps:
                msg += f" held-out loss {eval_loss(model, eval_windows):.3f}"
            print(f"{msg} ({time.time() - start:.0f}s)", flush=True)
    model.eval()
    return statistics.mean(losses[-max(1, steps // 10):]) if losses else None  # steps=0: not trained


# ---------------------------------------------------------------------------------------------- prompts

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


# --------------------------------------------------------------------------------------------- measures

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


# ------------------------------------------------------------------------------------------------ eagle

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


# ------------------------------------------------------------------------------------------------- main

def parse_args(argv=None) -> argparse.Namespace:
    from batchspec.training.train_draft import layer_ids  # train_draft's --layers parser, its check and message
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "batchspec/assets/demo")
    p.add_argument("--steps", type=int, default=700, help="target training steps")
    p.add_argument("--draft-steps", type=int, default=500, help="draft distillation steps on corpus windows")
    p.add_argument("--continuations", type=int, default=4000,
                   help="train-file prompts the target continues greedily for the draft's second stage")
    p.add_argument("--continuation-tokens", type=int, default=96, help="new tokens per continuation")
    p.add_argument("--continuation-steps", type=int, default=1500,
                   help="draft distillation steps on the target's continuations (0: skip the stage)")
    p.add_argument("--continuation-batch", type=int, default=16)
    p.add_argument("--continuation-lr", type=float, default=2e-3)
    p.add_argument("--reuse-target", type=Path, default=None, metavar="DIR",
                   help="load the tokenizer and target from DIR (an earlier build) instead of training them")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-3, help="target peak learning rate")
    p.add_argument("--draft-lr", type=float, default=3e-3, help="draft peak learning rate")
    p.add_argument("--target-shape", default="256x14x672", help="hidden x layers x MLP of the target (4 heads, 2 KV)")
    p.add_argument("--draft-shape", default="128x2x352", help="hidden x layers x MLP of the draft (4 heads, 2 KV)")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--n-prompts", type=int, default=200)
    p.add_argument("--n-agree", type=int, default=32, help="held-out prompts for the greedy agreement measure")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arch", choices=["llama", "qwen2"], default="llama",
                   help="architecture of the target and draft (the shipped demo is llama)")
    p.add_argument("--eagle", action="store_true",
                   help="also train the target's EAGLE-3 head with batchspec.train_draft and ship it in OUT/eagle")
    p.add_argument("--eagle-only", action="store_true",
                   help="only the --eagle stage, on the target already in OUT (nothing else is rebuilt)")
    p.add_argument("--eagle-minutes", type=float, default=15.0, help="train_draft's time budget for the head")
    p.add_argument("--eagle-layers", type=layer_ids, default=None,
                   help="the target hidden-state indices the head reads, e.g. 2,7,13 (default: train_draft's)")
    p.add_argument("--eagle-vocab", type=int, default=None, help="draft vocabulary of the head (default: full)")
    p.add_argument("--eagle-compare", type=int, default=200, help="held-out prompts for the eagle/draft comparison")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    t0 = time.time()
    torch.set_num_threads(2)
    torch.manual_seed(args.seed)
    root = Path(sysconfig.get_paths()["stdlib"])
    files = stdlib_files(root)
    train_files, heldout_files = split_files(files)
    if args.eagle_only:
        run_eagle(args, argv, root, train_files)
        return
    train_texts = [read_text(root, f) for f in train_files]
    heldout_texts = [read_text(root, f) for f in heldout_files]
    print(f"corpus: Python {platform.python_version()} stdlib {root}: {len(train_files)} train files "
          f"({sum(map(len, train_texts)) / 1e6:.2f} MB), {len(heldout_files)} held-out files "
          f"({sum(map(len, heldout_texts)) / 1e6:.2f} MB)", flush=True)

    if args.reuse_target:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(args.reuse_target / "target")
        for key in ("is_local", "local_files_only"):  # load-time options: save it as a fresh tokenizer would be
            tokenizer.init_kwargs.pop(key, None)
        reused = AutoModelForCausalLM.from_pretrained(args.reuse_target / "target", dtype=torch.float32)
    else:
        tokenizer = train_tokenizer(train_texts, args.vocab_size)
    train_stream, heldout_stream = token_stream(tokenizer, train_texts), token_stream(tokenizer, heldout_texts)
    print(f"tokenizer: vocab {len(tokenizer)}; {len(train_stream)} train tokens, {len(heldout_stream)} held-out "
          f"tokens ({time.time() - t0:.0f}s)", flush=True)
    heldout_windows = fixed_windows(heldout_stream, args.seq_len, bos=0)
    monitor_windows = heldout_windows[:: max(1, len(heldout_windows) // 32)][:32]
    train_eval_windows = fixed_windows(train_stream, args.seq_len, bos=0)
    train_eval_windows = train_eval_windows[:: max(1, len(train_eval_windows) // 64)][:64]

    vocab = len(tokenizer)
    (th, tl, tm), (dh, dl, dm) = (map(int, shape.split("x")) for shape in (args.target_shape, args.draft_shape))
    target = reused if args.reuse_target else new_model(model_config(args.arch, vocab, th, tl, tm, 4, 2, 1024), seed=args.seed)
    draft = new_model(model_config(args.arch, vocab, dh, dl, dm, 4, 2, 1024), seed=args.seed + 1)
    print(f"target {n_params(target) / 1e6:.2f}M params, draft {n_params(draft) / 1e6:.2f}M params", flush=True)

    t_train = time.time()
    windows = window_batches(train_stream, args.batch, args.seq_len)
    if args.reuse_target:
        target_train = None
        target.eval()
    else:
        target_train = train(target, windows, steps=args.steps, lr=args.lr, seed=args.seed + 10, name="target",
                             eval_windows=monitor_windows)
    t_draft = time.time()
    draft_kl = train(draft, windows, steps=args.draft_steps, lr=args.draft_lr, seed=args.seed + 11, name="draft",
                     eval_windows=monitor_windows, teacher=target)
    t_cont = time.time()
    continuation_kl, generated = None, 0
    if args.continuation_steps:
        sequences = train_continuations(root, train_files, tokenizer, target, draft, n=args.continuations,
                                        new_tokens=args.continuation_tokens, seed=args.seed + 12)
        generated = sum(map(len, sequences))
        print(f"continuations: {len(sequences)} sequences, {generated} tokens ({time.time() - t_cont:.0f}s)", flush=True)
        continuation_kl = train(draft, sequence_batches(sequences, args.continuation_batch, tokenizer.pad_token_id),
                                steps=args.continuation_steps, lr=args.continuation_lr, seed=args.seed + 13,
                                name="draft on continuations", eval_windows=monitor_windows, teacher=target)
    train_minutes = (t_draft - t_train) / 60, (t_cont - t_draft) / 60, (time.time() - t_cont) / 60

    prompts = build_prompts(root, heldout_files, tokenizer, args.n_prompts, min_tokens=20, max_tokens=150)
    print(f"prompts: {len(prompts)} from {len({p['source_file'] for p in prompts})} held-out files", flush=True)

    # Save, then measure the saved models as users will load them.
    out: Path = args.out
    old_readme = (out / "README.md").read_text() if (out / "README.md").exists() else ""
    for name in ("target", "draft"):
        if (out / name).exists():
            shutil.rmtree(out / name)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.chat_template = CHAT_TEMPLATE  # saved as chat_template.jinja
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(out / name)
        tokenizer.save_pretrained(out / name)
    pq.write_table(pa.Table.from_pylist(prompts, schema=pa.schema(
        [("id", pa.string()), ("prompt", pa.string()), ("source_file", pa.string())])), out / "prompts.parquet")
    target = AutoModelForCausalLM.from_pretrained(out / "target", dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(out / "draft", dtype=torch.float32).eval()

    m = {
        "target_train_loss": target_train, "draft_train_kl": draft_kl, "continuation_kl": continuation_kl,
        "continuation_tokens": generated,
        "target_train_eval": eval_loss(target, train_eval_windows), "draft_train_eval": eval_loss(draft, train_eval_windows),
        "target_heldout": eval_loss(target, heldout_windows), "draft_heldout": eval_loss(draft, heldout_windows),
    }
    print(f"loss (nats/token): target train {m['target_train_eval']:.3f} held-out {m['target_heldout']:.3f} "
          f"(ppl {math.exp(m['target_heldout']):.2f}); draft train {m['draft_train_eval']:.3f} held-out "
          f"{m['draft_heldout']:.3f} (ppl {math.exp(m['draft_heldout']):.2f})", flush=True)
    agree_prompts = [p["prompt"] for p in prompts[:: max(1, len(prompts) // args.n_agree)][: args.n_agree]]
    agreement = greedy_agreement(target, draft, tokenizer, agree_prompts, max_new_tokens=64)
    print(f"greedy agreement: {agreement.rate:.3f} over {agreement.positions} positions "
          f"({len(agree_prompts)} prompts x <=64 tokens); tokens per target pass with greedy speculation: "
          + ", ".join(f"k={k}: {v:.2f}" for k, v in agreement.tokens_per_verify.items()), flush=True)
    context = heldout_stream[1:129]
    timings = {(name, b, k): forward_ms(model, context, b, k)
               for name, model in (("target", target), ("draft", draft)) for b in (1, 8) for k in (1, 5)}
    for key, ms in timings.items():
        print(f"forward {key[0]} batch {key[1]} x {key[2]} tokens after 128 cached: {ms:.2f} ms", flush=True)

    wall = (time.time() - t0) / 60
    write_readme(out, args, argv, files=(train_files, heldout_files), tokens=(len(train_stream), len(heldout_stream)),
                 params=(n_params(target), n_params(draft)), steps=(args.steps, args.draft_steps),
                 train_minutes=train_minutes, losses=m, agreement=agreement, n_agree=len(agree_prompts),
                 timings=timings, n_prompts=len(prompts), wall=wall, target=target, draft=draft)
    if args.eagle:
        run_eagle(args, argv, root, train_files)
    elif (out / "eagle").is_dir() and args.reuse_target and EAGLE_START in old_readme:  # the head still fits
        update_readme_eagle(out, old_readme[old_readme.index(EAGLE_START): old_readme.index(EAGLE_END)] + EAGLE_END + "\n")
    elif (out / "eagle").is_dir():  # a head for an earlier target: stale
        shutil.rmtree(out / "eagle")
    sizes = {p.relative_to(out).as_posix(): p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()}
    print(f"assets: {sum(sizes.values()) / 1e6:.2f} MB in {out}", flush=True)
    print(f"wall time: {wall:.1f} min", flush=True)


def run_eagle(args, argv, root: Path, train_files: list[Path]) -> None:
    result = build_eagle(args, root, train_files, args.out)
    result["minutes"] = args.eagle_minutes
    command = "`python tools/build_demo.py " + " ".join(sys.argv[1:] if argv is None else argv) + "`"
    update_readme_eagle(args.out, eagle_section(result, command))


def write_readme(out: Path, args, argv, *, files, tokens, params, steps, train_minutes, losses, agreement,
                 n_agree, timings, n_prompts, wall, target, draft) -> None:
    """Describe the assets, how they were made and what was measured."""
    command = "python tools/build_demo.py" + ("" if argv is None and len(sys.argv) == 1 else
                                              " " + " ".join(sys.argv[1:] if argv is None else argv))
    tc, dc = target.config, draft.config

    def shape(c):
        arch = {"llama": "Llama", "qwen2": "Qwen2"}[c.model_type]
        return (f"{arch}, hidden {c.hidden_size}, {c.num_hidden_layers} layers, {c.num_attention_heads} heads "
                f"({c.num_key_value_heads} KV), MLP {c.intermediate_size}, vocab {c.vocab_size}, "
                f"max positions {c.max_position_embeddings}, tied embeddings")

    rows = "\n".join(f"| {name} | {b} | {k} | {ms:.2f} |" for (name, b, k), ms in timings.items())
    final_losses = ", ".join(f"{what} {losses[key]:.3f}" for what, key in (
        ("target", "target_train_loss"), ("draft KL to target on windows", "draft_train_kl"),
        ("draft KL to target on its continuations", "continuation_kl")) if losses[key] is not None)
    reuse_note = "" if args.reuse_target is None else (
        "\nThe tokenizer and target were loaded from an earlier build (`--reuse-target`); the same command"
        "\nwithout that option trains them first, with the settings above, and then runs every later stage.")
    target_time = (f"{train_minutes[0]:.1f} min" if losses["target_train_loss"] is not None else
                   f"this build loaded it from an earlier one with `--reuse-target {args.reuse_target}`")
    continuation = "" if not args.continuation_steps else f"""
  Then distilled on the target's own text: the target continued {args.continuations} prompts cut from
  the train files (as the held-out prompts are cut) by {args.continuation_tokens} greedy tokens
  ({losses['continuation_tokens']:,} tokens in all, prompts included), and the draft was trained on the KL to the target at
  every position of those sequences: {args.continuation_steps} steps of {args.continuation_batch} sequences,
  peak lr {args.continuation_lr:g} ({train_minutes[2]:.1f} min with the generation). This is where the draft learns
  where the target goes when it writes, which is what speculation needs."""
    text = f"""# Offline demo pair: stdlib-Python code models

Trained, tiny models for batchspec's offline demo and benchmark: no download, CPU-friendly.

| path | what |
|---|---|
| `target/` | target model ({params[0] / 1e6:.2f}M params, fp32 safetensors) + tokenizer |
| `draft/` | draft model ({params[1] / 1e6:.2f}M params, fp32 safetensors) + the same tokenizer |
| `prompts.parquet` | {n_prompts} held-out prompts: columns `id` (`heldout-0000`...), `prompt`, `source_file` |
| `chat.jsonl` | eight conversations (`id`, `messages`, `topic`) for `jobs/demo_chat.yaml`; written by hand, kept across rebuilds |

- **Corpus**: the pure-Python modules of the CPython {platform.python_version()} standard library
  (sorted; tests, idlelib, lib2to3, tkinter, distutils, encodings, pydoc_data and similar left out;
  files of 1-48 KB), split by file: {len(files[0])} train files ({tokens[0]:,} tokens) and
  {len(files[1])} held-out files ({tokens[1]:,} tokens; every {HELDOUT_EVERY}th file of the sorted list).
  Held-out files are never trained on and are the only source of the prompts.
- **Tokenizer**: byte-level BPE trained on the train files, vocab {tc.vocab_size};
  `<s>` (id 0, BOS, prepended by `tokenizer(text)`), `</s>` (id 1, EOS), `<pad>` (id 2).
  Its chat template (`chat_template.jinja`) writes a conversation as Python comments
  (`# user: ...`) and opens the answer with `# assistant:`, so chat jobs run offline.
- **Target**: {shape(tc)}. Trained from scratch, next-token cross-entropy, AdamW (peak lr {args.lr:g},
  cosine), {steps[0]} steps of {args.batch} x {args.seq_len} tokens (`<s>` + a random window of the
  train token stream), fp32 on 2 CPU threads ({target_time}).
- **Draft**: {shape(dc)}. Distilled from the trained target: KL to the target's next-token
  distribution on the same kind of windows, {steps[1]} steps of {args.batch} x {args.seq_len} tokens, peak lr {args.draft_lr:g} ({train_minutes[1]:.1f} min).{continuation}
- **Prompts**: every def/class of the held-out files gives a candidate: decorators + header + its
  first (up to 3) body lines, dedented, ending at a line end without the newline, 20-150 tokens
  with `<s>`, and with at least two more lines in the block; {n_prompts} are picked evenly spread
  over the candidates, in file and line order.

## How it was made

```
{command}
```

Fixed seeds (`--seed {args.seed}`), fp32, CPU, `torch.set_num_threads(2)`;
wall time {wall:.1f} min on a 2-core machine. The corpus is the running interpreter's standard
library, so rebuilding on another Python version gives different (but equivalent) assets.{reuse_note}

## Measurements (held-out data)

| model | train-window loss | held-out loss | held-out perplexity |
|---|---|---|---|
| target | {losses['target_train_eval']:.3f} | {losses['target_heldout']:.3f} | {math.exp(losses['target_heldout']):.2f} |
| draft | {losses['draft_train_eval']:.3f} | {losses['draft_heldout']:.3f} | {math.exp(losses['draft_heldout']):.2f} |

Losses are mean next-token cross-entropy in nats per token (held-out: every `<s>`-prefixed
{args.seq_len}-token window of the held-out files; train: 64 windows spread over the train files).
Final training loss (mean of the last 10% of steps): {final_losses}.

**Greedy agreement**: the target generates 64 tokens greedily (`generate(do_sample=False)`) for
{n_agree} held-out prompts; at {agreement.positions} positions the draft's greedy next token given
the target's prefix equals the target's in **{agreement.rate:.1%}** of them. Replaying greedy
speculative decoding on those sequences gives {agreement.tokens_per_verify[2]:.2f} (k=2) and
{agreement.tokens_per_verify[4]:.2f} (k=4) tokens per target forward.

**Forward time** (ms, median of 20, one forward of T new tokens after a 128-token KV cache, fp32,
2 threads; machine-dependent):

| model | batch | T | ms |
|---|---|---|---|
{rows}

The benchmark (`python -m batchspec.bench`) measures everything side by side in one process; the
times above come from this build's machine, possibly shared with other work.

**Why this shape**: speculation pays only when a draft step is cheap next to a target step
(c = t_draft / t_target) and a verify pass of k+1 tokens costs little more than a 1-token step. On
2 CPU cores a forward is dominated by per-layer work that hardly grows with the tokens per row, so
the target is deep and narrow ({tc.num_hidden_layers} layers of hidden {tc.hidden_size}) and the draft shallow
({dc.num_hidden_layers} layers of hidden {dc.hidden_size}): one target step at batch 8 costs about ten draft steps.
"""
    (out / "README.md").write_text(text)


if __name__ == "__main__":
    main()
