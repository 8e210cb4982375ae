"""GPU checks for the captured engine, in one call on a GPU machine (torch + transformers + pyarrow only).

    python tools/gpu_check.py --out $OUT/check                         # parity (fp32, demo pair)
    python tools/gpu_check.py --out $OUT/check --pair /tmp/pair        # + step times of a synthetic pair (bf16)
    python tools/gpu_check.py --out $OUT/check --trees 2x4 --modes on,unpacked   # + tree rounds, packed and not

1. Parity, fp32: the shipped demo pair on held-out prompts, Hugging Face `generate` on each prompt
   alone against batchspec with every drafter, batch 1 and 8, fixed k and adaptive, compile on (CUDA
   graphs), static (the same shapes, eager) and off (eager, busy rows only). Every output must be
   identical; the report counts mismatches per configuration and the capture time. With the demo's
   EAGLE-3 head (batchspec/assets/demo/eagle) the eagle drafter too; with --trees, each drafter that
   proposes trees at batch 8 with a tree every round.
2. Step times (with --pair, a `tools/synthetic_pair.py` pair in bf16): one static step of T = 1..5
   tokens per slot for the target and T = 1, 2 for the draft, at several batch sizes, eager against
   a CUDA-graph replay (median of timed runs), which is the cost table adaptive k uses on a GPU. With
   --inductor-widths, those target steps also compiled by inductor before capture (compile=inductor),
   against the weight-streaming time of the target's bytes at --bandwidth.
3. With --structured (needs llguidance): the same parity under per-row constraints (a JSON object, a
   regex, a choice), against `generate` with batchspec.bench_grammar's logits processor on each prompt
   alone: masks on captured verify logits, first tokens drawn under the grammar at admission.
4. EAGLE-3 training attention: whether this GPU's attention kernels keep an unrolled training step to its
   mask (`eagle.ttt.sees_future`: an earlier row's output must not move when later positions change), in fp32
   and under bf16 autocast, for a head shaped like the demo target's and (with --pair) the pair's target's.

Everything printed is also written to OUT/report.md and OUT/report.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import batchspec  # noqa: E402
from batchspec.bench.calibrate import forward_ms, read_prompts  # noqa: E402
from batchspec.engine.model.graphs import resolve_capture  # noqa: E402

DEMO = REPO / "batchspec" / "assets" / "demo"


def hf_reference(models, prompts: list[str], max_new_tokens: int) -> list[list[int]]:
    tokenizer, model = models.tokenizer, models.target
    model.generation_config.eos_token_id = models.eos_token_ids
    out = []
    for prompt in prompts:
        enc = tokenizer(prompt, return_tensors="pt").to(model.device)
        with torch.inference_mode():
            ids = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens)
        out.append(ids[0, enc["input_ids"].shape[1]:].tolist())
    return out


def parity(lines: list[str], report: dict, num_prompts: int, max_new_tokens: int, device: str,
           modes: list[str], drafters: list[str], batch_sizes: list[int], trees: list[str]) -> None:
    head = DEMO / "eagle"
    models = batchspec.load_models(str(DEMO / "target"), str(DEMO / "draft"), dtype="float32", device=device,
                                   head=str(head) if head.is_dir() else None)
    prompts = read_prompts(str(DEMO / "prompts.parquet"), num_prompts)
    reference = hf_reference(models, prompts, max_new_tokens)
    lines += ["## Parity, fp32, demo pair: outputs identical to HF generate on each prompt alone", "",
              "| compile | drafter | batch | k | identical | capture s | wall s |", "|---|---|---:|---|---:|---:|---:|"]
    report["parity"] = []
    for compile in modes:
        for drafter in drafters:
            if drafter == "eagle" and models.head is None:
                continue
            runs = [(8, False, None), (8, True, None), (1, False, None)]
            runs += [(8, False, tree) for tree in trees if drafter != "none"]  # a tree every round
            for batch_size, adaptive, tree in runs:
                if (drafter == "none" and adaptive) or batch_size not in batch_sizes:
                    continue
                generator = batchspec.build_generator(models, drafter=drafter, k=4, batch_size=batch_size,
                                                      max_new_tokens=max_new_tokens, adaptive=adaptive, tree=tree,
                                                      **compile_settings(compile), max_seq_len=512)
                started = time.perf_counter()
                results = {r.id: r for r in generator.run(batchspec.Request(str(i), p) for i, p in enumerate(prompts))}
                wall = time.perf_counter() - started
                same = sum(results[str(i)].completion_token_ids == ref for i, ref in enumerate(reference))
                row = dict(compile=compile, drafter=drafter, batch=batch_size, adaptive=adaptive, tree=tree,
                           identical=same, prompts=len(prompts), capture_s=generator.capture_s, wall_s=wall)
                report["parity"].append(row)
                shape = f"tree {tree}" if tree else "adaptive <= 4" if adaptive else "4"
                lines.append(f"| {compile} | {drafter} | {batch_size} | {shape} | "
                             f"{same}/{len(prompts)} | {generator.capture_s:.2f} | {wall:.1f} |")
                print(lines[-1], flush=True)


def compile_settings(mode: str) -> dict:
    """build_generator's settings for a --modes entry: a compile mode, or `unpacked` (CUDA graphs with the
    static path's verify unpacked: pack_static=False)."""
    return dict(compile="on", pack_static=False) if mode == "unpacked" else dict(compile=mode)


STRUCTURED = [dict(json_object=True), dict(regex=r"(def|return|for) [a-z_]+[(:]( [a-z_]+)*"),
              dict(choice=["def main():", "import os", "return None"])]


def structured_parity(lines: list[str], report: dict, num_prompts: int, max_new_tokens: int, device: str,
                      modes: list[str], drafters: list[str]) -> None:
    from transformers import LogitsProcessorList

    from batchspec.bench.grammar import GrammarLogitsProcessor
    from batchspec.engine.types import RowParams

    models = batchspec.load_models(str(DEMO / "target"), str(DEMO / "draft"), dtype="float32", device=device)
    prompts = read_prompts(str(DEMO / "prompts.parquet"), num_prompts)
    params = [RowParams(**STRUCTURED[i % len(STRUCTURED)]) for i in range(len(prompts))]
    model, tokenizer = models.target, models.tokenizer
    model.generation_config.eos_token_id = models.eos_token_ids
    reference = []
    for prompt, p in zip(prompts, params):
        enc = tokenizer(prompt, return_tensors="pt").to(model.device)
        processor = GrammarLogitsProcessor(tokenizer, [p.constraint()], eos_ids=models.eos_token_ids,
                                           vocab_size=model.get_output_embeddings().weight.shape[0],
                                           prompt_len=enc["input_ids"].shape[1])
        with torch.inference_mode():
            ids = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens,
                                 logits_processor=LogitsProcessorList([processor]))
        reference.append(ids[0, enc["input_ids"].shape[1]:].tolist())
    lines += ["", "## Structured output parity, fp32, demo pair (json_object / regex / choice per row)", "",
              "| compile | drafter | batch | identical | forced tokens | wall s |", "|---|---|---:|---:|---:|---:|"]
    report["structured"] = []
    for compile in modes:
        for drafter in drafters:
            for batch_size in (8, 1):
                generator = batchspec.build_generator(models, drafter=drafter, k=4, batch_size=batch_size,
                                                      max_new_tokens=max_new_tokens, adaptive=batch_size > 1,
                                                      **compile_settings(compile), max_seq_len=512)
                started = time.perf_counter()
                requests = [batchspec.Request(str(i), prompt, params=p) for i, (prompt, p) in enumerate(zip(prompts, params))]
                results = {r.id: r for r in generator.run(requests)}
                wall = time.perf_counter() - started
                same = sum(results[str(i)].completion_token_ids == ref for i, ref in enumerate(reference))
                forced = sum(r.forced_tokens for r in results.values())
                errors = [r.error for r in results.values() if r.error]
                report["structured"].append(dict(compile=compile, drafter=drafter, batch=batch_size, identical=same,
                                                 prompts=len(prompts), forced=forced, wall_s=wall, errors=errors[:3]))
                lines.append(f"| {compile} | {drafter} | {batch_size} | {same}/{len(prompts)} | {forced} | {wall:.1f} |"
                             + (f" errors: {errors[:1]}" if errors else ""))
                print(lines[-1], flush=True)


def step_times(lines: list[str], report: dict, pair: Path, batch_sizes: list[int], kv_len: int, device: str,
               inductor_widths: set[int], bandwidth: float) -> None:
    models = batchspec.load_models(str(pair / "target"), str(pair / "draft"), dtype="bfloat16", device=device)
    captured = resolve_capture("on", torch.device(device))
    compiled = resolve_capture("inductor", torch.device(device))
    weights = sum(p.numel() * p.element_size() for p in models.target.parameters())
    streaming_ms = 1000 * weights / bandwidth
    lines += ["", f"## Step times, bf16, {pair}: ms per static step over every slot, {kv_len} positions attended", "",
              f"Streaming the target's {weights / 1e9:.2f} GB of weights once at {bandwidth / 1e12:.2f} TB/s takes "
              f"{streaming_ms:.2f} ms.", "",
              "| model | batch | T | eager ms | captured ms | eager / captured | inductor + captured ms | compile s "
              "| streaming / inductor |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    report["steps"], report["weights_bytes"], report["streaming_ms"] = [], weights, streaming_ms
    for name, model, widths in (("target", models.target, range(1, 6)), ("draft", models.draft, (1, 2))):
        for b in batch_sizes:
            for T in widths:  # kv_len - T cached, then a step of T tokens: kv_len attended
                eager = forward_ms(model, b, T, kv_len - T, repeats=10, capture="static")
                graph = forward_ms(model, b, T, kv_len - T, repeats=20, capture=captured)
                row = dict(model=name, batch=b, T=T, eager_ms=eager, graph_ms=graph)
                fused = ""
                if name == "target" and T in inductor_widths:
                    started = time.perf_counter()
                    row["inductor_ms"] = forward_ms(model, b, T, kv_len - T, repeats=20, capture=compiled)
                    row["inductor_compile_s"] = time.perf_counter() - started
                    fused = (f" {row['inductor_ms']:.2f} | {row['inductor_compile_s']:.0f} | "
                             f"{streaming_ms / row['inductor_ms']:.2f} |")
                report["steps"].append(row)
                lines.append(f"| {name} | {b} | {T} | {eager:.2f} | {graph:.2f} | {eager / graph:.1f} |"
                             + (fused or " | | |"))
                print(lines[-1], flush=True)
                torch.cuda.empty_cache()


def attention_check(lines: list[str], report: dict, pair: Path | None, device: str) -> None:
    from transformers import AutoConfig

    from batchspec.eagle.config import EagleConfig
    from batchspec.eagle.head import EagleHead
    from batchspec.training.ttt import sees_future

    lines += ["", "## EAGLE-3 training attention: change of earlier rows when later positions change (0 = kept to "
              "its mask)", "", "| target shape | hidden | fp32 | bf16 autocast |", "|---|---:|---:|---:|"]
    report["attention"] = []
    for name, folder in (("demo", DEMO / "target"), ("pair", pair / "target" if pair else None)):
        if folder is None:
            continue
        config = AutoConfig.from_pretrained(folder)
        torch.manual_seed(0)
        head = EagleHead(EagleConfig.for_target(config, draft_vocab_size=min(4096, config.vocab_size))).to(device)
        ids = torch.randint(0, head.config.draft_vocab_size, (16, 160), device=device)
        feats = torch.randn(16, 160, head.config.feature_size, device=device) * 0.1
        change = {}
        for label, on in (("fp32", False), ("bf16", True)):
            with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=on):
                change[label] = sees_future(head, ids, feats, steps=4)
        report["attention"].append(dict(target=name, hidden=config.hidden_size, **change))
        lines.append(f"| {name} | {config.hidden_size} | {change['fp32']:.3g} | {change['bf16']:.3g} |")
        print(lines[-1], flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--pair", help="a tools/synthetic_pair.py output dir: also time its steps (bf16)")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-sizes", default="1,8,32,64")
    parser.add_argument("--kv-len", type=int, default=256)
    parser.add_argument("--inductor-widths", default="", help="with --pair: the target's steps of these widths "
                        "(e.g. 1 or 1,5) also compiled by inductor before capture (about a minute of compiling each)")
    parser.add_argument("--bandwidth", type=float, default=3.35e12, help="the card's memory bandwidth in bytes/s "
                        "(the weight-streaming time in the step table; H100 SXM: 3.35e12)")
    parser.add_argument("--skip-parity", action="store_true")
    parser.add_argument("--parity-batches", default="8,1", help="batch sizes of the parity check (8 runs k=4 and "
                        "adaptive, 1 runs k=4)")
    parser.add_argument("--trees", default="", help="tree drafts the parity check also runs at batch 8, a tree "
                        "every round (e.g. 2x4; none by default)")
    parser.add_argument("--structured", action="store_true", help="also the structured-output parity (llguidance)")
    parser.add_argument("--modes", default="on,static,off", help="compile modes the parity check runs (also "
                        "inductor), and `unpacked` (CUDA graphs with the verify unpacked)")
    parser.add_argument("--drafters", default="none,model,eagle,ngram,prompt_lookup,suffix",
                        help="drafters the parity check runs")
    parser.add_argument("--device", default="cuda", help="cpu runs the same checks with torch.compile for capture "
                        "(a smoke test of this script; slow)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device: this script checks the GPU path (--device cpu for a smoke test)")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    lines = [f"# gpu_check: {name}, torch {torch.__version__}", ""]
    report: dict = {"device": name, "torch": torch.__version__}
    try:
        if not args.skip_parity:
            parity(lines, report, args.num_prompts, args.max_new_tokens, args.device, args.modes.split(","),
                   args.drafters.split(","), [int(b) for b in args.parity_batches.split(",")],
                   [t for t in args.trees.split(",") if t])
        if args.structured:
            structured_parity(lines, report, args.num_prompts, args.max_new_tokens, args.device,
                              args.modes.split(","), [d for d in args.drafters.split(",") if d != "eagle"])
        if args.pair:
            step_times(lines, report, Path(args.pair), [int(b) for b in args.batch_sizes.split(",")], args.kv_len,
                       args.device, {int(w) for w in args.inductor_widths.split(",") if w}, args.bandwidth)
        attention_check(lines, report, Path(args.pair) if args.pair else None, args.device)
    finally:
        (out / "report.md").write_text("\n".join(lines) + "\n")
        (out / "report.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
