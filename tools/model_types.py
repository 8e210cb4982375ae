"""The coverage table of docs/how_it_works.md: every model type AutoModelForCausalLM maps, built tiny (tests/model_zoo.py),
run through batchspec and compared with `generate`; the table between the markers is rewritten.

    python tools/model_types.py              # all types (about 4 minutes on 2 cores), rewrites the docs' table
    python tools/model_types.py llama bloom  # some types, printed only

tests/test_model_types.py checks each type's outcome against the table, so a change that makes a type exact,
refused or unbuildable fails there until this tool is run again. The table names the transformers release it was
made with; under another release the test still holds every type to "exact or refused in one line" but does
not compare with the table (a new release adds types and changes which ones build).
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
DOC = ROOT / "docs" / "how_it_works.md"
START, END = "<!-- model-types: start (tools/model_types.py writes this table) -->", "<!-- model-types: end -->"


def reason(outcome) -> str:
    """The outcome's detail without the temporary folder a refusal names."""
    detail = re.sub(r"^target \S+: ", "", outcome.detail)
    return detail.replace("|", "/")


def table(outcomes) -> str:
    from model_zoo import EXACT

    counts = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    import transformers

    lines = [f"{len(outcomes)} types in transformers {transformers.__version__}: "
             + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ".", "",
             "| model type | outcome | why |", "|---|---|---|"]
    for o in outcomes:
        status = o.status + (" (windowed; static path too)" if o.windowed and o.status == EXACT else "")
        lines.append(f"| {o.model_type} | {status} | {reason(o) if o.status != EXACT else ''} |")
    return "\n".join(lines)


def table_text() -> str:
    """The docs' table, between its markers."""
    text = DOC.read_text()
    return text[text.index(START): text.index(END)]


def documented_version() -> str:
    """The transformers release the docs' table was made with (its first line names it)."""
    return re.search(r"types in transformers (\S+):", table_text()).group(1)


def documented() -> dict[str, str]:
    """model type -> its outcome in the docs' table (the status word before any parenthesis)."""
    body = table_text()
    rows = re.findall(r"^\| ([\w-]+) \| ([^|(]+?)(?: \([^|]*\))? \|", body, flags=re.M)
    return {t: s.strip() for t, s in rows if t != "model"}


def main(argv: list[str]) -> int:
    from model_zoo import check_type, model_types
    from tiny import build_tokenizer

    tokenizer = build_tokenizer()
    types = argv or model_types()
    outcomes = []
    for t in types:
        with tempfile.TemporaryDirectory() as folder:
            outcome = check_type(t, tokenizer, Path(folder))
        print(f"{t:<28} {outcome.status:<12} {reason(outcome)[:150]}", flush=True)
        outcomes.append(outcome)
    if not argv:
        text = DOC.read_text()
        DOC.write_text(text[: text.index(START) + len(START)] + "\n\n" + table(outcomes) + "\n\n" + text[text.index(END):])
        print(f"wrote the table of {len(outcomes)} types to {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
