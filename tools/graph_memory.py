"""The captured path's device memory besides weights and KV caches, as computed (engine/model/memory.py) for a
model shape: what docs/benchmarks.md's GPU section quotes. Needs only torch and transformers.

    python tools/graph_memory.py                         # Llama-3.2-3B shapes, 128k vocabulary, batch 64, bf16
    python tools/graph_memory.py --shape tiny --batch-size 8 --k 4 --max-seq-len 512 --draft-layers 1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from synthetic_pair import SHAPES, target_config  # noqa: E402

from batchspec.engine.model.memory import MiB, Shape, estimate, fit_buckets  # noqa: E402
from batchspec.engine.model.shapes import kv_buckets, kv_capacity  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.2-3b")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--max-seq-len", type=int, default=2048)
    p.add_argument("--dtype-bytes", type=int, default=2, help="2 for bf16/fp16, 4 for fp32")
    p.add_argument("--draft-layers", type=int, default=0, help="a draft of the target's first N layers (0: none)")
    p.add_argument("--budget-mib", type=int, help="a memory budget: the buckets that fit")
    p.add_argument("--sampling", action="store_true", help="coupled sampling's noise buffer too")
    p.add_argument("--unpacked", action="store_true", help="verifies unpacked (build_generator's pack_static=False)")
    args = p.parse_args(argv)
    config = target_config(args.shape)
    target = Shape.of(config)
    draft = None
    if args.draft_layers:
        config.num_hidden_layers = args.draft_layers
        draft = Shape.of(config)
    buckets = kv_buckets(kv_capacity(args.max_seq_len, args.k))
    widths = list(range(1, args.k + 2))

    def memory(b):
        return estimate(target, num_slots=args.batch_size, widths=widths, buckets=b, dtype_bytes=args.dtype_bytes,
                        draft=draft, draft_steps=args.k, noise=args.sampling,
                        packed_chain=0 if args.unpacked else args.k + 1)

    print(f"{args.shape} (vocab {target.vocab}), batch {args.batch_size}, k {args.k}, max_seq_len {args.max_seq_len}, "
          f"{args.dtype_bytes}-byte weights{f', draft of {args.draft_layers} layers' if draft else ''}")
    print(f"  buckets {buckets}: {memory(buckets)}")
    kv = 2 * (args.batch_size + 1) * buckets[-1] * target.kv_heads * target.head_dim * target.layers * args.dtype_bytes
    print(f"  (the target's KV cache, for comparison: {kv / MiB:,.0f} MiB)")
    if args.budget_mib:
        try:
            chosen, m = fit_buckets(buckets, args.budget_mib * MiB, memory)
            print(f"  within {args.budget_mib:,} MiB: buckets {chosen}: {m}")
        except ValueError as e:  # CaptureError
            print(f"  within {args.budget_mib:,} MiB: {e}")


if __name__ == "__main__":
    main()
