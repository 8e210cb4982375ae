"""Calibrate speculation for a pair and a workload: alpha, the cost curve, and the best k per batch size.

    python -m batchspec.calibrate                              # demo pair, model drafter
    python -m batchspec.calibrate --target T --draft D --prompts p.parquet --drafter ngram --batch-sizes 1,8,32

The tuning checklist as a command:
  1. measure alpha (the per-draft acceptance probability) on a sample of the job's prompts;
  2. measure the cost curve: one target forward of T = 1..k_max+1 tokens per row, and one draft
     forward of 1 token, at each batch size;
  3. predict, for every k, speedup(k) = E(alpha, k) * t_target(1) / (t_target(k+1) + k * t_draft(1))
     with E(alpha, k) = (1 - alpha^(k+1)) / (1 - alpha) tokens per round — Leviathan's formula with a
     verify pass that is not free — and recommend the best k (0 = do not speculate);
  4. run the sample at the recommended k and with drafter none, and print measured vs predicted.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from ..api import build_generator
from ..engine.drafters.head_model import HeadAsModel
from ..engine.drafters.registry import DRAFTERS, load_paths
from ..engine.model.graphs import StepGraphs
from ..engine.model.runner import ModelRunner
from ..engine.model.timing import median_seconds, time_step
from ..engine.model.models import Models, load_models
from ..sources import open_source
from ..sources.prompts import check_messages
from ..engine.types import Request
from ..util.files import atomic_write_text

DEMO = Path(__file__).resolve().parents[1] / "assets" / "demo"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def forward_ms(model, batch_size: int, width: int, context: int, repeats: int = 5, capture: str | None = None) -> float:
    """Median ms of one forward of `width` tokens per row for `batch_size` rows with `context` cached
    (a static step over every slot; captured first when `capture` says so, as the generator does)."""
    capacity = context + width + 1
    graphs = StepGraphs(capture, model.device)
    runner = ModelRunner(model, num_slots=batch_size, capacity=capacity, max_position=capacity, graphs=graphs,
                         widths=[width], name="calibrate")
    tokens = torch.zeros(batch_size, width, dtype=torch.long, device=model.device)
    runner.static_steps.declare(tokens, torch.zeros(batch_size, capacity, dtype=torch.long, device=model.device))
    graphs.capture_all()
    ids = torch.randint(3, 100, (batch_size, context), device=model.device)
    runner.prefill(list(range(batch_size)), ids, [0] * batch_size, [context] * batch_size)
    return 1000 * time_step(runner, width, context + width, repeats=repeats)


@torch.inference_mode()
def head_ms(head, target_vocab: int, batch_size: int, context: int, repeats: int = 5) -> float:
    """Median ms of one EAGLE-3 head step (1 token per row, its own hidden state in) over `context` cached
    entries: the eagle drafter's cost per drafted token."""
    model = HeadAsModel(head, target_vocab)
    runner = ModelRunner(model, num_slots=batch_size, capacity=context + 2, max_position=context + 2,
                         graphs=StepGraphs(None, model.device), name="head")
    hidden = torch.zeros(batch_size, context, head.config.feature_size, dtype=model.dtype, device=model.device)
    ids = torch.randint(3, 100, (batch_size, context), device=model.device)
    rows = list(range(batch_size))
    runner.prefill(rows, ids, [0] * batch_size, [context] * batch_size, extra={"hidden": hidden})
    own = torch.zeros(batch_size, 1, head.config.hidden_size, dtype=model.dtype, device=model.device)
    rows_t = torch.arange(batch_size, device=model.device)
    step = lambda: runner.forward(ids[:, :1], kv_len=context + 1, rows=rows_t, extra={"hidden": own})  # noqa: E731
    return 1000 * median_seconds(step, model.device, repeats)


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens per round with k drafts each kept with probability alpha until the first rejection."""
    return k + 1.0 if alpha >= 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)


def predicted_speedup(alpha: float, k: int, target_ms: list[float], draft_ms: float) -> float:
    """target_ms[t] = one target forward of t+1 tokens per row; speedup over plain decoding."""
    return expected_tokens(alpha, k) * target_ms[0] / (target_ms[k] + k * draft_ms)


def read_prompts(path: str, limit: int, column: str = "prompt", split: str = "train",
                 messages: bool = False) -> list:
    """The first `limit` text prompts of `column` in any input a job can read: a Parquet file, folder or
    glob, a saved or local Hugging Face dataset, a JSONL file. Rows without a text prompt are skipped; with
    `messages`, chat message lists ([{role, content}, ...]) count as prompts too."""
    source = open_source(path, "auto", split, {column: "--prompt-column"})
    prompts = []
    for _, values in source.rows(0, 1, None):
        prompt = values.get(column) if isinstance(values, dict) else None
        text = isinstance(prompt, str) and prompt.strip()
        if text or (messages and not isinstance(prompt, str) and check_messages(prompt) is None):
            prompts.append(prompt if text else [dict(m) for m in prompt])
            if len(prompts) == limit:
                break
    if not prompts:
        raise ValueError(f"{path}: no {'text or chat' if messages else 'text'} prompts in column {column!r}")
    return prompts


def measure_rate(models: Models, prompts: list[str], *, drafter: str, k: int, batch_size: int,
                 max_new_tokens: int, max_seq_len: int):
    """(tokens/s, RunStats) of one greedy run over `prompts` at a fixed k."""
    generator = build_generator(models, drafter=drafter, k=k, batch_size=batch_size, max_new_tokens=max_new_tokens,
                                max_seq_len=max_seq_len, adaptive=False)
    sync(models.target.device)
    t0 = time.perf_counter()
    for _ in generator.run(Request(str(i), p) for i, p in enumerate(prompts)):
        pass
    sync(models.target.device)
    return generator.stats.completion_tokens / (time.perf_counter() - t0), generator.stats


def calibrate(models: Models, prompts: list[str], *, drafter: str, k_max: int, batch_sizes: list[int],
              max_new_tokens: int, max_seq_len: int, measure_batch_size: int) -> dict:
    _, stats = measure_rate(models, prompts, drafter=drafter, k=k_max, batch_size=measure_batch_size,
                            max_new_tokens=max_new_tokens, max_seq_len=max_seq_len)
    alpha = stats.alpha or 0.0
    context = int(stats.prompt_tokens / max(stats.requests, 1) + max_new_tokens / 2)
    curves = {}
    for b in batch_sizes:
        target_ms = [forward_ms(models.target, b, t, context) for t in range(1, k_max + 2)]
        draft_ms = (forward_ms(models.draft, b, 1, context) if drafter == "model" else
                    head_ms(models.head, models.target.get_output_embeddings().weight.shape[0], b, context)
                    if drafter == "eagle" else 0.0)
        speedups = [predicted_speedup(alpha, k, target_ms, draft_ms) for k in range(k_max + 1)]
        best = max(range(k_max + 1), key=lambda k: speedups[k])
        curves[b] = {"target_ms": target_ms, "draft_ms": draft_ms, "c": draft_ms / target_ms[0],
                     "predicted_speedup": speedups, "best_k": best}
    best_k = curves[measure_batch_size]["best_k"] if measure_batch_size in curves else k_max
    rate_none, _ = measure_rate(models, prompts, drafter="none", k=0, batch_size=measure_batch_size,
                                max_new_tokens=max_new_tokens, max_seq_len=max_seq_len)
    rate_best, _ = (measure_rate(models, prompts, drafter=drafter, k=best_k, batch_size=measure_batch_size,
                                 max_new_tokens=max_new_tokens, max_seq_len=max_seq_len)
                    if best_k > 0 else (rate_none, None))
    return {
        "drafter": drafter, "alpha": alpha, "acceptance_rate": stats.acceptance_rate,
        "acceptance_by_position": stats.acceptance_by_position, "tokens_per_forward_at_k_max": stats.tokens_per_forward,
        "context_tokens": context, "curves": curves, "measure_batch_size": measure_batch_size, "best_k": best_k,
        "measured_tokens_per_s": {"none": rate_none, f"k={best_k}": rate_best},
        "measured_speedup": rate_best / rate_none, "predicted_speedup": curves.get(measure_batch_size, {}).get(
            "predicted_speedup", [1.0] * (best_k + 1))[best_k],
    }


def report(result: dict) -> str:
    k_max = len(next(iter(result["curves"].values()))["target_ms"]) - 1
    lines = [
        f"drafter {result['drafter']}: alpha = {result['alpha']:.3f} (per-draft acceptance, geometric fit); "
        f"acceptance rate at k={k_max}: {result['acceptance_rate'] or 0:.3f}; acceptance by position: "
        + ", ".join("-" if a is None else f"{a:.2f}" for a in result["acceptance_by_position"]),
        f"cost curve (ms per forward, ~{result['context_tokens']} tokens cached):",
        "| batch | target 1 tok | " + " | ".join(f"{t} tok" for t in range(2, k_max + 2))
        + " | draft 1 tok | c | " + " | ".join(f"k={k}" for k in range(k_max + 1)) + " | best k |",
        "|---:|---:|" + "---:|" * k_max + "---:|---:|" + "---:|" * (k_max + 1) + "---:|",
    ]
    for b, curve in result["curves"].items():
        ms = curve["target_ms"]
        lines.append(
            f"| {b} | {ms[0]:.2f} | " + " | ".join(f"{m:.2f} (x{m / ms[0]:.2f})" for m in ms[1:])
            + f" | {curve['draft_ms']:.2f} | {curve['c']:.2f} | "
            + " | ".join(f"{s:.2f}" for s in curve["predicted_speedup"]) + f" | {curve['best_k']} |"
        )
    rates = result["measured_tokens_per_s"]
    lines.append(
        f"recommended k at batch {result['measure_batch_size']}: {result['best_k']}; measured "
        + ", ".join(f"{name} {rate:.1f} tok/s" for name, rate in rates.items())
        + f" -> speedup {result['measured_speedup']:.2f} (predicted {result['predicted_speedup']:.2f})"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=str(DEMO / "target"))
    parser.add_argument("--draft", default=str(DEMO / "draft"))
    parser.add_argument("--drafter", default="model", choices=[d for d in DRAFTERS if d != "none"])
    parser.add_argument("--head", default=str(DEMO / "eagle"), help="the eagle drafter's EAGLE-3 head folder")
    parser.add_argument("--prompts", default=str(DEMO / "prompts.parquet"),
                        help="any job source: Parquet file/folder/glob, saved or local HF dataset, JSONL")
    parser.add_argument("--prompt-column", default="prompt")
    parser.add_argument("--split", default="train", help="for Hugging Face datasets")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-seq-len", type=int, default=512)
    parser.add_argument("--k-max", type=int, default=6)
    parser.add_argument("--batch-sizes", default="1,4,8,16")
    parser.add_argument("--batch-size", type=int, default=8, help="batch size of the measured runs")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--json", help="write the result as JSON here")
    args = parser.parse_args(argv)
    try:
        prompts = read_prompts(args.prompts, args.num_prompts, args.prompt_column, args.split)
    except ValueError as e:  # SourceError included
        parser.error(f"--prompts: {e}")
    draft_model, head = load_paths(args.drafter, args.draft, head=args.head)
    models = load_models(args.target, draft_model, dtype=args.dtype, device=args.device, head=head)
    result = calibrate(
        models, prompts, drafter=args.drafter, k_max=args.k_max,
        batch_sizes=[int(b) for b in args.batch_sizes.split(",")], max_new_tokens=args.max_new_tokens,
        max_seq_len=args.max_seq_len, measure_batch_size=args.batch_size,
    )
    print(report(result))
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
