"""Sliding-window layers on Gemma-3-270M at 8 rows x 2,048 positions: the whole slot cache masked (batchspec's
layout) against a cache bounded by the window (what a per-layer ring buffer holds: HF's DynamicCache keeps a
windowed layer's last `sliding_window` positions), and the same HF model with every layer global, side by side.
Prints KV memory and decode-step times at 512 and 2,048 cached positions, medians of 7 steps (docs/benchmarks.md,
"Sliding windows"). About 3 minutes on 2 cores, once the model is converted (tools/gemma3.py).

    python tools/window_cache.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM
from transformers.cache_utils import DynamicCache

from batchspec.engine.model.graphs import StepGraphs
from batchspec.engine.model.packed import RowTokens
from batchspec.engine.model.runner import ModelRunner
from batchspec.engine.model.timing import median_seconds

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gemma3  # noqa: E402

ROWS, CONTEXTS, STEPS, CHUNK = 8, (512, 2048), 7, 256


def mib(tensors) -> str:
    return f"{sum(t.numel() * t.element_size() for t in tensors) / 2**20:.0f} MiB"


@torch.inference_mode()
def batchspec_steps(model, ids: torch.Tensor) -> tuple[dict[int, dict[int, float]], str]:
    """Per cached length L: the median seconds of a packed forward of 1 and of 5 tokens on every row at L
    (the forward leaves the lengths as they are, so each repeat is the same step); and the cache's size."""
    runner = ModelRunner(model, num_slots=ROWS, capacity=max(CONTEXTS) + 64, max_position=max(CONTEXTS) + 64,
                         graphs=StepGraphs(None, model.device), name="target")
    out = {}
    for length in CONTEXTS:
        runner.reset_lengths()
        for slot in range(ROWS):
            for start in range(0, length, CHUNK):
                count = min(CHUNK, length - start)
                runner.forward_packed(ids[slot, start:start + count], runner.pack([RowTokens(slot, start, count)]))
        out[length] = {}
        for width in (1, 5):
            batch = runner.pack([RowTokens(slot, length, width) for slot in range(ROWS)])
            tokens = ids[:, length:length + width].reshape(-1)
            out[length][width] = median_seconds(lambda: runner.forward_packed(tokens, batch), model.device, STEPS)
    layers = [layer for layer in runner.cache.layers if layer.is_initialized]
    return out, mib([t for layer in layers for t in (layer.keys, layer.values)])


@torch.inference_mode()
def hf_steps(model, ids: torch.Tensor) -> dict[int, tuple[float, str]]:
    """Per cached length L: HF's median decode step (one token a row, the cache growing from L) and its cache's
    size after them."""
    out = {}
    for length in CONTEXTS:
        cache = DynamicCache(config=model.config)
        for start in range(0, length, CHUNK):
            model(input_ids=ids[:, start:start + CHUNK], past_key_values=cache, use_cache=True, logits_to_keep=1)
        samples = []
        for step in range(STEPS):
            started = time.perf_counter()
            model(input_ids=ids[:, length + step:length + step + 1], past_key_values=cache, use_cache=True,
                  logits_to_keep=1)
            samples.append(time.perf_counter() - started)
        layers = [layer for layer in cache.layers if getattr(layer, "keys", None) is not None]
        out[length] = (statistics.median(samples), mib([t for layer in layers for t in (layer.keys, layer.values)]))
    return out


def main() -> None:
    path = str(gemma3.ensure())
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    text = model.config.get_text_config()
    print("layers", text.num_hidden_layers, "sliding", text.layer_types.count("sliding_attention"),
          "window", text.sliding_window, "attention", model.config._attn_implementation)
    torch.manual_seed(0)
    ids = torch.randint(100, 20000, (ROWS, max(CONTEXTS) + STEPS + 8))
    ours, ours_kv = batchspec_steps(model, ids)
    print(f"batchspec (whole cache, masked): KV {ours_kv} for {ROWS} slots (+1 scratch) x {max(CONTEXTS) + 64} positions")
    bounded = hf_steps(model, ids)
    # The same weights with every layer global: what the whole cache costs in HF's engine.
    every_global = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, layer_types=["full_attention"] * text.num_hidden_layers).eval()
    full = hf_steps(every_global, ids)
    print(f"{'positions':>9} | batchspec 8x1 | batchspec 8x5 | HF window cache 8x1 (KV) | HF all-global 8x1 (KV)")
    for length in CONTEXTS:
        print(f"{length:>9} | {ours[length][1] * 1e3:8.0f} ms | {ours[length][5] * 1e3:8.0f} ms | "
              f"{bounded[length][0] * 1e3:6.0f} ms ({bounded[length][1]}) | "
              f"{full[length][0] * 1e3:6.0f} ms ({full[length][1]})")


if __name__ == "__main__":
    main()
