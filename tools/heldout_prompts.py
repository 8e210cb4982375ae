"""Held-out prompts for tools/heldout_grid.py, built from the docstrings of Python's standard library.

    python tools/heldout_prompts.py --kind module-chat --out heldout/module-chat.jsonl
    python tools/heldout_prompts.py --kind module-raw  --out heldout/module-raw.jsonl
    python tools/heldout_prompts.py --kind class-chat  --out heldout/class-chat.jsonl

No download and nothing the demo pair trained on as prompts: the text is what `ast.get_docstring` returns
for the top-level modules (module-*) or the public top-level classes (class-*) of the running Python's
standard library, those of 300 characters or more, sorted by name, shuffled by `random.Random(11)`, whitespace
collapsed, cut to the first 700 characters. Each line of the output is {"prompt": TEXT}.

- module-chat: "Here is the documentation of the Python module `NAME`:\\n\\nDOC\\n\\nExplain in a few sentences
  what this module is for and give one short usage example." (for a chat model: bench --chat renders it)
- module-raw: "# Python module `NAME`\\n\\nDOC\\n\\n## Example\\n\\n" (for a base model)
- class-chat / class-raw: the same with "class `MODULE.NAME`".

The module sets are the recipe of docs/benchmarks.md's held-out cells since 2026-11-30 (Python 3.11.7); the
class sets were first built on 2026-12-02 (thirty-third session), for cells no earlier change had seen.
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import sys
import sysconfig
from pathlib import Path

MIN_CHARS, MAX_CHARS, SEED = 300, 700, 11


def _clean(doc: str) -> str:
    return " ".join(doc.split())[:MAX_CHARS]


def _modules(root: Path):
    """(module name, parsed module) for each top-level stdlib module file that parses."""
    for path in sorted(root.glob("*.py")):
        try:
            yield path.stem, ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue


def docs(root: Path, what: str) -> list[tuple[str, str]]:
    """(name, docstring) of each top-level module (what="module") or each public top-level class ("class",
    named 'module.Class') whose docstring is long enough."""
    found = []
    for stem, tree in _modules(root):
        if what == "module":
            found.append((stem, ast.get_docstring(tree)))
        else:
            found += [(f"{stem}.{node.name}", ast.get_docstring(node)) for node in tree.body
                      if isinstance(node, ast.ClassDef) and not node.name.startswith("_")]
    return [(name, doc) for name, doc in found if doc and len(doc) >= MIN_CHARS]


def prompts(kind: str, root: Path) -> list[str]:
    what, style = kind.split("-")
    found = docs(root, what)
    random.Random(SEED).shuffle(found)
    if style == "chat":
        return [f"Here is the documentation of the Python {what} `{name}`:\n\n{_clean(doc)}\n\nExplain in a few "
                f"sentences what this {what} is for and give one short usage example." for name, doc in found]
    return [f"# Python {what} `{name}`\n\n{_clean(doc)}\n\n## Example\n\n" for name, doc in found]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", required=True, choices=["module-chat", "module-raw", "class-chat", "class-raw"])
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    texts = prompts(args.kind, Path(sysconfig.get_paths()["stdlib"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts), encoding="utf-8")
    print(f"{args.out}: {len(texts)} prompts ({args.kind}, Python {sys.version.split()[0]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
