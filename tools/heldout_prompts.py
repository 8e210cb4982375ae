"""Held-out prompts for tools/heldout_grid.py, built from the docstrings of Python's standard library.

    python tools/heldout_prompts.py --kind module-chat --out /work/heldout/stdlib_docs_chat.jsonl
    python tools/heldout_prompts.py --kind module-raw  --out /work/heldout/stdlib_docs_raw.jsonl
    python tools/heldout_prompts.py --kind class-chat  --out /work/heldout/stdlib_class_chat.jsonl

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


def module_docs(root: Path) -> list[tuple[str, str]]:
    """(module name, docstring) for each top-level stdlib module file with a long enough docstring."""
    out = []
    for path in sorted(root.glob("*.py")):
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError):
            continue
        if doc and len(doc) >= MIN_CHARS:
            out.append((path.stem, doc))
    return out


def class_docs(root: Path) -> list[tuple[str, str]]:
    """('module.Class', docstring) for each public top-level class of the top-level stdlib module files."""
    out = []
    for path in sorted(root.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= MIN_CHARS:
                    out.append((f"{path.stem}.{node.name}", doc))
    return out


def prompts(kind: str, root: Path) -> list[str]:
    what, style = kind.split("-")
    docs = module_docs(root) if what == "module" else class_docs(root)
    random.Random(SEED).shuffle(docs)
    noun = "module" if what == "module" else "class"
    if style == "chat":
        return [f"Here is the documentation of the Python {noun} `{name}`:\n\n{_clean(doc)}\n\nExplain in a few "
                f"sentences what this {noun} is for and give one short usage example." for name, doc in docs]
    return [f"# Python {noun} `{name}`\n\n{_clean(doc)}\n\n## Example\n\n" for name, doc in docs]


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
