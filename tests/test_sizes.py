"""Source sizes (the project's rule, as in pytorch-labs/gpt-fast): no .py file under batchspec/ or tools/ is
longer than 300 lines, and no function or method is longer than 60 lines.

A function's length counts from the first statement after its docstring to its last line: the signature
(however many lines its arguments take) and the docstring are not counted; a nested function counts in its
parent and again on its own. One exemption: a function named `parse_args` whose body only builds and checks
an argparse parser (it makes an `ArgumentParser`, and every statement is a call, an assignment, an import, a
return, or an `if` holding such statements, e.g. `if bad: p.error(...)`): a command's flags are one list,
read best in one place.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOTS = ["batchspec", "tools"]  # folders of the repository whose .py files the rule covers
MAX_FILE_LINES = 300
MAX_FUNCTION_LINES = 60
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
STRAIGHT = (ast.Expr, ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Import, ast.ImportFrom, ast.Return, ast.Pass)


def body_after_docstring(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.stmt]:
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:]
    return body


def body_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first statement after the docstring (its decorators included) to the function's end."""
    body = body_after_docstring(fn)
    if not body:
        return 0
    first = min([body[0].lineno] + [d.lineno for d in getattr(body[0], "decorator_list", [])])
    return fn.end_lineno - first + 1


def straight(statements: list[ast.stmt]) -> bool:
    """Calls, assignments, imports and returns only, or `if`s of them: no loop, `with`, `try` or definition."""
    return all(isinstance(s, STRAIGHT) or (isinstance(s, ast.If) and straight(s.body) and straight(s.orelse))
               for s in statements)


def argparse_only(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A `parse_args` that only builds and checks an argparse parser (see the module docstring)."""
    makes_parser = any(isinstance(n, ast.Call) and (getattr(n.func, "attr", None) == "ArgumentParser"
                                                   or getattr(n.func, "id", None) == "ArgumentParser")
                       for n in ast.walk(fn))
    return fn.name == "parse_args" and makes_parser and straight(body_after_docstring(fn))


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """'path:line name (N lines)' for each function of the file over `limit` body lines."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, FUNCTIONS) and not argparse_only(node) and (n := body_lines(node)) > limit:
            found.append(f"{path}:{node.lineno} {node.name} ({n} lines)")
    return found


def long_file(path: Path, limit: int = MAX_FILE_LINES) -> list[str]:
    """['path (N lines)'] if the file is over `limit` lines, else []."""
    n = len(path.read_text().splitlines())
    return [f"{path} ({n} lines)"] if n > limit else []


def python_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


RULES = [  # (what, check of one file -> offences, limit)
    ("file longer than 300 lines", long_file, MAX_FILE_LINES),
    ("function longer than 60 lines after its docstring", long_functions, MAX_FUNCTION_LINES),
]


@pytest.mark.parametrize("root", ROOTS)
@pytest.mark.parametrize("what,check,limit", RULES, ids=[r[0] for r in RULES])
def test_no_source_is_too_long(root, what, check, limit):
    files = python_files(REPO / root)
    assert files, f"no .py files under {root}/"
    offences = [o for path in files for o in check(path, limit)]
    assert not offences, f"{what} (split it into named steps or modules):\n" + "\n".join(
        o.replace(f"{REPO}/", "") for o in offences)


LONG_BODY = "\n".join(f"    x{i} = {i}" for i in range(61))
CASES = [  # (source, offences by long_file, offences by long_functions)
    ("x = 1\n" * 300, 0, 0),
    ("x = 1\n" * 301, 1, 0),
    (f'def f():\n    """Doc."""\n{LONG_BODY}\n', 0, 1),  # 61 lines after the docstring
    ("def f(\n" + "    a,\n" * 70 + '):\n    """' + "doc\n" * 30 + '"""\n' + "\n".join(LONG_BODY.splitlines()[:60])
     + "\n", 0, 0),  # a long signature and docstring do not count: 60 lines of body
    ("class C:\n    def method(self):\n" + "\n".join("    " + line for line in LONG_BODY.splitlines()) + "\n", 0, 1),
    ("def parse_args(argv=None):\n    p = argparse.ArgumentParser()\n"
     + "    p.add_argument('--x')\n" * 70 + "    args = p.parse_args(argv)\n"
     + "    if args.x is None:\n        p.error('no x')\n    return args\n", 0, 0),
    ("def parse_args(argv=None):\n    p = argparse.ArgumentParser()\n"
     + "    for i in range(3):\n        p.add_argument(f'--x{i}')\n" + "    p.add_argument('--y')\n" * 70
     + "    return p.parse_args(argv)\n", 0, 1),  # a loop: more than building the parser
]


@pytest.mark.parametrize("source,files,functions", CASES)
def test_the_checks_catch_what_is_too_long(tmp_path, source, files, functions):
    path = tmp_path / "module.py"
    path.write_text(source)
    assert (len(long_file(path)), len(long_functions(path))) == (files, functions)
