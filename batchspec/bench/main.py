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
its generator across repeats, as one long job would (with --interleave the batchspec contenders' jobs
run round by round side by side instead: bench/interleave.py). The table reports the median tokens/s, the
ratio to HF batched `generate`, the ratio to drafter none (the median of the ratios of runs made side
by side), acceptance, tokens per target forward, and the speedup over drafter none predicted from the
measured acceptance and cost curve:

    predicted = tokens_per_forward * t_verify(1) / (t_verify(k+1) + k * t_draft(1))

where t_verify(T) is one target forward of T tokens per row at this batch size and t_draft(1) one
draft forward of 1 token (0 for the n-gram and prompt-lookup drafters), both captured as the first
`--compile` mode says. It also checks that every greedy output equals drafter none's, token for
token, and says so. HF `generate` runs left-padded batches, with its default dynamic cache and with
`cache_implementation="static"` (which transformers compiles by itself on a GPU; every prompt is
padded to the longest so that every batch has one shape and compiles once).
"""

# The command line: the flags, their checks, loading the pair and the prompts, and writing the reports.
# The field and how each contender runs: contenders.py; the timed runs at one batch size:
# measure.py; the rows, tables and printed lines: report.py.

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from .contenders import requests  # noqa: F401 (importable from here, as before the split)
from .measure import bench_batch_size
from .report import render_by_batch_size
from .calibrate import read_prompts
from ..sources.corpus import load_corpus
from ..engine.drafters.registry import DRAFTERS, HEAD, drafter_spec
from ..engine.model.graphs import resolve_capture
from ..util.files import atomic_write_text
from ..engine.model.models import load_models
from ..engine.types import Constraint, TreeSpec

DEMO = Path(__file__).resolve().parents[1] / "assets" / "demo"


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(args, parser)
    torch.manual_seed(0)
    check_drafters(args, parser)
    models, prompts = load_inputs(args, parser)
    reports = [bench_batch_size(args, models, prompts, b) for b in args.batch_size]
    if len(reports) > 1:
        summary = render_by_batch_size(reports)
        print("\n" + summary)
    else:
        summary = reports[0]["table"]
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(reports[0] if len(reports) == 1 else reports, indent=2))
    if args.markdown:
        atomic_write_text(Path(args.markdown), summary + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_job_arguments(parser)
    add_field_arguments(parser)
    return parser


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """The pair, the prompts, the lengths, batch sizes, k, compile modes, trees and sampling."""
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
                        "(CUDA graphs on a GPU, eager on CPU), on (CUDA graphs; torch.compile on CPU), inductor "
                        "(forwards compiled, then captured, per shape on first use), off, static; "
                        "a list (e.g. on,off) runs every batchspec contender in each mode")
    parser.add_argument("--tree", default="", help="tree drafts to run too, BxD (e.g. 2x4,2x8): a fixed-tree "
                        "contender for each, and adaptive chooses between chains and these trees")
    parser.add_argument("--pack-static", choices=("on", "off", "both"), default="on",
                        help="on the static path (a GPU): verifies packed (chains and trees), each row computing only its own "
                        "tokens (on), every slot the round's width (off), or each batchspec contender both ways")
    parser.add_argument("--spare-slots", default="0", help="batchspec's spare cache slots, whose prompts packed "
                        "rounds prefill ahead in waves (build_generator's spare_slots; CPU); a list (e.g. 0,16) runs "
                        "every batchspec contender with each")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples, seeded")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verify", default="coupled", help="with sampling: coupled, rejection, or both "
                        "(coupled,rejection) side by side")


def add_field_arguments(parser: argparse.ArgumentParser) -> None:
    """Profiling, which contenders run, the drafters, structured output, chat prompts and the output files."""
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
    parser.add_argument("--fresh", action="store_true", help="every run builds its generator anew, as a job of "
                        "--num-prompts rows would (adaptive speculation starts from nothing but the machine's cached "
                        "costs); by default a contender keeps its generator across repeats, as one long job would")
    parser.add_argument("--interleave", action="store_true", help="run the batchspec contenders' jobs round by "
                        "round, interleaved in one stretch of time, so that the machine's swings slow each alike "
                        "(bench/interleave.py); each contender runs jobs until every one has finished --repeats")
    parser.add_argument("--noise-check", action="store_true", help="drafter none a second time ('batchspec none "
                        "(again)'): its ratio to the first is what the machine and the harness do to a ratio of 1")
    parser.add_argument("--json", help="write the table as JSON here")
    parser.add_argument("--markdown", help="write the table as Markdown here")


def check_args(args, parser) -> None:
    """Parse the list flags (--k, --compile, --tree, --verify, --batch-size, --spare-slots) in place; parser.error
    on a bad one."""
    args.k = sorted(set(integers(args.k, "--k", "4 or 1,2,4", parser)))
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
    args.batch_size = integers(args.batch_size, "--batch-size", "8 or 1,8,32", parser)
    args.spare_slots = sorted(set(integers(args.spare_slots, "--spare-slots", "0 or 0,16", parser)))
    if args.spare_slots[0] < 0:
        parser.error("--spare-slots must be at least 0")


def integers(value, flag: str, example: str, parser) -> list[int]:
    """A comma-separated list flag's integers, in order; parser.error naming the flag on anything else."""
    try:
        return [int(n) for n in str(value).split(",")]
    except ValueError:
        parser.error(f"{flag}: expected integers like {example}, got {value!r}")


def check_drafters(args, parser) -> None:
    args.drafters = [d.strip() for d in args.drafters.split(",") if d.strip()]
    drafting = [d for d in DRAFTERS if d != "none"]
    unknown = set(args.drafters) - set(drafting)
    if unknown:
        parser.error(f"--drafters: unknown {sorted(unknown)}; choose from {', '.join(drafting)}")


def load_inputs(args, parser) -> tuple[object, list]:
    """The prompts (chat-rendered with --chat), their constraints (set on args), the models (the draft randomized
    with --random-draft; every model stops at the same EOS tokens) and the suffix drafter's corpus (on args)."""
    try:
        prompts = read_prompts(args.prompts, args.num_prompts, args.prompt_column, args.split, messages=args.chat)
        schemas = read_prompts(args.prompts, args.num_prompts, args.schema_column, args.split) \
            if args.schema_column else None
    except ValueError as e:  # SourceError included
        parser.error(f"--prompts: {e}")
    if len(prompts) < args.num_prompts:  # said, so that a table's row count is not read as the one asked for
        print(f"--num-prompts {args.num_prompts}: {args.prompts} holds {len(prompts)} prompts; running {len(prompts)}",
              file=sys.stderr, flush=True)
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
    return models, prompts


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


def randomize(model, seed: int) -> None:
    """Replace every weight of `model` by a fresh random initialisation of the same config (fixed seed)."""
    torch.manual_seed(seed)
    fresh = AutoModelForCausalLM.from_config(model.config)
    model.load_state_dict(fresh.state_dict())


if __name__ == "__main__":
    main()
