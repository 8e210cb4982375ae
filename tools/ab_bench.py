"""This checkout against another one (say, main before a change), side by side, interleaved: in one process,
or with --processes each run in a process of its own.

    python tools/ab_bench.py --base /path/to/other/checkout --prompts batchspec/assets/demo/templated.parquet \\
        --num-prompts 300 --max-new-tokens 32 --batch-size 8,32,64 --drafters none,suffix:adaptive \\
        --row-lengths staggered --json ab.json

The other checkout's package is copied to a temporary folder as `batchspec_base` (the engine imports
itself relatively, so both load side by side) and the models are loaded once and shared. For each batch
size every contender runs in both checkouts once untimed (the warm-up), then --repeats times, each run
right after a run of the first contender (drafter none) of the same checkout, base and this in turn: a
machine whose speed drifts over minutes (a shared VM's does, by 10-30%) slows a pair alike. It prints
a line per run as it goes (stderr: its tokens/s and, for adaptive contenders, the payoff check's state so
far), then each contender's median tokens/s per checkout, its ratio to the same checkout's first
contender and this checkout's ratio to the base's, each the median of the ratios of runs made side by
side, and says whether every output equals the first contender's. Both run through the API they share
(`build_generator`, `Request`, `RowParams.max_new_tokens` for staggered lengths), so any earlier main can
be the base.

--processes: each timed pair (the first contender, then another) runs in a new Python process that imports
only its own checkout's package, loads the models, runs both contenders once untimed, then once timed, and
reports their rates and a digest of their outputs. Nothing is shared between the checkouts (allocator,
threads, caches of compiled kernels, the models' memory), at the price of a load per pair. The pairs are
interleaved as above: each repeat runs every contender's pair in both checkouts, who goes first
alternating.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

# Where this checkout and earlier ones keep them (a --processes worker imports its own checkout's).
LOADERS = ("batchspec.engine.model.models", "batchspec.engine.models", "batchspec.models")
READERS = ("batchspec.bench.calibrate", "batchspec.calibrate")
TYPES = ("batchspec.engine.types", "batchspec.types")


def first_module(names: tuple[str, ...]):
    """The first of `names` that imports (a module's place in this checkout or in an earlier one)."""
    for name in names:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is None or not name.startswith(error.name):
                raise  # a dependency the module needs is missing, not the module
    raise ModuleNotFoundError(f"none of {', '.join(names)}")


def load_base(checkout: Path, into: Path):
    """The other checkout's package under the name batchspec_base -> (its api, its types)."""
    shutil.copytree(checkout / "batchspec", into / "batchspec_base", ignore=shutil.ignore_patterns("assets", "__pycache__"))
    # Both packages register their packed attention with transformers by name: give the base's its own.
    engine = into / "batchspec_base" / "engine"
    for packed in (engine / "model" / "packed.py", engine / "packed.py"):  # engine/model/ since the parts are folders
        if packed.exists():
            text = packed.read_text()
            packed.write_text(text.replace('ATTENTION = "batchspec_packed"', 'ATTENTION = "batchspec_packed_base"'))
    sys.path.insert(0, str(into))
    # A base from before engine/ held the records has them at the package's top.
    types = "engine.types" if (into / "batchspec_base" / "engine" / "types.py").exists() else "types"
    return importlib.import_module("batchspec_base.api"), importlib.import_module(f"batchspec_base.{types}")


def requests(types, prompts: list[str], max_new_tokens: int, staggered: bool) -> list:
    """Each row's max_new_tokens: fixed, or drawn uniformly from [8, 2 x max_new_tokens] seeded by its id."""
    return [types.Request(str(i), p, params=types.RowParams(
        max_new_tokens=random.Random(str(i)).randint(8, 2 * max_new_tokens) if staggered else max_new_tokens))
        for i, p in enumerate(prompts)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    demo = HERE / "batchspec" / "assets" / "demo"
    parser.add_argument("--base", help="the other checkout (its folder holding batchspec/)")
    parser.add_argument("--processes", action="store_true", help="each timed pair in a process of its own")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # a --processes run: the checkout it imports
    parser.add_argument("--target", default=str(demo / "target"))
    parser.add_argument("--draft", default=str(demo / "draft"))
    parser.add_argument("--head", default="", help="an EAGLE-3 head folder, for the eagle drafter")
    parser.add_argument("--prompts", default=str(demo / "prompts.parquet"))
    parser.add_argument("--num-prompts", type=int, default=200)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--max-seq-len", type=int, default=512)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--batch-size", default="8")
    parser.add_argument("--drafters", default="none,suffix:adaptive",
                        help="contenders, drafter[:adaptive][:tree=BxD]; the first is the reference for ratios and "
                        "outputs")
    parser.add_argument("--row-lengths", choices=("fixed", "staggered"), default="fixed")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fresh", action="store_true", help="every run builds its generator anew, as a short job "
                        "would (default: each contender keeps its generator across repeats, as one long job)")
    parser.add_argument("--chat", action="store_true", help="render each prompt with the target's chat template")
    parser.add_argument("--compile", default="auto", help="build_generator's compile (e.g. static: the captured "
                        "path's steps, run eagerly on CPU)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    drafters = [d.strip() for d in args.drafters.split(",") if d.strip()]
    if args.worker:
        return worker(args, drafters)
    if not args.base:
        parser.error("--base is required")
    if args.processes:
        report = [bench_processes(args, argv if argv is not None else sys.argv[1:], drafters, int(b))
                  for b in args.batch_size.split(",")]
    else:
        report = in_process(args, drafters)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


def load_inputs(args):
    """(the models, the prompts) as the arguments name them, with the loaders of the checkout imported."""
    models = first_module(LOADERS).load_models(args.target, args.draft or None, dtype="float32", device="cpu",
                                               head=args.head or None)
    prompts = first_module(READERS).read_prompts(args.prompts, args.num_prompts)
    if args.chat:
        prompts = [models.tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                        add_generation_prompt=True) for p in prompts]
    return models, prompts


def in_process(args, drafters: list[str]) -> list[dict]:
    import batchspec.api as this_api
    with tempfile.TemporaryDirectory() as tmp:
        base_api, base_types = load_base(Path(args.base).resolve(), Path(tmp))
        versions = {"base": (base_api, base_types), "this": (this_api, first_module(TYPES))}
        models, prompts = load_inputs(args)
        return [bench_batch(args, versions, models, prompts, drafters, int(b)) for b in args.batch_size.split(",")]


def build(args, api, models, spec: str, batch: int):
    """The generator of contender `spec` (drafter[:adaptive][:tree=BxD]) through a checkout's API."""
    drafter, *options = spec.split(":")
    trees = [o.partition("=")[2] for o in options if o.startswith("tree=")]
    unknown = [o for o in options if o != "adaptive" and not o.startswith("tree=")]
    if unknown:
        raise SystemExit(f"contender {spec!r}: unknown option {unknown[0]!r} (adaptive, tree=BxD)")
    return api.build_generator(models, drafter=drafter, k=args.k, batch_size=batch,
                               max_new_tokens=2 * args.max_new_tokens, max_seq_len=args.max_seq_len,
                               adaptive="adaptive" in options, tree=trees[0] if trees else None,
                               compile=args.compile, guard_threads=False)  # threads are per process


def timed_run(args, generator, types, prompts: list[str]) -> tuple[float, dict]:
    """One job over the prompts -> (completion tokens/s, each row's completion token ids)."""
    generator.reset_stats()
    started = time.perf_counter()
    results = list(generator.run(requests(types, prompts, args.max_new_tokens, args.row_lengths == "staggered")))
    seconds = time.perf_counter() - started
    return generator.stats.completion_tokens / seconds, {r.id: r.completion_token_ids for r in results}


def digest(outputs: dict) -> str:
    return hashlib.sha256(json.dumps(outputs, sort_keys=True).encode()).hexdigest()[:16]


def worker(args, drafters: list[str]) -> None:
    """A --processes run: this process imports only the checkout `args.worker`; each contender once untimed,
    then once timed, in order -> one JSON line on stdout: {contender: [tokens/s, digest of the outputs]}."""
    checkout = Path(args.worker).resolve()
    sys.path[:] = [str(checkout)] + [p for p in sys.path if Path(p).resolve() != HERE]
    try:
        api = importlib.import_module("batchspec.api")
    except ModuleNotFoundError:
        api = None
    # An editable install finds its checkout's package after sys.path has none: never time that one instead.
    if api is None or not Path(api.__file__).resolve().is_relative_to(checkout):
        raise SystemExit(f"ab_bench: {checkout} holds no batchspec package")
    types = first_module(TYPES)
    models, prompts = load_inputs(args)
    batch = int(args.batch_size)
    generators = {d: build(args, api, models, d, batch) for d in drafters}
    for generator in generators.values():  # the warm-up
        timed_run(args, generator, types, prompts)
    report = {}
    for d in drafters:
        # suffix learns the job; --fresh: each run is a job of its own (the controller starts afresh)
        fresh = d.startswith("suffix") or args.fresh
        rate, outputs = timed_run(args, build(args, api, models, d, batch) if fresh else generators[d], types, prompts)
        report[d] = [rate, digest(outputs)]
    print(json.dumps(report), flush=True)


def bench_processes(args, argv: list[str], drafters: list[str], batch: int) -> dict:
    """Every contender's pair (the first contender, then it) in a new process a checkout, repeated, interleaved."""
    checkouts = {"base": Path(args.base).resolve(), "this": HERE}
    common = [a for a in argv if a not in ("--processes",)]
    reference = drafters[0]
    rates = {name: {d: [] for d in drafters} for name in checkouts}
    pairs = {name: {d: [] for d in drafters[1:]} for name in checkouts}
    digests: dict = {}
    for repeat in range(1, args.repeats + 1):
        for d in drafters[1:] or drafters:
            for name in sorted(checkouts, reverse=repeat % 2 == 0):
                pair = list(dict.fromkeys([reference, d]))
                command = [sys.executable, __file__, *common, "--worker", str(checkouts[name]),
                           "--batch-size", str(batch), "--drafters", ",".join(pair)]
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode:  # the worker's own words (a refused checkout, a traceback)
                    raise SystemExit(f"ab_bench: the {name} run failed ({done.returncode}):\n{done.stderr[-4000:]}")
                lines = done.stdout.splitlines()
                report = json.loads(lines[-1])
                for c, (rate, out) in report.items():
                    rates[name][c].append(rate)
                    digests.setdefault((name, c), set()).add(out)
                if d != reference:
                    pairs[name][d].append(report[d][0] / report[reference][0])
                print(f"  batch {batch} repeat {repeat}: {name} " + ", ".join(
                    f"{c} {rate:.1f} tok/s" for c, (rate, _) in report.items()), file=sys.stderr, flush=True)
    same = {name: all(digests[name, d] == digests[name, reference] and len(digests[name, d]) == 1
                      for d in drafters) for name in checkouts}
    same["across"] = all(digests["this", d] == digests["base", d] for d in drafters)
    return summarize(args, batch, drafters, rates, pairs, same, "separate processes")


def bench_batch(args, versions: dict, models, prompts: list[str], drafters: list[str], batch: int) -> dict:
    generators = {(name, d): build(args, api, models, d, batch) for name, (api, _) in versions.items()
                  for d in drafters}
    reference = drafters[0]
    rates = {name: {d: [] for d in drafters} for name in versions}
    pairs = {name: {d: [] for d in drafters[1:]} for name in versions}  # (contender, its reference) side by side
    outputs: dict = {}

    def run(name: str, d: str, repeat: int) -> float:
        api, types = versions[name]
        # suffix learns the job; --fresh: each run is a job of its own (the controller starts afresh)
        fresh = d.startswith("suffix") or args.fresh
        generator = build(args, api, models, d, batch) if fresh else generators[name, d]
        rate, outputs[name, d] = timed_run(args, generator, types, prompts)
        # One line a run as it goes (stderr), so that a run cut short by a timeout still says something.
        payoff = getattr(getattr(generator, "scheduler", None), "payoff", None)
        check = "" if payoff is None else (
            " (payoff check so far: {rounds_drafting} rounds drafting, {rounds_plain} plain, verdict {winner}, "
            "drafting / plain {ratio:.2f})".format(**payoff.summary()))
        which = f"repeat {repeat}" if repeat else "warm-up"
        print(f"  batch {batch} {which}: {name} {d} {rate:.1f} tok/s{check}", file=sys.stderr, flush=True)
        return rate

    for repeat in range(args.repeats + 1):  # the first is the warm-up
        # Each contender runs right after its reference, in both checkouts (who goes first alternates).
        for d in drafters[1:] or drafters:
            for name in sorted(versions, reverse=repeat % 2 == 1):
                timed = [(c, run(name, c, repeat)) for c in dict.fromkeys([reference, d])]
                if repeat:
                    for c, rate in timed:
                        rates[name][c].append(rate)
                    if d != reference:
                        pairs[name][d].append(timed[1][1] / timed[0][1])
    same = {name: all(outputs[name, d] == outputs[name, drafters[0]] for d in drafters) for name in versions}
    same["across"] = all(outputs["this", d] == outputs["base", d] for d in drafters)
    return summarize(args, batch, drafters, rates, pairs, same, "one process")


def summarize(args, batch: int, drafters: list[str], rates: dict, pairs: dict, same: dict, how: str) -> dict:
    """Print and return the medians, the ratios to the first contender and this checkout's to the base's."""
    reference = drafters[0]
    medians = {name: {d: statistics.median(r) for d, r in by.items()} for name, by in rates.items()}
    # Ratios of runs made next to each other (the same repeat), then their median: the machine's drift
    # over minutes cancels out of a pair, not out of a ratio of medians.
    paired = {name: {d: statistics.median(pairs[name][d]) if d != reference else 1.0 for d in drafters}
              for name in rates}
    this_vs_base = {d: statistics.median(t / b for t, b in zip(rates["this"][d], rates["base"][d])) for d in drafters}
    print(f"batch {batch}, {args.row_lengths} lengths, {args.num_prompts} prompts ({args.repeats} timed runs each, "
          f"interleaved, {how}; medians, ratios of runs made side by side; outputs equal to {reference}'s: "
          f"base {same['base']}, this {same['this']}; this's equal to base's: {same['across']})", flush=True)
    for d in drafters:
        b, t = medians["base"][d], medians["this"][d]
        print(f"  {d:24s} base {b:8.1f} tok/s ({paired['base'][d]:.2f}x)   this {t:8.1f} tok/s "
              f"({paired['this'][d]:.2f}x)   this/base {this_vs_base[d]:.2f}", flush=True)
    return {"batch_size": batch, "row_lengths": args.row_lengths, "how": how, "rates": rates, "medians": medians,
            "vs_first": paired, "this_vs_base": this_vs_base, "outputs_equal": same}


if __name__ == "__main__":
    main()
