"""batchspec: offline batch inference with speculative decoding at batch size > 1."""

import os as _os

# torch's OpenMP threads spin while waiting by default; on a shared CPU (SLURM nodes, CI, cron next
# to other jobs) that made a 2-thread job 10x slower. Read once when torch loads, so it is set here,
# before anything imports torch, and only where the user has not chosen.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .types import Request, Result, RowParams, RunStats  # noqa: E402

__version__ = "0.1.0"
__all__ = ["generate", "load_models", "build_generator", "Request", "Result", "RowParams", "RunStats", "__version__"]
_API = ("generate", "load_models", "build_generator")


def __getattr__(name: str):
    # The API imports torch and transformers (seconds): only when it is used, so that the commands
    # (python -m batchspec ..., batchspec.status) start at once and a Ctrl-C while they start is theirs.
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'batchspec' has no attribute {name!r}")
