"""The benchmark's field (python -m batchspec.bench): the contenders and how each one runs.

`Contender` holds one contender's settings and what its runs measured; `contenders` lists the ones a run's
flags call for (HF generate batched, with a static cache, assisted and prompt lookup at batch 1; batchspec
with drafter none and each drafter at every fixed k, tree and adaptive, in every compile and verify mode);
`run_contender` runs one over the prompts once and returns its tokens/s and outputs (`run_hf`,
`run_batchspec`); `count_launches` counts what a batchspec contender dispatches outside captured steps.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import torch
from transformers import LogitsProcessorList

from ..api import build_generator
from .grammar import GrammarLogitsProcessor
from .calibrate import sync
from ..engine.drafters.registry import DRAFT_MODEL, DRAFTERS, drafter_spec
from ..engine.model.host_device import LaunchCounter
from ..engine.phases import GRAMMAR_COMPILE, GRAMMAR_MASK
from ..engine.types import Request, RowParams


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
    pack_static: bool = True  # batchspec on the static path: verifies packed (engine/model/packed_static.py)
    spare_slots: int = 0  # batchspec: cache slots beyond the batch, prompts prefilled ahead (build_generator's)
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
    tokens: dict | None = None  # what its target forwards computed, summed over repeats (engine/stats.py TokenCounts)
    row_rounds: int = 0  # batchspec: rows that decided in its rounds, summed over rounds and repeats ...
    slot_rounds: int = 0  # ... and the slots those rounds had (rounds x batch size): how full its batch ran
    grammar_s: float = 0.0  # batchspec under constraints: host seconds in grammar work, summed over repeats


def contenders(args, has_draft: bool) -> list[Contender]:
    """The field, in table order: the HF contenders, then batchspec's in every (compile, verify) variant."""
    out = hf_contenders(args, has_draft)
    drafters = [d for d in DRAFTERS if d in args.drafters and (has_draft or drafter_spec(d).needs != DRAFT_MODEL)]
    packs = packings(args)
    spares = getattr(args, "spare_slots", [0])
    for mode, verify in variants(args):
        for pack in packs:
            for spare in spares:
                field = batchspec_contenders(args, drafters, mode, verify)
                for contender in field:
                    contender.pack_static, contender.spare_slots = pack, spare
                    if len(packs) > 1:
                        contender.name += " [packed]" if pack else " [unpacked]"
                    if len(spares) > 1:
                        contender.name += f" [spare {spare}]"
                out += field
    return out


def packings(args) -> list[bool]:
    """Whether the static path's verifies are packed, per --pack-static (both: each contender twice)."""
    choice = getattr(args, "pack_static", "on")
    return {"on": [True], "off": [False], "both": [True, False]}[choice]


def hf_contenders(args, has_draft: bool) -> list[Contender]:
    k_max = max(args.k)
    hf = args.row_lengths == "fixed"  # HF generate has one max_new_tokens per call
    out = [Contender("hf generate (batched)", "hf_batched")] if args.hf_batched and hf else []
    if args.hf_static and hf:
        out.append(Contender("hf generate (static cache)", "hf_static"))
    if args.hf_batch1 and hf and not args.constraints:  # HF's assisted generation: no constraints here
        if has_draft:
            out.append(Contender("hf assisted (batch 1)", "hf_assisted", k=k_max))
        out.append(Contender("hf prompt lookup (batch 1)", "hf_prompt_lookup", k=k_max))
    return out


def batchspec_contenders(args, drafters: list[str], mode: str, verify: str) -> list[Contender]:
    """Drafter none, then each drafter at every fixed k, every tree and adaptive, in one (compile, verify) variant."""
    k_max = max(args.k)
    tag = variant_tag(args, mode, verify)
    out = [Contender(f"batchspec none{tag}", "batchspec", "none", compile=mode, verify=verify)]
    if getattr(args, "noise_check", False):  # the same contender again: the ratio it reads is the noise
        out.append(Contender(f"batchspec none (again){tag}", "batchspec", "none", compile=mode, verify=verify))
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


def run_contender(contender: Contender, models, prompts, args) -> tuple[float, list[list[int]]]:
    """One run of the contender over every prompt: (generated tokens per second, each prompt's output tokens)."""
    run = run_batchspec if contender.kind == "batchspec" else run_hf
    return run(contender, models, prompts, args)


def hf_settings(contender: Contender, models, prompts, args) -> tuple[dict, dict, int]:
    """(generate's keyword arguments, the tokenizer's padding arguments, rows per generate call) of an HF contender."""
    tokenizer = models.tokenizer
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
    return common, padding, batch


@torch.inference_mode()
def run_hf(contender: Contender, models, prompts, args) -> tuple[float, list[list[int]]]:
    tokenizer, target = models.tokenizer, models.target
    tokenizer.padding_side = "left"
    common, padding, batch = hf_settings(contender, models, prompts, args)
    outputs, tokens = [], 0
    sync(target.device)
    t0 = time.perf_counter()
    for i in range(0, len(prompts), batch):
        enc = tokenizer(prompts[i : i + batch], return_tensors="pt", **padding).to(target.device)
        if args.constraints:  # the same constraints, as a logits processor (grammar.py)
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


def generator_settings(contender: Contender, args) -> dict:
    """build_generator's keyword arguments for a batchspec contender, less compile, profile and launches."""
    return dict(drafter=contender.drafter, k=contender.k, batch_size=args.batch_size,
                max_new_tokens=args.max_new_tokens, max_seq_len=args.max_seq_len, adaptive=contender.adaptive,
                temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                verify=contender.verify, tree=contender.tree, corpus=args.corpus_tokens,
                pack_static=contender.pack_static, spare_slots=contender.spare_slots,
                # Interleaved lanes share one process and so torch's one thread count: one lane's guard lowering it
                # would slow every lane's rounds alike and mix the comparison; the run reports the CPU's wait instead.
                guard_threads=not args.interleave)


def run_batchspec(contender: Contender, models, prompts, args):
    generator = batchspec_job(contender, models, args)
    sync(models.target.device)
    t0 = time.perf_counter()
    results = list(generator.run(requests(prompts, args)))
    sync(models.target.device)
    return finish_batchspec(contender, generator, results, len(prompts), time.perf_counter() - t0)


def batchspec_job(contender: Contender, models, args):
    """The generator for one run of a batchspec contender, its statistics reset: the contender's own, built at
    the warm-up, or a new one (suffix learns the prompts' completions, so that every run starts with what a
    job starts; --fresh: each run is a job of its own)."""
    generator = contender.generator
    if contender.drafter == "suffix" or args.fresh:
        generator = None
    if generator is None:  # the warm-up: forwards are captured once, here, as in a job
        generator = contender.generator = build_generator(
            models, profile=args.profile, compile=contender.compile, **generator_settings(contender, args))
    generator.reset_stats()
    return generator


def finish_batchspec(contender: Contender, generator, results, count: int, elapsed: float):
    """A run's (tokens per second, each prompt's output tokens in prompt order); its statistics added to the
    contender's."""
    by_id = {r.id: r for r in results}
    outputs = [by_id[str(i)].completion_token_ids for i in range(count)]
    add_stats(contender, generator)
    return generator.stats.completion_tokens / elapsed, outputs


def add_stats(contender: Contender, generator) -> None:
    """Add one run's statistics to the contender's (acceptance and tokens per forward: the latest run's)."""
    contender.grammar_s += generator.timers.seconds[GRAMMAR_MASK] + generator.timers.seconds[GRAMMAR_COMPILE]
    contender.acceptance = generator.stats.acceptance_rate
    contender.tokens_per_forward = generator.stats.tokens_per_forward
    before, now = contender.rounds_by_k or [], generator.stats.rounds_by_k  # forced drafts may reach past k
    contender.rounds_by_k = [n + (before[i] if i < len(before) else 0) for i, n in enumerate(now)]
    contender.rounds_by_tree = {t: (contender.rounds_by_tree or {}).get(t, 0) + n
                                for t, n in generator.stats.rounds_by_tree.items()}
    contender.timings = {name: (contender.timings or {}).get(name, 0.0) + t
                         for name, t in {**generator.timings, "noise": generator.noise_s}.items()}
    contender.tokens = {name: (contender.tokens or {}).get(name, 0) + n for name, n in generator.tokens.summary().items()}
    contender.row_rounds += generator.stats.target_forwards
    contender.slot_rounds += generator.stats.rounds * generator.batch_size


def count_launches(contender: Contender, models, prompts, args) -> dict:
    """One untimed run of the contender over the static path (compile=static) with a LaunchCounter: the aten
    ops each round dispatches outside captured steps, per phase, the steps it runs and its host syncs."""
    counter = LaunchCounter()
    generator = build_generator(models, compile="static", launches=counter, **generator_settings(contender, args))
    with counter:
        for _ in generator.run(requests(prompts, args)):
            pass
    rounds, tokens = max(generator.stats.rounds, 1), max(generator.stats.completion_tokens, 1)
    return {"ops_per_round": {k: round(v / rounds, 1) for k, v in counter.ops.items() if k != "admit"},
            "steps_per_round": round(sum(v for k, v in counter.replays.items() if k != "admit") / rounds, 1),
            "syncs_per_round": sum(v for k, v in counter.syncs.items() if k != "admit") / rounds,
            "admit_ops_per_token": counter.ops.get("admit", 0) / tokens, "problems_in_steps": counter.in_step[:5]}
