"""Which attention a packed forward should use on CPU: the candidates side by side on the same forwards.

    python tools/packed_attention.py                       # the demo target, batch 8 / 32 / 64
    python tools/packed_attention.py --target DIR --batch-size 8,64 --context 300

Each row of a packed forward verifies its own tokens over its own cached prefix; rows alternate between 1
and 5 tokens (a row drafting nothing next to one drafting 4), every prefix --context tokens long. Whole
target forwards are timed (median of --repeats after 3 warm-ups), interleaved:

  grouped        batchspec's packed_attention: a per-row layout [b, H, T, D] over each row's own cache, the
                 query heads that share a key head stacked along the query axis (no copy of keys);
  repeat-kv      the same per-row layout through transformers' sdpa_attention_forward, which repeats every
                 key and value head for the query heads sharing it once a row has more than one query;
  block-diagonal one attention over all N tokens against every row's keys laid end to end, masked to each
                 row's own (the layout of transformers' continuous batching with sdpa or eager): N x sum(kv)
                 scores, b times the per-row layout's;
  padded         today's eager round without packing: every row padded to the widest (5 tokens), a 4D
                 mask, transformers' sdpa.
Ratios are against `grouped` within one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from batchspec.engine.model import packed  # noqa: E402
from batchspec.engine.model.graphs import StepGraphs  # noqa: E402
from batchspec.engine.model.packed import RowTokens, pack  # noqa: E402
from batchspec.engine.model.runner import ModelRunner  # noqa: E402


def repeat_kv(module, query, key, value, attention_mask, *, packed=None, scaling=None, dropout=0.0, **kwargs):
    """The per-row layout through transformers' own sdpa (keys and values repeated per query head)."""
    q = query[0].transpose(0, 1)
    out = q.new_empty(q.shape)
    for group in packed.groups:
        qg = q[group.query].transpose(1, 2)
        kg, vg = key[group.rows, :, : group.kv_len], value[group.rows, :, : group.kv_len]
        og, _ = sdpa_attention_forward(module, qg, kg, vg, group.mask, scaling=scaling, dropout=dropout)
        out[group.put] = og.reshape(-1, q.shape[1], q.shape[2])[group.take]
    return out[None], None


def block_diagonal(module, query, key, value, attention_mask, *, packed=None, scaling=None, dropout=0.0, **kwargs):
    """One attention over all N queries against every row's keys end to end, a block-diagonal mask."""
    rows = packed.rows
    slots = torch.tensor([r.slot for r in rows])
    lengths = [r.start + r.count for r in rows]
    keys = torch.cat([key[s, :, :n] for s, n in zip(slots.tolist(), lengths)], dim=1)[None]  # [1, H_kv, sum, D]
    values = torch.cat([value[s, :, :n] for s, n in zip(slots.tolist(), lengths)], dim=1)[None]
    owner = torch.tensor([i for i, r in enumerate(rows) for _ in range(r.count)])
    index = packed.index  # each query's own cache index
    key_owner = torch.tensor([i for i, n in enumerate(lengths) for _ in range(n)])
    key_index = torch.tensor([j for n in lengths for j in range(n)])
    allowed = (owner[:, None] == key_owner[None, :]) & (key_index[None, :] <= index[:, None])
    mask = torch.zeros(allowed.shape, dtype=query.dtype).masked_fill_(~allowed, torch.finfo(query.dtype).min)
    out, _ = sdpa_attention_forward(module, query, keys, values, mask[None, None], scaling=scaling, dropout=dropout)
    return out, None


def timed(run, repeats: int) -> float:
    for _ in range(3):
        run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=str(HERE / "batchspec" / "assets" / "demo" / "target"))
    parser.add_argument("--batch-size", default="8,32,64")
    parser.add_argument("--context", type=int, default=150, help="cached tokens per row")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    original = packed.packed_attention
    variants = {"grouped": original, "repeat-kv": repeat_kv, "block-diagonal": block_diagonal}
    print(f"{args.target}: whole forwards, rows of 1 and 5 tokens over {args.context} cached tokens each, "
          f"median of {args.repeats} (ms; ratio to grouped)")
    for batch in [int(b) for b in args.batch_size.split(",")]:
        runner = ModelRunner(model, num_slots=batch, capacity=args.context + 8, max_position=4096,
                             graphs=StepGraphs(None, torch.device("cpu")))
        runner.set_lengths(slice(None, batch), args.context)
        widths = [1 if s % 2 else 5 for s in range(batch)]
        rows = [RowTokens(s, args.context, w) for s, w in enumerate(widths)]
        ids = torch.randint(3, runner.vocab_size, (sum(widths),))
        batch_ = pack(rows, device=model.device, dtype=model.dtype, keep=list(range(sum(widths))))
        padded = torch.randint(3, runner.vocab_size, (batch, 5))
        times = {}
        for name, function in variants.items():
            packed.packed_attention = function
            packed.AttentionInterface.register(packed.ATTENTION, function)
            try:
                times[name] = timed(lambda: runner.forward_packed(ids, batch_), args.repeats)
            finally:
                packed.AttentionInterface.register(packed.ATTENTION, original)
                packed.packed_attention = original
        times["padded"] = timed(lambda: runner.forward(padded, kv_len=args.context + 5, rows=slice(0, batch)),
                                args.repeats)
        print(f"  batch {batch:3d} ({sum(widths)} tokens): " + ", ".join(
            f"{name} {1000 * t:.1f} ({t / times['grouped']:.2f}x)" for name, t in times.items()), flush=True)


if __name__ == "__main__":
    main()
