"""Files written all or nothing: the one atomic writer every output goes through (part files, results,
summaries, job.json, markers, EAGLE heads, training checkpoints).

    atomic_write(path, lambda tmp: torch.save(state, tmp))     # anything that writes a file by its path
    atomic_write_text(path, text)

`write(tmp)` writes a temp file beside `path` (or at `tmp`, which must be on the same filesystem); it is
then fsynced and renamed over `path`, so a reader, or a run resumed after a kill or a power loss, sees
the old file or the new one, never half of one.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable


def atomic_write(path: Path, write: Callable[[Path], object], tmp: Path | None = None) -> None:
    """Call `write(tmp)`, then make the file it wrote `path`, synced, by a rename."""
    path = Path(path)
    if tmp is None:  # a name of this process and thread: two writers of one path never share a temp file
        tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    tmp = Path(tmp)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """`text` (UTF-8) at `path`, all or nothing."""
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
