"""Side-by-side benchmark: batchspec against Hugging Face generate on the same pair, prompts and lengths.

    python -m batchspec.bench                       # the shipped demo pair on held-out prompts, CPU
    python -m batchspec.bench --batch-size 1 --k 4 --repeats 5 --markdown bench.md --json bench.json
    python -m batchspec.bench --k 1,2,3,4 --drafters model     # a fixed-k sweep next to adaptive (k <= 4)
    python -m batchspec.bench --random-draft --drafters model  # a useless draft: adaptive should cost ~nothing
    python -m batchspec.bench --device cuda --compile on,off   # captured (CUDA graphs) next to eager forwards
    python -m batchspec.bench --target SMOLLM2 --draft '' --prompts batchspec/assets/extraction/prompts.jsonl \
        --chat --schema-column schema --drafters ngram,prompt_lookup,suffix   # structured output, a schema per row

Every contender first runs once untimed (the warm-up: CUDA graph capture, torch.compile, HF's own
compile with a static cache, allocator and kernel caches; its time is reported, not counted), then
all run interleaved, `--repeats` times each (at least 3), in one process. A batchspec contender keeps
its generator across repeats, as one long job would. The table reports the median tokens/s, the
ratio to HF batched `generate`, acceptance, tokens per target forward, and the speedup over drafter
none predicted from the measured acceptance and cost curve:

    predicted = tokens_per_forward * t_verify(1) / (t_verify(k+1) + k * t_draft(1))

where t_verify(T) is one target forward of T tokens per row at this batch size and t_draft(1) one
draft forward of 1 token (0 for the n-gram and prompt-lookup drafters), both captured as the first
`--compile` mode says. It also checks that every greedy output equals drafter none's, token for
token, and says so. HF `generate` runs left-padded batches, with its default dynamic cache and with
`cache_implementation="static"` (which transformers compiles by itself on a GPU; every prompt is
padded to the longest so that every batch has one shape and compiles once).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import LogitsProcessorList

from .api import build_generator
from .calibrate import forward_ms, read_prompts, sync
from .corpus import load_corpus
from .engine.drafters.registry import DRAFT_MODEL, DRAFTERS, HEAD, drafter_spec
from .engine.graphs import LaunchCounter, resolve_capture
from .models import load_models
from .bench_grammar import GrammarLogitsProcessor, schema_validity
from .types import Constraint, Request, RowParams, TreeSpec, rounds_by_k_text

DEMO = Path(__file__).parent / "assets" / "demo"


@dataclass
class Contender:
    name: str
    kind: str  # hf_batched | hf_static | hf_assisted | hf_prompt_lookup | batchspec
    drafter: str = "none"
    adaptive: bool = False
    k: int = 0  # drafts per round (the maximum, if adaptive)
    compile: str = "auto"  # batchspec: how its static-shape forwards are captured
    verify: str = "coupled"  # batchspec with sampling: coupled or rejection
    tree: str | None = None  # batchspec: tree drafts (a fixed tree, or the trees adaptive may choose)
    warmup_s: float | None = None  # the untimed first run (compile / capture included)
    capture_s: float | None = None  # of which batchspec spent capturing its forwards
    generator: object | None = None  # batchspec: built at the warm-up, reused by every repeat
    tokens_per_s: list[float] = field(default_factory=list)
    outputs: list[list[int]] | None = None
    acceptance: float | None = None
    tokens_per_forward: float | None = None
    timings: dict | None = None  # seconds per round phase, summed over repeats
    rounds_by_k: list[int] | None = None  # rounds by drafts verified, summed over repeats
    rounds_by_tree: dict | None = None  # tree rounds by tree shape, summed over repeats
    tokens: dict | None = None  # what its target forwards computed, summed over repeats (generator.TokenCounts)
    grammar_s: float = 0.0  # batchspec under constraints: host seconds in grammar work, summed over repeats


@torch.inference_mode()
def run_hf(contender: Contender, models, prompts, args) -> tuple[float, list[list[int]]]:
    tokenizer, target = models.tokenizer, models.target
    tokenizer.padding_side = "left"
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else models.eos_token_ids[0]
    common = dict(do_sample=False, max_new_tokens=args.max_new_tokens, pad_token_id=pad)
    if args.temperature > 0:
        common.update(do_sample=True, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    batch = args.batch_size if contender.kind in ("hf_batched", "hf_static") else 1
    padding: dict = {"padding": True}
    if contender.kind == "hf_static":
        common["cache_implementation"] = "static"
        # One shape for every batch: a new prompt length would re-initialise the static cache and recompile.
        longest = max(len(tokenizer(p)["input_ids"]) for p in prompts)
        padding = {"padding": "max_length", "max_length": longest}
    if contender.kind == "hf_assisted":
        gc = models.draft.generation_config  # HF reads the draft length from the assistant's config
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = contender.k, "constant", 0.0
        common["assistant_model"] = models.draft
    elif contender.kind == "hf_prompt_lookup":
        common["prompt_lookup_num_tokens"] = contender.k
    outputs, tokens = [], 0
    sync(target.device)
    t0 = time.perf_counter()
    for i in range(0, len(prompts), batch):
        enc = tokenizer(prompts[i : i + batch], return_tensors="pt", **padding).to(target.device)
        if args.constraints:  # the same constraints, as a logits processor (bench_grammar.py)
            common["logits_processor"] = LogitsProcessorList([GrammarLogitsProcessor(
                tokenizer, args.constraints[i : i + batch], vocab_size=target.get_output_embeddings().weight.shape[0],
                eos_ids=models.eos_token_ids, prompt_len=enc["input_ids"].shape[1])])
        out = target.generate(**enc, **common)
        for row in out[:, enc["input_ids"].shape[1] :].tolist():
            row = strip_after_eos(row, models.eos_token_ids)
            outputs.append(row)
            tokens += len(row)
    sync(target.device)
    return tokens / (time.perf_counter() - t0), outputs


def strip_after_eos(row: list[int], eos: list[int]) -> list[int]:
    """HF pads a batched row after its EOS; keep the tokens up to and including the first EOS."""
    for i, token in enumerate(row):
        if token in eos:
            return row[: i + 1]
    return row


def run_batchspec(contender: Contender, models, prompts, args):
    generator = contender.generator
    if contender.drafter == "suffix":  # it learns the prompts' completions: every run starts with what a job starts
        generator = None
    if generator is None:  # the warm-up: forwards are captured once, here, as in a job
        generator = contender.generator = build_generator(
            models, drafter=contender.drafter, k=contender.k, batch_size=args.batch_size,
            max_new_tokens=args.max_new_tokens, max_seq_len=args.max_seq_len, adaptive=contender.adaptive,
            profile=args.profile, compile=contender.compile, temperature=args.temperature, top_p=args.top_p,
            top_k=args.top_k, seed=args.seed, verify=contender.verify, tree=contender.tree, corpus=args.corpus_tokens,
        )
    generator.reset_stats()
    sync(models.target.device)
    t0 = time.perf_counter()
    results = list(generator.run(requests(prompts, args)))
    sync(models.target.device)
    elapsed = time.perf_counter() - t0
    contender.grammar_s += generator.grammars.mask_s + generator.grammars.compile_s
    by_id = {r.id: r for r in results}
    outputs = [by_id[str(i)].completion_token_ids for i in range(len(prompts))]
    contender.acceptance = generator.stats.acceptance_rate
    contender.tokens_per_forward = generator.stats.tokens_per_forward
    before, now = contender.rounds_by_k or [], generator.stats.rounds_by_k  # forced drafts may reach past k
    contender.rounds_by_k = [n + (before[i] if i < len(before) else 0) for i, n in enumerate(now)]
    contender.rounds_by_tree = {t: (contender.rounds_by_tree or {}).get(t, 0) + n
                                for t, n in generator.stats.rounds_by_tree.items()}
    contender.timings = {name: (contender.timings or {}).get(name, 0.0) + t
                         for name, t in {**generator.timings, "noise": generator.noise_s}.items()}
    contender.tokens = {name: (contender.tokens or {}).get(name, 0) + n for name, n in generator.tokens.summary().items()}
    return generator.stats.completion_tokens / elapsed, outputs


def requests(prompts: list[str], args) -> list[Request]:
    """The prompts as requests; with --row-lengths staggered each row's max_new_tokens is drawn uniformly from
    [8, 2 x --max-new-tokens], seeded by its id, so that rows end in almost every round, as in a real job;
    each with its constraint (--json-schema, --schema-column)."""
    out = []
    for i, p in enumerate(prompts):
        fields = {}
        if args.row_lengths == "staggered":
            fields["max_new_tokens"] = random.Random(str(i)).randint(8, 2 * args.max_new_tokens)
        constraint = args.constraints[i] if args.constraints else None
        if constraint is not None:
            fields[constraint.kind] = True if constraint.kind == "json_object" else constraint.value
        out.append(Request(str(i), p, params=RowParams(**fields) if fields else None))
    return out


def shares(contender: Contender) -> tuple[float | None, float | None, float | None]:
    """(padding, admission, admission at the margin) of a batchspec contender: the share of the tokens its
    target forwards computed that were padding, and admission's share of round time: its own phase, plus
    in packed rounds the prompt tokens' share of each forward's time (or, at the margin, what the prompt
    tokens add to forwards that run anyway: generator.TokenCounts)."""
    if not contender.timings or not contender.tokens:
        return None, None, None
    total = sum(t for name, t in contender.timings.items() if name != "noise")
    tokens, admit = contender.tokens, contender.timings["admit"]
    padding = tokens["padding"] / tokens["computed"] if tokens["computed"] else 0.0
    return padding, (admit + tokens["prefill_s"]) / total, (admit + tokens["prefill_marginal_s"]) / total


def count_launches(contender: Contender, models, prompts, args) -> dict:
    """One untimed run of the contender over the static path (compile=static) with a LaunchCounter: the aten
    ops each round dispatches outside captured steps, per phase, the steps it runs and its host syncs."""
    counter = LaunchCounter()
    generator = build_generator(
        models, drafter=contender.drafter, k=contender.k, batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens, max_seq_len=args.max_seq_len, adaptive=contender.adaptive,
        compile="static", temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
        verify=contender.verify, tree=contender.tree, launches=counter, corpus=args.corpus_tokens,
    )
    with counter:
        for _ in generator.run(requests(prompts, args)):
            pass
    rounds, tokens = max(generator.stats.rounds, 1), max(generator.stats.completion_tokens, 1)
    return {"ops_per_round": {k: round(v / rounds, 1) for k, v in counter.ops.items() if k != "admit"},
            "steps_per_round": round(sum(v for k, v in counter.replays.items() if k != "admit") / rounds, 1),
            "syncs_per_round": sum(v for k, v in counter.syncs.items() if k != "admit") / rounds,
            "admit_ops_per_token": counter.ops.get("admit", 0) / tokens, "problems_in_steps": counter.in_step[:5]}


def randomize(model, seed: int) -> None:
    """Replace every weight of `model` by a fresh random initialisation of the same config (fixed seed)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    fresh = AutoModelForCausalLM.from_config(model.config)
    model.load_state_dict(fresh.state_dict())


def contenders(args, has_draft: bool) -> list[Contender]:
    k_max = max(args.k)
    hf = args.row_lengths == "fixed"  # HF generate has one max_new_tokens per call
    out = [Contender("hf generate (batched)", "hf_batched")] if args.hf_batched and hf else []
    if args.hf_static and hf:
        out.append(Contender("hf generate (static cache)", "hf_static"))
    if args.hf_batch1 and hf and not args.constraints:  # HF's assisted generation: no constraints here
        if has_draft:
            out.append(Contender("hf assisted (batch 1)", "hf_assisted", k=k_max))
        out.append(Contender("hf prompt lookup (batch 1)", "hf_prompt_lookup", k=k_max))
    drafters = [d for d in DRAFTERS if d in args.drafters and (has_draft or drafter_spec(d).needs != DRAFT_MODEL)]
    for mode, verify in variants(args):
        tag = variant_tag(args, mode, verify)
        out.append(Contender(f"batchspec none{tag}", "batchspec", "none", compile=mode, verify=verify))
        for drafter in drafters:
            for k in args.k if args.fixed else ():
                out.append(Contender(f"batchspec {drafter} k={k}{tag}", "batchspec", drafter, k=k, compile=mode,
                                     verify=verify))
            for tree in args.tree:
                out.append(Contender(f"batchspec {drafter} tree {tree}{tag}", "batchspec", drafter, k=k_max,
                                     compile=mode, verify=verify, tree=tree))
            if args.adaptive:
                trees = f" + trees {','.join(args.tree)}" if args.tree else ""
                out.append(Contender(f"batchspec {drafter} adaptive k<={k_max}{trees}{tag}", "batchspec", drafter,
                                     adaptive=True, k=k_max, compile=mode, verify=verify,
                                     tree=",".join(args.tree) or None))
    return out


def variants(args) -> list[tuple[str, str]]:
    """(compile mode, verify mode) pairs every batchspec contender runs in; verify only matters when sampling."""
    verifies = args.verify if args.temperature > 0 else ["coupled"]
    return [(mode, verify) for mode in args.compile for verify in verifies]


def variant_tag(args, mode: str, verify: str) -> str:
    parts = ([mode] if len(args.compile) > 1 else []) + ([verify] if len(variants(args)) > len(args.compile) else [])
    return f" [{', '.join(parts)}]" if parts else ""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=str(DEMO / "target"))
    parser.add_argument("--draft", default=str(DEMO / "draft"), help="'' for no draft model")
    parser.add_argument("--prompts", default=str(DEMO / "prompts.parquet"),
                        help="any job source: Parquet file/folder/glob, saved or local HF dataset, JSONL")
    parser.add_argument("--prompt-column", default="prompt")
    parser.add_argument("--split", default="train", help="for Hugging Face datasets")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-seq-len", type=int, default=512)
    parser.add_argument("--row-lengths", choices=("fixed", "staggered"), default="fixed",
                        help="fixed: every row asks for --max-new-tokens; staggered: each row's max_new_tokens drawn "
                        "uniformly from [8, 2 x --max-new-tokens], seeded by its id, so that rows end in almost every "
                        "round as in real jobs (HF contenders are skipped: generate takes one length per call)")
    parser.add_argument("--batch-size", default="8", help="a list (e.g. 1,8,32) runs the whole field at each "
                        "and ends with a table of tokens/s by batch size")
    parser.add_argument("--k", default="4", help="drafts per round; a list (e.g. 1,2,3,4) runs a fixed-k sweep, "
                        "and adaptive gets the largest as its maximum")
    parser.add_argument("--repeats", type=int, default=3, help="timed, interleaved runs of each contender (>= 3)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--compile", default="auto", help="how batchspec captures its static-shape forwards: auto "
                        "(CUDA graphs on a GPU, eager on CPU), on (CUDA graphs; torch.compile on CPU), off, static; "
                        "a list (e.g. on,off) runs every batchspec contender in each mode")
    parser.add_argument("--tree", default="", help="tree drafts to run too, BxD (e.g. 2x4,2x8): a fixed-tree "
                        "contender for each, and adaptive chooses between chains and these trees")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples, seeded")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verify", default="coupled", help="with sampling: coupled, rejection, or both "
                        "(coupled,rejection) side by side")
    parser.add_argument("--profile", action="store_true", help="sync the GPU after every round phase, so that the "
                        "printed split of round time is exact (it slows the rounds down a little); and count, in one "
                        "more untimed run of each batchspec contender over the static path, the ops a round "
                        "dispatches outside captured steps (what a GPU pays in kernel launches)")
    parser.add_argument("--no-hf-static", dest="hf_static", action="store_false",
                        help="skip HF generate with cache_implementation='static'")
    parser.add_argument("--no-hf-batch1", dest="hf_batch1", action="store_false", help="skip the batch-1 HF contenders")
    parser.add_argument("--no-hf-batched", dest="hf_batched", action="store_false",
                        help="skip HF generate with its dynamic cache (eager: on a GPU at batch 1 it is the slowest "
                        "contender by far, and its column shows '-')")
    parser.add_argument("--no-adaptive", dest="adaptive", action="store_false", help="skip the adaptive-k contenders")
    parser.add_argument("--no-fixed", dest="fixed", action="store_false",
                        help="skip the fixed-k contenders (adaptive and trees only: a shorter run)")
    parser.add_argument("--drafters", default="model,ngram,prompt_lookup",
                        help="comma-separated drafters to run besides none: model, ngram, prompt_lookup, suffix "
                             "(default: model,ngram,prompt_lookup)")
    parser.add_argument("--corpus", help="the suffix drafter's warm start: an earlier output folder, or texts")
    parser.add_argument("--head", default=str(DEMO / "eagle"), help="the eagle drafter's EAGLE-3 head folder "
                        "(default: the demo's; with --drafters eagle)")
    parser.add_argument("--random-draft", action="store_true",
                        help="replace the draft's weights by random ones (same shapes, seed 0): a useless draft, "
                             "to check that adaptive speculation then costs next to nothing")
    parser.add_argument("--json-schema", help="structured output: every row's output must match this JSON schema file")
    parser.add_argument("--schema-column", help="structured output: each row's JSON schema (JSON text) from this "
                        "column of --prompts")
    parser.add_argument("--chat", action="store_true", help="render each prompt with the target's chat template: "
                        "text as one user message, or the column's list of {role, content} messages")
    parser.add_argument("--json", help="write the table as JSON here")
    parser.add_argument("--markdown", help="write the table as Markdown here")
    args = parser.parse_args(argv)
    try:
        args.k = sorted({int(k) for k in str(args.k).split(",")})
    except ValueError:
        parser.error(f"--k: expected integers like 4 or 1,2,4, got {args.k!r}")
    if args.k[0] < 1:
        parser.error("--k must be at least 1")
    if args.repeats < 3:
        print(f"bench: warning: --repeats {args.repeats}: medians of fewer than 3 interleaved repeats are noise",
              flush=True)
    args.compile = [m.strip() for m in str(args.compile).split(",") if m.strip()]
    try:
        args.tree = [str(t) for t in TreeSpec.parse_list(args.tree)]
    except ValueError as e:
        parser.error(f"--tree: {e}")
    args.verify = [m.strip() for m in str(args.verify).split(",") if m.strip()]
    if not set(args.verify) <= {"coupled", "rejection"}:
        parser.error(f"--verify: choose coupled, rejection or both, got {args.verify}")
    for mode in args.compile:
        try:
            resolve_capture(mode, torch.device("cpu"))
        except ValueError as e:
            parser.error(f"--compile: {e}")
    try:
        args.batch_size = [int(b) for b in str(args.batch_size).split(",")]
    except ValueError:
        parser.error(f"--batch-size: expected integers like 8 or 1,8,32, got {args.batch_size!r}")
    torch.manual_seed(0)
    args.drafters = [d.strip() for d in args.drafters.split(",") if d.strip()]
    drafting = [d for d in DRAFTERS if d != "none"]
    unknown = set(args.drafters) - set(drafting)
    if unknown:
        parser.error(f"--drafters: unknown {sorted(unknown)}; choose from {', '.join(drafting)}")
    try:
        prompts = read_prompts(args.prompts, args.num_prompts, args.prompt_column, args.split, messages=args.chat)
        schemas = read_prompts(args.prompts, args.num_prompts, args.schema_column, args.split) \
            if args.schema_column else None
    except ValueError as e:  # SourceError included
        parser.error(f"--prompts: {e}")
    args.constraints = constraints_for(args, len(prompts), schemas, parser)
    models = load_models(args.target, args.draft or None, dtype=args.dtype, device=args.device,
                         head=args.head if any(drafter_spec(d).needs == HEAD for d in args.drafters) else None)
    if args.chat:
        prompts = [models.tokenizer.apply_chat_template([{"role": "user", "content": p}] if isinstance(p, str) else p,
                                                        tokenize=False, add_generation_prompt=True) for p in prompts]
    if args.random_draft:
        if models.draft is None:
            parser.error("--random-draft needs --draft")
        randomize(models.draft, seed=0)
    for model in (models.target, models.draft):
        if model is not None:
            model.generation_config.eos_token_id = models.eos_token_ids  # the same stops for every contender
    args.corpus_tokens = load_corpus(args.corpus, models.tokenizer) if args.corpus else None
    reports = [bench_batch_size(args, models, prompts, b) for b in args.batch_size]
    if len(reports) > 1:
        summary = render_by_batch_size(reports)
        print("\n" + summary)
    else:
        summary = reports[0]["table"]
    if args.json:
        Path(args.json).write_text(json.dumps(reports[0] if len(reports) == 1 else reports, indent=2))
    if args.markdown:
        Path(args.markdown).write_text(summary + "\n")


def constraints_for(args, count: int, schemas: list[str] | None, parser) -> list[Constraint] | None:
    """Each prompt's constraint: --json-schema FILE for all, or the --schema-column of its row (JSON text)."""
    if args.json_schema and schemas:
        parser.error("--json-schema and --schema-column: choose one")
    if schemas is not None and len(schemas) != count:
        parser.error(f"--schema-column {args.schema_column!r}: {len(schemas)} of {count} rows have a schema")
    texts = [Path(args.json_schema).read_text()] * count if args.json_schema else schemas
    if texts is None:
        return None
    out = [Constraint.of("json_schema", t) for t in texts]
    bad = next((c for c in out if isinstance(c, str)), None)
    if bad:
        parser.error(bad)
    return out


def bench_batch_size(args, models, prompts: list[str], batch_size: int) -> dict:
    """Run every contender at one batch size, print its table and return the report."""
    args = argparse.Namespace(**{**vars(args), "batch_size": batch_size})
    runners = {"batchspec": run_batchspec}
    field_ = contenders(args, models.draft is not None)
    print(f"{len(prompts)} prompts, batch {args.batch_size}, k {args.k}, max_new_tokens {args.max_new_tokens}, "
          f"{args.repeats} repeats, device {models.target.device}, dtype {models.target.dtype}, "
          f"compile {','.join(args.compile)}", flush=True)
    for c in field_:  # the warm-up: every contender once, untimed
        started = time.perf_counter()
        _, c.outputs = runners.get(c.kind, run_hf)(c, models, prompts, args)
        c.warmup_s = time.perf_counter() - started
        c.capture_s = c.generator.capture_s if c.generator is not None else None
        extra = f" (capturing {c.capture_s:.1f} s)" if c.capture_s else ""
        print(f"  warm-up:  {c.name:32s} {c.warmup_s:8.1f} s{extra}", flush=True)
    for repeat in range(args.repeats):
        for c in field_:
            rate, outputs = runners.get(c.kind, run_hf)(c, models, prompts, args)
            c.tokens_per_s.append(rate)
            c.outputs = c.outputs or outputs
            print(f"  repeat {repeat + 1}: {c.name:32s} {rate:8.1f} tok/s", flush=True)

    context = int(statistics.mean(len(models.tokenizer(p)["input_ids"]) for p in prompts) + args.max_new_tokens / 2)
    capture = resolve_capture(args.compile[0], models.target.device)
    t_verify1 = forward_ms(models.target, args.batch_size, 1, context, capture=capture)
    t_verify = {k: forward_ms(models.target, args.batch_size, k + 1, context, capture=capture) for k in args.k}
    t_draft = forward_ms(models.draft, args.batch_size, 1, context, capture=capture) if models.draft is not None else 0.0
    cost = {"context": context, "target_ms_1": t_verify1, "draft_ms_1": t_draft,
            **{f"target_ms_{k + 1}": t for k, t in t_verify.items()}}

    hf_batched = next((c for c in field_ if c.kind == "hf_batched"), None)
    baseline = statistics.median(hf_batched.tokens_per_s) if hf_batched else None
    hf_static = next((c for c in field_ if c.kind == "hf_static"), None)
    nones = {(c.compile, c.verify): c for c in field_ if c.kind == "batchspec" and c.drafter == "none"}
    first_none = nones[variants(args)[0]]
    # Greedy and coupled sampling emit plain decoding's tokens, in every compile mode (greedy runs are all
    # "coupled" here): the first coupled none is the reference, never a rejection none, whose sampled
    # tokens differ by design (`--verify rejection,coupled` runs that one first).
    reference = next((c for (_, verify), c in nones.items() if verify == "coupled"), first_none).outputs
    rows = []
    for c in field_:
        rate = statistics.median(c.tokens_per_s)
        none_rate = statistics.median(nones.get((c.compile, c.verify), first_none).tokens_per_s)
        predicted = None
        if c.kind == "batchspec" and c.drafter not in ("none", "eagle") and c.tokens_per_forward and not c.adaptive \
                and not c.tree:
            draft_cost = c.k * t_draft if c.drafter == "model" else 0.0
            predicted = c.tokens_per_forward * t_verify1 / (t_verify[c.k] + draft_cost)
        mismatches = sum(a != b for a, b in zip(c.outputs, reference))
        rows.append({
            "contender": c.name, "kind": c.kind, "drafter": c.drafter if c.kind == "batchspec" else None,
            "k": c.k, "adaptive": c.adaptive, "compile": c.compile if c.kind == "batchspec" else None,
            "tree": c.tree, "rounds_by_tree": c.rounds_by_tree,
            "verify": c.verify if c.kind == "batchspec" and args.temperature > 0 else None,
            "tokens_per_s": rate, "repeats_tokens_per_s": list(c.tokens_per_s),
            "warmup_s": c.warmup_s, "capture_s": c.capture_s, "vs_hf_batched": rate / baseline if baseline else None,
            "vs_hf_static": rate / statistics.median(hf_static.tokens_per_s) if hf_static else None,
            "vs_none": rate / none_rate, "acceptance": c.acceptance, "tokens_per_forward": c.tokens_per_forward,
            "predicted_vs_none": predicted, "achieved_over_predicted": (rate / none_rate) / predicted if predicted else None,
            "outputs_equal_to_none": len(prompts) - mismatches, "num_prompts": len(prompts),
            "padding_share": shares(c)[0], "admission_share": shares(c)[1], "admission_marginal_share": shares(c)[2],
        })
    table = render(rows)
    print()
    print(table)
    print(f"\ncost curve at batch {args.batch_size}, ~{context} tokens cached: target 1 token {t_verify1:.2f} ms, "
          + ", ".join(f"{k + 1} tokens {t:.2f} ms (x{t / t_verify1:.2f})" for k, t in t_verify.items())
          + f"; draft 1 token {t_draft:.2f} ms")
    exact = models.target.device.type == "cpu" or args.profile
    print("where batchspec's time goes (share of round time: draft / verify / accept / bookkeeping / admit; then "
          "admission's share, its prompt tokens in packed forwards included (in proportion to their tokens, and at "
          "the margin), and the share of computed tokens that were padding)" + ("" if exact else "; without --profile a GPU's work lands in the phase that syncs:"))
    for c in field_:
        if c.timings:
            total = sum(t for name, t in c.timings.items() if name != "noise")
            noise = f"  (coupled noise {c.timings['noise'] / total:.1%})" if c.timings.get("noise") else ""
            padding, admission, marginal = shares(c)
            print(f"  {c.name:32s} " + " / ".join(f"{c.timings[n] / total:.0%}" for n in
                                                  ("draft", "verify", "accept", "bookkeeping", "admit"))
                  + f"  admission {admission:.1%} (at the margin {marginal:.1%}), padding {padding:.1%}" + noise)
    if args.constraints:
        print("structured output (outputs that parse and match their schema; host time in grammar work, share of "
              "round time):")
        for c in field_:
            valid, checked = schema_validity([models.tokenizer.decode(o, skip_special_tokens=True) for o in c.outputs],
                                             args.constraints)
            share = f", grammar {c.grammar_s / sum(t for n, t in c.timings.items() if n != 'noise'):.1%}" \
                if c.timings else ""
            print(f"  {c.name:32s} valid {valid}/{checked}{share}")
    launches = {c.name: count_launches(c, models, prompts, args) for c in field_ if c.kind == "batchspec"} \
        if args.profile else {}
    if launches:
        print("launches (ops dispatched outside captured steps, static path; per round by phase | steps run per round "
              "| host syncs per round | admission ops per generated token):")
        for name, n in launches.items():
            print(f"  {name:32s} {n['ops_per_round']} | {n['steps_per_round']} | {n['syncs_per_round']:.2f} | "
                  f"{n['admit_ops_per_token']:.3f}")
    adaptive_vs_best = {}
    for mode, verify in variants(args):
        for drafter in args.drafters:
            mine = [(r, c) for r, c in zip(rows, field_)
                    if r["drafter"] == drafter and c.compile == mode and c.verify == verify]
            fixed = [r for r, c in mine if not c.adaptive]
            adaptive = [(r, c) for r, c in mine if c.adaptive]
            if fixed and adaptive:
                best = max(fixed, key=lambda r: r["tokens_per_s"])
                row, contender = adaptive[0]
                key = drafter + variant_tag(args, mode, verify)
                adaptive_vs_best[key] = row["tokens_per_s"] / best["tokens_per_s"]
                trees = "".join(f"  tree {t} {n}" for t, n in (contender.rounds_by_tree or {}).items())
                print(f"adaptive vs the best fixed k: {key} {adaptive_vs_best[key]:.2f} (best fixed: "
                      f"{best['contender']}); adaptive vs none {row['vs_none']:.2f}; rounds by k: "
                      f"{rounds_by_k_text(contender.rounds_by_k)}{trees}")
    # Greedy and coupled sampling emit the target's own tokens whatever drafted them: those rows must
    # match drafter none's outputs (HF's sampled outputs and rejection sampling's differ by design).
    bound = rows if args.temperature == 0 else [r for r in rows if r["verify"] == "coupled"]
    same = all(r["outputs_equal_to_none"] == len(prompts) for r in bound)
    what = "greedy outputs" if args.temperature == 0 else "coupled sampled outputs (seed %d)" % args.seed
    print(f"{what}: " + ("all identical to drafter none" if same else
          "DIFFER: " + ", ".join(f"{r['contender']} {r['num_prompts'] - r['outputs_equal_to_none']}" for r in bound
                                 if r["outputs_equal_to_none"] != len(prompts))))
    settings = {**vars(args), "constraints": [c.kind for c in args.constraints] if args.constraints else None}
    return {"args": settings, "batch_size": batch_size, "cost_ms": cost, "rows": rows, "greedy_identical": same,
            "launches": launches,
            "adaptive_vs_best_fixed": adaptive_vs_best, "table": table,
            "machine": {"platform": platform.platform(), "threads": torch.get_num_threads(), "torch": torch.__version__,
                        "device": torch.cuda.get_device_name() if models.target.device.type == "cuda" else "cpu"}}




def render(rows: list[dict]) -> str:
    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    lines = ["| contender | tok/s | vs HF batched | vs HF static | vs none | acceptance | tokens/fwd | "
             "predicted vs none | achieved/predicted | = none |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['contender']} | {r['tokens_per_s']:.1f} | {fmt(r['vs_hf_batched'], '.2f')} | "
            f"{fmt(r['vs_hf_static'], '.2f')} | {r['vs_none']:.2f} | {fmt(r['acceptance'], '.2f')} | "
            f"{fmt(r['tokens_per_forward'], '.2f')} | {fmt(r['predicted_vs_none'], '.2f')} | "
            f"{fmt(r['achieved_over_predicted'], '.2f')} | {r['outputs_equal_to_none']}/{r['num_prompts']} |"
        )
    return "\n".join(lines)


def render_by_batch_size(reports: list[dict]) -> str:
    """One row per batch size: tokens/s of HF generate (dynamic and static cache), drafter none, and each
    drafter's best fixed k and adaptive, in every compile mode."""
    batchspec_rows = [row for r in reports for row in r["rows"] if row["kind"] == "batchspec"]
    modes = list(dict.fromkeys(row["compile"] for row in batchspec_rows))
    drafters = list(dict.fromkeys(row["drafter"] for row in batchspec_rows if row["drafter"] != "none"))
    has_static = any(row["kind"] == "hf_static" for r in reports for row in r["rows"])
    head = ["batch", "HF batched tok/s"] + (["HF static tok/s"] if has_static else [])
    for mode in modes:
        tag = f" [{mode}]" if len(modes) > 1 else ""
        head += [f"none{tag} tok/s", f"none{tag} vs HF" + (" static" if has_static else "")]
        for d in drafters:
            head += [f"{d}{tag} best fixed (k)", f"{d}{tag} adaptive", f"{d}{tag} best vs none"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for r in reports:
        by_kind = {row["kind"]: row for row in r["rows"] if row["kind"] != "batchspec"}
        cells = [str(r["batch_size"]),
                 f"{by_kind['hf_batched']['tokens_per_s']:.0f}" if "hf_batched" in by_kind else "-"]
        if has_static:
            cells.append(f"{by_kind['hf_static']['tokens_per_s']:.0f}" if "hf_static" in by_kind else "-")
        for mode in modes:
            mine = [row for row in r["rows"] if row["kind"] == "batchspec" and row["compile"] == mode]
            none = next(row for row in mine if row["drafter"] == "none")
            versus = none["vs_hf_static"] if has_static else none["vs_hf_batched"]
            cells += [f"{none['tokens_per_s']:.0f}", "-" if versus is None else f"{versus:.2f}"]
            for d in drafters:
                fixed = [row for row in mine if row["drafter"] == d and not row["adaptive"]]
                adaptive = [row for row in mine if row["drafter"] == d and row["adaptive"]]
                top = max(fixed, key=lambda row: row["tokens_per_s"]) if fixed else None
                best = max(fixed + adaptive, key=lambda row: row["tokens_per_s"]) if fixed + adaptive else None
                cells += [f"{top['tokens_per_s']:.0f} ({top['k']})" if top else "-",
                          f"{adaptive[0]['tokens_per_s']:.0f}" if adaptive else "-",
                          f"{best['vs_none']:.2f}" if best else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
