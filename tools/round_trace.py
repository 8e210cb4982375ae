"""What one round touches: the engine modules a `step()` enters and how deep its calls go to the model forward.

    python tools/round_trace.py                       # the demo pair, drafter ngram, adaptive, batch 8
    python tools/round_trace.py --drafter model --rounds 5

Runs a short job on the shipped demo pair until a few rounds in (so that rows are decoding, not only
prefilling), then profiles the next `--rounds` calls of `SpecBatchGenerator.step` with `sys.setprofile`:
every Python function a round enters, by module. It prints, per round, the batchspec modules entered, and
the call depth (step() is depth 0) at which the first call into transformers' model forward happens, with
the chain of batchspec functions that leads there. The figures are the ones issue 60 names ("modules touched
per round", "calls deep on the eager path").
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from batchspec.api import build_generator  # noqa: E402
from batchspec.bench.calibrate import read_prompts  # noqa: E402
from batchspec.engine.generator import SpecBatchGenerator  # noqa: E402
from batchspec.engine.model.models import load_models  # noqa: E402
from batchspec.engine.types import Request  # noqa: E402

PACKAGE = str(HERE / "batchspec")


def module_of(filename: str) -> str | None:
    """batchspec/engine/x.py -> 'engine/x.py'; None outside the package."""
    if not filename.startswith(PACKAGE):
        return None
    return filename[len(PACKAGE) + 1:]


class RoundTrace:
    """A profile hook over one step(): modules entered and the path to the first model forward."""

    def __init__(self):
        self.depth = 0
        self.modules: Counter = Counter()
        self.stack: list[tuple[str | None, str]] = []  # (batchspec module or None, function) of each frame
        self.model_path: list[str] | None = None

    def __call__(self, frame, event, arg):
        if event == "call":
            code = frame.f_code
            module = module_of(code.co_filename)
            self.depth += 1
            self.stack.append((module, code.co_name))
            if module:
                self.modules[module] += 1
            elif (self.model_path is None and code.co_name == "forward" and "transformers/models" in code.co_filename):
                self.model_path = [f"{m}:{name}" for m, name in self.stack[:-1] if m]
        elif event == "return":
            self.depth -= 1
            if self.stack:
                self.stack.pop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    demo = HERE / "batchspec" / "assets" / "demo"
    parser.add_argument("--drafter", default="ngram")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm-rounds", type=int, default=6, help="rounds run before the traced ones")
    args = parser.parse_args(argv)
    models = load_models(str(demo / "target"), str(demo / "draft") if args.drafter == "model" else None,
                         dtype="float32", device="cpu")
    generator = build_generator(models, drafter=args.drafter, k=4, batch_size=args.batch_size, max_new_tokens=48,
                                adaptive=True, guard_threads=False)
    prompts = read_prompts(str(demo / "prompts.parquet"), 2 * args.batch_size)
    step, traces, rounds = SpecBatchGenerator.step, [], [0]

    def traced(self):
        rounds[0] += 1
        if rounds[0] <= args.warm_rounds or len(traces) >= args.rounds:
            return step(self)
        trace = RoundTrace()
        sys.setprofile(trace)
        try:
            return step(self)
        finally:
            sys.setprofile(None)
            traces.append(trace)

    SpecBatchGenerator.step = traced
    try:
        for _ in generator.run(Request(str(i), p) for i, p in enumerate(prompts)):
            pass
    finally:
        SpecBatchGenerator.step = step
    for i, trace in enumerate(traces):
        engine = sorted(m for m in trace.modules if m.startswith("engine/"))
        others = sorted(m for m in trace.modules if not m.startswith("engine/"))
        path = trace.model_path or []
        # Depth below step(): the chain's first entry is step itself.
        print(f"round {args.warm_rounds + i + 1}: {len(engine)} engine modules, {len(others)} others; "
              f"model forward reached {len(path) - 1} calls below step()")
        print("  engine: " + " ".join(m.removeprefix("engine/") for m in engine))
        # By the engine's parts: its folders, and the round's own modules at its top.
        parts = Counter(m.split("/")[1] + "/" if m.count("/") > 1 else "the round" for m in engine)
        print("  parts:  " + ", ".join(f"{part} {n}" for part, n in sorted(parts.items())))
        if others:
            print("  others: " + " ".join(others))
        print("  path:   " + " -> ".join(path))


if __name__ == "__main__":
    main()
