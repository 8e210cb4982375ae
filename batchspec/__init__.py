"""batchspec: offline batch inference with speculative decoding at batch size > 1."""

from .api import build_generator, generate, load_models
from .types import Request, Result, RunStats

__version__ = "0.1.0"
__all__ = ["generate", "load_models", "build_generator", "Request", "Result", "RunStats", "__version__"]
