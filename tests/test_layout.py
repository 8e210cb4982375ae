"""The package's layout (docs/how_it_works.md, "Source layout"): its folders import one another one way
only, no module takes a private name from another, and every verb of `batchspec VERB` runs."""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from batchspec.__main__ import VERBS, main

PACKAGE = Path(__file__).resolve().parents[1] / "batchspec"


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(absolute module, names taken, line) of every `import` / `from ... import` in one file, deferred ones too."""
    module = ".".join(("batchspec",) + path.relative_to(PACKAGE).with_suffix("").parts)
    package = module.removesuffix(".__init__") if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((target, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            found.extend((a.name, [], node.lineno) for a in node.names)
    return [f for f in found if f[0].startswith("batchspec")]


def room(module: str) -> str:
    """The top-level folder or module of batchspec that a module belongs to ('batchspec' for the package's face)."""
    parts = module.split(".")
    return ".".join(parts[:2])


def cycles(edges: dict[str, set[str]]) -> list[str]:
    """The import cycles between rooms, each written 'a -> b -> a' (edges: room -> the rooms it imports)."""
    found = []

    def visit(node, path):
        for nxt in sorted(edges[node]):
            if nxt in path:
                found.append(path[path.index(nxt):] + [nxt])
            elif len(path) < 12:
                visit(nxt, path + [nxt])

    for start in sorted(edges):
        visit(start, [start])
    return sorted({" -> ".join(c) for c in found})


def test_no_folder_imports_one_that_imports_it_back():
    """The rooms (batchspec's folders and top-level modules) and their imports form no cycle: each room can
    be read knowing only the rooms below it. batchspec/__init__.py is left out: it only hands the API on,
    on first use."""
    edges = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        source = room(".".join(("batchspec",) + path.relative_to(PACKAGE).with_suffix("").parts))
        for target, names, line in imports(path):
            # `from batchspec import x` takes room batchspec.x; `from .a.b import c` takes room batchspec.a
            for module in ([f"{target}.{n}" for n in names] if target == "batchspec" else [target]):
                if room(module) not in (source, "batchspec"):
                    edges[source].add(room(module))
    assert not cycles(edges), cycles(edges)[:5]


def type_only(path: Path) -> set[int]:
    """The lines of a file's `if TYPE_CHECKING:` imports (names for annotations, not needed to run)."""
    lines = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            lines.update(inner.lineno for inner in node.body)
    return lines


def engine_part(module: str) -> str:
    """batchspec.engine.model.runner -> 'model/'; batchspec.engine.round -> 'round' (the round's own modules)."""
    parts = module.split(".")[2:]
    return parts[0] + "/" if len(parts) > 1 or (PACKAGE / "engine" / parts[0]).is_dir() else parts[0]


def test_the_engine_s_parts_import_one_another_one_way():
    """Inside the engine (docs/how_it_works.md, "Source layout"): its folders (model/, drafters/, control/,
    grammar/) and the round's modules beside them form no import cycle at run time, and model/ (the target on
    this machine) takes nothing from the engine above it but tree drafts' geometry (tree.py): it is handed
    tokens, lengths and masks. A drafter that imported the controller's timers put drafters/ and control/ in one
    cycle (before the forward timers moved to model/timing.py)."""
    engine = PACKAGE / "engine"
    edges, model_takes = defaultdict(set), set()
    for path in engine.rglob("*.py"):
        source = engine_part(".".join(("batchspec",) + path.relative_to(PACKAGE).with_suffix("").parts))
        skip = type_only(path)
        for target, names, line in imports(path):
            if line in skip or not target.startswith("batchspec.engine."):
                continue
            if engine_part(target) != source:
                edges[source].add(engine_part(target))
                if source == "model/":
                    model_takes.add(engine_part(target))
    assert not cycles(edges), cycles(edges)[:5]
    assert model_takes <= {"tree"}, model_takes


def test_no_private_name_is_imported_from_another_module():
    taken = []
    for path in PACKAGE.rglob("*.py"):
        for target, names, line in imports(path):
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private:
                taken.append(f"{path.relative_to(PACKAGE.parent)}:{line} takes {private} from {target}")
    assert not taken, taken


def test_every_deferred_import_says_why():
    """An import inside a function is there to save start-up time or to keep a dependency optional, and says so:
    "deferred" on its line, in the comments and imports right above it, or in a comment of the module's own
    (one reason for all of a module's deferred imports). TYPE_CHECKING blocks are not functions: not read."""
    unexplained = []
    for path in PACKAGE.rglob("*.py"):
        lines = path.read_text().splitlines()
        if any(line.startswith("#") and "deferred" in line.lower() for line in lines):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in ast.walk(node):
                if not isinstance(inner, (ast.Import, ast.ImportFrom)):
                    continue
                at = inner.lineno - 1
                above = at - 1
                while above >= 0 and (not lines[above].strip() or lines[above].lstrip().startswith(("#", "from ", "import "))):
                    above -= 1
                if not any("deferred" in line.lower() for line in lines[above + 1: at + 1]):
                    unexplained.append(f"{path.relative_to(PACKAGE.parent)}:{inner.lineno}")
    assert not unexplained, sorted(set(unexplained))


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_verb_runs(verb, monkeypatch, capsys):
    """`batchspec VERB --help` exits 0 with the verb's own usage (the module VERBS names runs it)."""
    monkeypatch.setattr(sys, "argv", ["batchspec", verb, "--help"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code in (0, None), capsys.readouterr()
    assert "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("name, verb", [("status", "status"), ("run_batch", "run-batch"), ("calibrate", "calibrate"),
                                        ("bench_io", "bench-io"), ("train_draft", "train-draft")])
def test_every_documented_module_spelling_is_a_thin_entry_module_of_its_verb(name, verb):
    """`python -m batchspec.NAME` finds entry/NAME.py (the folder is on the package's path) and runs the same
    main as `batchspec VERB`."""
    import importlib
    import importlib.util

    spec = importlib.util.find_spec(f"batchspec.{name}")
    assert spec is not None and Path(spec.origin) == PACKAGE / "entry" / f"{name}.py"
    assert importlib.import_module(f"batchspec.{name}").main is importlib.import_module(VERBS[verb]).main


@pytest.mark.parametrize("argv, code, line", [
    (["stauts", "out"], 2, "batchspec: error: unknown verb 'stauts'; verbs: job, run-batch, status, report, bench, "
                           "bench-io, calibrate, train-draft (or job=NAME to run a job)"),
])
def test_a_misspelt_verb_is_one_line(argv, code, line, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["batchspec", *argv])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == code
    assert capsys.readouterr().err.strip().splitlines() == [line]


@pytest.mark.parametrize("name", ["Round", "Draft", "Verified", "RoundShape"])
def test_round_records_are_values(name):
    """A round's records are built once by the stage that owns them and only read after (round.py): an
    attribute written after construction raises."""
    import dataclasses

    from batchspec.engine import round as records

    cls = getattr(records, name)
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, name


# Mixins left (issue 60 undid the last: a ModelRunner's static steps and prompt chunks are parts it holds).
MIXINS_LEFT: set[tuple[str, str]] = set()


def classes() -> dict[str, tuple[ast.ClassDef, Path]]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, (node, path))
    return out


def own_names(node: ast.ClassDef) -> set[str]:
    """What a class defines itself: its methods, class attributes, and the `self.x` it assigns."""
    names = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
        elif isinstance(item, ast.Assign):
            names.update(t.id for t in item.targets if isinstance(t, ast.Name))
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store) and getattr(sub.value, "id", "") == "self":
            names.add(sub.attr)
    return names


def test_no_class_is_spread_over_files_by_a_mixin():
    """A class inheriting from another module's class inherits a whole one (an interface with its own
    defaults: HostDrafter, Source), not a mixin that reads attributes only the inheriting class sets."""
    found = classes()
    mixins = set()
    for name, (node, path) in found.items():
        for base in node.bases:
            base_name = getattr(base, "id", None)
            if base_name not in found or found[base_name][1] == path:
                continue
            base_node = found[base_name][0]
            read = {sub.attr for sub in ast.walk(base_node) if isinstance(sub, ast.Attribute)
                    and isinstance(sub.ctx, ast.Load) and getattr(sub.value, "id", "") == "self"}
            if read - own_names(base_node):
                mixins.add((name, base_name))
    assert mixins == MIXINS_LEFT, f"new mixins: {mixins - MIXINS_LEFT}; undone (drop from the list): {MIXINS_LEFT - mixins}"


PROTOCOLS = [  # (module, protocol, the fewest implementations the engine has)
    ("batchspec.engine.drafters.base", "Drafter", 6),
    ("batchspec.engine.control.costs", "CostModel", 4),
    ("batchspec.engine.control.costs", "WholeRoundCosts", 2),
    ("batchspec.engine.verify_pass", "VerifyPass", 3),
]


def engine_classes() -> list[type]:
    """Every class the engine's modules define (each module imported)."""
    import importlib
    import inspect

    found = []
    for path in sorted((PACKAGE / "engine").rglob("*.py")):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        module = importlib.import_module(name)
        found += [c for c in vars(module).values() if inspect.isclass(c) and c.__module__ == module.__name__]
    return found


def public_methods(cls: type) -> dict:
    import inspect
    import typing

    return {name: value for klass in reversed(cls.__mro__) if klass not in (typing.Protocol, typing.Generic, object)
            for name, value in vars(klass).items() if inspect.isfunction(value) and not name.startswith("_")}


def implementations(module: str, protocol: str) -> tuple[dict, list[type]]:
    """(the protocol's methods, the engine's classes that have all of them)."""
    import importlib

    declared = public_methods(getattr(importlib.import_module(module), protocol))
    return declared, [c for c in engine_classes() if not getattr(c, "_is_protocol", False)
                      and all(callable(getattr(c, name, None)) for name in declared)]


def parameters(function) -> list:
    """A function's parameters as a caller sees them: names, kinds and defaults (annotations aside)."""
    import inspect

    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize("module, protocol, fewest", PROTOCOLS, ids=[p for _, p, _ in PROTOCOLS])
def test_a_protocols_implementations_take_its_methods_parameters_as_it_declares_them(module, protocol, fewest):
    """Every engine class that has all of a protocol's methods takes each method's parameters with the
    protocol's names, kinds and defaults, so that a caller written against the protocol calls any of them
    alike (issue 60: CostModel.observe(k, b, seconds) was not what PackedCosts.observe took)."""
    import inspect

    declared, found = implementations(module, protocol)
    assert len(found) >= fewest, [c.__name__ for c in found]
    differ = [f"{c.__name__}.{name}{inspect.signature(getattr(c, name))}" for c in found
              for name, method in declared.items() if parameters(getattr(c, name)) != parameters(method)]
    assert not differ, f"not as {protocol} declares them: {differ}"


def test_every_tree_drafter_proposes_trees_alike():
    """propose_tree, which only drafters whose policy says `trees` have (drafters/base.py), takes the same
    parameters in each of them."""
    _, drafters = implementations("batchspec.engine.drafters.base", "Drafter")
    trees = {c.__name__: parameters(c.propose_tree) for c in drafters if c.policy.trees}
    assert len(trees) >= 5 and len({repr(p) for p in trees.values()}) == 1, trees
    assert [c for c in drafters if c.policy.trees != callable(getattr(c, "propose_tree", None))] == []


# Tests of a path flag outside engine/model/ that run at each call, not once when the generator is built (issue 60:
# 31 of them before the paths were chosen in the constructors): (module under engine/, flags).
PATH_TESTS_LEFT: set[tuple[str, str]] = set()


def test_the_engine_chooses_its_path_once():
    """Outside the runner's folder no code asks at each call which path it is on (tools/path_flags.py): the
    path is chosen in the constructors (or the functions that run once at build, path_flags.CHOSEN_ONCE)."""
    sys.path.insert(0, str(PACKAGE.parent / "tools"))
    import path_flags

    found = set()
    for path in sorted((PACKAGE / "engine").rglob("*.py")):
        rel = path.relative_to(PACKAGE / "engine").as_posix()
        if not rel.startswith("model/"):
            found |= {(rel, names) for _, names, built in path_flags.flag_tests(path.read_text(), rel) if not built}
    assert found == PATH_TESTS_LEFT, f"new: {found - PATH_TESTS_LEFT}; gone (drop from the list): {PATH_TESTS_LEFT - found}"


# Modules read before a job has work to do (its config and the drafter names it checks against, the status
# command): importing them must not load torch or transformers (seconds), which a package __init__ that imports
# its modules eagerly, or a helper imported from a module that needs torch, does silently (engine/drafters/__init__.py
# made jobs.config take 3.9 s; jobs.grouping took sample_count from engine.intake, which loads torch).
LIGHT_MODULES = ["batchspec.jobs.cli", "batchspec.jobs.config", "batchspec.engine.drafters.registry", "batchspec.jobs.status",
                 "batchspec.jobs.build", "batchspec.training.train_draft"]


@pytest.mark.parametrize("module", LIGHT_MODULES)
def test_modules_read_before_the_work_load_no_torch(module):
    import subprocess

    code = f"import sys, {module}; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", (module, out.stdout, out.stderr[-2000:])


@pytest.mark.xdist_group("layout")
def test_an_xdist_group_runs_on_one_worker(request):
    """The suite's costly shared fixtures (the SLURM cluster and its array run, SmolLM2, Gemma-3) are built once
    because their tests share an xdist_group: under `--dist loadgroup` xdist renames each such test's node id
    with its group, and schedules by it. pytest 9.2 stopped reading the attribute xdist 3.8 writes, which
    silently spread the groups over both workers (pyproject.toml pins pytest below 9.2)."""
    if getattr(request.config.option, "dist", "no") == "no" and not hasattr(request.config, "workerinput"):
        pytest.skip("not under pytest-xdist")
    if not request.config.getvalue("loadgroup"):
        pytest.skip("not --dist loadgroup")
    assert request.node.nodeid.endswith("@layout"), request.node.nodeid
