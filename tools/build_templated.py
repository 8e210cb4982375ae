"""Build the templated workload: prompts that share templates, for drafters that learn across rows.

    python tools/build_templated.py                      # -> batchspec/assets/demo/templated.parquet
    python tools/build_templated.py --out P --rows-per-family 60

A dataset job often runs one prompt template over many records: the same instructions, the same code
skeleton, only the names change. Then the answers repeat across rows too, which a drafter that keeps a
job-wide structure (suffix decoding, issue 22) can use and one that looks only inside each request
cannot. The demo's own held-out prompts (prompts.parquet) are the opposite: cut from different files,
little shared structure.

Five families of Python prompts in the style of the demo target's training text (the CPython standard
library), each filled from fixed lists of class names and attribute names:

  repr       a class whose __init__ stores two attributes, ending at `def __repr__(self):`
  error      an exception class with a docstring, ending at its `def __init__(self, ATTR, msg=None):`
  accessor   a getter with a docstring, ending at the matching setter's header
  check      an instruction comment + a function header
  test       a unittest TestCase with setUp, ending at a test method's header

Rows interleave the families (row i is family i % 5), as a job reading a mixed dataset would; prompts
end at a line end without the newline, as the demo prompts do. Columns: `id` (templated-0000...),
`prompt`, `family`. Deterministic: no randomness, the same file on every run (--check compares).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

OUT = Path(__file__).resolve().parents[1] / "batchspec" / "assets" / "demo" / "templated.parquet"

NAMES = ["Point", "Vector", "Config", "Record", "Account", "Order", "Message", "Token", "Packet", "Window",
         "Buffer", "Reader", "Writer", "Parser", "Entry", "Node", "Request", "Response", "Session", "Channel",
         "Queue", "Event", "Handler", "Option"]
ATTRS = [("x", "y"), ("name", "value"), ("host", "port"), ("key", "data"), ("owner", "balance"),
         ("items", "total"), ("sender", "body"), ("kind", "text"), ("header", "payload"), ("width", "height"),
         ("size", "mode"), ("path", "encoding"), ("start", "end"), ("parent", "children"), ("source", "target"),
         ("level", "message"), ("timeout", "retries"), ("user", "password"), ("index", "count"),
         ("prefix", "suffix")]

FAMILIES = {
    "repr": ("class {Name}:\n    def __init__(self, {a}, {b}):\n        self.{a} = {a}\n        self.{b} = {b}\n\n"
             "    def __repr__(self):"),
    "error": ("class {Name}Error(Exception):\n    \"\"\"Raised when a {lname} is invalid.\"\"\"\n\n"
              "    def __init__(self, {a}, msg=None):"),
    "accessor": ("    def get_{a}(self):\n        \"\"\"Return the {a} of this {lname}.\"\"\"\n        return self._{a}\n\n"
                 "    def set_{a}(self, value):"),
    "check": "# Check that the {a} of a {lname} is valid and return it.\ndef check_{lname}_{a}({lname}):",
    "test": ("class Test{Name}(unittest.TestCase):\n\n    def setUp(self):\n        self.{lname} = {Name}()\n\n"
             "    def test_{a}(self):"),
}


def build(rows_per_family: int) -> pa.Table:
    """rows_per_family prompts of each family, interleaved; fillers walk the (name, attribute) grid with
    a stride so that neighbouring rows of a family differ in both."""
    grid = list(itertools.product(range(len(NAMES)), range(len(ATTRS))))
    if rows_per_family > len(grid):
        raise ValueError(f"at most {len(grid)} rows per family")
    ids, prompts, families = [], [], []
    for i in range(rows_per_family * len(FAMILIES)):
        family, j = list(FAMILIES)[i % len(FAMILIES)], i // len(FAMILIES)
        n, a = grid[(j * 31 + 7 * list(FAMILIES).index(family)) % len(grid)]
        name, (first, second) = NAMES[n], ATTRS[a]
        prompts.append(FAMILIES[family].format(Name=name, lname=name.lower(), a=first, b=second))
        ids.append(f"templated-{i:04d}")
        families.append(family)
    return pa.table({"id": ids, "prompt": prompts, "family": families})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--rows-per-family", type=int, default=60)
    parser.add_argument("--check", action="store_true", help="exit 1 if --out differs from what this builds")
    args = parser.parse_args(argv)
    table = build(args.rows_per_family)
    if args.check:
        same = args.out.exists() and pq.read_table(args.out).equals(table)
        print(f"{args.out}: {'up to date' if same else 'differs from the build'}")
        sys.exit(0 if same else 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, args.out)
    print(f"wrote {args.out}: {table.num_rows} rows, {len(FAMILIES)} families")


if __name__ == "__main__":
    main()
