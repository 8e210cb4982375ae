"""A random-weight target/draft pair with real model shapes and a chosen acceptance rate, for cost benchmarks.

    python tools/synthetic_pair.py --out /tmp/pair --shape llama-3.2-3b --draft-layers 8 --alpha 0.7 \
        --dtype bfloat16 --device cuda
    python -m batchspec.bench --target /tmp/pair/target --draft /tmp/pair/draft --prompts /tmp/pair/prompts.parquet \
        --device cuda --dtype bfloat16 --batch-size 16

Random weights are fine for measuring cost, but a random draft never agrees with a random target. So the
draft *is* the target's first `--draft-layers` layers (embeddings, those layers and the tied LM head
shared exactly; the final norm copied), and two knobs set how often they agree:

- the target's remaining layers write into the residual stream scaled by s in [0, 1]: at s = 0 the
  target computes exactly what the draft does (every draft accepted), at s = 1 it is a plain random model;
- the draft's final-norm weights get multiplicative noise of scale sigma, which moves its argmax away.

The tool bisects s (when the wanted agreement is above what s = 1 gives) or sigma (when below) until
the draft's greedy token equals the target's at the requested share of positions (`--alpha`),
measured teacher-forced on the target's own greedy continuations of the prompts.

With `--shape llama-3.2-3b` the target has Llama-3.2-3B's shapes (hidden 3072, 28 layers, 24 heads,
8 KV heads, MLP 8192, vocab 128256, tied embeddings) and an 8-layer draft has ~1.2B parameters, the cost
class of Llama-3.2-1B. The tokenizer is the demo pair's (4096 tokens); embedding rows past it are zero,
so their logits are exactly 0 and never beat the real tokens' under greedy decoding (the
full-vocabulary LM head is still computed, so the cost is the real one). Greedy only: with sampling
the ~124k zero-logit tokens would swamp the 4096 real ones. Prompts: the demo's held-out code prompts.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

DEMO = Path(__file__).resolve().parents[1] / "batchspec" / "assets" / "demo"

SHAPES = {
    # hidden, layers, heads, kv heads, MLP, vocab
    "llama-3.2-3b": (3072, 28, 24, 8, 8192, 128256),
    "llama-3.2-1b": (2048, 16, 32, 8, 8192, 128256),
    "tiny": (128, 6, 4, 2, 344, 4608),  # for tests on CPU
}


def target_config(shape: str) -> LlamaConfig:
    hidden, layers, heads, kv, mlp, vocab = SHAPES[shape]
    return LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv, intermediate_size=mlp, max_position_embeddings=8192, rope_theta=500000.0,
        tie_word_embeddings=True, bos_token_id=0, eos_token_id=1, pad_token_id=2,
    )


def build(shape: str, draft_layers: int, real_vocab: int, seed: int, dtype: torch.dtype, device: str):
    """(target, draft, knobs) with the draft sharing the target's first layers; see `set_knobs`."""
    config = target_config(shape)
    if not 1 <= draft_layers < config.num_hidden_layers:
        raise SystemExit(f"--draft-layers must be in [1, {config.num_hidden_layers - 1}], got {draft_layers}")
    torch.manual_seed(seed)
    with torch.device(device):
        target = LlamaForCausalLM(config).to(dtype).eval()
    with torch.no_grad():
        target.model.embed_tokens.weight[real_vocab:] = 0  # logits exactly 0: never the argmax
    draft_config = LlamaConfig(**{**config.to_dict(), "num_hidden_layers": draft_layers})
    with torch.device("meta"):
        draft = LlamaForCausalLM(draft_config)
    draft.model.embed_tokens = target.model.embed_tokens
    draft.model.layers = torch.nn.ModuleList(target.model.layers[:draft_layers])
    draft.model.rotary_emb = target.model.rotary_emb
    draft.model.norm = type(target.model.norm)(config.hidden_size, eps=config.rms_norm_eps).to(device)
    draft.lm_head = target.lm_head
    draft = draft.to(dtype).eval()
    extra = list(target.model.layers[draft_layers:])
    originals = [(layer.self_attn.o_proj.weight.detach().clone(), layer.mlp.down_proj.weight.detach().clone())
                 for layer in extra]
    norm_noise = torch.randn(config.hidden_size, generator=torch.Generator().manual_seed(seed + 1)).to(device)
    for model in (target, draft):
        model.generation_config.bos_token_id, model.generation_config.eos_token_id = 0, 1
        model.generation_config.pad_token_id = 2
    return target, draft, (extra, originals, target.model.norm.weight, draft.model.norm.weight, norm_noise)


@torch.no_grad()
def set_knobs(knobs, s: float, sigma: float) -> None:
    """Scale the target's own layers' residual writes by s; the draft's final norm = target's * (1 + sigma noise)."""
    layers, originals, target_norm, draft_norm, noise = knobs
    for layer, (o, down) in zip(layers, originals):
        layer.self_attn.o_proj.weight.copy_(o * s)
        layer.mlp.down_proj.weight.copy_(down * s)
    draft_norm.copy_(target_norm * (1 + sigma * noise).to(draft_norm.dtype))


@torch.no_grad()
def agreement(target, draft, prompts: list[list[int]], new_tokens: int) -> float:
    """Share of positions where the draft's greedy token equals the target's, on the target's continuations."""
    hits = total = 0
    for ids in prompts:
        x = torch.tensor([ids], device=target.device)
        seq = target.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, pad_token_id=2)
        n = seq.shape[1] - x.shape[1]
        want = seq[0, x.shape[1]:]
        got = draft(seq[:, :-1]).logits[0, -n:].argmax(-1)
        hits += int((got == want).sum())
        total += n
    return hits / total


def bisect(measure, lo: float, hi: float, alpha: float, decreasing: bool, steps: int):
    """Find x in [lo, hi] with measure(x) ~ alpha, measure monotone; returns (x, measured)."""
    best = (lo, -1.0)
    for _ in range(steps):
        mid = (lo + hi) / 2
        a = measure(mid)
        if abs(a - alpha) < abs(best[1] - alpha):
            best = (mid, a)
        if (a > alpha) == decreasing:
            lo = mid
        else:
            hi = mid
    return best


def calibrate_knobs(target, draft, knobs, prompts, alpha: float, new_tokens: int, steps: int = 12):
    """Set (s, sigma) so that greedy agreement ~ alpha; returns (s, sigma, measured agreement)."""
    def measure(s, sigma):
        set_knobs(knobs, s, sigma)
        a = agreement(target, draft, prompts, new_tokens)
        print(f"  s {s:.4g}, sigma {sigma:.4g}: agreement {a:.3f}", flush=True)
        return a

    natural = measure(1.0, 0.0)
    if natural >= alpha:  # add draft noise: sigma on a log scale in [1e-3, 1e3]
        x, a = bisect(lambda x: measure(1.0, math.exp(x)), math.log(1e-3), math.log(1e3), alpha, True, steps)
        s, sigma = 1.0, math.exp(x)
    else:  # bring the target closer to the draft
        s, a = bisect(lambda x: measure(x, 0.0), 0.0, 1.0, alpha, True, steps)
        sigma = 0.0
    set_knobs(knobs, s, sigma)
    return s, sigma, a


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.2-3b")
    p.add_argument("--draft-layers", type=int, default=8)
    p.add_argument("--alpha", type=float, default=0.7, help="wanted greedy agreement of draft and target")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="bfloat16")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--calibration-prompts", type=int, default=32)
    p.add_argument("--calibration-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    t0 = time.time()
    tokenizer = AutoTokenizer.from_pretrained(DEMO / "target")
    target, draft, extra = build(args.shape, args.draft_layers, len(tokenizer), args.seed,
                                 getattr(torch, args.dtype), args.device)
    n_t = sum(p.numel() for p in target.parameters())
    n_d = sum(p.numel() for p in draft.parameters())
    print(f"target {args.shape}: {n_t / 1e9:.2f}B params; draft = its first {args.draft_layers} layers: "
          f"{n_d / 1e9:.2f}B params ({time.time() - t0:.0f}s)", flush=True)
    import pyarrow.parquet as pq

    prompts = pq.read_table(DEMO / "prompts.parquet", columns=["prompt"]).column("prompt").to_pylist()
    # The bench's prompts (its --num-prompts first ones): agreement of random models varies a lot by prompt.
    calib = [tokenizer(t)["input_ids"] for t in prompts[: args.calibration_prompts]]
    s, sigma, a = calibrate_knobs(target, draft, extra, calib, args.alpha, args.calibration_tokens)
    print(f"s {s:.4g}, sigma {sigma:.4g}: greedy agreement {a:.3f} (wanted {args.alpha})", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(args.out / name)
        tokenizer.save_pretrained(args.out / name)
    shutil.copy(DEMO / "prompts.parquet", args.out / "prompts.parquet")
    (args.out / "README.md").write_text(
        f"Synthetic pair (tools/synthetic_pair.py {' '.join(sys.argv[1:] if argv is None else argv)}): target "
        f"{args.shape} ({n_t / 1e9:.2f}B), draft its first {args.draft_layers} layers ({n_d / 1e9:.2f}B), random "
        f"weights, s {s:.4g}, sigma {sigma:.4g}, greedy agreement {a:.3f}.\n")
    print(f"saved to {args.out} ({time.time() - t0:.0f}s)", flush=True)


if __name__ == "__main__":
    main()
