"""The README written next to the assets: what they are, how they were made and what was measured."""

from __future__ import annotations

import math
import platform
import sys
from pathlib import Path

from .corpus import HELDOUT_EVERY


def write_readme(out: Path, args, argv, *, files, tokens, params, steps, train_minutes, losses, agreement,
                 n_agree, timings, n_prompts, wall, target, draft) -> None:
    """Describe the assets, how they were made and what was measured."""
    command = "python tools/build_demo.py" + ("" if argv is None and len(sys.argv) == 1 else
                                              " " + " ".join(sys.argv[1:] if argv is None else argv))
    tc, dc = target.config, draft.config
    text = (assets_section(args, files=files, tokens=tokens, params=params, steps=steps, train_minutes=train_minutes,
                           losses=losses, n_prompts=n_prompts, tc=tc, dc=dc)
            + made_section(args, command, wall)
            + measurements_section(args, losses=losses, agreement=agreement, n_agree=n_agree, timings=timings,
                                   tc=tc, dc=dc))
    (out / "README.md").write_text(text)


def model_shape(c) -> str:
    """A model's architecture and shape, as the README's bullets give them."""
    arch = {"llama": "Llama", "qwen2": "Qwen2"}[c.model_type]
    return (f"{arch}, hidden {c.hidden_size}, {c.num_hidden_layers} layers, {c.num_attention_heads} heads "
            f"({c.num_key_value_heads} KV), MLP {c.intermediate_size}, vocab {c.vocab_size}, "
            f"max positions {c.max_position_embeddings}, tied embeddings")


def continuation_note(args, losses: dict, minutes: float) -> str:
    """The draft's second stage (on the target's continuations) for its bullet: nothing where it was skipped."""
    return "" if not args.continuation_steps else f"""
  Then distilled on the target's own text: the target continued {args.continuations} prompts cut from
  the train files (as the held-out prompts are cut) by {args.continuation_tokens} greedy tokens
  ({losses['continuation_tokens']:,} tokens in all, prompts included), and the draft was trained on the KL to the target at
  every position of those sequences: {args.continuation_steps} steps of {args.continuation_batch} sequences,
  peak lr {args.continuation_lr:g} ({minutes:.1f} min with the generation). This is where the draft learns
  where the target goes when it writes, which is what speculation needs."""


def assets_section(args, *, files, tokens, params, steps, train_minutes, losses, n_prompts, tc, dc) -> str:
    """The title, the table of assets and a bullet on how each was made."""
    target_time = (f"{train_minutes[0]:.1f} min" if losses["target_train_loss"] is not None else
                   f"this build loaded it from an earlier one with `--reuse-target {args.reuse_target}`")
    continuation = continuation_note(args, losses, train_minutes[2])
    return f"""# Offline demo pair: stdlib-Python code models

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
- **Target**: {model_shape(tc)}. Trained from scratch, next-token cross-entropy, AdamW (peak lr {args.lr:g},
  cosine), {steps[0]} steps of {args.batch} x {args.seq_len} tokens (`<s>` + a random window of the
  train token stream), fp32 on 2 CPU threads ({target_time}).
- **Draft**: {model_shape(dc)}. Distilled from the trained target: KL to the target's next-token
  distribution on the same kind of windows, {steps[1]} steps of {args.batch} x {args.seq_len} tokens, peak lr {args.draft_lr:g} ({train_minutes[1]:.1f} min).{continuation}
- **Prompts**: every def/class of the held-out files gives a candidate: decorators + header + its
  first (up to 3) body lines, dedented, ending at a line end without the newline, 20-150 tokens
  with `<s>`, and with at least two more lines in the block; {n_prompts} are picked evenly spread
  over the candidates, in file and line order.

"""


def made_section(args, command: str, wall: float) -> str:
    """The command that built the assets, its seeds and its wall time."""
    reuse_note = "" if args.reuse_target is None else (
        "\nThe tokenizer and target were loaded from an earlier build (`--reuse-target`); the same command"
        "\nwithout that option trains them first, with the settings above, and then runs every later stage.")
    return f"""## How it was made

```
{command}
```

Fixed seeds (`--seed {args.seed}`), fp32, CPU, `torch.set_num_threads(2)`;
wall time {wall:.1f} min on a 2-core machine. The corpus is the running interpreter's standard
library, so rebuilding on another Python version gives different (but equivalent) assets.{reuse_note}

"""


def measurements_section(args, *, losses, agreement, n_agree, timings, tc, dc) -> str:
    """Losses, greedy agreement and forward timings on held-out data, and why the models have their shapes."""
    rows = "\n".join(f"| {name} | {b} | {k} | {ms:.2f} |" for (name, b, k), ms in timings.items())
    final_losses = ", ".join(f"{what} {losses[key]:.3f}" for what, key in (
        ("target", "target_train_loss"), ("draft KL to target on windows", "draft_train_kl"),
        ("draft KL to target on its continuations", "continuation_kl")) if losses[key] is not None)
    return f"""## Measurements (held-out data)

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
