"""The corpus: a fixed, sorted list of pure-Python stdlib modules, split by file into train and held-out."""

from __future__ import annotations

from pathlib import Path

# Stdlib folders left out: tests, GUI/tools, deprecated copies, codec tables and generated data.
EXCLUDED_DIRS = {
    "test", "tests", "idlelib", "lib2to3", "site-packages", "encodings", "pydoc_data", "ensurepip",
    "turtledemo", "distutils", "tkinter", "__phello__", "lib-dynload", "__pycache__", "msilib",
}
MIN_FILE_BYTES, MAX_FILE_BYTES = 1_000, 48_000  # skip stubs and the few huge modules (~4 MB in all)
HELDOUT_EVERY = 10  # every 10th file of the sorted list is held out


def stdlib_files(root: Path) -> list[Path]:
    """Sorted stdlib-relative paths of the pure-Python modules that make up the corpus."""
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in EXCLUDED_DIRS or part.startswith("config-") for part in rel.parts[:-1]):
            continue
        if rel.name.startswith(("_sysconfigdata", "test_")):
            continue
        if MIN_FILE_BYTES <= path.stat().st_size <= MAX_FILE_BYTES:
            files.append(rel)
    return files


def split_files(files: list[Path]) -> tuple[list[Path], list[Path]]:
    """(train, held-out): file i is held out when i % HELDOUT_EVERY == HELDOUT_EVERY - 1."""
    heldout = [f for i, f in enumerate(files) if i % HELDOUT_EVERY == HELDOUT_EVERY - 1]
    train = [f for i, f in enumerate(files) if i % HELDOUT_EVERY != HELDOUT_EVERY - 1]
    return train, heldout


def read_text(root: Path, rel: Path) -> str:
    return (root / rel).read_text(encoding="utf-8", errors="replace")
