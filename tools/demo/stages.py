"""The build's steps in order (build_demo.main runs them): data, models, training, saving, measuring."""

from __future__ import annotations

import math
import platform
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

from .corpus import read_text
from .measures import Agreement, forward_ms, greedy_agreement
from .models import model_config, n_params, new_model
from .prompts import train_continuations
from .tokenizer import CHAT_TEMPLATE, load_reused, token_stream, train_tokenizer
from .training import eval_loss, fixed_windows, sequence_batches, train, window_batches


@dataclass
class Data:
    """The corpus as the build uses it: its files, the tokenizer, token streams and evaluation windows."""

    train_files: list[Path]
    heldout_files: list[Path]
    tokenizer: PreTrainedTokenizerFast
    reused: PreTrainedModel | None  # the target of --reuse-target, None when it is trained here
    train_stream: torch.Tensor
    heldout_stream: torch.Tensor
    heldout_windows: torch.Tensor  # every held-out window: the README's held-out loss
    monitor_windows: torch.Tensor  # 32 of them: the held-out loss printed while training
    train_eval_windows: torch.Tensor  # 64 train windows: the README's train-window loss


@dataclass
class Training:
    """What the training stages report: final losses (None: stage not run), tokens generated, minutes each."""

    target_loss: float | None
    draft_kl: float | None
    continuation_kl: float | None
    continuation_tokens: int
    minutes: tuple[float, float, float]  # target, draft on windows, draft on continuations (with generation)


def prepare_data(args, root: Path, train_files: list[Path], heldout_files: list[Path], t0: float) -> Data:
    """Read the corpus, train (or load) the tokenizer, tokenize both splits and cut the evaluation windows."""
    train_texts = [read_text(root, f) for f in train_files]
    heldout_texts = [read_text(root, f) for f in heldout_files]
    print(f"corpus: Python {platform.python_version()} stdlib {root}: {len(train_files)} train files "
          f"({sum(map(len, train_texts)) / 1e6:.2f} MB), {len(heldout_files)} held-out files "
          f"({sum(map(len, heldout_texts)) / 1e6:.2f} MB)", flush=True)
    if args.reuse_target:
        tokenizer, reused = load_reused(args.reuse_target)
    else:
        tokenizer, reused = train_tokenizer(train_texts, args.vocab_size), None
    train_stream, heldout_stream = token_stream(tokenizer, train_texts), token_stream(tokenizer, heldout_texts)
    print(f"tokenizer: vocab {len(tokenizer)}; {len(train_stream)} train tokens, {len(heldout_stream)} held-out "
          f"tokens ({time.time() - t0:.0f}s)", flush=True)
    heldout_windows = fixed_windows(heldout_stream, args.seq_len, bos=0)
    train_eval_windows = fixed_windows(train_stream, args.seq_len, bos=0)
    return Data(train_files, heldout_files, tokenizer, reused, train_stream, heldout_stream, heldout_windows,
                monitor_windows=heldout_windows[:: max(1, len(heldout_windows) // 32)][:32],
                train_eval_windows=train_eval_windows[:: max(1, len(train_eval_windows) // 64)][:64])


def make_models(args, data: Data) -> tuple[PreTrainedModel, PreTrainedModel]:
    """The target (fresh, or the reused one) and a fresh draft, of the shapes asked for."""
    vocab = len(data.tokenizer)
    (th, tl, tm), (dh, dl, dm) = (map(int, shape.split("x")) for shape in (args.target_shape, args.draft_shape))
    target = data.reused if args.reuse_target else new_model(model_config(args.arch, vocab, th, tl, tm, 4, 2, 1024),
                                                             seed=args.seed)
    draft = new_model(model_config(args.arch, vocab, dh, dl, dm, 4, 2, 1024), seed=args.seed + 1)
    print(f"target {n_params(target) / 1e6:.2f}M params, draft {n_params(draft) / 1e6:.2f}M params", flush=True)
    return target, draft


def train_models(args, root: Path, data: Data, target, draft) -> Training:
    """Train the target (unless reused), distil the draft on windows, then on the target's continuations."""
    t_train = time.time()
    windows = window_batches(data.train_stream, args.batch, args.seq_len)
    if args.reuse_target:
        target_train = None
        target.eval()
    else:
        target_train = train(target, windows, steps=args.steps, lr=args.lr, seed=args.seed + 10, name="target",
                             eval_windows=data.monitor_windows)
    t_draft = time.time()
    draft_kl = train(draft, windows, steps=args.draft_steps, lr=args.draft_lr, seed=args.seed + 11, name="draft",
                     eval_windows=data.monitor_windows, teacher=target)
    t_cont = time.time()
    continuation_kl, generated = None, 0
    if args.continuation_steps:
        continuation_kl, generated = distill_on_continuations(args, root, data, target, draft, t_cont)
    minutes = (t_draft - t_train) / 60, (t_cont - t_draft) / 60, (time.time() - t_cont) / 60
    return Training(target_train, draft_kl, continuation_kl, generated, minutes)


def distill_on_continuations(args, root: Path, data: Data, target, draft, t_cont: float) -> tuple[float, int]:
    """The draft's second stage: KL to the target on the target's own greedy continuations of train prompts.
    Returns (the stage's final KL, tokens in the sequences)."""
    tokenizer = data.tokenizer
    sequences = train_continuations(root, data.train_files, tokenizer, target, draft, n=args.continuations,
                                    new_tokens=args.continuation_tokens, seed=args.seed + 12)
    generated = sum(map(len, sequences))
    print(f"continuations: {len(sequences)} sequences, {generated} tokens ({time.time() - t_cont:.0f}s)", flush=True)
    continuation_kl = train(draft, sequence_batches(sequences, args.continuation_batch, tokenizer.pad_token_id),
                            steps=args.continuation_steps, lr=args.continuation_lr, seed=args.seed + 13,
                            name="draft on continuations", eval_windows=data.monitor_windows, teacher=target)
    return continuation_kl, generated


def save_assets(out: Path, tokenizer, target, draft, prompts: list[dict]) -> tuple[str, PreTrainedModel,
                                                                                   PreTrainedModel]:
    """Write target/, draft/ (each with the tokenizer) and prompts.parquet into OUT, then load the models back
    as users will. Returns (the README that OUT held before, or "", the loaded target, the loaded draft)."""
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
    return old_readme, target, draft


def measure(args, data: Data, training: Training, prompts: list[dict], target, draft
            ) -> tuple[dict, Agreement, int, dict]:
    """Losses, greedy agreement and forward timings of the saved pair, printed as measured.
    Returns (losses, agreement, prompts it was measured on, timings)."""
    m = {
        "target_train_loss": training.target_loss, "draft_train_kl": training.draft_kl,
        "continuation_kl": training.continuation_kl, "continuation_tokens": training.continuation_tokens,
        "target_train_eval": eval_loss(target, data.train_eval_windows),
        "draft_train_eval": eval_loss(draft, data.train_eval_windows),
        "target_heldout": eval_loss(target, data.heldout_windows), "draft_heldout": eval_loss(draft, data.heldout_windows),
    }
    print(f"loss (nats/token): target train {m['target_train_eval']:.3f} held-out {m['target_heldout']:.3f} "
          f"(ppl {math.exp(m['target_heldout']):.2f}); draft train {m['draft_train_eval']:.3f} held-out "
          f"{m['draft_heldout']:.3f} (ppl {math.exp(m['draft_heldout']):.2f})", flush=True)
    agree_prompts = [p["prompt"] for p in prompts[:: max(1, len(prompts) // args.n_agree)][: args.n_agree]]
    agreement = greedy_agreement(target, draft, data.tokenizer, agree_prompts, max_new_tokens=64)
    print(f"greedy agreement: {agreement.rate:.3f} over {agreement.positions} positions "
          f"({len(agree_prompts)} prompts x <=64 tokens); tokens per target pass with greedy speculation: "
          + ", ".join(f"k={k}: {v:.2f}" for k, v in agreement.tokens_per_verify.items()), flush=True)
    context = data.heldout_stream[1:129]
    timings = {(name, b, k): forward_ms(model, context, b, k)
               for name, model in (("target", target), ("draft", draft)) for b in (1, 8) for k in (1, 5)}
    for key, ms in timings.items():
        print(f"forward {key[0]} batch {key[1]} x {key[2]} tokens after 128 cached: {ms:.2f} ms", flush=True)
    return m, agreement, len(agree_prompts), timings


def report_sizes(out: Path, wall: float) -> None:
    """The last lines of a build: what OUT holds, and the wall time."""
    sizes = {p.relative_to(out).as_posix(): p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()}
    print(f"assets: {sum(sizes.values()) / 1e6:.2f} MB in {out}", flush=True)
    print(f"wall time: {wall:.1f} min", flush=True)
