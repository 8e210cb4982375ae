"""Sliding-window layers on Gemma-3-270M at 8 rows x 2,048 positions: the whole slot cache masked (batchspec's
layout) against a cache bounded by the window (what a per-layer ring buffer holds: HF's DynamicCache keeps a
windowed layer's last `sliding_window` positions), and the same HF model with every layer global, side by side.
Prints KV memory and decode-step times at 512 and 2,048 cached positions, medians of 7 steps (docs/benchmarks.md,
"Sliding windows"). About 3 minutes on 2 cores, once the model is converted (tools/gemma3.py).

    python tools/window_cache.py
"""

import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM
from transformers.cache_utils import DynamicCache
from batchspec.engine.graphs import StepGraphs
from batchspec.engine.packed import RowTokens
from batchspec.engine.runner import ModelRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gemma3  # noqa: E402

PATH = str(gemma3.ensure())
B, CONTEXTS, STEPS = 8, (512, 2048), 7
model = AutoModelForCausalLM.from_pretrained(PATH, dtype=torch.float32).eval()
text = model.config.get_text_config()
print("layers", text.num_hidden_layers, "sliding", sum(t == "sliding_attention" for t in text.layer_types),
      "window", text.sliding_window, "attn", model.config._attn_implementation)
torch.manual_seed(0)
ids = torch.randint(100, 20000, (B, max(CONTEXTS) + STEPS + 8))

def mib(n): return f"{n / 2**20:.0f} MiB"

# batchspec: the whole slot cache, windowed layers masked
runner = ModelRunner(model, num_slots=B, capacity=max(CONTEXTS) + 64, max_position=max(CONTEXTS) + 64,
                     graphs=StepGraphs(None, model.device), name="target")
ours = {}
with torch.inference_mode():
    for L in CONTEXTS:
        runner.reset_lengths()
        for s in range(B):  # prefill each slot in chunks of 256
            for a in range(0, L, 256):
                runner.forward_packed(ids[s, a:a + 256], runner.pack([RowTokens(s, a, min(256, L - a))]))
        times = {}
        for width in (1, 5):
            samples = []
            for step in range(STEPS):
                batch = runner.pack([RowTokens(s, L, width) for s in range(B)])
                tokens = ids[:, L:L + width].reshape(-1)
                t = time.perf_counter(); runner.forward_packed(tokens, batch); samples.append(time.perf_counter() - t)
            times[width] = statistics.median(samples)
        ours[L] = times
kv = sum(layer.keys.numel() + layer.values.numel() for layer in runner.cache.layers if layer.is_initialized) * 4
print(f"batchspec (whole cache, masked): KV {mib(kv)} for {B} slots x {runner.capacity} positions")
del runner

# HF: the windowed layers' cache bounded by the window; and the same model with every layer global (what a
# whole cache costs in the same engine)
def hf(full: bool):
    m = model
    if full:
        m = AutoModelForCausalLM.from_pretrained(PATH, dtype=torch.float32,
                                                 layer_types=["full_attention"] * text.num_hidden_layers).eval()
    out = {}
    with torch.inference_mode():
        for L in CONTEXTS:
            cache = DynamicCache(config=m.config)
            for a in range(0, L, 256):
                m(input_ids=ids[:, a:a + 256], past_key_values=cache, use_cache=True, logits_to_keep=1)
            samples = []
            for step in range(STEPS):
                t = time.perf_counter()
                m(input_ids=ids[:, L + step:L + step + 1], past_key_values=cache, use_cache=True, logits_to_keep=1)
                samples.append(time.perf_counter() - t)
            size = sum(l.keys.numel() + l.values.numel() for l in cache.layers if getattr(l, "keys", None) is not None) * 4
            out[L] = (statistics.median(samples), size)
    return out

ring, full = hf(False), hf(True)
print(f"{'positions':>9} | batchspec 8x1 | batchspec 8x5 | HF window cache 8x1 (KV) | HF all-global 8x1 (KV)")
for L in CONTEXTS:
    print(f"{L:>9} | {ours[L][1]*1e3:8.0f} ms | {ours[L][5]*1e3:8.0f} ms | {ring[L][0]*1e3:6.0f} ms ({mib(ring[L][1])}) "
          f"| {full[L][0]*1e3:6.0f} ms ({mib(full[L][1])})")
