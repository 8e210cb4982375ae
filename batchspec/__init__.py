"""batchspec: offline batch inference with speculative decoding at batch size > 1."""

import os

from .engine.runstats import RunStats
from .engine.types import Constraint, Request, Result, RowParams

# `python -m batchspec.status` and the other documented spellings: their thin entry modules are in entry/
# (entry/__init__.py), found as batchspec.NAME because the folder is on the package's path.
__path__.append(os.path.join(os.path.dirname(__file__), "entry"))

__version__ = "0.1.0"
__all__ = ["generate", "load_models", "build_generator", "Constraint", "Request", "Result", "RowParams", "RunStats",
           "__version__"]
_API = ("generate", "load_models", "build_generator")


def __getattr__(name: str):
    # The API imports torch and transformers (seconds): only when it is used, so that the commands
    # (python -m batchspec ..., batchspec.status) start at once and a Ctrl-C while they start is theirs.
    if name in _API:
        from . import api  # deferred: torch and transformers load on first use (above)

        return getattr(api, name)
    raise AttributeError(f"module 'batchspec' has no attribute {name!r}")
