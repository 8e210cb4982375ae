"""Train an EAGLE-3 draft head for a Hugging Face target on its own continuations of your prompts.

    python -m batchspec.train_draft TARGET --prompts SOURCE --out DIR [--minutes 15] [--resume]

SOURCE is anything a job reads (Parquet file/folder/glob, JSONL, a saved or hub dataset). The head is
written to DIR in the EAGLE / SpecForge layout, the one SGLang's and vLLM's llama_eagle3.py read (names
and config fields checked against their source; not loaded in either engine here), or with
--format speculators in vLLM's speculators layout; in the target's dtype unless --save-dtype says
otherwise; with DIR/train_summary.txt. A killed run continues with --resume.
The training logic is in batchspec/training/train.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Deferred imports: the trainer's modules (torch, transformers) are imported inside the functions that need
# them, so that --help and a bad argument answer before they load.
SAVE_DTYPES = ("float32", "bfloat16", "float16")


def layer_ids(text: str) -> tuple[int, int, int]:
    ids = tuple(int(x) for x in text.split(","))
    if len(ids) != 3:
        raise argparse.ArgumentTypeError("give three comma-separated hidden-state indices, e.g. 2,7,11")
    return ids  # type: ignore[return-value]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m batchspec.train_draft", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", help="target model: local directory or hub id")
    p.add_argument("--prompts", required=True, help="prompt source: Parquet, JSONL, saved or hub dataset")
    p.add_argument("--out", required=True, help="directory for the head, its summary and the run's state")
    p.add_argument("--prompt-column", default="prompt",
                   help="text or token ids; with --chat a user message or a list of {role, content} messages")
    p.add_argument("--chat", action="store_true",
                   help="render each prompt with the target's chat template (a generation prompt added)")
    p.add_argument("--split", default="train", help="dataset split (Hugging Face datasets)")
    p.add_argument("--limit", type=int, default=None, help="read at most this many prompts")
    # training.data.PROMPT_ORDERS, spelt out: importing it would load torch for --help
    p.add_argument("--prompt-order", choices=["shuffled", "file"], default="shuffled",
                   help="shuffled (default): prompts held out evenly over the source, the rest continued in an "
                        "order shuffled by --seed, so a budget that stops generation early still samples the whole "
                        "source; file: the old order, every round(1/--heldout)-th prompt from the start held out, the "
                        "rest in the source's order")
    p.add_argument("--minutes", type=float, default=15.0,
                   help="time budget for the whole run, generation included (0: none; then give --steps)")
    p.add_argument("--steps", type=int, default=0, help="stop training after this many steps (0: the budget decides)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="auto", help="target dtype: auto (bfloat16 on a GPU, float32 on CPU), float32, "
                                                 "bfloat16, float16")
    p.add_argument("--resume", action="store_true", help="continue the run in --out after a kill")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (AdamW, warmup then cosine; "
                   "default 3e-3 for a head up to 256 wide, 3e-3 * 256 / width above)")
    p.add_argument("--batch-size", type=int, default=4, help="sequences per training step")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW's decoupled weight decay (default 0; "
                   "0.1-2.0 gave 0.03-0.05 more tokens per forward on SmolLM2: docs/eagle.md)")
    p.add_argument("--ttt-steps", type=int, default=4,
                   help="draft steps unrolled in training (EAGLE-3's test); chains deeper than this are untrained")
    p.add_argument("--ttt-ramp", type=float, default=0.5,
                   help="share of training (0-1) over which the unrolled steps grow from 1 to --ttt-steps, so "
                        "that early steps cost less (0: every step unrolls --ttt-steps); on SmolLM2, 0.5 ran 1.6x "
                        "the steps and gave 1.65 tokens per forward at k=4 against 1.59 without (docs/eagle.md)")
    p.add_argument("--draft-vocab-size", type=int, default=None,
                   help="draft vocabulary: the most frequent target tokens (default: as many as cover 97%% of the "
                        "training tokens, in multiples of 256, at most 32000; on SmolLM2 fewer rows ran 7-24%% more training "
                        "steps and drafted as well or better: docs/eagle.md)")
    p.add_argument("--heldout", type=float, default=0.05, help="share of prompts held out for acceptance")
    p.add_argument("--max-heldout", type=int, default=128, help="at most this many held-out prompts (32 of them "
                   "measured one SmolLM2 head at 1.70-2.01 tokens per forward, 128 at 1.79-1.93)")
    p.add_argument("--max-prompt-tokens", type=int, default=512, help="skip longer prompts")
    p.add_argument("--max-new-tokens", type=int, default=96, help="tokens the target writes per training prompt")
    p.add_argument("--eval-new-tokens", type=int, default=64, help="greedy tokens per held-out prompt")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sample the training continuations at this temperature (0: greedy)")
    p.add_argument("--labels", choices=["auto", "hard", "soft"], default="auto",
                   help="learn the target's greedy token (hard) or its distribution (soft); auto: hard for "
                        "greedy continuations, soft at --temperature otherwise")
    p.add_argument("--data-fraction", type=float, default=0.25,
                   help="share of --minutes generation may use (0.25: with the unrolled-step ramp, SmolLM2 gained more "
                        "from training steps than from more data; docs/eagle.md)")
    p.add_argument("--gen-batch-size", type=int, default=128, help="batch size of the generation (plain decoding, "
                   "recording states: on SmolLM2 on 2 cores 234-258 tokens/s at 128, 203-206 at 64; its KV cache "
                   "grows with it: lower it when memory is short)")
    p.add_argument("--gen-dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="dtype of the target copy that writes the training continuations (auto: the target's); "
                        "bfloat16 on a CPU with AVX512-BF16 decoded SmolLM2 1.6x faster than float32, so the data "
                        "share writes more data; held-out continuations stay in the target's dtype")
    p.add_argument("--prompt-loss", action="store_true",
                   help="also learn at prompt positions (off by default: no better on SmolLM2 or the demo, and slower)")
    p.add_argument("--no-prompt-loss", action="store_true", help=argparse.SUPPRESS)  # the default now; kept for old commands
    p.add_argument("--layers", type=layer_ids, default=None,
                   help="target hidden-state indices to read (default 2,L//2,L-3); for a target of 4 or more layers "
                        "they must be distinct, ascending and >= 1, as vLLM and SGLang capture them")
    p.add_argument("--lm-head", choices=["train", "frozen"], default="train",
                   help="train the head's LM head (its rows start as the target's) or keep it frozen at the "
                        "target's rows (frozen: SmolLM2's steps ran 14%% faster, 1.89 against 1.86 tokens per forward at k=4; "
                        "the demo head lost 0.08: docs/eagle.md)")
    p.add_argument("--feature-loss", type=float, default=10.0,
                   help="weight of a smooth-L1 regression of the head's normed output onto the target's LM-head "
                        "input for the same token (EAGLE-1's feature loss), added to the label loss (0: none). On "
                        "SmolLM2, whose head learns its data by heart, 1-20 gave 1.89-1.93 tokens per forward at k=4 "
                        "against 1.86 and 10 1.14x drafter none in the bench (0.99x); level or 0.03 down on two "
                        "targets whose head does not: docs/eagle.md")
    p.add_argument("--feature-noise", type=float, default=0.0,
                   help="uniform noise added to the target's features in training, +- this share of each layer's "
                        "RMS (EAGLE-1's augmentation; default 0: 0.2 gave SmolLM2 1.92 against 1.89 tokens per "
                        "forward at k=4, within one run's noise: docs/eagle.md)")
    p.add_argument("--format", choices=["eagle", "speculators"], default="eagle",
                   help="layout of the saved head: eagle (what SGLang's and vLLM's llama_eagle3.py read) or "
                        "speculators (what vLLM's speculators reader reads); checked against their source, not "
                        "loaded in them here")
    p.add_argument("--save-dtype", choices=["auto", *SAVE_DTYPES], default="auto",
                   help="dtype of the saved head: auto (the target's dtype, from its config.json, as vLLM gives a "
                        "draft the target's dtype and SGLang takes the draft config's; float32 when it names none)")
    p.add_argument("--checkpoint-every", type=float, default=60.0, help="seconds between checkpoints")
    p.add_argument("--autocast", choices=["auto", "bfloat16", "off"], default="auto",
                   help="bf16 matmuls in training: auto (on a GPU only: on CPU, bf16 steps were faster but slowed "
                        "the process's later fp32 forwards), bfloat16 (always), off (fp32); the saved head is "
                        "--save-dtype either way")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not args.weight_decay >= 0:  # NaN included
        p.error(f"--weight-decay {args.weight_decay}: need a number >= 0")
    if not 0 <= args.feature_loss < float("inf"):  # NaN included
        p.error(f"--feature-loss {args.feature_loss}: need a weight >= 0")
    if not 0 <= args.feature_noise < float("inf"):  # NaN included
        p.error(f"--feature-noise {args.feature_noise}: need a share >= 0")
    if not 0 <= args.ttt_ramp <= 1:
        p.error(f"--ttt-ramp {args.ttt_ramp}: need a share of training between 0 and 1")
    return args


def target_facts(target: str) -> tuple[str | None, int | None]:
    """(dtype named in the target's config, its layer count), each None when the config cannot be read
    (the run then reports why the target does not load)."""
    try:
        # deferred here and below: `--help` and a bad argument answer before transformers and torch load
        from transformers import AutoConfig

        from ..eagle.config import target_num_layers

        config = AutoConfig.from_pretrained(target)
    except Exception:  # noqa: BLE001 - load_models gives the one-line reason later
        return None, None
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if dtype is None and hasattr(config, "get_text_config"):
        dtype = getattr(config.get_text_config(), "dtype", None)
    dtype = str(dtype).removeprefix("torch.") if dtype is not None else None
    try:
        layers = target_num_layers(config)
    except ValueError:
        layers = None
    return dtype, layers


def save_dtype(requested: str, target_dtype: str | None) -> tuple[str, str]:
    """(dtype to save the head in, why)."""
    if requested != "auto":
        return requested, "--save-dtype"
    if target_dtype in SAVE_DTYPES:
        return target_dtype, "the target's dtype"
    return "float32", (f"the target's dtype {target_dtype} is not one a head is saved in" if target_dtype
                       else "the target's config names no dtype")


def save_notes(summary, dtype: str, why: str) -> list[str]:
    """Lines for the summary: what was written, in which dtype, and whether other engines can use its layers."""
    from ..eagle.formats import CHECKED
    from ..eagle.layer_ids import engine_layer_ids, engine_layer_problem

    c = summary.config
    lines = [f"  saved: {summary.out}/config.json + model.safetensors in {dtype} ({why}); {CHECKED[summary.format]}"]
    kept = Path(summary.out) / ".train"
    size = sum(f.stat().st_size for f in kept.rglob("*") if f.is_file()) if kept.is_dir() else 0
    if size:  # 4 target states x width x 4 bytes per token: 2.8 GiB after SmolLM2's 20 minutes on CPU
        lines.append(f"  kept: {kept} ({size / (1 << 30):,.2f} GiB: the samples, the target's states and the last "
                     "checkpoint, for --resume; delete it when the head is final)")
    layers, ids = c["target_num_layers"], tuple(c["target_layer_ids"])
    problem = engine_layer_problem(ids, layers)
    if problem:
        better = engine_layer_ids(layers)
        fix = (f"train with --layers {','.join(map(str, better))} for one they can" if better else
               f"a {layers}-layer target has no three distinct hidden states 1..{layers - 1} to give them")
        lines.append(f"  warning: other engines cannot load this head (from vLLM's and SGLang's source): {problem}; {fix}. "
                     "batchspec loads it.")
    return lines


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.minutes <= 0 and args.steps <= 0:
        sys.exit("train_draft: with --minutes 0 give --steps")
    target_dtype, num_layers = target_facts(args.target)
    if args.layers and num_layers:
        from ..eagle.layer_ids import engine_layer_ids, engine_layer_problem

        problem = engine_layer_problem(args.layers, num_layers)
        if problem and num_layers >= 4:
            sys.exit(f"train_draft: --layers: {problem}; choose e.g. "
                     f"{','.join(map(str, engine_layer_ids(num_layers)))}")
    dtype, why = save_dtype(args.save_dtype, target_dtype)
    from .train import TrainDraftOptions, run

    options = TrainDraftOptions(
        target=args.target, prompts=args.prompts, out=args.out, prompt_column=args.prompt_column, chat=args.chat, split=args.split,
        limit=args.limit, prompt_order=args.prompt_order, minutes=args.minutes, steps=args.steps, device=args.device, dtype=args.dtype,
        resume=args.resume, lr=args.lr, batch_size=args.batch_size, ttt_steps=args.ttt_steps, ttt_ramp=args.ttt_ramp,
        draft_vocab_size=args.draft_vocab_size, heldout=args.heldout, max_heldout=args.max_heldout,
        max_prompt_tokens=args.max_prompt_tokens, max_new_tokens=args.max_new_tokens,
        eval_new_tokens=args.eval_new_tokens, temperature=args.temperature, labels=args.labels,
        data_fraction=args.data_fraction,
        gen_batch_size=args.gen_batch_size, gen_dtype=args.gen_dtype, train_on_prompt=args.prompt_loss and not args.no_prompt_loss, layers=args.layers,
        lm_head=args.lm_head, feature_loss=args.feature_loss,
        format=args.format, save_dtype=dtype, seed=args.seed,
        loop={"checkpoint_every": args.checkpoint_every, "autocast": args.autocast, "weight_decay": args.weight_decay,
              "feature_noise": args.feature_noise},
    )
    from ..eagle.config import HeadError
    from ..util.files import atomic_write
    from .loop import NonFiniteLoss
    from .summary import render
    from .train import TrainDraftError
    from ..sources import SourceError
    from ..engine.model.models import ModelLoadError

    try:
        summary = run(options)
        text = "\n".join([render(summary), *save_notes(summary, dtype, why)])
        print(text)
        report = Path(summary.out) / "train_summary.txt"
        atomic_write(report, lambda tmp: Path(tmp).write_text(text + "\n"))
    except NonFiniteLoss as e:
        sys.exit(f"train_draft: {e}: try a lower --lr")
    except (HeadError, TrainDraftError, ModelLoadError, SourceError) as e:  # each a one-line message
        sys.exit(f"train_draft: {e}")


if __name__ == "__main__":
    main()
