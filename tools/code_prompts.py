"""More held-out prompts for a `tools/build_demo.py` pair: def/class prefixes from Python files it never trained on.

    python tools/code_prompts.py --pair heldout/p512 --rows 1000 --out heldout/p512_1k.parquet

A pair's own prompts.parquet holds what its held-out stdlib files give (500 for a 512-wide pair: too few for the
held-out grid's 1,000-row jobs). This keeps those and adds prefixes cut as build_demo cuts them (a def or class
header and its first lines, 20-150 tokens under the pair's tokenizer) from transformers' `modeling_*.py` files,
which no build_demo pair trains on (it trains on the standard library), shuffled by `random.Random(5)`, then the
whole set shuffled by `random.Random(6)`. The rows' ids say where each came from (heldout-NNNN, tf-NNNN);
`--source` and `--glob` take the added prompts from other files.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import transformers
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_demo import file_prompts, read_text  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", required=True, help="a build_demo output folder (target/, prompts.parquet)")
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--out", required=True)
    parser.add_argument("--source", default=str(Path(transformers.__file__).parent / "models"),
                        help="the folder the added prompts come from (default: transformers' models)")
    parser.add_argument("--glob", default="modeling_*.py", help="its files, searched recursively")
    args = parser.parse_args(argv)
    pair = Path(args.pair)
    tokenizer = AutoTokenizer.from_pretrained(pair / "target")
    own = pq.read_table(pair / "prompts.parquet").to_pylist()[: args.rows]
    root = Path(args.source)
    seen, found = {row["prompt"] for row in own}, []
    for rel in sorted(p.relative_to(root) for p in root.rglob(args.glob)):
        for prompt in file_prompts(read_text(root, rel), tokenizer, 20, 150):
            if prompt not in seen:
                seen.add(prompt)
                found.append((prompt, f"{root.parent.name}/{root.name}/{rel.as_posix()}"))
    random.Random(5).shuffle(found)
    extra = [{"id": f"tf-{i:04d}", "prompt": p, "source_file": f}
             for i, (p, f) in enumerate(found[: args.rows - len(own)])]
    rows = own + extra
    random.Random(6).shuffle(rows)
    pq.write_table(pa.Table.from_pylist(rows), args.out)
    print(f"{args.out}: {len(rows)} prompts ({len(own)} of the pair's own, {len(extra)} from {root}, "
          f"{len(found)} found there)")


if __name__ == "__main__":
    main()
