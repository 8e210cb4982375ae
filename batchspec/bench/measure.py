"""The benchmark's measurement (python -m batchspec.bench): one batch size, every contender, timed.

`bench_batch_size` runs the field at one batch size and returns its report: `measure` runs every contender
once untimed (the warm-up), then all of them interleaved, --repeats times each (with --interleave the
batchspec contenders round by round, interleave.py); `cost_curve` measures the
target's and the draft's forward times that the predicted speedups use; report.py turns the results
into rows, tables and the lines printed under them.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from ..engine.model.graphs import resolve_capture
from .calibrate import forward_ms
from .contenders import Contender, contenders, count_launches, run_contender
from .interleave import interleave
from .report import (CostCurve, adaptive_vs_best_fixed, print_cost_curve, print_identity, print_launches,
                     print_structured, print_time_split, render, result_rows)


def bench_batch_size(args, models, prompts: list[str], batch_size: int) -> dict:
    """Run every contender at one batch size, print its table and return the report."""
    args = argparse.Namespace(**{**vars(args), "batch_size": batch_size})
    field_ = contenders(args, models.draft is not None)
    print(f"{len(prompts)} prompts, batch {args.batch_size}, k {args.k}, max_new_tokens {args.max_new_tokens}, "
          f"{args.repeats} repeats, device {models.target.device}, dtype {models.target.dtype}, "
          f"compile {','.join(args.compile)}", flush=True)
    measure(field_, models, prompts, args)
    curve = cost_curve(args, models, prompts)
    rows = result_rows(field_, args, len(prompts), curve)
    table = render(rows)
    print()
    print(table)
    print_cost_curve(args.batch_size, curve)
    print_time_split(field_, exact=models.target.device.type == "cpu" or args.profile)
    if args.constraints:
        print_structured(field_, models.tokenizer, args.constraints)
    launches = {c.name: count_launches(c, models, prompts, args) for c in field_ if c.kind == "batchspec"} \
        if args.profile else {}
    print_launches(launches)
    adaptive_vs_best = adaptive_vs_best_fixed(rows, field_, args)
    same = print_identity(rows, args, len(prompts))
    settings = {**vars(args), "constraints": [c.kind for c in args.constraints] if args.constraints else None}
    return {"args": settings, "batch_size": batch_size, "prompts": len(prompts), "cost_ms": curve.as_dict(),
            "rows": rows, "greedy_identical": same, "launches": launches,
            "adaptive_vs_best_fixed": adaptive_vs_best, "table": table, "machine": machine(models)}


def measure(field_: list[Contender], models, prompts: list[str], args) -> None:
    """The warm-up (every contender once, untimed), then --repeats interleaved timed runs of each."""
    for c in field_:
        started = time.perf_counter()
        _, c.outputs = run_contender(c, models, prompts, args)
        c.warmup_s = time.perf_counter() - started
        c.capture_s = c.generator.capture_s if c.generator is not None else None
        extra = f" (capturing {c.capture_s:.1f} s)" if c.capture_s else ""
        print(f"  warm-up:  {c.name:32s} {c.warmup_s:8.1f} s{extra}", flush=True)
    if args.interleave:  # the batchspec contenders round by round, in one stretch of time (interleave.py)
        interleave([c for c in field_ if c.kind == "batchspec"], models, prompts, args)
    for repeat in range(args.repeats):
        for c in (c for c in field_ if c.kind != "batchspec" or not args.interleave):
            rate, outputs = run_contender(c, models, prompts, args)
            c.tokens_per_s.append(rate)
            c.outputs = c.outputs or outputs
            print(f"  repeat {repeat + 1}: {c.name:32s} {rate:8.1f} tok/s", flush=True)


def cost_curve(args, models, prompts: list[str]) -> CostCurve:
    """The target's forward time at 1 and k + 1 tokens per row and the draft's at 1, at this batch size and
    the mean context, captured as the first --compile mode says."""
    context = int(statistics.mean(len(models.tokenizer(p)["input_ids"]) for p in prompts) + args.max_new_tokens / 2)
    capture = resolve_capture(args.compile[0], models.target.device)
    t_verify1 = forward_ms(models.target, args.batch_size, 1, context, capture=capture)
    t_verify = {k: forward_ms(models.target, args.batch_size, k + 1, context, capture=capture) for k in args.k}
    t_draft = forward_ms(models.draft, args.batch_size, 1, context, capture=capture) if models.draft is not None else 0.0
    return CostCurve(context, t_verify1, t_verify, t_draft)


def machine(models) -> dict:
    return {"platform": platform.platform(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if models.target.device.type == "cuda" else "cpu"}
