"""Where the engine still asks which path it is on: tests of path flags outside the runner (issue 60).

    python tools/path_flags.py            # per file, then the total
    python tools/path_flags.py --list     # every test, with its line

A *flag test* is a condition (`if`, `while`, a conditional expression, a comprehension's `if`) that reads a
name or attribute that selects an execution path: static, packed, packs, per_row, packed_width, fill_budget,
static_steps, static_prefill (a runner's or a drafter's captured steps, None off the static path).
The runner's folder (engine/model/), where the paths are implemented, is not counted. Tests are split by when
they run: "built" in a constructor (`__init__`) or a function that runs once, when the generator is built
(CHOSEN_ONCE: the verify pass's choice and cost model, the controllers, the captured steps' declarations); "each call" anywhere else, asked again every time the code
runs (every round, every admission).
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[1] / "batchspec" / "engine"
FLAGS = {"static", "packed", "packs", "per_row", "packed_width", "fill_budget", "static_steps", "static_prefill"}
# Functions that run once, when the generator is built: the verify pass's choice and cost model, the
# controllers, the captured steps' declarations (a drafter's `bind`).
CHOSEN_ONCE = {("verify_pass.py", "verify_pass"), ("verify_pass.py", "cost_model"),
               ("control/round_prices.py", "controllers"), ("round_steps.py", "declare_round_steps"),
               ("drafters/model.py", "bind"), ("drafters/eagle.py", "bind")}


def flag_names(node: ast.AST) -> set[str]:
    """The path flags a condition reads."""
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id in FLAGS:
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute) and sub.attr in FLAGS:
            found.add(sub.attr)
    return found


def flag_tests(source: str, rel: str) -> list[tuple[int, str, bool]]:
    """(line, flags, built) of each flag test in one module's source (rel: its path under engine/); built: in a
    function that chooses a path once."""
    tree = ast.parse(source)
    once = {id(sub) for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)
            and (fn.name == "__init__" or (rel, fn.name) in CHOSEN_ONCE) for sub in ast.walk(fn)}
    tests = []
    for node in ast.walk(tree):
        conditions = []
        if isinstance(node, (ast.If, ast.While, ast.IfExp)):
            conditions = [node.test]
        elif isinstance(node, ast.comprehension):
            conditions = node.ifs
        for condition in conditions:
            names = flag_names(condition)
            if names:
                tests.append((condition.lineno, ", ".join(sorted(names)), id(node) in once))
    return sorted(tests)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="every test with its line")
    args = parser.parse_args()
    totals = [0, 0]
    print("each call  built  module")
    for path in sorted(ENGINE.rglob("*.py")):
        rel = path.relative_to(ENGINE).as_posix()
        if rel.startswith("model/"):
            continue
        tests = flag_tests(path.read_text(), rel)
        if not tests:
            continue
        built = sum(t[2] for t in tests)
        totals[0] += len(tests) - built
        totals[1] += built
        print(f"{len(tests) - built:9d}  {built:5d}  engine/{rel}")
        if args.list:
            for line, names, once in tests:
                print(f"       {line:4d}  {names}{'  (built)' if once else ''}")
    print(f"{totals[0]:9d}  {totals[1]:5d}  flag tests outside engine/model/")


if __name__ == "__main__":
    main()
