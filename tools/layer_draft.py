"""A draft model cut from the target itself: its first N decoder layers, its final norm and its head.

    python tools/layer_draft.py --target ~/.cache/batchspec/smollm2 --layers 6 --out /work/heldout/smollm2-l6

No training: the draft reads the target's embeddings and early layers and jumps to its head (the
self-speculative drafts of LayerSkip and Draft & Verify, without their fine-tuning). It shares the
target's tokenizer, so any target with a `model.layers` list (Llama, Qwen2, Mistral, Gemma...) gets a
draft nothing was fitted on, with an acceptance of its own: the held-out grid uses it as a pair that no
part of the controller was tuned on. The tokenizer files are copied beside it.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM


def cut(target: str, layers: int, out: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    blocks = model.model.layers
    if not 0 < layers < len(blocks):
        raise SystemExit(f"--layers {layers}: the target has {len(blocks)} layers; keep 1 to {len(blocks) - 1}")
    model.model.layers = torch.nn.ModuleList(list(blocks)[:layers])
    model.config.num_hidden_layers = layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:layers]
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                 "generation_config.json"):
        if (Path(target) / name).exists():
            shutil.copy(Path(target) / name, out / name)
    print(f"{out}: the first {layers} of {len(blocks)} layers of {target}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="a local model folder")
    parser.add_argument("--layers", type=int, required=True, help="how many of its first layers the draft keeps")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    cut(args.target, args.layers, args.out)


if __name__ == "__main__":
    main()
